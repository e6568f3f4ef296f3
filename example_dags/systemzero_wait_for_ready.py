"""Wait until System Zero says a job is ready, reading the job's log as it grows.

``start_job`` launches a (simulated) job that keeps appending to its log; the deferrable
``wait_until_ready`` sensor streams every new line to System Zero from the triggerer and
succeeds on the first decision that the job is ready with confidence ≥ 0.8 — no worker slot
is held while it waits. ``report`` reads the decision from XCom.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pendulum
from airflow.sdk import DAG, task

from airflow_provider_systemzero.sensors.decision import SystemZeroDecisionSensor

LOG_DIR = Path(os.environ.get("SYSTEMZERO_EXAMPLE_DIR", tempfile.gettempdir())) / "systemzero-examples"

#: The simulated job: a few progress lines, then "Job is ready.", then it exits.
JOB = """
import sys, time
path = sys.argv[1]
for line in ["Loading input", "Transforming 1200 rows", "Writing output", "Verifying output", "Job is ready."]:
    time.sleep(float(sys.argv[2]))
    with open(path, "a") as log:
        log.write(line + "\\n")
"""


with DAG(
    dag_id="systemzero_wait_for_ready",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["systemzero", "example"],
    doc_md=__doc__,
) as dag:

    @task
    def start_job(run_id: str | None = None) -> str:
        """Start the job in the background and return its log's path."""
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        log = LOG_DIR / f"job-{hashlib.sha256(str(run_id).encode()).hexdigest()[:16]}.log"
        log.write_text("Job started\n")
        step = os.environ.get("SYSTEMZERO_EXAMPLE_STEP_SECONDS", "0.4")
        job = subprocess.Popen(
            [sys.executable, "-c", JOB, str(log), step],
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        # The job outlives this task. A thread collects its exit status when it ends, so it is
        # not left a zombie (a real job would be tracked by its own scheduler).
        threading.Thread(target=job.wait, name=f"job-{job.pid}", daemon=True).start()
        return str(log)

    log_path = start_job()

    wait_until_ready = SystemZeroDecisionSensor(
        task_id="wait_until_ready",
        question="ready",
        instructions="Is the job ready?",
        source={"type": "file", "path": "{{ ti.xcom_pull(task_ids='start_job') }}", "poll_interval": 0.2},
        min_confidence=0.8,
        deferrable=True,  # wait in the triggerer; Airflow's default is to poke
        timeout=300,
    )

    @task
    def report(ti=None) -> str:
        """Say what System Zero decided."""
        decision = ti.xcom_pull(task_ids="wait_until_ready")
        message = (
            f"ready={decision['decision']} probability={decision['probability']} "
            f"confidence={decision['confidence']} at state version {decision['state_version']}"
        )
        print(message)
        return message

    log_path >> wait_until_ready >> report()
