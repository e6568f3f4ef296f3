"""Helpers shared by the Airflow-level tests."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import json
import threading
import types
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from concurrent.futures import Future
from contextlib import asynccontextmanager, contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

import pytest

from airflow_provider_systemzero.compat import AIRFLOW_TASK_STATE_STORE, airflow_version
from airflow_provider_systemzero.decisions.conditions import DecisionCondition
from airflow_provider_systemzero.emulator.deciders import RulesDecider
from airflow_provider_systemzero.emulator.server import Emulator
from airflow_provider_systemzero.protocol.limits import Limits

_T = TypeVar("_T")

#: The directory that holds ``tests/`` (the checkout, or where a copy of ``tests/`` was put).
REPO = Path(__file__).resolve().parents[2]

#: For a test of what Airflow 3.3's task state store keeps across tries (budgets, reviews).
needs_task_state_store = pytest.mark.skipif(
    airflow_version()[:2] < AIRFLOW_TASK_STATE_STORE,
    reason="needs Airflow 3.3's task state store: older releases keep budgets and reviews per try "
    "(docs/compatibility.md)",
)


class TaskStateStore:
    """Airflow 3.3's task state store (``context["task_state_store"]``), in memory: what a task
    keeps across its tries, for a test that resumes a task by hand."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def set(self, key: str, value: Any, **_: Any) -> None:
        self.data[key] = value


class ResumedTaskInstance:
    """What the context of a task resumed by hand holds of its task instance: its ID and
    identity, its try, and the XComs it pushes (``xcoms``)."""

    id = "0199c0de-0000-7000-8000-000000000001"

    def __init__(
        self, dag_id: str = "d", task_id: str = "decide", run_id: str = "r", try_number: int = 1
    ) -> None:
        self.dag_id, self.task_id, self.run_id, self.map_index = dag_id, task_id, run_id, -1
        self.try_number = try_number
        self.xcoms: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[key] = value


