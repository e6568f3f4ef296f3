"""Schedule a Dag when System Zero decides something became true (event-driven scheduling).

An ``AssetWatcher`` runs :class:`SystemZeroDecisionEventTrigger` in the triggerer: it streams a
status file to System Zero and emits an asset event each time "Is the release approved?" turns
true, which schedules ``systemzero_on_release_approved``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pendulum
from airflow.sdk import DAG, Asset, AssetWatcher, task

from airflow_provider_systemzero.decisions.conditions import DecisionCondition
from airflow_provider_systemzero.triggers.decision import SystemZeroDecisionEventTrigger

STATUS_FILE = (
    Path(os.environ.get("SYSTEMZERO_EXAMPLE_DIR", tempfile.gettempdir()))
    / "systemzero-examples"
    / "release-status.log"
)

release_approved = Asset(
    name="release_approved",
    uri="systemzero://examples/release-approved",
    watchers=[
        AssetWatcher(
            name="release_approved_watch",
            trigger=SystemZeroDecisionEventTrigger(
                systemzero_conn_id="systemzero_default",
                request={
                    "questions": {
                        "ready": {
                            "type": "boolean",
                            "instructions": "Is the release approved and the job ready?",
                        }
                    }
                },
                condition=DecisionCondition("ready", True, min_confidence=0.8).to_dict(),
                state="",
                watch_id="examples-release-approved",
                source={"type": "file", "path": str(STATUS_FILE), "poll_interval": 1.0},
            ),
        )
    ],
)

with DAG(
    dag_id="systemzero_on_release_approved",
    schedule=[release_approved],
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["systemzero", "example"],
    doc_md=__doc__,
) as dag:

    @task(inlets=[release_approved])
    def announce(triggering_asset_events=None) -> str:
        # Looked up in Airflow's accessor, never in a plain dict: Airflow 3.1 cannot hash an Asset.
        events = list(triggering_asset_events[release_approved]) if triggering_asset_events else []
        # the trigger's event payload arrives in the asset event's extra, under "payload"
        payload = (events[-1].extra or {}).get("payload", {}) if events else {}
        return f"release approved: {payload.get('decision')} (confidence {payload.get('confidence')})"

    announce()
