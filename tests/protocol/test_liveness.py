"""Liveness of the client core, checked by hypothesis against the real gateway core on a simulated clock.

A :class:`World` joins a :class:`ClientSession` to a fresh :class:`GatewaySession` per connection
and plays the I/O adapter's part: it writes what the session wants to send, wakes it at
``next_wakeup``, treats a silent peer as dead at ``receipt_deadline``, recycles the connection when
the session asks, and reconnects as :class:`ReconnectPlanner` says. The machine mixes caller
changes (no-op replaces, A→B→A toggles inside a pacing window, states equal in Python but not as
JSON, bursts past the buckets), decide outcomes (every failure class, with and without a
following goodbye), goodbyes, drops and silent peers, and a hostile gateway's legal but unusual
sequences: a goodbye or a fatal error with no close after it, two goodbyes naming different
delays, a message refused (``message_rate_limited``) with or without naming it, a decide refused
as stale although it named the acknowledged version. After every step:

(a) the client never spins: connected, it is never "due now" with nothing to send;
(d) no idempotency key is ever used with two different bodies;
(e) no connection is opened sooner than the gateway asked: the longest delay a goodbye or a fatal
    error named, from the end of the connection, and any other error's retry delay from its arrival;

and the ``settle`` rule checks that once the gateway behaves, within bounded simulated time,
(b) the client is in sync and has a decision (or the state's final failure) about the current
desired state, and (c) the gateway holds the desired state byte for byte.

The same machine runs with the session asking before each dispatch (``admission=True``), as the
stream client runs it: the adapter answers every question from a gate the rules open and close
(the account's decision starts, a budget), asks again when the gate opens and when a connection
ends, and (a) to (e) hold all the same — a held dispatch is never "due now".
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from airflow_provider_systemzero.protocol import (
    ClientSession,
    ConnectionOutcome,
    DecideFailure,
    DecideSuccess,
    ErrorEnvelope,
    GatewaySession,
    Limits,
    PlanKind,
    ReconnectPlanner,
    RetryHint,
    StreamRequest,
    compact_json,
    encode_message,
)
from airflow_provider_systemzero.protocol.client_events import (
    DecisionFailedEvent,
    DecisionReceived,
    GoodbyeReceived,
)
from airflow_provider_systemzero.protocol.gateway import CloseConnection, DispatchDecide, SendMessage
from airflow_provider_systemzero.protocol.messages import (
    Error,
    Goodbye,
    Ping,
    decode_client_message,
    sent_event_id,
)
from airflow_provider_systemzero.protocol.reconnect import MAX_SERVER_DELAY_S, Backoff, CloseCode

QUESTIONS = {"ready": {"type": "boolean", "instructions": "Is the job ready?"}}
#: Small enough that bursts, pending-event limits, heartbeats and idle timeouts all happen.
LIMITS = Limits(
    max_pending_events=3,
    heartbeat_interval_ms=5_000,
    pong_timeout_ms=2_000,
    idle_timeout_ms=30_000,
    max_duration_ms=600_000,
    min_interval_ms=0,
)
#: How long a behaving gateway may take to bring the client in sync with a current decision.
SETTLE_BOUND_S = 120.0
#: A gateway that said goodbye and never closes still pings this often (under the client's
#: receipt deadline: heartbeat plus pong timeout).
ZOMBIE_PING_S = 3.0


def reply_for(body: str) -> DecideSuccess:
    digest = hashlib.sha256(body.encode()).hexdigest()[:32]
    return DecideSuccess(
        reply={
            "id": f"szd_{digest}",
            "answers": {
                "ready": {"type": "boolean", "probability": 0.9, "confidence": 0.9, "decision": True}
            },
        },
        request_id="r",
    )


FAILURES = {
    "429": DecideFailure(
        429, ErrorEnvelope("rate_limit_error", "rate_limited", "slow down"), RetryHint(True, 700), "r"
    ),
    "503": DecideFailure(
        503, ErrorEnvelope("overloaded_error", "overloaded", "busy"), RetryHint(True, None), "r"
    ),
    "503-maintenance": DecideFailure(
        503, ErrorEnvelope("overloaded_error", "maintenance", "going away"), RetryHint(True, 400), "r"
    ),
    "409": DecideFailure(
        409, ErrorEnvelope("idempotency_error", "idempotency_conflict", "running"), RetryHint(True, 200), "r"
    ),
    "500": DecideFailure(500, ErrorEnvelope("api_error", "internal", "broken"), RetryHint(False), "r"),
    "400": DecideFailure(
        400, ErrorEnvelope("invalid_request_error", "invalid_request", "no"), RetryHint(False), "r"
    ),
}


class World:
    """The client session, the gateway of its current connection, and an adapter in between."""

    def __init__(self, mode: str, initial: Any, *, admission: bool = False) -> None:
        self.now = 0.0
        self.mode = mode
        request = StreamRequest.build(model="m", questions=QUESTIONS, prompt_cache_key="pck")
        self.client = ClientSession(
            request=request, state=initial, decision_mode=mode, key_namespace="ns", admission=admission
        )
        #: The adapter's answer to the session's questions before a dispatch (with ``admission``).
        self.gate_open = True
        #: Questions the session asked so far.
        self.asked = 0
        self.planner = ReconnectPlanner(Backoff(base=0.5, cap=8.0, rng=random.Random(7)))
        self.gateway: GatewaySession | None = None
        self.connections = 0
        self.reconnect_at: float | None = 0.0
        self.when_needed = False
        self.stopped = False
        self.silent = False
        self.auto = False
        self.pending: list[DispatchDecide] = []
        self.ledger: dict[str, str] = {}
        self.decisions: list[DecisionReceived] = []
        self.failures: list[Error] = []
        self._conn: dict[str, Any] = {}
        #: (e): the delay named for after this connection (ms), and no connection before this time
        self.named_ms = 0
        self.not_before = 0.0
        #: the next client message (not a pong) is refused with this error code, naming it or not
        self.refuse_next: tuple[str, bool] | None = None
        #: after a goodbye or a fatal error with no close: the gateway reads nothing (its timers
        #: stand still, so its idle timeout never closes the connection) and only pings,
        #: every ZOMBIE_PING_S (so the client never finds it silent), until the client closes
        self.zombie = False
        self.zombie_ping_at = 0.0
        self.step()

    # ---------------------------------------------------------------- the adapter

    def connect(self) -> None:
        self.connections += 1
        self.gateway = GatewaySession(stream_id=f"szws_{self.connections:032x}", now=self.now, limits=LIMITS)
        self.client.connection_opened(self.now)
        self.pending = []
        self.silent = False
        self._conn = {"opened": self.now, "goodbye": None, "fatal": None, "decided": False}
        assert self.now >= self.not_before - 1e-9, (  # (e)
            f"connected at {self.now:.3f} although the gateway asked not before {self.not_before:.3f}"
        )
        self.reconnect_at = None
        self.named_ms = 0
        self.zombie = False
        self.handle(self.gateway.actions())

    def deliver(self, message: Any) -> None:
        """A server message reaches the client (and what it asks of the next connection is noted)."""
        if isinstance(message, Goodbye) and message.retry_after_ms is not None:
            self.named_ms = max(self.named_ms, message.retry_after_ms)
        if isinstance(message, Error) and message.retry.retry_after_ms is not None:
            if message.fatal:
                self.named_ms = max(self.named_ms, message.retry.retry_after_ms)
            else:
                delay = min(message.retry.retry_after_ms / 1000, MAX_SERVER_DELAY_S)
                self.not_before = max(self.not_before, self.now + delay)
        for event in self.client.receive_text(encode_message(message), self.now):
            if isinstance(event, DecisionReceived):
                self.decisions.append(event)
                self._conn["decided"] = True
            elif isinstance(event, DecisionFailedEvent):
                self.failures.append(event.error)
                if event.error.fatal:
                    self._conn["fatal"] = event.error
            elif isinstance(event, GoodbyeReceived):
                self._conn["goodbye"] = event.goodbye

    def inject(self, message_type: type, **fields: Any) -> None:
        """A message the gateway core would not send, numbered as the connection's next."""
        assert self.gateway is not None
        self.deliver(message_type(stream_id=self.gateway.stream_id, seq=self.gateway.next_seq(), **fields))

    def handle(self, actions: list[Any]) -> None:
        finished: list[DispatchDecide] = []  # decided after the rest is delivered, as a real gateway does
        for action in actions:
            if self.gateway is None:
                return
            if isinstance(action, SendMessage):
                if self.silent:
                    continue
                self.deliver(action.message)
            elif isinstance(action, DispatchDecide):
                key = action.idempotency_key
                if key is not None:
                    assert self.ledger.setdefault(key, action.body) == action.body, f"key {key} reused"  # (d)
                self.pending.append(action)
                if self.auto:
                    finished.append(action)
            elif isinstance(action, CloseConnection) and not self.silent:
                self.end(action.code)
        for action in finished:
            if self.gateway is not None:
                self.finish(action, reply_for(action.body))

    def _refuse(self, text: str, code: str, named: bool) -> bool:
        """Drop ``text`` unread and answer ``code``, as a hostile gateway would (a pong, and for
        ``stale_state_version`` anything but a ``decide``, passes; a silent gateway refuses nothing)."""
        kind = decode_client_message(text).TYPE
        if self.silent or kind == "pong" or (code == "stale_state_version" and kind != "decide"):
            return False
        self.refuse_next = None
        self.inject(
            Error,
            event_id=sent_event_id(text) if named and kind != "decide" else None,
            state_version=None,
            http_status=None,
            request_id="r",
            fatal=False,
            envelope=ErrorEnvelope("rate_limit_error", code, "refused"),
            retry=RetryHint(True, 300),
        )
        return True

    def finish(self, action: DispatchDecide, outcome: Any) -> None:
        assert self.gateway is not None
        if action in self.pending:
            self.pending.remove(action)
        self.handle(self.gateway.dispatch_finished(action.dispatch_id, outcome, self.now))

    def end(self, code: int, kind: str = "closed") -> None:
        assert self.gateway is not None
        goodbye = self._conn["goodbye"]
        fatal = self._conn["fatal"]
        delay = self.client.next_connection_delay_ms(self.now)  # as the I/O adapter asks it
        self.not_before = max(self.not_before, self.now + min(self.named_ms / 1000, MAX_SERVER_DELAY_S))
        self.gateway.connection_lost()
        self.gateway = None
        self.pending = []
        self.client.connection_lost()
        self.client.retry_admission()  # a new connection asks anew, as the stream client does
        plan = self.planner.plan(
            ConnectionOutcome(
                code,
                "",
                goodbye.reason if goodbye else None,
                delay,
                fatal.code if fatal else None,
                started=True,
                decided=self._conn["decided"],
                duration=self.now - self._conn["opened"],
                kind=kind,
            )
        )
        if plan.kind is PlanKind.STOP:
            self.stopped = True
            return
        self.reconnect_at = self.now + plan.delay
        self.when_needed = plan.kind is PlanKind.WHEN_NEEDED

    def pump(self) -> None:
        for _ in range(10_000):
            if self.gateway is None:
                return
            frames = self.client.data_to_send(self.now)
            asked = self.client.admission_wanted
            if asked is not None:  # at most one dispatch per turn, so at most one question
                assert self.client.admission, f"asked without admission: {asked}"
                self.asked += 1
                self.client.admit(self.gate_open)
                frames += self.client.data_to_send(self.now)
                again = self.client.admission_wanted
                assert again is None, f"asked again in the same turn ({again}) after answering {asked}"
            if not frames:
                return
            for text in frames:
                if self.gateway is None:
                    return
                if self.refuse_next is not None and self._refuse(text, *self.refuse_next):
                    continue
                if self.zombie:
                    continue  # read by nobody: only a close (the client's) ends this
                self.handle(self.gateway.receive_text(text, self.now))
        raise AssertionError("the client kept sending without end")

    def step(self) -> None:
        """Do everything due at ``now`` and check (a): connected, the client is never due with nothing to send."""
        for _ in range(1_000):
            if self.stopped:
                return
            self.pump()
            if self.gateway is None:
                if (
                    self.reconnect_at is not None
                    and self.now >= self.reconnect_at
                    and (not self.when_needed or self.client.has_work())
                ):
                    self.connect()
                    continue
                return
            client = self.client
            if client.recycle_due(self.now):
                self.end(CloseCode.NORMAL_CLOSURE, "recycled")
                continue
            deadline = client.receipt_deadline()
            if deadline is not None and self.now >= deadline:
                self.end(CloseCode.ABNORMAL_CLOSURE, "silent")
                continue
            if self.silent:
                pass
            elif self.zombie:
                if self.now >= self.zombie_ping_at:
                    self.zombie_ping_at = self.now + ZOMBIE_PING_S
                    self.inject(Ping, nonce=1)
                    continue
            else:
                actions = self.gateway.tick(self.now)
                if actions:
                    self.handle(actions)
                    continue
            wakeup = client.next_wakeup(self.now)
            assert wakeup is None or wakeup > self.now, (
                f"spin: next_wakeup {wakeup} <= now {self.now} with nothing to send (phase {client.phase})"
            )
            return
        raise AssertionError("the adapter found something due at the same instant a thousand times")

    def next_event(self) -> float | None:
        times: list[float | None] = []
        if self.gateway is not None:
            times.append(self.client.next_wakeup(self.now))
            times.append(self.client.receipt_deadline())
            if self.silent:
                pass
            elif self.zombie:
                times.append(self.zombie_ping_at)
            else:
                times.append(self.gateway.next_deadline())
        elif self.reconnect_at is not None and (not self.when_needed or self.client.has_work()):
            times.append(self.reconnect_at)
        found = [t for t in times if t is not None and t != float("inf")]
        return min(found) if found else None

    def advance(self, seconds: float) -> None:
        target = self.now + seconds
        while True:
            at = self.next_event()
            if at is None or at > target:
                self.now = target
                self.step()
                return
            self.now = max(self.now, at)
            self.step()


