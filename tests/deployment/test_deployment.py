"""End to end against Airflow run as separate components, the way it runs in production.

``dag.test()`` runs a trigger inline in the test process. Here the scheduler hands work to
LocalExecutor workers, which defer to two real ``airflow triggerer`` processes; the stream lives
in a triggerer's trigger-runner subprocess and the gateway is the emulator on loopback. The
scenarios, in the order they run:

1. 20 deferrable sensors on files appended to over time all succeed on a true decision, and no
   triggerer process tree ever holds more than ``max_streams_per_process`` sockets to the gateway
   although a triggerer runs more triggers than that (stream leasing);
3. a ``start_from_trigger`` sensor is deferred by the scheduler, never runs on a worker before the
   decision, and resumes once;
5. the operator's answers reach a downstream task through XCom in a real run;
4. a pool with ``include_deferred=True``, sized to the account's stream capacity, bounds how many
   sensors wait at once, and the account is never refused for capacity;
2. a triggerer is killed with SIGKILL mid-wait: its triggers move to the other triggerer and still
   succeed, and every billed decision is a distinct state (the replays are not billed);
7. an asset watcher fires once; its triggerer is killed; the other triggerer adopts it and does
   not fire again for the same run of met decisions, and fires once for the next run
   (:mod:`tests.helpers.deployment.watcher`);
6. (PostgreSQL mode only) the same with 50 sensors while their states keep changing: no trigger runs in both triggerers at once, every sensor succeeds once.

A task may be retried, but only for apache/airflow#71580 (see :func:`_assert_retries_explained`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import airflow.sdk.execution_time.context
import pytest

from airflow_provider_systemzero.protocol.limits import Limits
from tests.helpers.deployment.harness import (
    ACCOUNT_POOL_SLOTS,
    RESULTS,
    SMALL_KEY,
    TRIGGERER_HEALTH_THRESHOLD,
    Deployment,
    database,
    wait_for,
)
from tests.helpers.deployment.reporting import double_runs, trigger_spans
from tests.helpers.deployment.watcher import run_watcher_restart

pytestmark = [pytest.mark.deployment, pytest.mark.timeout(600)]

MAX_STREAMS_PER_PROCESS = Limits().max_streams_per_process
READY = "Job is ready.\n"


# ---------------------------------------------------------------------------------------- helpers


def _files(directory: Path, count: int) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / f"job_{index:02d}.log" for index in range(count)]
    for path in paths:
        path.write_text("job started\n")
    return paths


def _append(path: Path, text: str) -> None:
    with path.open("a") as handle:
        handle.write(text)


@contextmanager
def _background(target: Callable[[threading.Event], None]) -> Iterator[threading.Event]:
    """Run ``target(stop)`` in a thread for the block; re-raise its failure at the end."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            target(stop)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield stop
    finally:
        stop.set()
        thread.join(timeout=30)
    if errors:
        raise errors[0]


def _assert_all_succeeded(deployment: Deployment, dag_id: str, run_id: str, state: str) -> dict[str, Any]:
    tis = deployment.task_instances(dag_id, run_id)
    assert state == "success", f"{dag_id} ended {state}: {tis}"
    assert all(ti["state"] == "success" for ti in tis.values()), tis
    return tis


def _assert_retries_explained(deployment: Deployment, dag_id: str, run_id: str) -> int:
    """A task may have needed more than one try only when the scheduler failed each earlier try on
    the stale executor event of apache/airflow#71580 (see :meth:`Deployment.unexplained_retries`).
    Returns how many such mismatches the run had."""
    unexplained, mismatched = deployment.unexplained_retries(dag_id, run_id)
    assert not unexplained, (
        f"retried without the apache/airflow#71580 state mismatch: {unexplained}; "
        f"mismatches logged: {sorted(mismatched)}"
    )
    return len(mismatched)


def _wait_quiet(deployment: Deployment, name: str, quiet: float = 2.0, timeout: float = 60) -> None:
    """Wait until a triggerer's process tree has held no gateway socket for ``quiet`` seconds."""
    assert deployment.sampler is not None
    component = deployment.components[name]
    since = time.monotonic()
    deadline = since + timeout
    while time.monotonic() - since < quiet:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name} kept a gateway socket open for {timeout} s")
        if deployment.sampler.count(component):
            since = time.monotonic()
        time.sleep(0.1)


