"""The fault matrix's harness: an emulator with spies, the triggers run the way the triggerer runs
them (serialize → rebuild → ``run()``), and the four invariants every case checks.

The spies only observe (plus one scripted fault, :attr:`SpiedEmulator.drop_before`):

* **upgrades** — the emulator's own :attr:`Emulator.upgrades`: every upgrade request on the stream
  path, with the time it arrived, the status (101: accepted) and a refusal's ``Retry-After``;
* **server messages** — every message a stream queued, with the time (goodbyes carry their delay);
* **decide calls** — every call into the decide backend, with its start and end time and outcome;
* **client streams** — every :class:`DecisionStream` a hook opened, so its ``reconnects`` records
  outlive the trigger (a trigger drops its stream in ``cleanup()``).

The invariants (:meth:`Harness.check`):

1. the task ends in the right state on the right decision — the event, and the sensor's or
   operator's ``execute_complete`` on it (the reply must be one the gateway gave for the final
   desired state's body);
2. the gateway's last accepted state is byte-identical to the desired state;
3. billed decisions equal distinct decided states: no body billed twice, replays unbilled, and
   every idempotency key named one body;
4. every reconnect waited at least the server's delay — as the client recorded it, and as the
   gateway saw it (the next upgrade after a delay-carrying goodbye, fatal error or refusal).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from airflow_provider_systemzero.decisions.conditions import DecisionCondition
from airflow_provider_systemzero.emulator.server import Emulator
from airflow_provider_systemzero.hooks.systemzero import SystemZeroHook
from airflow_provider_systemzero.identity import task_namespace
from airflow_provider_systemzero.protocol.body import body_hash, compact_json
from airflow_provider_systemzero.protocol.gateway import (
    CloseConnection,
    DecideFailure,
    GatewayAction,
    SendMessage,
)
from airflow_provider_systemzero.protocol.limits import Limits
from airflow_provider_systemzero.protocol.messages import Error, Goodbye, ServerMessage
from airflow_provider_systemzero.stream import DecisionStream
from airflow_provider_systemzero.triggers.decision import SystemZeroDecideTrigger, SystemZeroDecisionTrigger
from tests.helpers import fault_sources as sources
from tests.helpers import first_event, rebuilt

#: The test account's key (long enough for Airflow's secrets masker).
KEY = "sz-fault-matrix-0123456789abcdef"
CONN_ID = "systemzero_faults"
QUESTIONS = {"ready": {"type": "boolean", "instructions": "Is the job ready?"}}
REQUEST = {"model": "sz-test", "questions": QUESTIONS}
CONDITION = DecisionCondition("ready", True, min_confidence=0.5).to_dict()
DAG_ID, RUN_ID = "faults", "manual__fault"

#: Liveness in hundreds of milliseconds; the account's decision buckets out of the way (no case
#: tests them); idle and lifetime long unless a case shrinks them. A pong has 2 s: a full collection
#: of a test process holding Airflow pauses its loop (client and emulator alike) for up to 200 ms,
#: and on a loaded machine longer, which a 300 ms pong timeout turned into a second reconnect (1013)
#: in cases that expect one; the missed-pong cases shrink it (:data:`SHORT_PONG`).
LIMITS = Limits(
    start_timeout_ms=2_000,
    idle_timeout_ms=30_000,
    max_duration_ms=120_000,
    heartbeat_interval_ms=300,
    pong_timeout_ms=2_000,
    decision_settlement_timeout_ms=100,
    write_progress_timeout_ms=2_000,
    close_handshake_timeout_ms=500,
    account_decision_burst=10_000,
    account_decision_ceiling_per_minute=1_000_000,
)
#: The missed-pong cases' limits: a muted client is found out 300 ms after a ping.
SHORT_PONG = LIMITS.replace(pong_timeout_ms=300)


class ReadyDecider:
    """``ready`` is true when the newest non-empty line of the state says ``READY``."""

    def decide(self, request: Mapping[str, Any], *, now: float) -> dict[str, Any]:
        state = request["state"]
        text = state if isinstance(state, str) else compact_json(state)
        lines = [line for line in text.splitlines() if line.strip()]
        ready = bool(lines) and "READY" in lines[-1]
        return {"ready": {"decision": ready, "probability": 0.95 if ready else 0.9, "confidence": 0.9}}


# ------------------------------------------------------------------------------------ spies


@dataclass(frozen=True, slots=True)
class Sent:
    """One server message queued by a stream."""

    at: float
    stream_id: str
    message: ServerMessage


@dataclass(frozen=True, slots=True)
class Call:
    """One decide backend call."""

    started: float
    ended: float
    key: str | None
    body_sha256: str
    status: int
    retry_after_ms: int | None


class SpiedEmulator(Emulator):
    """An :class:`Emulator` that records what it does (see the module docstring).

    :ivar drop_before: when set, the first server message it matches is never sent: the TCP
        connection is aborted instead (the client sees 1006). Everything the gateway session
        decided at that moment (a dispatch, say) still happens, as on a real gateway whose
        socket died under it.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sent: list[Sent] = []
        self.closes: list[tuple[float, str, int]] = []
        self.calls: list[Call] = []
        #: every decide call as it starts: (time, idempotency key, body SHA-256)
        self.started: list[tuple[float, str | None, str]] = []
        self.drop_before: Callable[[ServerMessage], bool] | None = None
        self.action_tap = self.tap
        backend_decide = self.backend.decide

        async def decide(account: str, body: str, idempotency_key: str | None) -> Any:
            started = time.monotonic()
            self.started.append((started, idempotency_key, body_hash(body)))
            outcome = await backend_decide(account, body, idempotency_key)
            failure = outcome if isinstance(outcome, DecideFailure) else None
            self.calls.append(
                Call(
                    started,
                    time.monotonic(),
                    idempotency_key,
                    body_hash(body),
                    failure.http_status if failure else 200,
                    failure.retry.retry_after_ms if failure else None,
                )
            )
            return outcome

        self.backend.decide = decide  # type: ignore[method-assign]

    def tap(self, stream: Any, actions: list[GatewayAction]) -> list[GatewayAction]:
        """The emulator's ``action_tap``: record what a stream sends and closes, and carry out
        :attr:`drop_before`."""
        now = time.monotonic()
        if self.drop_before is not None:
            for index, action in enumerate(actions):
                if isinstance(action, SendMessage) and self.drop_before(action.message):
                    self.drop_before = None
                    stream.ws.transport.abort()
                    actions = actions[:index] + [
                        a for a in actions[index + 1 :] if not isinstance(a, SendMessage)
                    ]
                    break
        for action in actions:
            if isinstance(action, SendMessage):
                self.sent.append(Sent(now, stream.stream_id, action.message))
            elif isinstance(action, CloseConnection):
                self.closes.append((now, stream.stream_id, action.code))
        return actions

    def messages(self, kind: type[ServerMessage]) -> list[Any]:
        """Every queued server message of one type, in order."""
        return [s.message for s in self.sent if isinstance(s.message, kind)]