class EmulatorThread:
    """Runs an :class:`Emulator` on its own event loop in a thread, for synchronous code such as
    ``dag.test()`` (which runs triggers with ``asyncio.run`` in the calling thread).

    :param stop: the emulator's ``stop()`` arguments when the block ends (``retry_after_ms=0``:
        clients may reconnect at once).
    :param kwargs: the :class:`Emulator`'s.
    """

    def __init__(self, *, stop: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self.emulator = Emulator(**kwargs)
        self._stop_kwargs = dict(stop or {})
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="emulator", daemon=True)

    def call(self, function: Callable[[Emulator], Any]) -> Any:
        """Run ``function(emulator)`` on the emulator's loop (awaiting it if it is a coroutine)."""
        future: Future[Any] = asyncio.run_coroutine_threadsafe(self._run(function), self._loop)
        return future.result(timeout=60)

    async def _run(self, function: Callable[[Emulator], Any]) -> Any:
        result = function(self.emulator)
        if asyncio.iscoroutine(result):
            result = await result
        return result

    async def acall(self, function: Callable[[Emulator], Any]) -> Any:
        """:meth:`call`, awaited from another event loop instead of blocking it."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._run(function), self._loop))

    def __getattr__(self, name: str) -> Any:
        # read-only views (stats, origin, final_states …) come straight from the emulator
        return getattr(self.emulator, name)

    def __enter__(self) -> EmulatorThread:
        self._thread.start()
        self.call(lambda emu: emu.start())
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self.call(lambda emu: emu.stop(**self._stop_kwargs))
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()


def put_connection(
    conn_id: str,
    *,
    host: str,
    password: str | None,
    extra: dict[str, Any] | None = None,
    port: int | None = None,
) -> None:
    """Insert (or replace) a ``systemzero`` connection row in the metadata DB (not an env var).

    :param extra: the connection's extras (``None``: none).
    """
    import json

    from airflow.models import Connection
    from airflow.utils.session import create_session

    with create_session() as session:
        session.query(Connection).filter(Connection.conn_id == conn_id).delete()
        session.add(
            Connection(
                conn_id=conn_id,
                conn_type="systemzero",
                host=host,
                password=password,
                port=port,
                extra=None if extra is None else json.dumps(extra),
            )
        )


@contextmanager
def systemzero_connection(conn_id: str, origin: str, key: str = "demo", **extra: Any) -> Iterator[None]:
    """A ``systemzero`` connection stored in the metadata DB (not an env var) for the block."""
    from airflow.models import Connection
    from airflow.utils.session import create_session

    put_connection(conn_id, host=origin, password=key, extra=extra or None)
    try:
        yield
    finally:
        with create_session() as session:
            session.query(Connection).filter(Connection.conn_id == conn_id).delete()


def decision_result(
    version: int = 1, *, reply: str | None = None, **answers: tuple[Any, float | None, float | None]
) -> Any:
    """A ``DecisionResult`` about state ``version`` with boolean ``answers``, each
    ``question=(decision, probability, confidence)``; its reply id is ``reply``, or ``szd_`` and the
    version in 32 hex digits."""
    from airflow_provider_systemzero.protocol.reply import Answer, DecisionResult

    return DecisionResult(
        reply={"id": reply or f"szd_{version:032x}"},
        state_version=version,
        covered_event_ids=(),
        request_id="r",
        stream_id="s",
        answers={
            name: Answer(name=name, type="boolean", decision=d, probability=p, confidence=c)
            for name, (d, p, c) in answers.items()
        },
    )


#: The rules of most Dag tests: "job is ready" in the state means ready, anything else not.
READY_RULES: dict[str, Any] = {
    "rules": [
        {
            "question": "ready",
            "pattern": "(?i)job is ready",
            "answer": True,
            "probability": 0.95,
            "confidence": 0.9,
        }
    ],
    "default": {"answer": False, "probability": 0.1, "confidence": 0.8},
}


def ready_log(directory: Path) -> Path:
    """A job log in ``directory`` whose one line makes the rules emulator answer ready = true."""
    log = directory / "job.log"
    log.write_text("Job is ready.\n")
    return log


@contextmanager
def rules_emulator(
    rules: dict[str, Any], directory: Any, key: str, conn_id: str, **conn_extra: Any
) -> Iterator[EmulatorThread]:
    """An :class:`EmulatorThread` answering by ``rules`` (the ``rules:`` decider), with the account's
    decision buckets out of the way and a ``conn_id`` connection to it stored in the metadata DB.

    :param directory: where to write the rules file (a ``pathlib.Path``).
    """
    import json

    from airflow_provider_systemzero.protocol.limits import Limits

    path = directory / "rules.json"
    path.write_text(json.dumps(rules))
    limits = Limits(account_decision_burst=1000, account_decision_ceiling_per_minute=100_000)
    with (
        EmulatorThread(api_keys={key: 8}, decider=f"rules:{path}", limits=limits) as emu,
        systemzero_connection(conn_id, emu.origin, key, **conn_extra),
    ):
        yield emu


def wait_until(
    predicate: Callable[[], _T], timeout: float = 10.0, interval: float = 0.01, *, what: str = "the condition"
) -> _T:
    """Poll ``predicate`` until it returns a truthy value (bounded); ``TimeoutError`` naming ``what`` otherwise."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def append_once(
    emulator: Any, counter: str, log: Path, line: str, *, timeout: float, what: str, pause: float = 0.0
) -> Callable[[], None]:
    """A step for :func:`run_dag_while` that changes a tailed log when the run gets there, not on a
    clock: once the emulator's ``counter`` statistic grew past its value now (and ``pause`` seconds
    after, where the test needs the change later than that), ``line`` is appended to ``log``.

    :param emulator: the emulator the Dag's connection points at.
    :param counter: the name of a statistic on ``emulator.stats`` (``decisions_dispatched``, ...).
    :param timeout: the bound on the wait (``TimeoutError`` naming ``what`` after it).
    :param what: what the wait is for, as the timeout error names it.
    """
    import time

    before = getattr(emulator.stats, counter)

    def append() -> None:
        wait_until(lambda: getattr(emulator.stats, counter) > before, timeout=timeout, what=what)
        if pause:
            time.sleep(pause)  # a spacing the test asserts on, after the awaited event
        with log.open("a") as out:
            out.write(line + "\n")

    return append