def _billing(deployment: Deployment, since: float) -> tuple[int, int, list[str]]:
    """Decide calls answered since ``since`` (epoch seconds): (billed, replayed unbilled), and the
    bodies ever billed twice for one account (must be none: a state decided again — by a retry, a
    restarted or a second triggerer — is replayed from the idempotency ledger, not billed)."""
    ledger = deployment.ledger()
    window = [entry for entry in ledger if entry.time >= since]
    billed = [(entry.account, entry.body_sha256) for entry in ledger if entry.billed]
    twice = sorted({body for account, body in billed if billed.count((account, body)) > 1})
    return sum(e.billed for e in window), sum(not e.billed for e in window), twice


def _keep_writing(
    files: list[Path], writing: threading.Event | None = None
) -> Callable[[threading.Event], None]:
    """A :func:`_background` target appending a line to every file each 2 s (while ``writing`` is set)."""

    def write(stop: threading.Event) -> None:
        step = 0
        while not stop.wait(2.0):
            if writing is None or writing.is_set():
                for path in files:
                    _append(path, f"step {step}: still working\n")
                step += 1

    return write


def _assert_handed_over_run(
    deployment: Deployment, dag_id: str, run_id: str, state: str, count: int, since: float
) -> tuple[int, int, int, dict[str, int]]:
    """After a hand-over: all ``count`` sensors (``wait_NN``) succeeded on a true decision, retried
    only for apache/airflow#71580, no state billed twice, no triggerer over the socket cap.
    Returns (#71580 mismatches, billed, replayed unbilled, max sockets per triggerer)."""
    tis = _assert_all_succeeded(deployment, dag_id, run_id, state)
    assert len(tis) == count, sorted(tis)
    mismatches = _assert_retries_explained(deployment, dag_id, run_id)
    xcoms = deployment.xcoms(dag_id, run_id)
    assert all(xcoms[(f"wait_{i:02d}", "return_value")]["decision"] is True for i in range(count))
    billed, replayed, twice = _billing(deployment, since)
    assert not twice, f"states billed twice: {twice}"
    assert deployment.sampler is not None
    sockets = dict(deployment.sampler.maxima)
    assert max(sockets.values()) <= MAX_STREAMS_PER_PROCESS, sockets
    return mismatches, billed, replayed, sockets


def _placed(
    deployment: Deployment, dag_id: str, run_id: str, count: int, timeout: float
) -> dict[str, list[str]]:
    """Wait until all ``count`` triggers of the run are assigned to a triggerer; triggerer name ->
    task IDs, every triggerer named (those holding none with an empty list). Which triggerer claims
    a trigger is a race: one whose loop is slow may get none."""

    def assigned() -> dict[str, list[str]] | None:
        deployment.check_alive()
        placed = deployment.triggers_by_triggerer(dag_id, run_id)
        found = {k: v for k, v in placed.items() if k != "?"}
        if sum(map(len, found.values())) != count:
            return None
        return {**{name: [] for name in deployment.triggerer_jobs}, **found}

    return wait_for(assigned, timeout, f"all {count} sensors deferred in the triggerers", interval=0.5)


# ---------------------------------------------------------------------------------------- scenarios