# ------------------------------------------------------------------------------------ the harness


@dataclass(slots=True)
class FakeTI:
    """The slice of a task instance ``execute_complete`` uses."""

    task_id: str
    dag_id: str = DAG_ID
    run_id: str = RUN_ID
    map_index: int = -1
    xcom: dict[str, Any] = field(default_factory=dict)

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcom[key] = json.loads(json.dumps(value))  # XCom values are JSON


@dataclass(slots=True)
class Harness:
    """One case's emulator, spies and helpers."""

    emu: SpiedEmulator
    streams: list[DecisionStream]

    # -------------------------------------------------------------- triggers

    @staticmethod
    def namespace(task_id: str) -> str:
        """The key namespace the task instance ``task_id`` of the test run derives."""
        return task_namespace(DAG_ID, task_id, RUN_ID, -1)

    def sensor(
        self, source_name: str, *, task_id: str = "wait", decision_mode: str = "on_change", **overrides: Any
    ) -> SystemZeroDecisionTrigger:
        """The sensor's trigger over the callable source ``source_name`` (as the sensor builds it)."""
        kwargs: dict[str, Any] = {
            "systemzero_conn_id": CONN_ID,
            "request": REQUEST,
            "condition": CONDITION,
            "state": "",
            "source": {
                "type": "callable",
                "path": "tests.helpers.fault_sources.state",
                "kwargs": {"name": source_name},
                "poll_interval": 0.02,
            },
            "key_namespace": self.namespace(task_id),
            "decision_mode": decision_mode,
            "deadline": time.time() + 60,
            "lease": False,
        }
        kwargs.update(overrides)
        return rebuilt(SystemZeroDecisionTrigger(**kwargs))

    def operator(self, state: Any, *, task_id: str = "decide", **overrides: Any) -> SystemZeroDecideTrigger:
        """The operator's trigger for a fixed state (as the operator builds it)."""
        kwargs: dict[str, Any] = {
            "systemzero_conn_id": CONN_ID,
            "request": REQUEST,
            "state": state,
            "key_namespace": self.namespace(task_id),
            "deadline": time.time() + 60,
        }
        kwargs.update(overrides)
        return rebuilt(SystemZeroDecideTrigger(**kwargs))

    @staticmethod
    def start(trigger: Any, within: float = 30) -> asyncio.Task[dict[str, Any]]:
        """Run a trigger as the triggerer does; the task's result is its one event's payload."""
        return asyncio.ensure_future(first_event(trigger, within))

    @staticmethod
    async def restart_triggerer(task: asyncio.Task[Any], trigger: Any) -> Any:
        """Cancel a running trigger (the triggerer stops) and rebuild it from ``serialize()``."""
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await trigger.cleanup()
        return rebuilt(trigger)

    async def until(self, predicate: Callable[[SpiedEmulator], bool], timeout: float = 15) -> None:  # noqa: ASYNC109
        """Wait (bounded) until ``predicate(emulator)`` holds."""
        await self.emu.wait_for(predicate, timeout=timeout)  # type: ignore[arg-type]

    def stream_of(self, namespace: str) -> DecisionStream:
        """The newest client stream a trigger with this key namespace opened."""
        matching = [
            s for s in self.streams if s.settings is not None and s.session.key_namespace == namespace
        ]
        assert matching, f"no stream was opened for {namespace}"
        return matching[-1]

    def reconnects(self) -> list[Any]:
        """Every reconnect of every client stream."""
        return [r for s in self.streams for r in s.reconnects]

    # -------------------------------------------------------------- the invariants

    async def settle(self) -> None:
        """Wait until every decide call the gateway started has finished (a call interrupted by a
        fault keeps running and is billed or replayed later: billing is checked after it)."""
        await self.until(lambda e: len(e.calls) == e.backend.calls)

    async def check(
        self,
        payload: dict[str, Any],
        *,
        kind: str,
        desired: Any,
        billed: int | None = None,
        one_client: bool = True,
    ) -> None:
        """The four invariants (module docstring) for a case that must end in success.

        :param payload: the trigger's event.
        :param kind: ``sensor`` or ``operator``.
        :param desired: the final desired state.
        :param billed: the number of distinct states that must have been decided, if known.
        :param one_client: only one client connected during the case (the gateway-side timing
            check pairs each delay with the next upgrade).
        """
        namespace = payload.get("key_namespace")
        assert payload["status"] == "success", payload
        await self.settle()
        stream = self.stream_of(namespace)
        # 2. byte-identical final state
        cache_key = stream.request.prompt_cache_key
        assert cache_key is not None
        latest = self.emu.latest_state(cache_key)
        assert latest is not None and compact_json(latest.state) == compact_json(desired), (latest, desired)
        assert latest.attachments == [a.to_dict() for a in stream.attachments]
        assert compact_json(stream.state) == compact_json(desired)
        # 1. the right decision: one the gateway gave for the final state's body
        final_body = body_hash(stream.session.desired_body())
        replies = {e.reply_id for e in self.entries() if e.body_sha256 == final_body}
        assert payload["reply_id"] in replies, (payload, replies)
        if kind == "sensor":
            assert payload["decision"] is True
            summary = sensor_outcome(payload, task_id=task_of(namespace))
            assert summary["reply_id"] == payload["reply_id"] and summary["decision"] is True
        else:
            ti = FakeTI(task_of(namespace))
            assert operator_outcome(payload, ti) == {"ready": payload["answers"]["ready"]["decision"]}
            assert (
                ti.xcom["decision_id"] == payload["reply_id"]
                and ti.xcom["reply"]["id"] == payload["reply_id"]
            )
        # 3. billing
        self.check_billing(billed)
        # 4. reconnect delays
        self.check_delays(one_client=one_client)

    def entries(self) -> list[Any]:
        """The account's ledger (answered decide calls, billed and replayed)."""
        return list(self.emu.ledger.get(KEY, []))

    def check_billing(self, distinct_states: int | None = None) -> None:
        """Billed decisions equal distinct decided states; replays are unbilled."""
        entries = self.entries()
        billed = [e.body_sha256 for e in entries if e.billed]
        decided = {e.body_sha256 for e in entries}
        assert len(billed) == len(set(billed)) == len(decided), entries
        assert self.emu.stats.decisions_billed == len(billed)
        assert self.emu.stats.decisions_replayed == len(entries) - len(billed)
        first_seen: set[str] = set()
        for entry in entries:  # a repeat of a decided body is never billed
            assert entry.billed == (entry.body_sha256 not in first_seen), entries
            first_seen.add(entry.body_sha256)
        bodies_by_key: dict[str | None, set[str]] = {}
        for entry in entries:
            bodies_by_key.setdefault(entry.idempotency_key, set()).add(entry.body_sha256)
        assert None not in bodies_by_key and all(len(b) == 1 for b in bodies_by_key.values()), bodies_by_key
        if distinct_states is not None:
            assert len(decided) == distinct_states, entries

    def check_delays(self, *, one_client: bool = True) -> None:
        """Every reconnect (and every client decide retry) waited at least the server's delay."""
        for record in self.reconnects():
            if record.server_delay is not None:
                assert record.waited >= record.server_delay, record
            assert record.waited >= record.planned_delay, record
        if not one_client:
            return
        # the gateway's view: a delay it asked for, then the next upgrade
        delays: list[tuple[float, float]] = []
        for sent in self.emu.sent:
            message = sent.message
            if isinstance(message, Goodbye) and message.retry_after_ms:
                delays.append((sent.at, message.retry_after_ms / 1000))
            if isinstance(message, Error) and message.fatal and message.retry.retry_after_ms:
                delays.append((sent.at, message.retry.retry_after_ms / 1000))
        delays += [(u.at, u.retry_after_s) for u in self.emu.upgrades if not u.accepted and u.retry_after_s]
        for at, delay in delays:
            later = [u.at for u in self.emu.upgrades if u.at > at]
            if later:
                assert min(later) - at >= delay, (at, delay, min(later))


