"""End to end on Airflow's distributed engine: the CeleryExecutor, two Celery workers, two
triggerers, PostgreSQL and Redis, every component a process of its own on loopback, one System
Zero account at the published limits (:mod:`tests.helpers.deployment.celery`).

Run with ``make test-deployment EXECUTOR=celery``. The scenarios, in the order they run:

1. mapped ``SystemZeroDecideOperator`` instances and mapped ``@task.systemzero`` calls (each a
   stream and a budget mirror of its own in the worker process that runs it) spread over both
   workers, a poking sensor in a worker, a deferrable one in a triggerer and an asset watcher in
   a triggerer: every task ends as it should, with the answers the rules give, and no state is
   billed twice on the account they share;
2. a worker is killed with SIGKILL while the gateway is making the decision its task asked for:
   the task's retry runs on the other worker, gets that decision replayed from the idempotency
   ledger (billed once in all), and the run succeeds with the answer;
3. the "Decision timeline" view under the FAB auth manager: a user whose role may read one Dag
   gets its timeline and is refused the other's.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.deployment.celery import ADMIN, READABLE_DAG, READER, UNREADABLE_DAG, CeleryDeployment
from tests.helpers.deployment.harness import RESULTS, executor, running, wait_for

pytestmark = [
    pytest.mark.deployment,
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        executor() != "celery", reason="the Celery deployment runs with: make test-deployment EXECUTOR=celery"
    ),
]

WORKERS = ("worker-a", "worker-b")
READY = "Job is ready.\n"


@pytest.fixture(scope="module")
def celery(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CeleryDeployment]:
    """PostgreSQL, Redis, the emulator, the api-server, scheduler, dag-processor, two triggerers and
    two Celery workers."""
    with running(CeleryDeployment(tmp_path_factory.mktemp("airflow-celery"), workers=WORKERS)) as deployment:
        yield deployment


@pytest.fixture(scope="module")
def runs() -> dict[str, str]:
    """The run of each Dag the scenarios started (the timeline scenario reads them)."""
    return {}


def _task_rows(deployment: CeleryDeployment, dag_id: str, run_id: str) -> list[tuple[Any, ...]]:
    return deployment.query(
        "SELECT task_id, map_index, state, try_number, hostname FROM task_instance "
        "WHERE dag_id = ? AND run_id = ? ORDER BY task_id, map_index",
        (dag_id, run_id),
    )


def _return_values(deployment: CeleryDeployment, dag_id: str, run_id: str) -> dict[tuple[str, int], Any]:
    rows = deployment.query(
        "SELECT task_id, map_index, value FROM xcom WHERE dag_id = ? AND run_id = ? AND key = 'return_value'",
        (dag_id, run_id),
    )
    return {
        (task, index): value if not isinstance(value, str) else json.loads(value)
        for task, index, value in rows
    }


def _billed_twice(deployment: CeleryDeployment) -> list[str]:
    billed = [(entry.account, entry.body_sha256) for entry in deployment.ledger() if entry.billed]
    return sorted({body for account, body in billed if billed.count((account, body)) > 1})


def _get(deployment: CeleryDeployment, path: str, token: str) -> tuple[int, str]:
    request = urllib.request.Request(deployment.api + path, headers=deployment.auth_headers(token))
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def test_every_kind_of_system_zero_task_on_two_celery_workers(
    celery: CeleryDeployment, runs: dict[str, str], tmp_path: Path
) -> None:
    from tests.helpers.deployment.dag_parts import BUILDS, TICKETS

    started = time.time()
    for name in ("poke.log", "deferred.log"):
        (tmp_path / name).write_text("job started\n")
    run_id = runs["decide"] = celery.trigger("sz_celery_decide", {"dir": str(tmp_path)})

    def sensors_waiting() -> bool:
        celery.check_alive()
        states = {row[0]: row[2] for row in _task_rows(celery, "sz_celery_decide", run_id)}
        return states.get("poke") in ("running", "up_for_reschedule") and states.get("deferred") == "deferred"

    wait_for(sensors_waiting, 240, "the poking sensor to run on a worker and the deferrable one to defer")
    for name in ("poke.log", "deferred.log"):
        with (tmp_path / name).open("a") as handle:
            handle.write("tests passed\n" + READY)
    watch_file = celery.home / "watch" / "release.log"  # the watcher's file (the Dag reads AIRFLOW_HOME)
    watch_file.parent.mkdir(parents=True, exist_ok=True)
    watch_file.write_text("release checks passed\n" + READY)

    assert celery.wait_run("sz_celery_decide", run_id, timeout=400) == "success"
    rows = _task_rows(celery, "sz_celery_decide", run_id)
    assert all(state == "success" for _, _, state, _, _ in rows), rows
    hosts = {task: {host for t, _, _, _, host in rows if t == task} for task in ("decide", "triage")}
    assert hosts["decide"] | hosts["triage"] == set(WORKERS), f"not spread over both workers: {hosts}"
    assert {host for t, _, _, _, host in rows if t == "poke"} <= set(WORKERS)
    values = _return_values(celery, "sz_celery_decide", run_id)
    assert [values[("decide", index)] for index in range(len(BUILDS))] == [{"ready": True}] * len(BUILDS)
    assert [values[("triage", index)] for index in range(len(TICKETS))] == [
        {"urgent": urgent} for urgent in TICKETS.values()
    ]

    def released() -> str | None:
        rows = celery.query(
            "SELECT run_id, state FROM dag_run WHERE dag_id = 'sz_celery_on_release' ORDER BY id"
        )
        return rows[0][1] if rows and rows[0][1] in ("success", "failed") else None

    assert wait_for(released, 240, "the asset watcher's event to run sz_celery_on_release") == "success"
    twice = _billed_twice(celery)
    assert not twice, f"states billed twice: {twice}"
    billed = sum(1 for entry in celery.ledger() if entry.billed and entry.time >= started)
    RESULTS.append(
        f"Celery: {len(BUILDS)} mapped operators and {len(TICKETS)} @task.systemzero calls over "
        f"{sorted(hosts['decide'] | hosts['triage'])}, a poking and a deferrable sensor, an asset watcher: "
        f"all succeeded; {billed} decisions billed on one account at the published limits, none twice; "
        f"{time.time() - started:.0f} s"
    )


def test_a_worker_killed_mid_decision_bills_once_and_loses_nothing(
    celery: CeleryDeployment, runs: dict[str, str]
) -> None:
    started = time.time()
    run_id = runs["held"] = celery.trigger("sz_celery_held", {})
    assert celery.decider.started.wait(240), "the held decision never reached the gateway"

    def asker() -> str | None:
        rows = [row for row in _task_rows(celery, "sz_celery_held", run_id) if row[2] == "running"]
        return rows[0][4] if rows and rows[0][4] in WORKERS else None

    victim = wait_for(asker, 60, "the worker running the held decision")
    survivor = next(name for name in WORKERS if name != victim)
    celery.components[victim].kill()  # SIGKILL, its whole process tree, mid-decision
    celery.decider.release.set()  # the gateway finishes the decision the dead worker asked for
    assert celery.wait_run("sz_celery_held", run_id, timeout=400) == "success"
    ((task, _, state, tries, host),) = _task_rows(celery, "sz_celery_held", run_id)
    assert (state, host) == ("success", survivor) and tries >= 2, (task, state, tries, host)
    assert _return_values(celery, "sz_celery_held", run_id)[("decide", -1)] == {"ready": True}
    entries = [e for e in celery.ledger() if e.time >= started]
    keys = {e.idempotency_key for e in entries}
    assert len(keys) == 1, f"one state, one key: {keys}"
    billed, replayed = sum(e.billed for e in entries), sum(not e.billed for e in entries)
    assert (billed, replayed >= 1) == (1, True), f"{billed} billed, {replayed} replayed"
    assert not _billed_twice(celery)
    RESULTS.append(
        f"Celery: {victim} killed (SIGKILL) mid-decision; the retry (try {tries}) on {survivor} got the "
        f"decision replayed: {billed} billed, {replayed} replayed unbilled; {time.time() - started:.0f} s"
    )


def test_the_timeline_under_the_fab_auth_manager_shows_a_reader_only_its_dag(
    celery: CeleryDeployment, runs: dict[str, str]
) -> None:
    if not {"decide", "held"} <= set(runs):
        pytest.skip("needs the runs of the two scenarios before it")
    reader, admin = celery.token(READER), celery.token(ADMIN)
    readable = f"/systemzero/timeline/dags/{READABLE_DAG}/runs/{runs['decide']}/tasks/decide?map_index=0"
    unreadable = f"/systemzero/timeline/dags/{UNREADABLE_DAG}/runs/{runs['held']}/tasks/decide"
    status, page = _get(celery, readable, reader)
    assert status == 200 and "decided by model" in page, (status, page[:500])
    status, page = _get(celery, unreadable, reader)
    assert status == 403 and "held-decision" not in page, (status, page[:500])
    assert _get(celery, unreadable, admin)[0] == 200
    RESULTS.append(
        "Celery: the timeline under the FAB auth manager: the reader got its Dag (200), not the other (403)"
    )