def test_fanout_shares_the_per_process_stream_cap(deployment: Deployment, tmp_path: Path) -> None:
    """(1) 20 sensors, two triggerers: every sensor succeeds on a true decision, and no triggerer
    process tree ever holds more than ``max_streams_per_process`` gateway sockets."""
    dag_id, count = "sz_deploy_fanout", 20
    files = _files(tmp_path / "fanout", count)
    assert deployment.sampler is not None
    deployment.sampler.reset()
    since = time.time()
    held: dict[str, int] = {}
    started = time.monotonic()
    run_id = deployment.trigger(dag_id, {"dir": str(tmp_path / "fanout")})

    def write(stop: threading.Event) -> None:
        # wait until the sensors are waiting, then keep the logs growing for ~20 s, then finish
        # them one after the other over ~10 s
        wait_for(
            lambda: (
                stop.is_set()
                or sum(ti["state"] == "deferred" for ti in deployment.task_instances(dag_id, run_id).values())
                >= count // 2
            ),
            120,
            "half of the sensors to defer",
        )
        for step in range(8):
            for path in files:
                _append(path, f"step {step}: still working\n")
            if stop.wait(2.5):
                return
        for path in files:
            _append(path, READY)
            if stop.wait(0.5):
                return

    def observe(stop: threading.Event) -> None:
        while not stop.wait(0.5):
            for name, tasks in deployment.triggers_by_triggerer(dag_id, run_id).items():
                if name != "?":  # "?": not picked up by a triggerer yet
                    held[name] = max(held.get(name, 0), len(tasks))

    with _background(write), _background(observe):
        state = deployment.wait_run(dag_id, run_id, timeout=180)
    elapsed = time.monotonic() - started

    _assert_all_succeeded(deployment, dag_id, run_id, state)
    mismatches = _assert_retries_explained(deployment, dag_id, run_id)
    xcoms = deployment.xcoms(dag_id, run_id)
    decisions = [xcoms[(f"wait_{i:02d}", "return_value")] for i in range(count)]
    assert all(d["decision"] is True and d["confidence"] >= 0.8 for d in decisions), decisions

    sockets = dict(deployment.sampler.maxima)
    assert max(sockets.values()) <= MAX_STREAMS_PER_PROCESS, sockets
    assert max(sockets.values()) >= 1, f"the sampler saw no gateway socket at all: {sockets}"
    # the cap was binding: a triggerer ran more triggers at once than it may hold streams
    assert max(held.values()) > MAX_STREAMS_PER_PROCESS, held
    stats = deployment.emulator.stats
    assert stats.max_streams_open <= MAX_STREAMS_PER_PROCESS * len(deployment.triggerer_jobs), stats
    billed, replayed, twice = _billing(deployment, since)
    assert not twice, f"states billed twice: {twice}"
    RESULTS.append(
        f"(1) fan-out: {count} sensors succeeded in {elapsed:.0f} s; triggers held at once per "
        f"triggerer {held}; max gateway sockets per triggerer process tree {sockets} (cap "
        f"{MAX_STREAMS_PER_PROCESS}); {billed} decisions billed, {replayed} replayed unbilled, no state "
        f"billed twice; #71580 retries: {mismatches}"
    )


def test_start_from_trigger_never_runs_on_a_worker_first(deployment: Deployment, tmp_path: Path) -> None:
    """(3) The scheduler defers the sensor itself; the triggerer renders its key namespace; the only
    worker run is the resume."""
    dag_id = "sz_deploy_start_from_trigger"
    work = tmp_path / "sft"
    work.mkdir()
    (work / "job.log").write_text("job started\n")
    run_id = deployment.trigger(dag_id, {"dir": str(work)})
    seen: list[str] = []
    task_logs = deployment.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / "task_id=wait"

    def deferred() -> dict[str, Any] | None:
        deployment.check_alive()
        ti = deployment.task_instances(dag_id, run_id).get("wait")
        if ti and ti["state"] and (not seen or seen[-1] != ti["state"]):
            seen.append(ti["state"])
        return ti if ti and ti["state"] == "deferred" and ti["trigger_id"] else None

    ti = wait_for(deferred, 90, "the start-from-trigger sensor to be deferred", interval=0.1)
    # the trigger row came from StartTriggerArgs: its namespace is still the template
    stored = deployment.trigger_kwargs_text(ti["trigger_id"])
    assert "sz-sft-{{ ti.dag_id }}.{{ ti.task_id }}.{{ ti.run_id }}.{{ ti.map_index }}" in stored, stored[
        :2000
    ]
    wait_for(
        lambda: deployment.triggers_by_triggerer(dag_id, run_id).keys() - {"?"},
        60,
        "a triggerer to pick the trigger up",
    )
    time.sleep(2)  # waiting in the triggerer ...
    assert not (task_logs / "attempt=1.log").exists(), "a worker ran the task before the trigger fired"
    assert deployment.task_instances(dag_id, run_id)["wait"]["state"] == "deferred"
    _append(work / "job.log", READY)
    state = deployment.wait_run(dag_id, run_id, timeout=90)

    tis = _assert_all_succeeded(deployment, dag_id, run_id, state)
    mismatches = _assert_retries_explained(deployment, dag_id, run_id)
    assert not {"queued", "running"} & set(seen[: seen.index("deferred")]), seen
    xcoms = deployment.xcoms(dag_id, run_id)
    assert xcoms[("wait", "return_value")]["decision"] is True
    assert xcoms[("report", "return_value")].startswith("ready=True")
    # the triggerer rendered the namespace; the resumed worker accepted it
    rendered = f"sz-sft-{dag_id}.wait.{run_id}.-1"
    trigger_logs = " ".join(p.read_text() for p in task_logs.glob("attempt=*.log.trigger.*.log"))
    assert rendered in trigger_logs, trigger_logs[-2000:]
    # one worker execution (a worker writes one "Pre Execute" group per run into the try's log),
    # and it was the resume, not execute() deferring
    worker_log = (task_logs / f"attempt={tis['wait']['try_number']}.log").read_text()
    worker_runs = worker_log.count("::group::Pre Execute")
    assert worker_runs == 1, worker_log[-3000:]
    assert "System Zero decided ready = True" in worker_log
    assert "Pausing task as DEFERRED" not in worker_log
    RESULTS.append(
        f"(3) start_from_trigger: states before the resume {seen}; the trigger row held the "
        f"namespace template, the triggerer rendered {rendered!r}; one worker run (the resume, "
        f"try {tis['wait']['try_number']}); #71580 retries: {mismatches}"
    )