def task_of(namespace: str) -> str:
    """The test task whose namespace this is."""
    for task_id in ("wait", "decide", "wait-a", "wait-b"):
        if Harness.namespace(task_id) == namespace:
            return task_id
    raise AssertionError(f"unknown namespace {namespace}")


def _context(ti: FakeTI) -> dict[str, Any]:
    return {"ti": ti}


def sensor_outcome(payload: dict[str, Any], *, task_id: str = "wait") -> dict[str, Any]:
    """What the deferred sensor does with the event: its return value, or its exception."""
    from airflow_provider_systemzero.sensors.decision import SystemZeroDecisionSensor

    sensor = SystemZeroDecisionSensor(
        task_id=task_id, instructions="Is the job ready?", state="x", systemzero_conn_id=CONN_ID
    )
    return sensor.execute_complete(_context(FakeTI(task_id)), payload)


def operator_outcome(payload: dict[str, Any], ti: FakeTI | None = None) -> dict[str, Any]:
    """What the deferred operator does with the event: its return value (XCom pushed to ``ti``)."""
    from airflow_provider_systemzero.operators.decide import SystemZeroDecideOperator

    ti = ti or FakeTI("decide")
    operator = SystemZeroDecideOperator(
        task_id=ti.task_id, questions={"ready": "Is the job ready?"}, state="x", systemzero_conn_id=CONN_ID
    )
    return operator.execute_complete(_context(ti), payload)


