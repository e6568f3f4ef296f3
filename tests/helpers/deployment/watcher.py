"""Scenario 7 of the deployment test: an asset watcher survives the death of its triggerer
without scheduling its Dags again.

The watcher ``sz_deploy_release_watch`` (``dags/deployment_dags.py``) tails
``$AIRFLOW_HOME/watch/release.log``. Its state lives in real components only: the asset events
and the watch's memory (``systemzero.watch:deploy-release``) in the ``asset_state_store`` table
of the metadata database, written through the triggerer's supervisor.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.helpers.deployment.harness import TRIGGERER_HEALTH_THRESHOLD, Deployment, wait_for

ASSET = "sz_deploy_release"
MEMORY_KEY = "systemzero.watch:deploy-release"
CONSUMER = "sz_deploy_on_release"
READY = "Job is ready.\n"
WAITING = "Job is still waiting.\n"


def _json(value: Any) -> Any:
    """A JSON column as either database returns it (PostgreSQL: decoded already)."""
    if isinstance(value, bytes):
        value = value.decode()
    return json.loads(value) if isinstance(value, str) else value


def watch_file(deployment: Deployment) -> Path:
    path = deployment.home / "watch" / "release.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def placement(deployment: Deployment) -> str | None:
    """The triggerer component running the watcher's trigger (``None``: none yet)."""
    deployment.check_alive()
    rows = deployment.query(
        "SELECT t.triggerer_id FROM trigger t JOIN asset_watcher w ON w.trigger_id = t.id "
        "JOIN asset a ON a.id = w.asset_id WHERE a.name = ?",
        (ASSET,),
    )
    names = {job: name for name, job in deployment.triggerer_jobs.items()}
    return names.get(rows[0][0]) if rows and rows[0][0] is not None else None


def asset_events(deployment: Deployment) -> list[dict[str, Any]]:
    """The trigger event payload of each asset event of the watched asset, oldest first."""
    rows = deployment.query(
        "SELECT e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id WHERE a.name = ? ORDER BY e.id",
        (ASSET,),
    )
    return [(_json(extra) or {}).get("payload", {}) for (extra,) in rows]


def memory(deployment: Deployment) -> dict[str, Any]:
    """The watch's memory in the asset's store (``{}``: none written)."""
    rows = deployment.query(
        "SELECT s.value FROM asset_state_store s JOIN asset a ON a.id = s.asset_id "
        "WHERE a.name = ? AND s.key = ?",
        (ASSET, MEMORY_KEY),
    )
    return _json(rows[0][0]) if rows else {}


def _remembers(deployment: Deployment, fired: bool, what: str) -> dict[str, Any]:
    return wait_for(
        lambda: (value := memory(deployment)) and value.get("fired") is fired and value,
        60,
        what,
    )


def consumer_runs(deployment: Deployment) -> int:
    return deployment.query("SELECT count(*) FROM dag_run WHERE dag_id = ?", (CONSUMER,))[0][0]


def run_watcher_restart(deployment: Deployment) -> str:
    """Fire once, SIGKILL the watcher's triggerer, let the other adopt it: the adopted watcher
    decides the same state (replayed, unbilled) and does not fire; a new run of met decisions
    fires once. Returns the scenario's line for the results."""
    victim = wait_for(lambda: placement(deployment), 120, "the watcher to run in a triggerer")
    path = watch_file(deployment)
    path.write_text(READY)
    wait_for(lambda: len(asset_events(deployment)) == 1, 120, "the first asset event")
    _remembers(deployment, True, "the watch to remember that it fired")

    survivor = next(name for name in deployment.triggerer_jobs if name != victim)
    replayed_before = deployment.emulator.stats.decisions_replayed
    deployment.components[victim].kill()
    wait_for(
        lambda: placement(deployment) == survivor,
        TRIGGERER_HEALTH_THRESHOLD + 90,
        f"{survivor} to adopt the watcher",
    )
    # the adopted watcher decides the state its predecessor fired for (a replay: not billed) ...
    wait_for(
        lambda: deployment.emulator.stats.decisions_replayed > replayed_before,
        60,
        "the adopted watcher to decide the same state",
    )
    # ... recalls that it fired, and stays quiet; a decision that does not meet the condition
    # ends the run, and the next met one fires
    log = deployment.logs / f"{survivor}.log"
    wait_for(
        lambda: "asset watch 'deploy-release' fired (reply" in log.read_text(errors="replace"),
        30,
        "the recall logged",
    )
    path.write_text(WAITING)
    _remembers(deployment, False, "the end of the run remembered")
    path.write_text(READY + READY)
    wait_for(lambda: len(asset_events(deployment)) >= 2, 120, "the new run's asset event")
    _remembers(deployment, True, "the new run remembered")
    wait_for(lambda: consumer_runs(deployment) == 2, 120, f"two runs of {CONSUMER}")

    events = asset_events(deployment)
    assert len(events) == 2, events
    assert events[0]["reply_id"] != events[1]["reply_id"], "the adopted watcher fired again for the same run"
    assert all(event["watch_id"] == "deploy-release" and event["decision"] is True for event in events)
    deployment.start_triggerer(victim)
    return (
        f"(7) asset watcher: fired once, SIGKILL of {victim}; {survivor} adopted it, decided the same "
        f"state (replayed) and recalled from the asset state store that it had fired: no second "
        f"event; a new run of met decisions fired once ({len(events)} asset events, "
        f"{consumer_runs(deployment)} consumer runs)"
    )
