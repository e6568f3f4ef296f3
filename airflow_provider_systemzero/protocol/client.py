"""The client side of a System Zero stream, as a pure state machine (WIRE.md §3–8).

Theory of operation
-------------------

:class:`ClientSession` outlives connections. It holds the caller's *desired* state and turns it
into the next message; per connection it tracks event IDs, acknowledgements, pings and decide
intents, and after a reconnect it produces the replay: a ``start`` carrying the full desired
state with the same per-state key and a byte-identical request, then only what the replay lacked.

A connection goes through the phases of :class:`Phase`; the legal moves are the data in
:data:`TRANSITIONS`. The I/O adapter drives it:

* :meth:`~ClientSession.connection_opened` / :meth:`~ClientSession.connection_lost`;
* :meth:`~ClientSession.receive_text` for each frame → a list of events;
* :meth:`~ClientSession.outgoing` after every input and at :meth:`~ClientSession.next_wakeup` →
  the messages to write now, paced under the gateway's event and message buckets so that fast
  local changes coalesce into the next mutation instead of being rejected;
* :meth:`~ClientSession.recycle_due`: the session wants the connection closed and the state
  replayed on a new one (a decide failure the gateway will not retry on this connection).

One function, :meth:`~ClientSession._wanted`, answers "what would be sent next, and from when";
``outgoing`` sends it when its time has come and ``next_wakeup`` reports that time, so the two
cannot disagree. The liveness invariant follows: whenever the client is connected it either has
something to send now, waits for a timer, waits for the gateway (an ack, a decision), or is in
sync with nothing wanted — never "due now" with nothing to send.

Caller changes (:meth:`~ClientSession.append_text` …) are validated before they touch the desired
state: an invalid change raises :class:`LocalProtocolError` and changes nothing. What is accepted
is a snapshot: mutating the caller's list or dict afterwards changes nothing here.

Design choices beyond the wire contract: at most one mutation is in flight (the next is planned
from the acknowledged state when its ack arrives, so a rejection never cascades into
out-of-sequence errors and dense changes coalesce naturally), and per-state keys can be derived
from a namespace and the hash of the decide body so the same state always carries the same key.
"""

from __future__ import annotations

import copy
import enum
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_systemzero.protocol.body import json_size
from airflow_provider_systemzero.protocol.client_events import (
    Acknowledged,
    ClientEvent,
    DecisionFailed,
    DecisionReceived,
    GoodbyeReceived,
    HelloReceived,
    MutationRejected,
    ServerError,
    StreamFailed,
)
from airflow_provider_systemzero.protocol.errors import LocalProtocolError, RemoteProtocolError
from airflow_provider_systemzero.protocol.keys import derive_state_key
from airflow_provider_systemzero.protocol.limits import Limits
from airflow_provider_systemzero.protocol.messages import (
    PROTOCOL,
    Ack,
    Attachment,
    ClientMessage,
    Decide,
    Decision,
    Error,
    Goodbye,
    Hello,
    Mutation,
    Ping,
    Pong,
    Scheduled,
    Start,
    StreamRequest,
    decode_server_message,
    encode_message,
    event_id,
    event_number,
    validate_attachment_tuple,
)
from airflow_provider_systemzero.protocol.ratelimit import TokenBucket
from airflow_provider_systemzero.protocol.reconnect import (
    DEFAULT_REJECTION_RETRY_MS,
    MAX_SERVER_DELAY_S,
    DecideRetry,
    classify_decide_failure,
)
from airflow_provider_systemzero.protocol.reply import DecisionResult
from airflow_provider_systemzero.protocol.state import StreamState, plan_mutation, same_json
from airflow_provider_systemzero.protocol.validation import (
    validate_decision_mode,
    validate_idempotency_key,
    validate_min_interval_ms,
    validate_state,
)

__all__ = [
    "TRANSITIONS",
    "Acknowledged",
    "ClientEvent",
    "ClientSession",
    "DecisionFailed",
    "DecisionReceived",
    "GoodbyeReceived",
    "HelloReceived",
    "MutationRejected",
    "Phase",
    "ServerError",
    "StreamFailed",
    "check_hello",
]

#: A placeholder ``stream_id`` of the right length, to predict body sizes before ``hello``.
_STREAM_ID_PLACEHOLDER = "szws_" + "0" * 32
#: Rejections after which the same mutation may be sent again later.
_RETRYABLE_REJECTIONS = frozenset({"event_rate_limited", "too_many_pending_events", "shutting_down"})
#: Pacing runs at this fraction of the gateway's advertised rates: our clock and the gateway's
#: drift, and network jitter compresses intervals, so a client at exactly the advertised rate
#: would now and then be rejected.
_PACING_RATE_FACTOR = 0.9
#: Event tokens kept back from the gateway's ``event_burst``, for the same reason.
_EVENT_BURST_RESERVE = 1
#: Message tokens kept back from ``message_burst``: a pong and a ``decide`` may follow a burst
#: of mutations at once, and the gateway counts them in the same bucket.
_MESSAGE_BURST_RESERVE = 2