def test_operator_xcom_consumed_downstream(deployment: Deployment) -> None:
    """(5) build_log → decide (replays build_log's output as state) → consume reads the answers."""
    dag_id = "sz_deploy_operator_xcom"
    run_id = deployment.trigger(dag_id, {})
    state = deployment.wait_run(dag_id, run_id, timeout=120)
    _assert_all_succeeded(deployment, dag_id, run_id, state)
    mismatches = _assert_retries_explained(deployment, dag_id, run_id)
    xcoms = deployment.xcoms(dag_id, run_id)
    assert xcoms[("decide", "return_value")] == {"ready": True}
    decision_id = xcoms[("decide", "decision_id")]
    assert decision_id.startswith("szd_")
    assert xcoms[("consume", "return_value")] == {
        "ship": True,
        "probability": 0.96,
        "decision_id": decision_id,
    }
    replayed = [
        {"task_id": "build_log", "output": {"build": 41, "log": "compiling\ntests passed\nJob is ready.\n"}}
    ]
    assert replayed in [s.state for s in deployment.emulator.final_states.values()]
    RESULTS.append(
        f"(5) operator → downstream XCom: {xcoms[('consume', 'return_value')]}; #71580 retries: {mismatches}"
    )


def test_pool_with_deferred_slots_bounds_waiting_sensors(deployment: Deployment, tmp_path: Path) -> None:
    """(4) 6 sensors on an account with 2 streams, in a pool of 2 slots that counts deferred tasks."""
    dag_id, count = "sz_deploy_pool", 6
    files = _files(tmp_path / "pool", count)
    refusals_before = deployment.emulator.stats.upgrade_refusals.get(429, 0)
    run_id = deployment.trigger(dag_id, {"dir": str(tmp_path / "pool")})
    peak = {"deferred": 0, "occupying": 0}
    deferred_since: dict[str, float] = {}

    def watch_and_finish(stop: threading.Event) -> None:
        # finish each sensor 3 s after it started waiting, so they really hold their slots
        while not stop.wait(0.25):
            tis = deployment.task_instances(dag_id, run_id)
            waiting = [task for task, ti in tis.items() if ti["state"] == "deferred"]
            peak["deferred"] = max(peak["deferred"], len(waiting))
            peak["occupying"] = max(
                peak["occupying"],
                sum(ti["state"] in ("queued", "running", "deferred") for ti in tis.values()),
            )
            now = time.monotonic()
            for task in waiting:
                if now - deferred_since.setdefault(task, now) >= 3 and task not in finished:
                    _append(files[int(task.rsplit("_", 1)[1])], READY)
                    finished.add(task)

    finished: set[str] = set()
    with _background(watch_and_finish):
        state = deployment.wait_run(dag_id, run_id, timeout=180)

    tis = _assert_all_succeeded(deployment, dag_id, run_id, state)
    mismatches = _assert_retries_explained(deployment, dag_id, run_id)
    assert {ti["pool"] for ti in tis.values()} == {"systemzero_account"}
    assert peak["occupying"] <= ACCOUNT_POOL_SLOTS, peak
    assert peak["deferred"] == ACCOUNT_POOL_SLOTS, peak  # the pool was full, never over
    stats = deployment.emulator.stats
    assert stats.peak_connections_by_account.get(SMALL_KEY, 0) <= ACCOUNT_POOL_SLOTS, stats
    assert stats.upgrade_refusals.get(429, 0) == refusals_before, stats  # never over the account's capacity
    RESULTS.append(
        f"(4) pool of {ACCOUNT_POOL_SLOTS} with include_deferred: {count} sensors, at most "
        f"{peak['deferred']} deferred and {peak['occupying']} occupying slots at once; the account "
        f"held at most {stats.peak_connections_by_account.get(SMALL_KEY, 0)} streams, no 429; "
        f"#71580 retries: {mismatches}"
    )


