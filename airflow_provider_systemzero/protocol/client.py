"""The client side of a System Zero stream, as a pure state machine (WIRE.md §3–8).

:class:`ClientSession` outlives connections. It holds the caller's *desired* state and turns it
into the next mutations; per connection it tracks event IDs, acknowledgements, pings and decide
intents, and after a reconnect it produces the replay: a ``start`` carrying the full desired
state with the same per-state key and a byte-identical request, then only the mutations the
replay lacked.

The I/O adapter drives it:

* :meth:`~ClientSession.connection_opened` / :meth:`~ClientSession.connection_lost`;
* :meth:`~ClientSession.receive_text` for each frame → a list of events;
* :meth:`~ClientSession.outgoing` after every input and at :meth:`~ClientSession.next_wakeup` →
  the messages to write now, paced under the gateway's event and message buckets so that fast
  local changes coalesce into the next mutation instead of being rejected.

Caller changes (:meth:`~ClientSession.append_text` …) are validated before they touch the desired
state: an invalid change raises :class:`LocalProtocolError` and changes nothing.

Design choices beyond the wire contract: at most one mutation is in flight (the next is planned
from the acknowledged state when its ack arrives, so a rejection never cascades into
out-of-sequence errors and dense changes coalesce naturally), and per-state keys can be derived
from a namespace and the hash of the decide body so the same state always carries the same key.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from airflow_provider_systemzero.protocol.body import json_size
from airflow_provider_systemzero.protocol.errors import LocalProtocolError, RemoteProtocolError
from airflow_provider_systemzero.protocol.gateway import DecideFailure, is_automatically_retryable
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
from airflow_provider_systemzero.protocol.reply import DecisionResult
from airflow_provider_systemzero.protocol.state import StreamState, plan_mutation
from airflow_provider_systemzero.protocol.validation import (
    validate_decision_mode,
    validate_idempotency_key,
    validate_min_interval_ms,
    validate_state,
)

__all__ = [
    "Acknowledged",
    "ClientEvent",
    "ClientSession",
    "DecisionFailed",
    "DecisionReceived",
    "GoodbyeReceived",
    "HelloReceived",
    "MutationRejected",
    "ServerError",
    "StreamFailed",
    "derive_state_key",
]

#: A placeholder ``stream_id`` of the right length, to predict body sizes before ``hello``.
_STREAM_ID_PLACEHOLDER = "szws_" + "0" * 32
#: Rejections after which the same mutation may be sent again later.
_RETRYABLE_REJECTIONS = frozenset({"event_rate_limited", "too_many_pending_events", "shutting_down"})
#: Margin under the gateway's buckets (loopback and network jitter can compress intervals).
_PACING_RATE_FACTOR = 0.9


def derive_state_key(namespace: str, body: str) -> str:
    """The per-state idempotency key for a decide body: ``<namespace>:<sha256 of the body>``.

    The same state (same body) always gets the same key, and a different state a different key,
    so a replay is billed once and a changed state never reuses a key (HTTP 422).

    :param namespace: a stable prefix (printable ASCII, at most 190 characters).
    :param body: the synthesized decide body.
    """
    return f"{namespace}:{hashlib.sha256(body.encode('utf-8')).hexdigest()}"


# ---------------------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class HelloReceived:
    """The gateway said ``hello``; its limits now apply."""

    hello: Hello


@dataclass(frozen=True, slots=True)
class Acknowledged:
    """A mutation (``start`` included) was accepted; ``replayed`` for a reconnect's ``start``."""

    ack: Ack
    message_type: str
    replayed: bool = False


@dataclass(frozen=True, slots=True)
class DecisionReceived:
    """A decision arrived.

    :param result: the typed decision.
    :param current: it covers the complete desired state (nothing newer was asked for locally).
    :param intents: the decide intents it resolves.
    """

    result: DecisionResult
    current: bool
    intents: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class DecisionFailed:
    """A dispatch failed (``error`` with an HTTP status).

    :param error: the error message (envelope, retry hint, ``fatal``).
    :param intents: the on_request intents it fails (empty for on_change: the gateway retries).
    """

    error: Error
    intents: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class MutationRejected:
    """A mutation was rejected for a passing reason (rate, pending events); it is sent again later."""

    error: Error


