"""What the deployment test's Dag files share: an asset watcher on a file the test writes, and the
Dag its events schedule; and the Celery Dags' mapped inputs, which the test checks the replies of
(imported by the Dag files through the components' ``PYTHONPATH``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import DAG, Asset, AssetWatcher, task

from airflow_provider_systemzero.decisions.conditions import DecisionCondition
from airflow_provider_systemzero.triggers.decision import SystemZeroDecisionEventTrigger

START = pendulum.datetime(2026, 1, 1, tz="UTC")
#: The watched file: ``$AIRFLOW_HOME/watch/release.log`` of the deployment that parses the Dag.
WATCH_FILE = Path(os.environ.get("AIRFLOW_HOME", "/nonexistent")) / "watch" / "release.log"
#: The states of the mapped operator: each is decided ready by the emulator's rules.
BUILDS = [f"build {index}: compiling\ntests passed\nJob is ready.\n" for index in range(8)]
#: The tickets of the mapped @task.systemzero calls, and whether the rules call each urgent.
TICKETS = {
    "checkout is down for everyone": True,
    "I was charged twice this month": False,
    "how do I export my data?": False,
    "nobody can log in, outage since 9:00": True,
}


def released_on_ready(prefix: str, watch_id: str, uri: str, default_args: dict[str, Any]) -> DAG:
    """The asset ``<prefix>_release`` watched by ``<prefix>_release_watch`` (a System Zero watch
    ``watch_id`` on :data:`WATCH_FILE`, firing when the job is ready), and the Dag
    ``<prefix>_on_release`` its events schedule, which it returns.

    :param prefix: the names' prefix.
    :param watch_id: the watch's ID (the key of its memory in the asset state store).
    :param uri: the asset's URI.
    :param default_args: the Dag's default arguments.
    """
    release = Asset(
        name=f"{prefix}_release",
        uri=uri,
        watchers=[
            AssetWatcher(
                name=f"{prefix}_release_watch",
                trigger=SystemZeroDecisionEventTrigger(
                    systemzero_conn_id="systemzero_default",
                    request={
                        "questions": {"ready": {"type": "boolean", "instructions": "Is the job ready?"}}
                    },
                    condition=DecisionCondition("ready", True, min_confidence=0.8),
                    state="",
                    watch_id=watch_id,
                    source={"type": "file", "path": str(WATCH_FILE), "poll_interval": 0.5},
                    lease_after=1.0,
                ),
            )
        ],
    )
    with DAG(
        f"{prefix}_on_release",
        schedule=[release],
        start_date=START,
        catchup=False,
        default_args=default_args,
        tags=["systemzero", "deployment-test"],
    ) as dag:

        @task
        def released() -> str:
            return "released"

        released()
    return dag