def test_killed_triggerer_hands_its_triggers_over(deployment: Deployment, tmp_path: Path) -> None:
    """(2) SIGKILL the triggerer running some of the sensors mid-wait; the other one adopts them
    after the health-check threshold, and a state already decided is replayed, not billed again."""
    dag_id, count = "sz_deploy_handover", 8
    files = _files(tmp_path / "handover", count)
    assert deployment.sampler is not None
    deployment.sampler.reset()
    since = time.time()
    run_id = deployment.trigger(dag_id, {"dir": str(tmp_path / "handover")})
    writing = threading.Event()
    writing.set()

    with _background(_keep_writing(files, writing)):
        placed = _placed(deployment, dag_id, run_id, count, 120)
        victim = max(placed, key=lambda name: len(placed[name]))
        survivor = next(name for name in placed if name != victim)
        orphans = sorted(placed[victim])
        # stop writing until the victim holds no socket for a while: each of its triggers then has a
        # decision about its current state and has given its stream back (leasing); kill it then
        writing.clear()
        _wait_quiet(deployment, victim)
        replayed_before = deployment.emulator.stats.decisions_replayed
        killed_at = time.monotonic()
        deployment.components[victim].kill()

        def adopted() -> bool:
            deployment.check_alive()
            return sorted(deployment.triggers_by_triggerer(dag_id, run_id).get(survivor, [])) == sorted(
                placed[survivor] + orphans
            )

        wait_for(adopted, TRIGGERER_HEALTH_THRESHOLD + 60, f"{survivor} to adopt {victim}'s triggers")
        handover = time.monotonic() - killed_at
        # the adopted triggers reopen their streams with the states the dead triggerer had decided:
        # each is answered from the idempotency ledger, not billed
        wait_for(
            lambda: deployment.emulator.stats.decisions_replayed >= replayed_before + len(orphans),
            60,
            "every adopted trigger to replay its decided state",
        )
        writing.set()
        time.sleep(2)
        for path in files:
            _append(path, READY)
        state = deployment.wait_run(dag_id, run_id, timeout=120)

    mismatches, billed, replayed, sockets = _assert_handed_over_run(
        deployment, dag_id, run_id, state, count, since
    )
    # the killed triggerer comes back as a new process, and the deployment is whole again
    deployment.start_triggerer(victim)
    RESULTS.append(
        f"(2) SIGKILL {victim} holding {len(orphans)} of {count} triggers: {survivor} adopted them "
        f"{handover:.0f} s later (health threshold {TRIGGERER_HEALTH_THRESHOLD} s); all succeeded; "
        f"{billed} decisions billed = {billed} distinct states, {replayed} replayed unbilled (each "
        f"adopted trigger's decided state); max sockets per triggerer {sockets}; "
        f"#71580 retries: {mismatches}"
    )


@pytest.mark.skipif(
    not hasattr(airflow.sdk.execution_time.context, "AssetStateStoreAccessors"),
    reason="the asset state store a watcher remembers in is new in Airflow 3.3",
)
def test_killed_triggerer_does_not_make_a_watcher_fire_again(deployment: Deployment) -> None:
    """(7) SIGKILL the triggerer running an asset watcher that fired; the adopted watcher recalls it."""
    RESULTS.append(run_watcher_restart(deployment))