def check_hello(message: Any) -> Hello:
    """The first server message of a connection: a ``hello`` of this protocol (WIRE.md §2).

    :raises RemoteProtocolError: it is another message, or another protocol's ``hello``.
    """
    if not isinstance(message, Hello):
        raise RemoteProtocolError(f"the first server message must be hello, got {message.TYPE}",
                                  code="hello_expected", field="type")
    if message.protocol != PROTOCOL:
        raise RemoteProtocolError(f"hello.protocol {message.protocol[:40]!r} is not {PROTOCOL!r}",
                                  code="unsupported_protocol", field="protocol")
    return message


class Phase(enum.Enum):
    """Where a session is with its current connection."""

    #: No connection. :meth:`ClientSession.has_work` says whether one is needed.
    DISCONNECTED = "disconnected"
    #: The WebSocket is open; the gateway speaks first (``hello``). Nothing is sent but pongs.
    AWAITING_HELLO = "awaiting_hello"
    #: ``hello`` arrived; ``start`` (the full desired state) is being sent or awaits its ack.
    STARTING = "starting"
    #: ``start`` was acknowledged: mutations and ``decide`` flow, at most one mutation in flight.
    STREAMING = "streaming"
    #: A non-retryable rejection: the desired state cannot be streamed. Terminal.
    FAILED = "failed"


#: The legal phase changes. Every connection ends in DISCONNECTED; FAILED is never left.
TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.DISCONNECTED: frozenset({Phase.AWAITING_HELLO}),
    Phase.AWAITING_HELLO: frozenset({Phase.STARTING, Phase.DISCONNECTED}),
    Phase.STARTING: frozenset({Phase.STREAMING, Phase.FAILED, Phase.DISCONNECTED}),
    Phase.STREAMING: frozenset({Phase.FAILED, Phase.DISCONNECTED}),
    Phase.FAILED: frozenset(),
}


@dataclass(slots=True)
class _InFlightMutation:
    """The one mutation sent and not yet acknowledged or rejected."""

    message: Mutation
    #: The state the gateway holds once it is accepted.
    result: StreamState
    #: The caller generation it carries.
    generation: int


@dataclass(slots=True)
class _Intent:
    """A caller waiting for a decision about generation ``generation`` or later."""

    intent_id: int
    generation: int


@dataclass(slots=True)
class _Connection:
    """Everything that is forgotten when a connection ends."""

    #: The gateway's ``hello`` (``None`` until it arrives).
    hello: Hello | None = None
    #: The ``seq`` of the last server message (``hello`` is 1; each next one is exactly one more).
    seq: int = 0
    #: What the gateway holds (``None`` before the ``start`` ack) and its version.
    acked: StreamState | None = None
    acked_version: int = 0
    #: The caller generation the acknowledged state stands for (a later generation whose state is
    #: byte-identical is adopted: see :meth:`ClientSession._adopt`).
    acked_generation: int = -1
    in_flight: _InFlightMutation | None = None
    #: The version a ``decide`` was sent for and not yet settled (on_request).
    decide_outstanding: int | None = None
    #: on_request: the gateway rejected a mutation ``too_many_pending_events``; a ``decide`` of
    #: the acknowledged version drains the pending events.
    drain: bool = False
    #: The last decision's version on this connection (0: none).
    decided_version: int = 0
    #: No mutation is sent before this time (a rejection's delay); ``inf`` while the gateway shuts
    #: down, which also stops ``decide``.
    blocked_until: float = 0.0
    #: When to close and replay on a new connection (on_change decide failure nobody retries here).
    recycle_at: float | None = None
    last_receipt: float = 0.0
    event_bucket: TokenBucket | None = None
    message_bucket: TokenBucket | None = None
    pongs: list[Pong] = field(default_factory=list)
    #: version → the caller generation it stands for, for versions a decision may still cover.
    version_generation: dict[int, int] = field(default_factory=dict)
    #: A reconnect (the ``start`` is a replay).
    replay: bool = False


def _snapshot(value: Any) -> Any:
    """A copy the caller cannot change behind the session's back (strings are immutable)."""
    return value if isinstance(value, str) else copy.deepcopy(value)