# ------------------------------------------------------------------------------------ the machine

STATES = [
    "log\n",
    "log\nmore\n",
    "",
    [1],
    [True],
    [1.0],
    [1, 2],
    {"a": 1},
    {"a": True},
    {"a": 1.0},
    ["x", {"y": [1]}],
]


class ClientLiveness(RuleBasedStateMachine):
    #: Whether the session asks before each dispatch (and the gate rules run).
    ADMISSION = False

    @initialize(mode=st.sampled_from(["on_change", "on_request"]), initial=st.sampled_from(STATES))
    def open(self, mode: str, initial: Any) -> None:
        self.w = World(mode, initial, admission=self.ADMISSION)

    # ---- the adapter's answers before a dispatch (admission)
    @precondition(lambda self: self.ADMISSION)
    @rule()
    def close_the_gate(self) -> None:
        self.w.gate_open = False
        self.w.step()

    @precondition(lambda self: self.ADMISSION)
    @rule()
    def open_the_gate(self) -> None:
        self.w.gate_open = True
        self.w.client.retry_admission()  # the held dispatch is asked about again
        self.w.step()

    # ---- caller changes
    @rule(state=st.sampled_from(STATES))
    def set_state(self, state: Any) -> None:
        self.w.client.set_desired(state)
        self.w.step()

    @rule()
    def replace_with_the_same_state(self) -> None:
        self.w.client.replace(self.w.client.desired_state)
        self.w.step()

    @rule(a=st.sampled_from(STATES), b=st.sampled_from(STATES))
    def toggle_within_one_pacing_window(self, a: Any, b: Any) -> None:
        back = self.w.client.desired_state
        for state in (a, b, back):
            self.w.client.set_desired(state)  # no step in between: nothing can be sent
        self.w.step()

    @precondition(lambda self: isinstance(self.w.client.desired_state, str))
    @rule(text=st.sampled_from(["x", "line\n", "é"]), count=st.integers(1, 40))
    def burst_of_appends(self, text: str, count: int) -> None:
        for _ in range(count):
            self.w.client.append_text(text)
            self.w.step()

    @precondition(lambda self: isinstance(self.w.client.desired_state, list))
    @rule(item=st.sampled_from([1, True, "z", {"k": None}]), count=st.integers(1, 12))
    def append_items(self, item: Any, count: int) -> None:
        for _ in range(count):
            self.w.client.append_items([item])
            self.w.step()

    @rule()
    def ask_for_a_decision(self) -> None:
        if not self.w.stopped:
            self.w.client.request_decision()
            self.w.step()

    # ---- the gateway
    @precondition(lambda self: bool(self.w.pending))
    @rule(kind=st.sampled_from(["ok", *FAILURES]), goodbye=st.booleans())
    def decide(self, kind: str, goodbye: bool) -> None:
        action = self.w.pending[0]
        self.w.finish(action, reply_for(action.body) if kind == "ok" else FAILURES[kind])
        if goodbye and self.w.gateway is not None:
            self.w.handle(self.w.gateway.begin_shutdown(self.w.now, 300))
        self.w.step()

    @precondition(lambda self: self.w.gateway is not None)
    @rule(retry_after_ms=st.sampled_from([0, 250, 2_000]))
    def restart(self, retry_after_ms: int) -> None:
        assert self.w.gateway is not None
        self.w.handle(self.w.gateway.begin_shutdown(self.w.now, retry_after_ms))
        self.w.step()

    # ---- a hostile gateway
    @precondition(lambda self: self.w.gateway is not None and not self.w.silent)
    @rule(
        reason=st.sampled_from(["shutdown", "overload", "idle_timeout", "max_duration"]),
        retry_after_ms=st.sampled_from([None, 0, 250, 2_000]),
        again_ms=st.sampled_from([None, 0, 5_000]),
    )
    def goodbye_and_no_close(self, reason: str, retry_after_ms: int | None, again_ms: int | None) -> None:
        """A goodbye (maybe a second one naming another delay), and the gateway never closes."""
        for delay in (retry_after_ms, again_ms) if again_ms is not None else (retry_after_ms,):
            if self.w.gateway is not None:
                self.w.inject(
                    Goodbye,
                    reason=reason,
                    state_version=None,
                    last_decision_state_version=None,
                    retry_after_ms=delay,
                )
        self.w.zombie, self.w.zombie_ping_at = True, self.w.now + ZOMBIE_PING_S
        self.w.step()

    @precondition(lambda self: self.w.gateway is not None and not self.w.silent)
    @rule(retry_after_ms=st.sampled_from([None, 0, 700]))
    def fatal_error_and_no_close(self, retry_after_ms: int | None) -> None:
        self.w.inject(
            Error,
            event_id=None,
            state_version=None,
            http_status=None,
            request_id="r",
            fatal=True,
            envelope=ErrorEnvelope("api_error", "internal", "broken"),
            retry=RetryHint(retry_after_ms is not None, retry_after_ms),
        )
        self.w.zombie, self.w.zombie_ping_at = True, self.w.now + ZOMBIE_PING_S
        self.w.step()

    @precondition(lambda self: self.w.gateway is not None and not self.w.silent)
    @rule(code=st.sampled_from(["message_rate_limited", "stale_state_version"]), named=st.booleans())
    def refuse_the_next_message(self, code: str, named: bool) -> None:
        self.w.refuse_next = (code, named)
        self.w.step()

    @precondition(lambda self: self.w.gateway is not None)
    @rule()
    def drop(self) -> None:
        self.w.end(CloseCode.ABNORMAL_CLOSURE)
        self.w.step()

    @precondition(lambda self: self.w.gateway is not None)
    @rule()
    def go_silent(self) -> None:
        self.w.silent = True

    @rule(seconds=st.sampled_from([0.05, 0.3, 1.0, 4.0, 40.0]))
    def time_passes(self, seconds: float) -> None:
        self.w.advance(seconds)

    # ---- once the gateway behaves
    @rule()
    def settle(self) -> None:
        w = self.w
        if w.stopped:
            return
        w.auto = True
        w.refuse_next = None
        if not w.gate_open:
            w.gate_open = True
            w.client.retry_admission()
        for action in list(w.pending):
            w.finish(action, reply_for(action.body))
        if w.silent:
            w.advance(10.0)  # the silent connection is found dead and replaced
        client = w.client
        start = w.now
        intent = None
        if client.current_decision is None and client.current_failure is None:
            intent = client.request_decision()
        w.step()
        while w.now - start < SETTLE_BOUND_S:
            current = client.current_decision is not None or client.current_failure is not None
            if (
                current
                and (intent is None or client.pending_intents == 0)
                and (w.gateway is None or client.in_sync)
            ):
                break
            w.advance(1.0)
        else:
            raise AssertionError(
                f"no decision about the current state within {SETTLE_BOUND_S} s "
                f"(phase {client.phase}, in_sync {client.in_sync}, work {client.has_work()})"
            )
        assert not w.stopped
        if w.gateway is not None and w.gateway.stream_state is not None:  # (c)
            assert compact_json(w.gateway.stream_state.state) == compact_json(client.desired_state)
        w.auto = False

    @invariant()
    def never_spins(self) -> None:
        w = getattr(self, "w", None)
        if w is not None and w.gateway is not None and not w.stopped:
            wakeup = w.client.next_wakeup(w.now)
            assert wakeup is None or wakeup > w.now or w.client.recycle_due(w.now)


class ClientLivenessUnderAdmission(ClientLiveness):
    ADMISSION = True

    @invariant()
    def asks_only_when_a_dispatch_is_due(self) -> None:
        w = getattr(self, "w", None)
        if w is not None:
            assert w.client.admission_wanted is None  # every question was answered in its turn


def _machine_settings(examples: int) -> settings:
    return settings(
        max_examples=int(__import__("os").environ.get("LIVENESS_EXAMPLES", str(examples))),
        stateful_step_count=30,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )


TestClientLiveness = ClientLiveness.TestCase
TestClientLiveness.settings = _machine_settings(60)
TestClientLivenessUnderAdmission = ClientLivenessUnderAdmission.TestCase
TestClientLivenessUnderAdmission.settings = _machine_settings(40)