def once_logged(logger: str, fragment: str, *, timeout: float) -> Callable[[], None]:
    """A wait, for a step of :func:`run_dag_while` (or a reviewer's answer), until ``logger``
    logged a message containing ``fragment``: for a point of the run the gateway cannot see (what
    a trigger made of a decision). The listener is attached now, so a message logged before the
    wait starts counts; it is removed when the wait ends.

    :param logger: the name of the logger that says it (``airflow_provider_systemzero.decisions.watch``).
    :param fragment: a part of the formatted message.
    :param timeout: the bound on the wait (``TimeoutError`` naming the message after it).
    """
    import logging

    seen = threading.Event()

    class _Listener(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if fragment in record.getMessage():
                seen.set()

    target = logging.getLogger(logger)
    listener = _Listener(logging.DEBUG)
    target.addHandler(listener)
    level = target.level
    if not target.isEnabledFor(logging.INFO):
        target.setLevel(logging.INFO)

    def wait() -> None:
        try:
            if not seen.wait(timeout):
                raise TimeoutError(
                    f"timed out after {timeout:.0f} s waiting for {logger} to log {fragment!r}"
                )
        finally:
            target.removeHandler(listener)
            target.setLevel(level)

    return wait


def append_once_logged(
    logger: str, fragment: str, log: Path, line: str, *, timeout: float
) -> Callable[[], None]:
    """A step for :func:`run_dag_while` that appends ``line`` to ``log`` once ``logger`` logged a
    message containing ``fragment`` (:func:`once_logged`).

    :param logger: the name of the logger that says it.
    :param fragment: a part of the formatted message.
    :param timeout: the bound on the wait.
    """
    logged = once_logged(logger, fragment, timeout=timeout)

    def append() -> None:
        logged()
        with log.open("a") as out:
            out.write(line + "\n")

    return append


async def until(condition: Callable[[], object], within: float = 5.0, *, what: str = "the condition") -> None:
    """Let the loop run until ``condition`` holds, polling every 5 ms (bounded: ``TimeoutError``
    naming ``what`` after ``within`` seconds)."""
    import asyncio
    import time

    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {within:.1f} s waiting for {what}")
        await asyncio.sleep(0.005)


def dagbag_module() -> Any:
    """Where ``DagBag``, ``BundleDagBag`` and ``sync_bag_to_db`` live: ``airflow.dag_processing.dagbag``
    from Airflow 3.2, ``airflow.models.dagbag`` on 3.1."""
    try:
        from airflow.dag_processing import dagbag
    except ImportError:
        from airflow.models import dagbag
    return dagbag


def run_dag(dag: Any) -> Any:
    """``dag.test()`` for a Dag built in a test: register it in the DB first (Airflow 3.3 only
    runs serialized Dags), then run it and return the DagRun."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager

    DagBundlesManager().sync_bundles_to_db()
    bag = dagbag_module().DagBag(collect_dags=False)
    bag.bag_dag(dag)
    dagbag_module().sync_bag_to_db(bag, "dags-folder", None)
    return dag.test()


def run_dag_while(dag: Any, step: Callable[[], None], within: float = 60.0) -> Any:
    """:func:`run_dag` with ``step`` run beside it in a thread: what a test does to the world while
    the Dag runs (writes to a tailed file, a gateway restart). A step that fails or does not end
    within ``within`` seconds fails the test once the run ended; a thread's error would otherwise
    be lost.

    :param step: the test's actions (each of its waits bounded).
    :return: the DagRun.
    """
    errors: list[BaseException] = []

    def beside() -> None:
        try:
            step()
        except BaseException as exc:
            errors.append(exc)

    helper = threading.Thread(target=beside, name="beside-the-run", daemon=True)
    helper.start()
    try:
        dag_run = run_dag(dag)
    finally:
        helper.join(within)
    if errors:
        raise errors[0]
    if helper.is_alive():
        raise TimeoutError(f"the step beside the run ({step.__name__}) did not end within {within:.0f} s")
    return dag_run


def event_read_back(payload: dict[str, Any]) -> Any:
    """A trigger event's payload as the resumed task reads it, by Airflow's own code: stored in
    ``next_kwargs`` (``airflow.sdk.serde`` on Airflow 3.2+, which ``handle_event_submit`` calls; the
    ``ExtendedJSON`` column's ``BaseSerialization`` on 3.1), handed to the worker as JSON the Task
    SDK's ``TIRunContext`` model parses (one object around ``next_kwargs``, as in the Execution API's
    response), and deserialized there.

    :raises Exception: whatever Airflow raises on the way (``RecursionError``, ``AttributeError``,
        pydantic's ``ValidationError`` …).
    """
    from airflow.sdk.api.datamodels._generated import TIRunContext
    from pydantic import create_model

    try:
        from airflow.sdk.serde import deserialize, serialize
    except ImportError:  # Airflow 3.1
        from airflow.serialization.serialized_objects import BaseSerialization

        serialize, deserialize = BaseSerialization.serialize, BaseSerialization.deserialize
    response = create_model(
        "Response", next_kwargs=(TIRunContext.model_fields["next_kwargs"].annotation, ...)
    )
    stored = json.dumps(serialize({"event": payload}))
    handed = response.model_validate_json(f'{{"next_kwargs": {stored}}}').next_kwargs  # type: ignore[attr-defined]
    return deserialize(handed)["event"]


def xcoms_of(dag_id: str, run_id: str) -> dict[tuple[str, str, int], Any]:
    """Every XCom of a run: ``(task_id, key, map_index) -> value``."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.query(XComModel).filter(XComModel.dag_id == dag_id, XComModel.run_id == run_id).all()
        return {(r.task_id, r.key, r.map_index): XComModel.deserialize_value(r) for r in rows}


def task_states(dag_run: Any) -> dict[str, str]:
    """``task_id[map_index] -> state`` of a run."""
    return {
        ti.task_id + (f"[{ti.map_index}]" if ti.map_index >= 0 else ""): str(ti.state)
        for ti in dag_run.get_task_instances()
    }


def task_tries(dag_run: Any) -> dict[str, int]:
    """``task_id -> try_number`` of a run."""
    return {ti.task_id: ti.try_number for ti in dag_run.get_task_instances()}


def file_sensor(log: Path, conn_id: str, **kwargs: Any) -> Any:
    """A deferrable ``SystemZeroDecisionSensor`` (task ``wait``) tailing ``log`` until the job is ready
    (a confident ``ready``), as most sensor Dag tests wait: ``kwargs`` add or override arguments.

    :param log: the tailed file.
    :param conn_id: the connection (see :func:`rules_emulator`).
    """
    from airflow_provider_systemzero.sensors.decision import SystemZeroDecisionSensor

    arguments: dict[str, Any] = {
        "task_id": "wait",
        "systemzero_conn_id": conn_id,
        "model": "sz-test",
        "question": "ready",
        "instructions": "Is the job ready?",
        "source": {"type": "file", "path": str(log), "poll_interval": 0.05},
        "min_confidence": 0.5,
        "timeout": 60,
        "lease_after": 0.2,
    }
    return SystemZeroDecisionSensor(**(arguments | kwargs))


def examples(modest: int, thorough: int) -> int:
    """How many examples a hypothesis state machine runs: ``modest`` in ``make test``, ``thorough``
    with ``HYPOTHESIS_PROFILE=thorough`` (a run of thousands, once, on a developer's machine)."""
    import os

    return thorough if os.environ.get("HYPOTHESIS_PROFILE") == "thorough" else modest


# ------------------------------------------------------------------ triggers run in the test's loop

#: The trigger tests' rules: "job is ready" in the state means ready (0.93), anything else not.
TRIGGER_RULES: dict[str, Any] = {
    "rules": [
        {
            "question": "ready",
            "pattern": "(?i)job is ready",
            "answer": True,
            "probability": 0.93,
            "confidence": 0.9,
        }
    ],
    "default": {"answer": False, "probability": 0.2, "confidence": 0.8},
}


class RecordingDecider(RulesDecider):
    """An emulator decider answering by ``rules`` (default :data:`TRIGGER_RULES`) that remembers every
    state a decision started about, in order (``states``)."""

    def __init__(self, rules: Mapping[str, Any] | None = None) -> None:
        base = RulesDecider.from_dict(TRIGGER_RULES if rules is None else rules)
        super().__init__(base.rules, base.default)
        self.states: list[Any] = []

    def decide(self, request: Mapping[str, Any], *, now: float) -> dict[str, Any]:
        self.states.append(request.get("state"))
        return super().decide(request, now=now)


#: The trigger tests' request and condition (the ``ready`` question of :data:`TRIGGER_RULES`).
TRIGGER_REQUEST: dict[str, Any] = {
    "model": "sz-test",
    "questions": {"ready": {"type": "boolean", "instructions": "Is the job ready?"}},
}
TRIGGER_CONDITION: dict[str, Any] = DecisionCondition("ready", True, min_confidence=0.5).to_dict()
#: The account's decision buckets (5 burst, 60/min) are tested in the emulator's suite; here
#: they are raised so the stream cap, not billing pacing, is what a density test measures.
TRIGGER_LIMITS = Limits(account_decision_burst=10_000, account_decision_ceiling_per_minute=1_000_000)
#: The connection of :func:`loopback_emulator` (``AIRFLOW_CONN_SYSTEMZERO_TEST``).
TRIGGER_CONN_ID = "systemzero_test"


@pytest.fixture
def rules_file(tmp_path: Path) -> str:
    """:data:`TRIGGER_RULES` in a file, for the ``rules:`` decider."""
    path = tmp_path / "rules.json"
    path.write_text(json.dumps(TRIGGER_RULES))
    return str(path)


@asynccontextmanager
async def loopback_emulator(
    rules_file: str, monkeypatch: pytest.MonkeyPatch, **kwargs: Any
) -> AsyncIterator[Emulator]:
    """An :class:`Emulator` on this test's loop answering by ``rules_file``, with the account's buckets
    out of the way, and the :data:`TRIGGER_CONN_ID` connection to it (an environment variable).

    :param kwargs: more :class:`Emulator` arguments (``decide_latency_ms``, a ``decider`` of the
        test's own …).
    """
    kwargs.setdefault("decider", f"rules:{rules_file}")
    async with Emulator(api_keys={"demo": 8}, limits=TRIGGER_LIMITS, **kwargs) as emu:
        monkeypatch.setenv(
            f"AIRFLOW_CONN_{TRIGGER_CONN_ID.upper()}",
            json.dumps({"conn_type": "systemzero", "host": emu.origin, "password": "demo"}),
        )
        yield emu


@asynccontextmanager
async def recording_emulator(
    rules_file: str, monkeypatch: pytest.MonkeyPatch, rules: Mapping[str, Any], **kwargs: Any
) -> AsyncIterator[tuple[Emulator, RecordingDecider]]:
    """A :func:`loopback_emulator` answering by ``rules``, and its :class:`RecordingDecider` (every
    state a decision started about, in order)."""
    decider = RecordingDecider(rules)
    async with loopback_emulator(rules_file, monkeypatch, decider=decider, **kwargs) as emu:
        yield emu, decider


@pytest.fixture
async def emulator(rules_file: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Emulator]:
    """The trigger tests' emulator (see :func:`loopback_emulator`)."""
    async with loopback_emulator(rules_file, monkeypatch) as emu:
        yield emu


def trigger_kwargs(**overrides: Any) -> dict[str, Any]:
    """A ``SystemZeroDecisionTrigger``'s kwargs waiting for :data:`TRIGGER_CONDITION` through the
    :data:`TRIGGER_CONN_ID` connection, from an empty state, for task ``d.t`` of run ``r``
    (``overrides`` add or replace kwargs: ``key_namespace``, ``source``, ``lease_after`` …)."""
    from airflow_provider_systemzero.identity import task_namespace

    return {
        "systemzero_conn_id": TRIGGER_CONN_ID,
        "request": TRIGGER_REQUEST,
        "condition": TRIGGER_CONDITION,
        "state": "",
        "key_namespace": task_namespace("d", "t", "r", -1),
        **overrides,
    }


def sensor_trigger(**overrides: Any) -> Any:
    """A :class:`SystemZeroDecisionTrigger` from :func:`trigger_kwargs` that gives its stream back
    at once when quiet (``lease_after=0``), with ``overrides``."""
    from airflow_provider_systemzero.triggers.decision import SystemZeroDecisionTrigger

    return SystemZeroDecisionTrigger(**trigger_kwargs(**{"lease_after": 0.0, **overrides}))


def rebuilt(trigger: Any) -> Any:
    """What the triggerer does: rebuild a trigger from its JSON-only serialized form."""
    classpath, kwargs = trigger.serialize()
    assert json.loads(json.dumps(kwargs)) == kwargs
    module, _, name = classpath.rpartition(".")
    cls = getattr(__import__(module, fromlist=[name]), name)
    clone = cls(**kwargs)
    assert clone.serialize() == (classpath, kwargs)
    return clone


async def first_event(trigger: Any, within: float = 30) -> dict[str, Any]:
    """The one event of a single-event trigger (it must return right after yielding it)."""
    gen = trigger.run()
    try:
        async with asyncio.timeout(within):
            event = await anext(gen)
            with pytest.raises(StopAsyncIteration):
                await anext(gen)
        return dict(event.payload)
    finally:
        await gen.aclose()


def emulator_cache_keys(emulator: Emulator) -> set[str]:
    """The prompt cache keys the emulator saw: those of its ledger's decide calls, else those of
    the streams that started."""
    return {
        entry.prompt_cache_key
        for entries in emulator.ledger.values()
        for entry in entries
        if getattr(entry, "prompt_cache_key", None)
    } or emulator.prompt_cache_keys


def channel_trigger(task: str, channel: str, **overrides: Any) -> Any:
    """A ``SystemZeroDecisionTrigger`` of task ``task`` reading the push channel ``channel`` of
    :mod:`tests.helpers.channels` (giving its stream back after 0.05 s of quiet), as the triggerer
    runs it: serialized, then built again from its kwargs."""
    from airflow_provider_systemzero.identity import task_namespace
    from airflow_provider_systemzero.triggers.decision import SystemZeroDecisionTrigger
    from tests.helpers import channels

    kwargs = trigger_kwargs(
        **{
            "key_namespace": task_namespace("d", task, channel, -1),
            "source": channels.source(channel),
            "lease_after": 0.05,
            **overrides,
        }
    )
    _, serialized = SystemZeroDecisionTrigger(**kwargs).serialize()
    return SystemZeroDecisionTrigger(**json.loads(json.dumps(serialized)))


@asynccontextmanager
async def running_trigger(trigger: Any) -> AsyncIterator[asyncio.Future[Any]]:
    """Run ``trigger`` as the triggerer does (its first event is the task's result); on exit cancel
    it, close its generator and run its ``cleanup()``."""
    gen = trigger.run()
    task = asyncio.ensure_future(anext(gen))
    try:
        yield task
    finally:
        task.cancel()
        with suppress(asyncio.CancelledError, StopAsyncIteration):
            await task
        await gen.aclose()
        await trigger.cleanup()


@asynccontextmanager
async def watching_events(trigger: Any) -> AsyncIterator[tuple[list[Any], asyncio.Future[None]]]:
    """Run a trigger that fires many times (an asset watcher's) as the triggerer does: yields the
    list its events are collected in and the task running it; on exit cancel it (a triggerer
    stopping) and run its ``cleanup()`` (a trigger that failed raises its failure there)."""
    events: list[Any] = []

    async def run() -> None:
        async for event in trigger.run():
            events.append(event)

    task = asyncio.ensure_future(run())
    try:
        yield events, task
    finally:
        task.cancel()
        with suppress(asyncio.CancelledError):
            await task
        await trigger.cleanup()


async def until_read(trigger: Any, state: Any, within: float = 10.0) -> None:
    """Wait (bounded) until ``trigger``'s watch has read ``state`` from its source."""
    await until(
        lambda: trigger.progress.read_state == state,
        within,
        what=f"the trigger to read {state!r}",
    )


def dormant(trigger: Any) -> bool:
    """Whether ``trigger`` runs its watch and holds no stream (waiting for its source, or for time)."""
    progress = trigger.progress  # a decision trigger's; an asset watcher's too
    return progress.running and progress.dormant


#: What every process of an :func:`audited_python` runs first: an audit hook that writes down the
#: address of every socket it connects or sends to, on the internet's families (``{log}`` is the file).
_AUDIT_HOOK = """
import os as _os, socket as _socket, sys as _sys

def _systemzero_test_audit(event, args, _log={log!r}):
    if event in ("socket.connect", "socket.sendto") and getattr(args[0], "family", None) in (
        _socket.AF_INET, _socket.AF_INET6
    ):
        with open(_log, "a", encoding="utf-8") as file:
            file.write(f"{{_os.getpid()}} {{event}} {{args[1]!r}}\\n")

_sys.addaudithook(_systemzero_test_audit)
"""


def audited_python(directory: Path) -> tuple[Path, Path]:
    """A Python interpreter of its own (a virtualenv in ``directory``) that runs this environment's
    packages and writes down the address of every network socket any of its processes connects or
    sends to — a child that runs ``sys.executable`` too, whatever environment it is given.

    :return: the interpreter, and the file the addresses go to (one line each: pid, event, address).
    """
    import site
    import subprocess
    import sys
    import sysconfig

    venv = directory / "audited-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    ours = [sysconfig.get_paths()["purelib"], *site.getsitepackages()]
    log = directory / "connections.log"
    log.touch()
    # the packages of this environment (its .pth files too: an editable install's finder)
    lines = "".join(f"import site; site.addsitedir({path!r})\n" for path in dict.fromkeys(ours))
    (Path(purelib) / "systemzero_test_packages.pth").write_text(lines, encoding="utf-8")
    (Path(purelib) / "sitecustomize.py").write_text(_AUDIT_HOOK.format(log=str(log)), encoding="utf-8")
    return python, log


def network_peers(log: Path) -> list[str]:
    """The addresses an :func:`audited_python` wrote down that are not on loopback."""
    import ast
    import ipaddress

    outside = []
    for line in log.read_text(encoding="utf-8").splitlines():
        _, _, address = line.split(" ", 2)
        host = ast.literal_eval(address)[0]
        if not ipaddress.ip_address(host.split("%")[0]).is_loopback:
            outside.append(line)
    return outside


def run_in_network_namespace(tmp_path: Path, module: str, *, setup: str = "", arguments: str = "") -> Any:
    """Run ``python -m module`` in a network namespace and a mount namespace of its own (loopback
    up, nothing else reachable), whose ``/etc/resolv.conf`` names ``127.0.0.1`` (the module answers
    DNS there, or not), and return the JSON object its last line prints.

    Skips the test, with the reason, where the machine refuses the namespaces (``unshare``).

    :param module: the scenario's module (``tests.helpers.dead_resolver``).
    :param setup: shell commands run first, in the namespace (``ip addr add …``).
    :param arguments: the module's arguments.
    """
    import shutil
    import subprocess
    import sys

    for tool in ("unshare", "ip", "mount"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed: no network namespace with a resolver of the test's own")
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.1\n")
    command = " && ".join(
        step
        for step in (
            "ip link set lo up",
            setup,
            f"mount --bind {resolv} /etc/resolv.conf",
            f"exec {sys.executable} -m {module} {arguments}".strip(),
        )
        if step
    )
    done = subprocess.run(
        ["unshare", "--net", "--mount", "--map-root-user", "sh", "-c", command],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0 and not done.stdout.strip():
        if "unshare" in done.stderr or "mount" in done.stderr or "Operation not permitted" in done.stderr:
            pytest.skip(f"network and mount namespaces are refused here: {done.stderr.strip()[-300:]}")
        raise AssertionError(f"the scenario failed: {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def stream_kinds() -> tuple[type, ...]:
    """What a trigger waiting without a stream must not keep: anything of a stream — the stream, its
    session, its socket, transport, reader and writer."""
    import socket

    from airflow_provider_systemzero.protocol.client import ClientSession
    from airflow_provider_systemzero.stream.decision_stream import DecisionStream

    return (
        DecisionStream,
        ClientSession,
        socket.socket,
        asyncio.BaseTransport,
        asyncio.StreamReader,
        asyncio.StreamWriter,
    )


#: Shared objects :func:`kept_objects` never enters: what they reach existed before a trigger and is
#: not its own (a task's context is what the trigger runner sets in it).
_SHARED_KINDS = (
    type,
    types.ModuleType,
    types.FunctionType,
    types.CodeType,
    asyncio.AbstractEventLoop,
    contextvars.Context,
)


def kept_objects(root: Any, existing: set[int], shared: tuple[type, ...] = ()) -> list[Any]:
    """The collector-tracked objects reachable from ``root`` (a trigger's task) that did not exist
    in ``existing`` (ids of ``gc.get_objects()`` taken before, kept alive meanwhile so that no new
    object reuses one); ``shared``: more types the walk does not enter, such as the process's file
    watcher."""
    found: list[Any] = []
    seen: set[int] = set()
    todo = [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or id(obj) in existing or isinstance(obj, _SHARED_KINDS + shared):
            continue
        seen.add(id(obj))
        if gc.is_tracked(obj):
            found.append(obj)
        todo.extend(gc.get_referents(obj))
    return found


#: The ``reply`` of the public document's example ``decision`` (its example exchange), as it
#: stands there.
EXAMPLE_REPLY: dict[str, Any] = {
    "id": "szd_0123456789abcdef0123456789abcdef",
    "model": "MODEL_ID",
    "served_by": "SERVED_BY",
    "created": 1790000000,
    "context": {"route": "direct", "tokens": 32},
    "answers": {
        "ready": {
            "type": "boolean",
            "probability": 0.9,
            "confidence": 0.9,
            "calibration_version": "unpublished",
            "decision": True,
            "alternatives": [{"decision": False, "confidence": 0.1}],
            "calibrated": False,
        }
    },
    "usage": {
        "input_tokens": 32,
        "cached_input_tokens": 0,
        "media_tokens": 0,
        "long_input_tokens": 0,
        "media_items": 0,
        "thought_tokens": 0,
    },
}


def live_timers() -> list[tuple[asyncio.TimerHandle, Any]]:
    """The running loop's timers not cancelled yet, each with the callback it will call.

    asyncio has no public way to list a loop's timers: this is the one place the tests read its
    private ``_scheduled`` (and each handle's ``_callback``) for it.
    """
    loop = asyncio.get_running_loop()
    return [
        (handle, handle._callback)  # type: ignore[attr-defined]
        for handle in loop._scheduled  # type: ignore[attr-defined]
        if not handle.cancelled()
    ]


def provider_timers() -> list[asyncio.TimerHandle]:
    """Live timers whose callback belongs to the provider's triggers or streams (not the emulator)."""
    found = []
    for handle, callback in live_timers():
        owner = getattr(callback, "__self__", callback)
        module = (
            type(owner).__module__ if hasattr(callback, "__self__") else getattr(callback, "__module__", "")
        )
        if module.startswith("airflow_provider_systemzero") and ".emulator" not in module:
            found.append(handle)
    return found


def alive(*kinds: type, collect: bool = True) -> list[object]:
    """The objects of ``kinds`` alive now (after a collection unless ``collect`` is false).

    What earlier tests of this process left alive is not the test's own (a Dag run by dag.test() can
    leave its task's frames, and with them its trigger, alive after the test): a test takes this list
    first and keeps it, so that no new object reuses an id of theirs, then asks :func:`new_since`.
    """
    if collect:
        gc.collect()
    return [o for o in gc.get_objects() if type(o) in kinds]  # type(): no lazy proxy resolves


def new_since(earlier: list[object], now: list[object]) -> list[object]:
    """The objects of ``now`` that are not in ``earlier`` (both from :func:`alive`)."""
    known = {id(o) for o in earlier}
    return [o for o in now if id(o) not in known]


def nested(depth: int) -> dict[str, Any]:
    """A decision reply's JSON object ``depth`` levels deep (itself level 1), built without recursion.

    :param depth: how deep the object nests.
    """
    value: dict[str, Any] = {"id": "szd_" + "0" * 32}
    inner = value
    for _ in range(depth - 1):
        inner["context"] = {}
        inner = inner["context"]
    return value