class ClientSession:
    """The client's state machine for a stream (across reconnects).

    :param request: the fixed request parts; send an explicit ``prompt_cache_key`` so replays are
        byte-identical across connections.
    :param state: the initial desired state.
    :param decision_mode: ``on_change`` or ``on_request``.
    :param attachments: the initial inline attachments.
    :param min_interval_ms: minimum time between dispatch starts, or ``None``.
    :param idempotency_key: the key of the initial state (``None``: derived from ``key_namespace``
        if given, else unkeyed).
    :param key_namespace: when set, every change without an explicit key gets
        :func:`derive_state_key` of its resulting body.
    :param limits: limits to assume before ``hello`` (the public document's by default).
    """

    def __init__(
        self,
        *,
        request: StreamRequest,
        state: Any,
        decision_mode: str,
        attachments: Sequence[Attachment] = (),
        min_interval_ms: int | None = None,
        idempotency_key: str | None = None,
        key_namespace: str | None = None,
        limits: Limits | None = None,
    ) -> None:
        request.validate()
        #: The fixed request parts.
        self.request = request
        self.decision_mode = validate_decision_mode(decision_mode)
        self.min_interval_ms = validate_min_interval_ms(min_interval_ms)
        if key_namespace is not None:
            validate_idempotency_key(key_namespace, field="key_namespace")
            if len(key_namespace) > 190:
                raise LocalProtocolError(
                    "key_namespace is longer than 190 characters: derived keys must stay within "
                    "255 characters",
                    code="invalid_idempotency_key",
                    field="key_namespace",
                )
        self.key_namespace = key_namespace
        #: The limits in force: the public document's until ``hello``, then the gateway's.
        self.limits = limits or Limits()
        #: Where the session is (see :class:`Phase`).
        self.phase = Phase.DISCONNECTED
        self._desired = StreamState(None, ())
        self._desired_key: str | None = None
        #: Counts accepted caller changes; 0 for the initial state.
        self._generation = 0
        self._intents: list[_Intent] = []
        self._intent_ids = 0
        # across connections: the newest generation any connection acknowledged, the newest one
        # a decision or a final failure settled (on_change), the generation of the last decision,
        # and the generation a final failure settled with that failure
        self._acked_generation = -1
        self._settled_generation = -1
        self._decision_generation = -1
        self._failure_generation = -1
        self._final_failure: Error | None = None
        self._conn: _Connection | None = None
        #: The last decision received, on any connection.
        self.last_decision: DecisionResult | None = None
        #: The current (or last) connection's ``stream_id``.
        self.stream_id: str | None = None
        #: Connections opened so far.
        self.connections = 0
        #: The delay the gateway named for the next connection (goodbye), in ms, or ``None``.
        self.server_delay_ms: int | None = None
        self._stream_failure: Error | None = None
        self._start_overhead_for: tuple[str, int] | None = None
        #: Asked before writing a message that can start a dispatch at the gateway (on_change: every
        #: mutation, ``start`` included; on_request: ``decide``); returning ``False`` holds it and
        #: everything after it (see :attr:`dispatch_held`). ``None``: nothing is held.
        self.dispatch_gate: Callable[[ClientMessage], bool] | None = None
        #: Whether the gate refused: on_change then sends no more mutations; on_request no more
        #: ``decide`` until the waiting intents are gone.
        self.dispatch_held = False
        validate_state(state, field="state")
        attachments = tuple(attachments)
        validate_attachment_tuple(attachments, field="attachments")
        self._set_desired(StreamState(_snapshot(state), attachments), idempotency_key, field="state")
        self._generation = 0

    def _move(self, phase: Phase) -> None:
        if phase is not self.phase and phase not in TRANSITIONS[self.phase]:
            raise RuntimeError(f"illegal client phase change {self.phase.value} -> {phase.value}")
        self.phase = phase

    # ------------------------------------------------------------------ desired state

    @property
    def desired_state(self) -> Any:
        """The state the caller wants the gateway to have."""
        return self._desired.state

    @property
    def desired_attachments(self) -> tuple[Attachment, ...]:
        """The attachments the caller wants."""
        return self._desired.attachments

    @property
    def desired_key(self) -> str | None:
        """The idempotency key naming the desired state."""
        return self._desired_key

    @property
    def generation(self) -> int:
        """Counts caller changes (0 for the initial state)."""
        return self._generation

    @property
    def state_version(self) -> int:
        """The latest version the gateway acknowledged on the current connection (0 before ``start``)."""
        return self._conn.acked_version if self._conn else 0

    @property
    def in_sync(self) -> bool:
        """Whether the gateway has acknowledged the complete desired state on this connection."""
        conn = self._conn
        return (
            self.phase is Phase.STREAMING
            and conn is not None
            and conn.in_flight is None
            and conn.acked_generation == self._generation
        )

    def desired_body(self, stream_id: str | None = None) -> str:
        """The synthesized decide body of the desired state."""
        return self.request.decide_body(
            self._desired.state,
            self._desired.attachments,
            stream_id=stream_id or self.stream_id or _STREAM_ID_PLACEHOLDER,
        )

    def _set_desired(self, new: StreamState, key: str | None, *, field: str) -> list[ClientEvent]:
        body = self.request.decide_body(
            new.state, new.attachments, stream_id=self.stream_id or _STREAM_ID_PLACEHOLDER
        )
        try:
            size = len(body.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise LocalProtocolError(
                f"{field} holds text that is not valid Unicode ({exc.reason}: {exc.object[exc.start : exc.end]!r}): "
                "a state must encode as UTF-8; nothing was changed",
                code="invalid_state",
                field=field,
            ) from None
        if size > self.limits.max_decide_body_bytes:
            raise LocalProtocolError(
                f"{field} would make the decide body {size} bytes: the synthesized body may not exceed "
                f"max_decide_body_bytes ({self.limits.max_decide_body_bytes}); nothing was changed",
                code="decide_body_too_large",
                field=field,
            )
        start_size = size + self._start_overhead()
        if start_size > self.limits.max_message_bytes:
            raise LocalProtocolError(
                f"{field} would make the replay start message {start_size} bytes: messages may not exceed "
                f"max_message_bytes ({self.limits.max_message_bytes}); nothing was changed",
                code="message_too_large",
                field=field,
            )
        if key is not None:
            key = validate_idempotency_key(key)
        elif self.key_namespace is not None:
            key = derive_state_key(self.key_namespace, body)
        self._desired = new
        self._desired_key = key
        self._generation += 1
        return self._adopt()

    def _start_overhead(self) -> int:
        """Bytes a replayed ``start`` (with the longest key) adds to the decide body of the same state.

        State and attachments appear once in each, framed the same way, so the difference depends
        only on the request: it is measured once on an empty state instead of encoding the whole
        state a second time on every change.
        """
        stream_id = self.stream_id or _STREAM_ID_PLACEHOLDER
        if self._start_overhead_for is None or self._start_overhead_for[0] != stream_id:
            start = json_size(
                Start(
                    event_id(1), self.request, "", self.decision_mode, (), self.min_interval_ms, "k" * 255
                ).to_dict()
            )
            body = len(self.request.decide_body("", (), stream_id=stream_id).encode("utf-8"))
            self._start_overhead_for = (stream_id, start - body)
        return self._start_overhead_for[1]

    def _adopt(self) -> list[ClientEvent]:
        """Adopt the desired generation as acknowledged when its state is what the gateway holds.

        A change back to the acknowledged state (``replace`` with the same state, A→B→A before B
        was sent, or an ack that lands on a state the caller returned to) sends nothing and counts
        as acknowledged at once (WIRE.md §8). If a decision already covered that state, it covers
        the current generation too: callers waiting for one get it now.
        """
        conn = self._conn
        if (
            conn is None
            or self.phase is not Phase.STREAMING
            or conn.in_flight is not None
            or conn.acked_generation == self._generation
            or conn.acked is None
            or self._desired.attachments != conn.acked.attachments
            or not same_json(self._desired.state, conn.acked.state)
        ):
            return []
        previous = conn.acked_generation
        conn.acked_generation = self._generation
        self._acked_generation = max(self._acked_generation, self._generation)
        if conn.acked_version in conn.version_generation:
            conn.version_generation[conn.acked_version] = self._generation
        if self._failure_generation == previous:
            self._failure_generation = self._generation
        if self._settled_generation == previous:
            self._settled_generation = self._generation
        if (
            conn.decided_version == conn.acked_version
            and self._decision_generation == previous
            and self.last_decision is not None
        ):
            self._decision_generation = self._generation
            intents = self._resolve(self._generation)
            if intents:
                return [DecisionReceived(self.last_decision, current=True, intents=intents, repeated=True)]
        return []

    def append_text(self, text: str, *, idempotency_key: str | None = None) -> list[ClientEvent]:
        """Append ``text`` to a string state.

        :returns: events the change settles at once (usually none).
        :raises LocalProtocolError: the state is not a string, ``text`` is not a string, the key is
            invalid or the state would grow past the body limit; nothing changes.
        """
        if not isinstance(text, str):
            raise LocalProtocolError(
                f"text must be a string, got {type(text).__name__}", code="invalid_text", field="text"
            )
        if not isinstance(self._desired.state, str):
            raise LocalProtocolError(
                "append_text needs a string state: use append_items for an array or replace for an object",
                code="state_type_mismatch",
                field="text",
            )
        if not text:
            return []
        return self._set_desired(
            StreamState(self._desired.state + text, self._desired.attachments), idempotency_key, field="text"
        )

    def append_items(self, items: Sequence[Any], *, idempotency_key: str | None = None) -> list[ClientEvent]:
        """Append complete values to an array state.

        :returns: events the change settles at once (usually none).
        :raises LocalProtocolError: the state is not an array, ``items`` is empty or not JSON, the
            key is invalid or the state would grow past the body limit; nothing changes.
        """
        if isinstance(items, str | bytes) or not isinstance(items, Sequence):
            raise LocalProtocolError(
                "items must be a list of JSON values", code="invalid_items", field="items"
            )
        if not isinstance(self._desired.state, list):
            raise LocalProtocolError(
                "append_items needs an array state: use append_text for a string or replace for an object",
                code="state_type_mismatch",
                field="items",
            )
        if not items:
            raise LocalProtocolError(
                "items must not be empty: append at least one item", code="empty_items", field="items"
            )
        _check_json(list(items), "items")
        return self._set_desired(
            StreamState([*self._desired.state, *_snapshot(list(items))], self._desired.attachments),
            idempotency_key,
            field="items",
        )

    def replace(
        self,
        state: Any,
        *,
        attachments: Sequence[Attachment] | None = None,
        idempotency_key: str | None = None,
    ) -> list[ClientEvent]:
        """Replace the complete state (and the attachments, when given; ``[]`` removes all).

        :returns: events the change settles at once (a change back to a decided state).
        :raises LocalProtocolError: the state is not a string/array/object or not JSON, an
            attachment is invalid, or the body would be too large; nothing changes.
        """
        validate_state(state, field="state")
        _check_json(state, "state")
        new_attachments = self._desired.attachments
        if attachments is not None:
            new_attachments = tuple(attachments)
            validate_attachment_tuple(new_attachments, field="attachments")
        return self._set_desired(
            StreamState(_snapshot(state), new_attachments), idempotency_key, field="state"
        )

    def append_attachments(
        self, attachments: Sequence[Attachment], *, idempotency_key: str | None = None
    ) -> list[ClientEvent]:
        """Add inline attachments; the state is unchanged.

        :returns: events the change settles at once (usually none).
        :raises LocalProtocolError: empty list, invalid or duplicate names, invalid data URLs;
            nothing changes.
        """
        new = tuple(attachments)
        validate_attachment_tuple(
            new, field="attachments", existing=self._desired.attachments, allow_empty=False
        )
        return self._set_desired(
            StreamState(self._desired.state, (*self._desired.attachments, *new)),
            idempotency_key,
            field="attachments",
        )

    def set_desired(self, state: Any, *, idempotency_key: str | None = None) -> list[ClientEvent]:
        """Make ``state`` the desired state (a reconciling source); the minimal mutation is planned.

        Unlike :meth:`replace`, nothing happens when the state is unchanged — byte for byte as
        JSON: ``[1]`` and ``[true]`` are different states although Python calls them equal.
        """
        if same_json(state, self._desired.state) and (
            idempotency_key is None or idempotency_key == self._desired_key
        ):
            return []
        return self.replace(state, idempotency_key=idempotency_key)

    # ------------------------------------------------------------------ decide intents

    def request_decision(self) -> int:
        """Ask for a decision covering the desired state as it is now; returns the intent ID.

        on_request: a ``decide`` is sent once the gateway acknowledged everything up to now.
        on_change: nothing is sent (every change schedules); the intent resolves with the first
        decision covering it.
        """
        self._intent_ids += 1
        self._intents.append(_Intent(self._intent_ids, self._generation))
        return self._intent_ids

    def cancel_intent(self, intent_id: int) -> None:
        """Forget an intent (its waiter gave up). on_request: once none waits, a held ``decide``
        may be asked again (the gate decides anew)."""
        self._intents = [i for i in self._intents if i.intent_id != intent_id]
        if not self._intents and self.decision_mode == "on_request":
            self.dispatch_held = False

    def _may_dispatch(self, message: ClientMessage) -> bool:
        gate = self.dispatch_gate
        if gate is None or gate(message):
            return True
        self.dispatch_held = True
        return False

    @property
    def current_decision(self) -> DecisionResult | None:
        """The last decision if it covers the desired state as it is now (no change since), else ``None``.

        on_change needs no new dispatch for such a state: a caller asking for its decision can
        have this one.
        """
        if self.last_decision is not None and self._decision_generation == self._generation:
            return self.last_decision
        return None

    @property
    def current_failure(self) -> Error | None:
        """on_change: the final failure of the desired state's dispatch, if nothing changed since.

        The gateway does not dispatch a state again after a non-retryable failure; a caller asking
        for this state's decision gets the failure at once instead of waiting for nothing.
        """
        if self._final_failure is not None and self._failure_generation == self._generation:
            return self._final_failure
        return None

    @property
    def pending_intents(self) -> int:
        """Intents not yet resolved."""
        return len(self._intents)

    def has_work(self) -> bool:
        """Whether the session needs a connection: a change to send or a decision to wait for.

        Answered across connections: after a connection ends with everything acknowledged (and,
        on_change, decided), there is no work until the caller changes the state or asks for a
        decision — so a client can stay disconnected after an ``idle_timeout`` goodbye.
        """
        if self._intents:
            return True
        if self.phase is Phase.FAILED:
            return False
        conn = self._conn
        if self.phase in (Phase.AWAITING_HELLO, Phase.STARTING):
            return True
        if conn is not None:
            synced = conn.in_flight is None and conn.acked_generation == self._generation
        else:
            synced = self._acked_generation == self._generation
        if not synced:
            return True
        return self.decision_mode == "on_change" and self._settled_generation < self._generation

    # ------------------------------------------------------------------ connection lifecycle

    def connection_opened(self, now: float) -> None:
        """A WebSocket connection is open; wait for ``hello``."""
        if self.phase is Phase.FAILED:
            raise RuntimeError("the stream failed: no new connection")
        self._move(Phase.AWAITING_HELLO)
        self.connections += 1
        self._conn = _Connection(last_receipt=now, replay=self.connections > 1)
        self.server_delay_ms = None

    def connection_lost(self) -> None:
        """The connection ended; everything not acknowledged stays desired and is replayed."""
        self._conn = None
        if self.phase is not Phase.FAILED:
            self._move(Phase.DISCONNECTED)

    @property
    def connected(self) -> bool:
        """Whether a connection is open."""
        return self._conn is not None

    @property
    def stream_failure(self) -> Error | None:
        """The non-retryable rejection that stopped the stream, if any."""
        return self._stream_failure

    def receipt_deadline(self) -> float | None:
        """When the peer counts as silent (heartbeat interval plus pong timeout after the last receipt)."""
        conn = self._conn
        if conn is None:
            return None
        return conn.last_receipt + (self.limits.heartbeat_interval_ms + self.limits.pong_timeout_ms) / 1000

    def recycle_due(self, now: float) -> bool:
        """Whether the session wants this connection closed and its state replayed on a new one.

        on_change after a decide failure the gateway does not retry while the connection lives
        (503 ``maintenance``): if no goodbye follows by the server's delay, the client acts.
        """
        conn = self._conn
        return conn is not None and conn.recycle_at is not None and now >= conn.recycle_at

    # ------------------------------------------------------------------ input

    def receive_text(self, text: str | bytes, now: float) -> list[ClientEvent]:
        """Handle one server frame.

        :raises RemoteProtocolError: the gateway broke the contract; close the connection and
            reconnect.
        """
        conn = self._conn
        if conn is None:
            raise RuntimeError("receive_text without an open connection")
        conn.last_receipt = now
        message = decode_server_message(text)
        self._check_sequence(conn, message)
        if conn.hello is None:
            message = check_hello(message)
            conn.hello = message
            self.limits = message.limits
            self.stream_id = message.stream_id
            lim = message.limits
            conn.event_bucket = TokenBucket(
                max(0.1, lim.max_events_per_second * _PACING_RATE_FACTOR),
                max(1, lim.event_burst - _EVENT_BURST_RESERVE),
                now,
            )
            conn.message_bucket = TokenBucket(
                max(0.1, lim.max_messages_per_second * _PACING_RATE_FACTOR),
                max(1, lim.message_burst - _MESSAGE_BURST_RESERVE),
                now,
            )
            self._move(Phase.STARTING)
            return [HelloReceived(message)]
        if isinstance(message, Hello):
            raise RemoteProtocolError(
                "a second hello on one connection", code="unexpected_hello", field="type"
            )
        if isinstance(message, Ping):
            conn.pongs.append(Pong(message.nonce))
            return []
        if isinstance(message, Ack):
            return self._on_ack(conn, message)
        if isinstance(message, Scheduled):
            return []
        if isinstance(message, Decision):
            return self._on_decision(conn, message)
        if isinstance(message, Error):
            return self._on_error(conn, message, now)
        assert isinstance(message, Goodbye)
        self.server_delay_ms = message.retry_after_ms
        conn.recycle_at = None  # the gateway closes the connection itself
        return [GoodbyeReceived(message)]

    @staticmethod
    def _check_sequence(conn: _Connection, message: Any) -> None:
        """Every server message names this connection's stream and the next ``seq`` (WIRE.md §2)."""
        if conn.hello is not None and message.stream_id != conn.hello.stream_id:
            raise RemoteProtocolError(
                f"{message.TYPE} names stream {message.stream_id[:40]!r}, not this "
                f"connection's {conn.hello.stream_id!r}",
                code="unexpected_stream_id",
                field="stream_id",
            )
        if message.seq != conn.seq + 1:
            raise RemoteProtocolError(
                f"{message.TYPE}.seq is {message.seq}, expected {conn.seq + 1}: server "
                "messages are numbered 1, 2, 3 … over the connection",
                code="seq_out_of_order",
                field="seq",
            )
        conn.seq = message.seq

    def _on_ack(self, conn: _Connection, ack: Ack) -> list[ClientEvent]:
        flight = conn.in_flight
        if flight is None or ack.event_id != flight.message.event_id:
            expected = flight.message.event_id if flight else None
            raise RemoteProtocolError(
                f"ack for {ack.event_id[:40]!r} but the mutation in flight is {expected!r}",
                code="unexpected_ack",
                field="event_id",
            )
        number = event_number(ack.event_id)
        if ack.state_version != number:
            raise RemoteProtocolError(
                f"ack.state_version {ack.state_version} does not match {ack.event_id!r}: "
                "each accepted mutation increments state_version once",
                code="invalid_ack",
                field="state_version",
            )
        conn.in_flight = None
        conn.acked = flight.result
        conn.acked_version = ack.state_version
        conn.acked_generation = flight.generation
        conn.version_generation[ack.state_version] = flight.generation
        self._acked_generation = max(self._acked_generation, flight.generation)
        is_start = isinstance(flight.message, Start)
        if is_start:
            self._move(Phase.STREAMING)
        return [Acknowledged(ack, flight.message.TYPE, replayed=is_start and conn.replay), *self._adopt()]

    def _resolve(self, generation: int) -> tuple[int, ...]:
        done = tuple(i.intent_id for i in self._intents if i.generation <= generation)
        if done:
            self._intents = [i for i in self._intents if i.generation > generation]
        return done

    def _on_decision(self, conn: _Connection, message: Decision) -> list[ClientEvent]:
        if message.state_version > conn.acked_version:
            raise RemoteProtocolError(
                f"decision covers version {message.state_version} but only "
                f"{conn.acked_version} was acknowledged: an ack precedes any decision "
                "covering it",
                code="decision_before_ack",
                field="state_version",
            )
        result = DecisionResult.from_message(message)
        self.last_decision = result
        conn.decided_version = message.state_version
        conn.recycle_at = None
        generation = conn.version_generation.get(message.state_version, -1)
        for version in [v for v in conn.version_generation if v < message.state_version]:
            del conn.version_generation[version]
        if conn.decide_outstanding is not None and message.state_version >= conn.decide_outstanding:
            conn.decide_outstanding = None
        conn.drain = False
        intents = self._resolve(generation)
        self._settled_generation = max(self._settled_generation, generation)
        self._decision_generation = generation
        return [DecisionReceived(result, current=generation == self._generation, intents=intents)]

    def _on_error(self, conn: _Connection, error: Error, now: float) -> list[ClientEvent]:
        flight = conn.in_flight
        if error.http_status is not None and error.event_id is None:
            return self._on_decide_failure(conn, error, now)
        if flight is not None and error.event_id == flight.message.event_id and not error.fatal:
            conn.in_flight = None
            if error.code in _RETRYABLE_REJECTIONS:
                delay = error.retry.retry_after_ms
                delay_s = min(
                    (DEFAULT_REJECTION_RETRY_MS if delay is None else delay) / 1000, MAX_SERVER_DELAY_S
                )
                conn.blocked_until = now + delay_s
                if error.code == "too_many_pending_events" and self.decision_mode == "on_request":
                    conn.drain = True
                # the caller may have returned to the acknowledged state meanwhile
                return [MutationRejected(error), *self._adopt()]
            self._stream_failure = error
            self._move(Phase.FAILED)
            return [StreamFailed(error)]
        if error.event_id is None and error.code in ("stale_state_version", "shutting_down"):
            conn.decide_outstanding = None
            if error.code == "shutting_down":
                conn.blocked_until = math.inf
            return [ServerError(error)]
        if (
            error.event_id is None
            and not error.fatal
            and error.code in ("decide_not_allowed", "start_required")
        ):
            self._stream_failure = error
            self._move(Phase.FAILED)
            return [StreamFailed(error)]
        return [ServerError(error)]

    def _on_decide_failure(self, conn: _Connection, error: Error, now: float) -> list[ClientEvent]:
        assert error.http_status is not None
        conn.drain = False
        if self.decision_mode == "on_request":
            conn.decide_outstanding = None
            failed = tuple(i.intent_id for i in self._intents)
            self._intents = []
            return [DecisionFailed(error, failed)]
        retry = classify_decide_failure(error.http_status, error.envelope, error.retry)
        if error.fatal:
            return [DecisionFailed(error, ())]  # goodbye and close follow; the next connection replays
        if retry is DecideRetry.CLIENT:
            # nobody retries it on this connection: replay on a new one after the server's delay
            delay = error.retry.retry_after_ms
            conn.recycle_at = now + min(
                (DEFAULT_REJECTION_RETRY_MS if delay is None else delay) / 1000, MAX_SERVER_DELAY_S
            )
        elif retry is DecideRetry.NONE:
            # the gateway will not dispatch this state again: it is settled, with this failure
            generation = conn.version_generation.get(error.state_version or 0, -1)
            self._settled_generation = max(self._settled_generation, generation)
            self._failure_generation, self._final_failure = generation, error
        return [DecisionFailed(error, ())]

    # ------------------------------------------------------------------ output

    def _wanted(self, conn: _Connection) -> tuple[ClientMessage | None, bool]:
        """The next mutation or ``decide`` the session would send, ignoring time: (message, is_mutation).

        The single answer behind :meth:`outgoing` and :meth:`next_wakeup`.
        """
        if self.phase not in (Phase.STARTING, Phase.STREAMING) or conn.in_flight is not None:
            return None, False
        on_change = self.decision_mode == "on_change"
        decide_possible = (
            not on_change
            and not self.dispatch_held
            and conn.decide_outstanding is None
            and self.phase is Phase.STREAMING
            and conn.blocked_until != math.inf
        )
        if decide_possible and conn.drain:
            # the gateway holds too many undispatched events: a decide freezes them, then the
            # rejected mutation fits (WIRE.md §8)
            return Decide(conn.acked_version), False
        if not (on_change and self.dispatch_held):
            mutation = self._plan(conn)
            if mutation is not None:
                return mutation, True
        if (
            decide_possible
            and self._intents
            and conn.acked_generation >= min(i.generation for i in self._intents)
        ):
            return Decide(conn.acked_version), False
        return None, False

    def _ready_at(self, conn: _Connection, is_mutation: bool, now: float) -> float:
        """When a message of that kind may be written under the buckets (and, for a mutation, the
        delay of the last rejection)."""
        assert conn.event_bucket is not None and conn.message_bucket is not None
        at = max(now, now + conn.message_bucket.delay(now))
        if is_mutation:
            at = max(at, conn.blocked_until, now + conn.event_bucket.delay(now))
        return at

    def outgoing(self, now: float) -> list[ClientMessage]:
        """The messages to write now, in order (pongs first)."""
        conn = self._conn
        if conn is None:
            return []
        out: list[ClientMessage] = []
        if conn.pongs:
            for pong in conn.pongs:
                if conn.message_bucket is not None:
                    conn.message_bucket.try_take(now)
                out.append(pong)
            conn.pongs = []
        message, is_mutation = self._wanted(conn)
        if message is None or self._ready_at(conn, is_mutation, now) > now:
            return out
        # what can start a dispatch at the gateway: on_change every mutation, on_request a decide
        starts_dispatch = is_mutation == (self.decision_mode == "on_change")
        if starts_dispatch and not self._may_dispatch(message):
            return out
        assert conn.event_bucket is not None and conn.message_bucket is not None
        conn.message_bucket.try_take(now)
        if is_mutation:
            conn.event_bucket.try_take(now)
            conn.in_flight = _InFlightMutation(message, self._desired, self._generation)  # type: ignore[arg-type]
        else:
            assert isinstance(message, Decide)
            conn.decide_outstanding = message.state_version
            conn.drain = False
        out.append(message)
        return out

    def _plan(self, conn: _Connection) -> Mutation | None:
        if self.phase is Phase.STARTING:
            return Start(
                event_id(1),
                self.request,
                self._desired.state,
                self.decision_mode,
                self._desired.attachments,
                self.min_interval_ms,
                self._desired_key,
            )
        if conn.acked_generation == self._generation:
            return None
        assert conn.acked is not None
        mutation = plan_mutation(
            conn.acked,
            self._desired,
            event_id=event_id(conn.acked_version + 1),
            idempotency_key=self._desired_key,
        )
        if mutation is None:  # unreachable: every path that makes them equal adopts at once
            raise AssertionError("desired state equals the acknowledged one but was not adopted")
        return mutation

    def next_wakeup(self, now: float) -> float | None:
        """When :meth:`outgoing` may have something new to send without any input, or ``None``.

        Also the time :meth:`recycle_due` becomes true. Never ``<= now`` unless :meth:`outgoing`
        (or :meth:`recycle_due`) has something to do now.
        """
        conn = self._conn
        if conn is None:
            return None
        times = []
        if conn.recycle_at is not None:
            times.append(conn.recycle_at)
        if conn.pongs:
            times.append(now)
        message, is_mutation = self._wanted(conn)
        if message is not None:
            times.append(self._ready_at(conn, is_mutation, now))
        return min(times) if times else None

    def data_to_send(self, now: float) -> list[str]:
        """:meth:`outgoing`, encoded as text frames."""
        return [encode_message(m) for m in self.outgoing(now)]


def _check_json(value: Any, field: str) -> None:
    try:
        json_size(value)
    except (TypeError, ValueError) as exc:
        reason = "text that is not valid Unicode" if isinstance(exc, UnicodeEncodeError) else str(exc)
        raise LocalProtocolError(
            f"{field} is not JSON-serialisable: {reason}", code="invalid_state", field=field
        ) from None
