"""The Dags of the UI test (``tests/ui``): a sensor whose policy asks a person, and one whose wait
the "Decision timeline" shows.

The emulator's rules (``tests/ui/emulator_rules.json``) answer a log that "looks ready" with
``ready: true`` at probability 0.72 — between the policy's bars, so a person is asked — and a log
that says "Job is ready." with 0.96, above them.

``retries=4``: an answer given within seconds of the pause can meet apache/airflow#71580 (the
scheduler fails the resumed try on the worker's stale exit event); the retry takes the person's
answer from the task state store without asking again, and the test accepts a retry only when
the scheduler logged that "state mismatch". The retry of a sensor whose condition is already met
is itself the fastest deferral, exposed to the same race: on a machine at load 16, one sensor
met it three times in a row, hence 4.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DAG

from airflow_provider_systemzero.decisions.policy import DecisionPolicy
from airflow_provider_systemzero.sensors.decision import SystemZeroDecisionSensor

#: What both Dags are: started by the test with the directory of the build log they watch.
UI_DAG = {
    "schedule": None,
    "start_date": pendulum.datetime(2026, 1, 1, tz="UTC"),
    "catchup": False,
    "params": {"dir": ""},
    "tags": ["systemzero", "ui-test"],
}
#: What both sensors wait for: the nightly build's log, a line at a time.
BUILD_LOG = {
    "question": "ready",
    "instructions": "Is the nightly build ready to ship?",
    "source": {"type": "file", "path": "{{ params.dir }}/build.log", "poll_interval": 0.5},
}

with DAG("sz_ui_review", **UI_DAG, default_args={"retries": 4, "retry_delay": timedelta(seconds=2)}):
    SystemZeroDecisionSensor(
        task_id="wait_until_ready",
        **BUILD_LOG,
        policy=DecisionPolicy(act_above=0.85, review_above=0.6, below="wait"),
        review_subject="Ship the nightly build?",
        lease_after=1.0,
        timeout=900,
    )

with DAG("sz_ui_timeline", **UI_DAG):
    # The build log gains a line at a time: "compiling" (not ready), "looks ready" (ready, but its
    # confidence 0.64 is under the bar), "Job is ready." (fires). The stream is held through the
    # test's changes (lease_after), so one trigger sees all three states.
    SystemZeroDecisionSensor(
        task_id="wait_for_build",
        **BUILD_LOG,
        min_confidence=0.8,
        lease_after=600,
        timeout=900,
    )