@pytest.mark.skipif(
    database() != "postgres",
    reason="the 50-sensor failover runs on PostgreSQL: make test-deployment DEPLOYMENT_DB=postgres",
)
def test_postgres_failover_of_fifty_waiting_sensors(deployment: Deployment, tmp_path: Path) -> None:
    """(6) PostgreSQL: 50 sensors waiting in the triggerers (which claim triggers with row locks);
    one triggerer is SIGKILLed mid-wait while the states keep changing. The other adopts its
    triggers within the health threshold; every sensor succeeds once, no state is billed twice, no
    trigger runs in both triggerers at once beyond the hand-over, and no triggerer ever holds more
    than ``max_streams_per_process`` gateway sockets."""
    dag_id, count = "sz_deploy_failover", 50
    files = _files(tmp_path / "failover", count)
    assert deployment.sampler is not None
    deployment.sampler.reset()
    since = time.time()
    started = time.monotonic()
    run_id = deployment.trigger(dag_id, {"dir": str(tmp_path / "failover")})

    with _background(_keep_writing(files)):
        placed = _placed(deployment, dag_id, run_id, count, 300)
        spread_after = time.monotonic() - started
        victim = max(placed, key=lambda name: len(placed[name]))
        survivor = next(name for name in placed if name != victim)
        orphans = sorted(placed[victim])
        time.sleep(3)  # mid-wait: the states keep changing and the victim decides them
        killed_at = time.monotonic()
        killed_epoch = time.time()
        deployment.components[victim].kill()

        def adopted() -> bool:
            deployment.check_alive()
            return len(deployment.triggers_by_triggerer(dag_id, run_id).get(survivor, [])) == count

        wait_for(
            adopted,
            TRIGGERER_HEALTH_THRESHOLD + 150,
            f"{survivor} to adopt {victim}'s triggers",
            interval=0.5,
        )
        handover = time.monotonic() - killed_at
        time.sleep(4)  # the adopted triggers decide the current states in the survivor
    for path in files:
        _append(path, READY)
    state = deployment.wait_run(dag_id, run_id, timeout=300)
    elapsed = time.monotonic() - started

    mismatches, billed, replayed, sockets = _assert_handed_over_run(
        deployment, dag_id, run_id, state, count, since
    )
    spans = trigger_spans(deployment, dag_id, run_id)
    assert len(spans) == count, f"trigger logs for {len(spans)} of {count} tasks"
    survivor_job, victim_job = deployment.triggerer_jobs[survivor], deployment.triggerer_jobs[victim]
    # each orphan ran in the survivor, and only after the kill (no copy started while the victim lived)
    unadopted = [task for task in orphans if survivor_job not in spans.get(task, {})]
    assert not unadopted, f"no trigger log of {survivor} for {unadopted}"
    early = {
        task: round(killed_epoch - spans[task][survivor_job][0], 1)
        for task in orphans
        if spans[task][survivor_job][0] < killed_epoch
    }
    assert not early, f"{survivor} started these triggers before {victim} was killed (s): {early}"
    late = {
        task: by_job[victim_job][1] - killed_epoch
        for task, by_job in spans.items()
        if victim_job in by_job and by_job[victim_job][1] > killed_epoch + 1
    }
    assert not late, f"{victim} wrote trigger logs after it was killed: {late}"
    double = double_runs(spans)
    assert not double, f"triggers run by both triggerers at once (seconds): {double}"
    stayed = [task for task in spans if task not in orphans and set(spans[task]) != {survivor_job}]
    assert not stayed, f"triggers of {survivor} that ran elsewhere too: {stayed}"
    deployment.start_triggerer(victim)
    RESULTS.append(
        f"(6) PostgreSQL failover: {count} sensors in the triggerers {spread_after:.0f} s after the "
        f"run started; SIGKILL {victim} holding {len(orphans)}: {survivor} held all {count} "
        f"{handover:.0f} s later (health threshold {TRIGGERER_HEALTH_THRESHOLD} s, heartbeat 1 s); no "
        f"trigger run by both at once; all succeeded in {elapsed:.0f} s; {billed} decisions billed, "
        f"{replayed} replayed unbilled, no state billed twice; max gateway sockets per triggerer "
        f"{sockets}; #71580 retries: {mismatches}"
    )