@dataclass(frozen=True, slots=True)
class ServerError:
    """Any other ``error`` the session absorbed (a stale decide it re-sends, a fatal error before a close)."""

    error: Error


@dataclass(frozen=True, slots=True)
class StreamFailed:
    """The desired state cannot be streamed (a non-retryable rejection): the caller must be told."""

    error: Error


@dataclass(frozen=True, slots=True)
class GoodbyeReceived:
    """The gateway will close; reconnect after at least ``goodbye.retry_after_ms``."""

    goodbye: Goodbye


ClientEvent: TypeAlias = (HelloReceived | Acknowledged | DecisionReceived | DecisionFailed | MutationRejected
                          | ServerError | StreamFailed | GoodbyeReceived)


@dataclass(slots=True)
class _InFlightMutation:
    message: Mutation
    result: StreamState
    key: str | None
    generation: int


@dataclass(slots=True)
class _Intent:
    intent_id: int
    generation: int


@dataclass(slots=True)
class _Connection:
    """Everything that is forgotten when a connection ends."""

    hello: Hello | None = None
    started: bool = False
    acked: StreamState | None = None
    acked_version: int = 0
    acked_generation: int = -1
    in_flight: _InFlightMutation | None = None
    decide_outstanding: int | None = None
    blocked_until: float = 0.0
    last_receipt: float = 0.0
    event_bucket: TokenBucket | None = None
    message_bucket: TokenBucket | None = None
    pongs: list[Pong] = field(default_factory=list)
    version_generation: dict[int, int] = field(default_factory=dict)
    replay: bool = False


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

    def __init__(self, *, request: StreamRequest, state: Any, decision_mode: str,
                 attachments: Sequence[Attachment] = (), min_interval_ms: int | None = None,
                 idempotency_key: str | None = None, key_namespace: str | None = None,
                 limits: Limits | None = None) -> None:
        request.validate()
        self.request = request
        self.decision_mode = validate_decision_mode(decision_mode)
        self.min_interval_ms = validate_min_interval_ms(min_interval_ms)
        if key_namespace is not None:
            validate_idempotency_key(key_namespace, field="key_namespace")
            if len(key_namespace) > 190:
                raise LocalProtocolError("key_namespace is longer than 190 characters: derived keys must stay within "
                                         "255 characters", code="invalid_idempotency_key", field="key_namespace")
        self.key_namespace = key_namespace
        self.limits = limits or Limits()
        self._desired = StreamState(None, ())
        self._desired_key: str | None = None
        self._generation = 0
        self._intents: list[_Intent] = []
        self._intent_ids = 0
        # survive connection loss: the newest generation any connection acknowledged, and (on_change)
        # the newest generation a decision or a final failure settled
        self._acked_generation = -1
        self._settled_generation = -1
        self._decision_generation = -1
        self._conn: _Connection | None = None
        self.last_decision: DecisionResult | None = None
        self.stream_id: str | None = None
        self.connections = 0
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
        self._set_desired(StreamState(state, attachments), idempotency_key, field="state")
        self._generation = 0

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
        return bool(conn and conn.started and conn.in_flight is None and conn.acked_generation == self._generation)

    def desired_body(self, stream_id: str | None = None) -> str:
        """The synthesized decide body of the desired state."""
        return self.request.decide_body(self._desired.state, self._desired.attachments,
                                        stream_id=stream_id or self.stream_id or _STREAM_ID_PLACEHOLDER)

    def _set_desired(self, new: StreamState, key: str | None, *, field: str) -> None:
        body = self.request.decide_body(new.state, new.attachments,
                                        stream_id=self.stream_id or _STREAM_ID_PLACEHOLDER)
        size = len(body.encode("utf-8"))
        if size > self.limits.max_decide_body_bytes:
            raise LocalProtocolError(
                f"{field} would make the decide body {size} bytes: the synthesized body may not exceed "
                f"max_decide_body_bytes ({self.limits.max_decide_body_bytes}); nothing was changed",
                code="decide_body_too_large", field=field)
        start_size = size + self._start_overhead()
        if start_size > self.limits.max_message_bytes:
            raise LocalProtocolError(
                f"{field} would make the replay start message {start_size} bytes: messages may not exceed "
                f"max_message_bytes ({self.limits.max_message_bytes}); nothing was changed",
                code="message_too_large", field=field)
        if key is not None:
            key = validate_idempotency_key(key)
        elif self.key_namespace is not None:
            key = derive_state_key(self.key_namespace, body)
        self._desired = new
        self._desired_key = key
        self._generation += 1

    def _start_overhead(self) -> int:
        """Bytes a replayed ``start`` (with the longest key) adds to the decide body of the same state.

        State and attachments appear once in each, framed the same way, so the difference depends
        only on the request: it is measured once on an empty state instead of encoding the whole
        state a second time on every change.
        """
        stream_id = self.stream_id or _STREAM_ID_PLACEHOLDER
        if self._start_overhead_for is None or self._start_overhead_for[0] != stream_id:
            start = json_size(Start(event_id(1), self.request, "", self.decision_mode, (), self.min_interval_ms,
                                    "k" * 255).to_dict())
            body = len(self.request.decide_body("", (), stream_id=stream_id).encode("utf-8"))
            self._start_overhead_for = (stream_id, start - body)
        return self._start_overhead_for[1]

    def append_text(self, text: str, *, idempotency_key: str | None = None) -> None:
        """Append ``text`` to a string state.

        :raises LocalProtocolError: the state is not a string, ``text`` is not a string, the key is
            invalid or the state would grow past the body limit; nothing changes.
        """
        if not isinstance(text, str):
            raise LocalProtocolError(f"text must be a string, got {type(text).__name__}", code="invalid_text",
                                     field="text")
        if not isinstance(self._desired.state, str):
            raise LocalProtocolError("append_text needs a string state: use append_items for an array or replace "
                                     "for an object", code="state_type_mismatch", field="text")
        if not text:
            return
        self._set_desired(StreamState(self._desired.state + text, self._desired.attachments), idempotency_key,
                          field="text")

    def append_items(self, items: Sequence[Any], *, idempotency_key: str | None = None) -> None:
        """Append complete values to an array state.

        :raises LocalProtocolError: the state is not an array, ``items`` is empty or not JSON, the
            key is invalid or the state would grow past the body limit; nothing changes.
        """
        if isinstance(items, str | bytes) or not isinstance(items, Sequence):
            raise LocalProtocolError("items must be a list of JSON values", code="invalid_items", field="items")
        if not isinstance(self._desired.state, list):
            raise LocalProtocolError("append_items needs an array state: use append_text for a string or replace "
                                     "for an object", code="state_type_mismatch", field="items")
        if not items:
            raise LocalProtocolError("items must not be empty: append at least one item", code="empty_items",
                                     field="items")
        _check_json(list(items), "items")
        self._set_desired(StreamState([*self._desired.state, *items], self._desired.attachments), idempotency_key,
                          field="items")

    def replace(self, state: Any, *, attachments: Sequence[Attachment] | None = None,
                idempotency_key: str | None = None) -> None:
        """Replace the complete state (and the attachments, when given; ``[]`` removes all).

        :raises LocalProtocolError: the state is not a string/array/object or not JSON, an
            attachment is invalid, or the body would be too large; nothing changes.
        """
        validate_state(state, field="state")
        _check_json(state, "state")
        new_attachments = self._desired.attachments
        if attachments is not None:
            new_attachments = tuple(attachments)
            validate_attachment_tuple(new_attachments, field="attachments")
        self._set_desired(StreamState(state, new_attachments), idempotency_key, field="state")

    def append_attachments(self, attachments: Sequence[Attachment], *, idempotency_key: str | None = None) -> None:
        """Add inline attachments; the state is unchanged.

        :raises LocalProtocolError: empty list, invalid or duplicate names, invalid data URLs;
            nothing changes.
        """
        new = tuple(attachments)
        validate_attachment_tuple(new, field="attachments", existing=self._desired.attachments, allow_empty=False)
        self._set_desired(StreamState(self._desired.state, (*self._desired.attachments, *new)), idempotency_key,
                          field="attachments")

    def set_desired(self, state: Any, *, idempotency_key: str | None = None) -> None:
        """Make ``state`` the desired state (a reconciling source); the minimal mutation is planned.

        Unlike :meth:`replace`, nothing happens when the state is unchanged.
        """
        if StreamState(state, self._desired.attachments) == self._desired:
            return
        self.replace(state, idempotency_key=idempotency_key)

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
        if self._stream_failure is not None:
            return False
        conn = self._conn
        if conn is not None and not conn.started:
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
        self.connections += 1
        self._conn = _Connection(last_receipt=now, replay=self.connections > 1)
        self.server_delay_ms = None

    def connection_lost(self) -> None:
        """The connection ended; everything not acknowledged stays desired and is replayed."""
        self._conn = None

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
        if conn.hello is None:
            if not isinstance(message, Hello):
                raise RemoteProtocolError(f"the first server message must be hello, got {message.TYPE}",
                                          code="hello_expected", field="type")
            if message.protocol != PROTOCOL:
                raise RemoteProtocolError(f"hello.protocol {message.protocol!r} is not {PROTOCOL!r}",
                                          code="unsupported_protocol", field="protocol")
            conn.hello = message
            self.limits = message.limits
            self.stream_id = message.stream_id
            lim = message.limits
            conn.event_bucket = TokenBucket(max(0.1, lim.max_events_per_second * _PACING_RATE_FACTOR),
                                            max(1, lim.event_burst - 1), now)
            conn.message_bucket = TokenBucket(max(0.1, lim.max_messages_per_second * _PACING_RATE_FACTOR),
                                              max(1, lim.message_burst - 2), now)
            return [HelloReceived(message)]
        if isinstance(message, Hello):
            raise RemoteProtocolError("a second hello on one connection", code="unexpected_hello", field="type")
        if isinstance(message, Ping):
            conn.pongs.append(Pong(message.nonce))
            # a gateway keeps at most max_pending_probes pings unanswered: older ones are moot (a flood stays bounded)
            del conn.pongs[:-max(1, self.limits.max_pending_probes)]
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
        return [GoodbyeReceived(message)]

    def _on_ack(self, conn: _Connection, ack: Ack) -> list[ClientEvent]:
        flight = conn.in_flight
        if flight is None or ack.event_id != flight.message.event_id:
            expected = flight.message.event_id if flight else None
            raise RemoteProtocolError(f"ack for {ack.event_id!r} but the mutation in flight is {expected!r}",
                                      code="unexpected_ack", field="event_id")
        number = event_number(ack.event_id)
        if ack.state_version != number:
            raise RemoteProtocolError(f"ack.state_version {ack.state_version} does not match {ack.event_id!r}: "
                                      "each accepted mutation increments state_version once",
                                      code="invalid_ack", field="state_version")
        conn.in_flight = None
        conn.acked = flight.result
        conn.acked_version = ack.state_version
        conn.acked_generation = flight.generation
        conn.version_generation[ack.state_version] = flight.generation
        self._acked_generation = max(self._acked_generation, flight.generation)
        is_start = isinstance(flight.message, Start)
        if is_start:
            conn.started = True
        return [Acknowledged(ack, flight.message.TYPE, replayed=is_start and conn.replay)]

    def _resolve(self, generation: int) -> tuple[int, ...]:
        done = tuple(i.intent_id for i in self._intents if i.generation <= generation)
        if done:
            self._intents = [i for i in self._intents if i.generation > generation]
        return done

    def _on_decision(self, conn: _Connection, message: Decision) -> list[ClientEvent]:
        if message.state_version > conn.acked_version:
            raise RemoteProtocolError(f"decision covers version {message.state_version} but only "
                                      f"{conn.acked_version} was acknowledged: an ack precedes any decision "
                                      "covering it", code="decision_before_ack", field="state_version")
        result = DecisionResult.from_message(message, self.request.questions)
        self.last_decision = result
        generation = conn.version_generation.get(message.state_version, -1)
        for version in [v for v in conn.version_generation if v < message.state_version]:
            del conn.version_generation[version]
        if conn.decide_outstanding is not None and message.state_version >= conn.decide_outstanding:
            conn.decide_outstanding = None
        intents = self._resolve(generation)
        self._settled_generation = max(self._settled_generation, generation)
        self._decision_generation = generation
        return [DecisionReceived(result, current=generation == self._generation, intents=intents)]

    def _on_error(self, conn: _Connection, error: Error, now: float) -> list[ClientEvent]:
        flight = conn.in_flight
        if error.http_status is not None and error.event_id is None:
            # a failed dispatch
            if self.decision_mode == "on_request":
                conn.decide_outstanding = None
                failed = tuple(i.intent_id for i in self._intents)
                self._intents = []
                return [DecisionFailed(error, failed)]
            if not error.fatal and not is_automatically_retryable(
                    DecideFailure(error.http_status, error.envelope, error.retry, error.request_id)):
                # the gateway will not retry this state: it is settled until the next change
                generation = conn.version_generation.get(error.state_version or 0, -1)
                self._settled_generation = max(self._settled_generation, generation)
            return [DecisionFailed(error, ())]
        if flight is not None and error.event_id == flight.message.event_id and not error.fatal:
            conn.in_flight = None
            if error.code in _RETRYABLE_REJECTIONS:
                delay = error.retry.retry_after_ms
                conn.blocked_until = now + (1000 if delay is None else delay) / 1000
                return [MutationRejected(error)]
            self._stream_failure = error
            return [StreamFailed(error)]
        if error.event_id is None and error.code in ("stale_state_version", "shutting_down"):
            conn.decide_outstanding = None
            if error.code == "shutting_down":
                conn.blocked_until = math.inf
            return [ServerError(error)]
        if error.event_id is None and not error.fatal and error.code in ("decide_not_allowed", "start_required"):
            self._stream_failure = error
            return [StreamFailed(error)]
        return [ServerError(error)]

    # ------------------------------------------------------------------ output

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
        if conn.hello is None or self._stream_failure is not None:
            return out
        assert conn.event_bucket is not None and conn.message_bucket is not None
        on_change = self.decision_mode == "on_change"
        if conn.in_flight is None and now >= conn.blocked_until and not (on_change and self.dispatch_held):
            message = self._plan(conn)
            if message is not None and self._take_tokens(conn, now, mutation=True) \
                    and (not on_change or self._may_dispatch(message)):
                conn.in_flight = _InFlightMutation(message, self._desired, self._desired_key, self._generation)
                out.append(message)
        if not on_change and self._intents and conn.decide_outstanding is None and not self.dispatch_held \
                and conn.in_flight is None and conn.started and now >= conn.blocked_until \
                and conn.acked_generation >= min(i.generation for i in self._intents) \
                and self._take_tokens(conn, now, mutation=False):
            decide = Decide(conn.acked_version)
            if self._may_dispatch(decide):
                conn.decide_outstanding = conn.acked_version
                out.append(decide)
        return out

    def _plan(self, conn: _Connection) -> Mutation | None:
        if not conn.started:
            return Start(event_id(1), self.request, self._desired.state, self.decision_mode,
                         self._desired.attachments, self.min_interval_ms, self._desired_key)
        assert conn.acked is not None
        if conn.acked_generation == self._generation:
            return None
        return plan_mutation(conn.acked, self._desired, event_id=event_id(conn.acked_version + 1),
                             idempotency_key=self._desired_key)

    def _take_tokens(self, conn: _Connection, now: float, *, mutation: bool) -> bool:
        assert conn.event_bucket is not None and conn.message_bucket is not None
        if conn.message_bucket.tokens(now) < 1 or (mutation and conn.event_bucket.tokens(now) < 1):
            return False
        conn.message_bucket.try_take(now)
        if mutation:
            conn.event_bucket.try_take(now)
        return True

    def next_wakeup(self, now: float) -> float | None:
        """When :meth:`outgoing` may have something new to send without any input, or ``None``."""
        conn = self._conn
        if conn is None or conn.hello is None or conn.in_flight is not None or self._stream_failure is not None:
            return None
        assert conn.event_bucket is not None and conn.message_bucket is not None
        held = self.dispatch_held
        on_change = self.decision_mode == "on_change"
        wants_mutation = (not conn.started or conn.acked_generation != self._generation) and not (on_change and held)
        wants_decide = (not on_change and bool(self._intents) and not held
                        and conn.decide_outstanding is None and conn.started)
        if not (wants_mutation or wants_decide):
            return None
        at = max(now, conn.blocked_until)
        at = max(at, now + conn.message_bucket.delay(now))
        if wants_mutation:
            at = max(at, now + conn.event_bucket.delay(now))
        return at

    def data_to_send(self, now: float) -> list[str]:
        """:meth:`outgoing`, encoded as text frames."""
        return [encode_message(m) for m in self.outgoing(now)]


def _check_json(value: Any, field: str) -> None:
    try:
        json_size(value)
    except (TypeError, ValueError) as exc:
        raise LocalProtocolError(f"{field} is not JSON-serialisable: {exc}", code="invalid_state",
                                 field=field) from None