@contextlib.contextmanager
def spying(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[DecisionStream]]:
    """Install the spy that lives outside the emulator: the client streams the hook opens (the
    emulator records what its streams send through its action tap, :meth:`SpiedEmulator.tap`)."""
    streams: list[DecisionStream] = []
    original = SystemZeroHook.stream

    def stream(self: SystemZeroHook, *args: Any, **kwargs: Any) -> DecisionStream:
        created = original(self, *args, **kwargs)
        streams.append(created)
        return created

    monkeypatch.setattr(SystemZeroHook, "stream", stream)
    yield streams


def set_source(name: str, state: Any) -> None:
    """Change what the callable source ``name`` returns (the trigger polls it every 20 ms)."""
    sources.STATES[name] = state


#: ``await make_harness(limits=..., **emulator_kwargs)`` (the fixture of ``tests/faults``).
HarnessFactory = Callable[..., Awaitable[Harness]]

WORKING = "build 7 started\n"
READY = "build 7 started\nREADY\n"
#: the operator's fixed state: the outputs of upstream tasks, replayed as an array
OUTPUTS = [{"task_id": "build", "output": "artifact built"}, {"task_id": "verify", "output": "READY"}]


def only_reconnect(h: Harness) -> Any:
    """The case's one reconnect."""
    records = h.reconnects()
    assert len(records) == 1, records
    return records[0]
