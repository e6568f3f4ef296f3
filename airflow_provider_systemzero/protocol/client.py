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
  replayed on a new one (a decide failure the gateway will not retry on this connection);
* :attr:`~ClientSession.admission_wanted` (a session made with ``admission=True``): before it
  writes what can start a dispatch at the gateway, the session stops and asks (an
  :class:`~.client_events.AdmissionWanted`); the adapter answers :meth:`~ClientSession.admit`
  and, when a refusal no longer holds, :meth:`~ClientSession.retry_admission` — as h11 hands its
  caller an event to act on rather than calling out.

One function, :meth:`~ClientSession._wanted`, answers "what would be sent next, and from when";
``outgoing`` sends it when its time has come and ``next_wakeup`` reports that time, so the two
cannot disagree. The liveness invariant follows: whenever the client is connected it either has
something to send now, waits for a timer, waits for the gateway (an ack, a decision), or is in
sync with nothing wanted — never "due now" with nothing to send.

What each server message does is the session's input half, :mod:`.client_input`; the
per-connection bookkeeping is :class:`~.connection_state.ConnectionState`'s.

Caller changes (:meth:`~ClientSession.append_text` …) are validated before they touch the desired
state: an invalid change raises :class:`LocalProtocolError` and changes nothing. What is accepted
is a snapshot: mutating the caller's list or dict afterwards changes nothing here.

Design choices beyond the wire contract: at most one mutation is in flight (the next is planned
from the acknowledged state when its ack arrives, so a rejection never cascades into
out-of-sequence errors and dense changes coalesce naturally), and per-state keys can be derived
from a namespace and the hash of the decide body so the same state always carries the same key.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from airflow_provider_systemzero.protocol.client_events import (
    Acknowledged,
    AdmissionWanted,
    ClientEvent,
    DecisionFailedEvent,
    DecisionReceived,
    GoodbyeReceived,
    HelloReceived,
    MutationRejected,
    ServerError,
    StreamFailed,
)
from airflow_provider_systemzero.protocol.client_input import SessionInput
from airflow_provider_systemzero.protocol.connection_state import (
    TRANSITIONS,
    ConnectionState,
    InFlightMutation,
    Phase,
    check_hello,
)
from airflow_provider_systemzero.protocol.desired import Change, DesiredState
from airflow_provider_systemzero.protocol.errors import LocalProtocolError
from airflow_provider_systemzero.protocol.limits import DOCUMENT_LIMITS, Limits
from airflow_provider_systemzero.protocol.messages import (
    Attachment,
    ClientMessage,
    Decide,
    Error,
    Mutation,
    StreamRequest,
    encode_message,
)
from airflow_provider_systemzero.protocol.outcomes import Outcomes
from airflow_provider_systemzero.protocol.reply import DecisionResult
from airflow_provider_systemzero.protocol.validation import (
    validate_decision_mode,
    validate_min_interval_ms,
)

__all__ = [
    "TRANSITIONS",
    "Acknowledged",
    "AdmissionWanted",
    "ClientEvent",
    "ClientSession",
    "DecisionFailedEvent",
    "DecisionReceived",
    "GoodbyeReceived",
    "HelloReceived",
    "MutationRejected",
    "Phase",
    "ServerError",
    "StreamFailed",
    "check_hello",
]


class ClientSession(SessionInput):
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
        :func:`derive_state_key` of its resulting body (the request must then name its
        ``prompt_cache_key``).
    :param limits: limits to assume before ``hello`` (the public document's by default).
    :param admission: ask before writing what can start a dispatch at the gateway (on_change every
        mutation, ``start`` included; on_request a ``decide``): the session stops there and says
        so in :attr:`admission_wanted` until :meth:`admit` answers. ``False``: everything is written.
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
        admission: bool = False,
    ) -> None:
        request.validate()
        if key_namespace is not None and request.prompt_cache_key is None:
            # "If start omits prompt_cache_key, the server uses stream_id": each connection's body
            # would differ, and a replay would send the same derived key with another body
            raise LocalProtocolError(
                "derived idempotency keys (key_namespace) need an explicit prompt_cache_key: "
                "without one the gateway uses each connection's stream_id, so a replay would name "
                "another decide body with the same key (422 idempotency_key_reused); pass a stable "
                "prompt_cache_key",
                code="prompt_cache_key_required",
                field="prompt_cache_key",
            )
        #: The fixed request parts.
        self.request = request
        self.decision_mode = validate_decision_mode(decision_mode)
        self.min_interval_ms = validate_min_interval_ms(min_interval_ms)
        self.key_namespace = key_namespace
        #: The limits in force: the public document's until ``hello``, then the gateway's.
        self.limits = limits or DOCUMENT_LIMITS
        #: Where the session is (see :class:`Phase`).
        self.phase = Phase.DISCONNECTED
        #: What the caller wants, its key and generation (see :class:`DesiredState`).
        self.desired = DesiredState(request, self.decision_mode, self.min_interval_ms, key_namespace)
        #: Who waits for a decision, and what has been decided (see :class:`Outcomes`).
        self.outcomes = Outcomes()
        self._conn: ConnectionState | None = None
        #: The current (or last) connection's ``stream_id``.
        self.stream_id: str | None = None
        #: Connections opened so far.
        self.connections = 0
        #: The longest delay a ``goodbye`` or a fatal ``error`` of this connection named before the
        #: next one, in ms, counted from the end of the connection (``None``: none named).
        self.server_delay_ms: int | None = None
        #: No new connection before this time: the end of the longest retry delay another error
        #: named (a decide failure the gateway retries after it, a rejected change), counted from
        #: its arrival; it outlives the connection.
        self.retry_not_before = 0.0
        self._stream_failure: Error | None = None
        #: Whether a message that can start a dispatch waits for the adapter's answer (the parameter).
        self.admission = admission
        #: The message the session asked about and waits for :meth:`admit` to answer (set by
        #: :meth:`outgoing`; cleared by the answer and by the connection's end).
        self._asking: ClientMessage | None = None
        #: The message :meth:`admit` let through, written by the next :meth:`outgoing` that plans it
        #: (cleared then, and by the connection's end).
        self._admitted: ClientMessage | None = None
        #: A refusal holds: on_change no mutation is written, on_request no ``decide``, until
        #: :meth:`retry_admission` (or, on_request, until no intent waits: :meth:`cancel_intent`).
        self._held = False
        self.desired.accept(
            self.desired.with_state(state, tuple(attachments)),
            idempotency_key,
            field="state",
            limits=self.limits,
            stream_id=None,
        )

    def _move(self, phase: Phase) -> None:
        if phase is not self.phase and phase not in TRANSITIONS[self.phase]:
            raise RuntimeError(f"illegal client phase change {self.phase.value} -> {phase.value}")
        self.phase = phase

    # ------------------------------------------------------------------ desired state

    @property
    def desired_state(self) -> Any:
        """The state the caller wants the gateway to have."""
        return self.desired.current.state

    @property
    def desired_state_hash(self) -> str:
        """SHA-256 (hex) of :attr:`desired_state`'s canonical JSON, carried forward with each
        change (:meth:`~airflow_provider_systemzero.protocol.desired.DesiredState.state_hash`)."""
        return self.desired.state_hash()

    @property
    def desired_attachments(self) -> tuple[Attachment, ...]:
        """The attachments the caller wants."""
        return self.desired.current.attachments

    @property
    def desired_key(self) -> str | None:
        """The idempotency key naming the desired state."""
        return self.desired.key

    @property
    def generation(self) -> int:
        """Counts caller changes (0 for the initial state)."""
        return self.desired.generation

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
            and conn.acked_generation == self.desired.generation
        )

    def desired_body(self, stream_id: str | None = None) -> str:
        """The synthesized decide body of the desired state (built in full)."""
        return self.desired.body(stream_id or self.stream_id)

    def desired_body_bytes(self) -> int:
        """The size of :meth:`desired_body`, without building it."""
        return self.desired.body_bytes(self.stream_id)

    def _accept(self, change: Change | None, key: str | None, field: str) -> list[ClientEvent]:
        if change is None:
            return []
        self.desired.accept(change, key, field=field, limits=self.limits, stream_id=self.stream_id)
        return self._adopt()

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
            or conn.acked_generation == self.desired.generation
            or conn.acked is None
            or self.desired.current.attachments != conn.acked.attachments
            or not self.desired.current.same_state(conn.acked)
        ):
            return []
        previous, current = conn.acked_generation, self.desired.generation
        conn.acked_generation = current
        if conn.acked_version in conn.version_generation:
            conn.version_generation[conn.acked_version] = current
        decided_here = conn.decided_version == conn.acked_version
        intents = self.outcomes.adopt(previous, current, decided_here=decided_here)
        last = self.outcomes.last_decision
        if intents and last is not None:
            return [DecisionReceived(last, current=True, intents=intents, repeated=True)]
        inherited = self.outcomes.inherited_failure(current)
        if inherited is not None:
            # on_change: the state the caller returned to failed for good, and the gateway will
            # not dispatch it again: whoever waits hears that failure now, not after a timeout
            error, failed, report = inherited
            if failed or report:
                return [DecisionFailedEvent(error, failed, current=report, repeated=True)]
        return []

    def append_text(self, text: str, *, idempotency_key: str | None = None) -> list[ClientEvent]:
        """Append ``text`` to a string state.

        :returns: events the change settles at once (usually none).
        :raises LocalProtocolError: the state is not a string, ``text`` is not a string, the key is
            invalid or the state would grow past the body limit; nothing changes.
        """
        return self._accept(self.desired.with_text(text), idempotency_key, "text")

    def append_items(self, items: Sequence[Any], *, idempotency_key: str | None = None) -> list[ClientEvent]:
        """Append complete values to an array state.

        :returns: events the change settles at once (usually none).
        :raises LocalProtocolError: the state is not an array, ``items`` is empty or not JSON, the
            key is invalid or the state would grow past the body limit; nothing changes.
        """
        return self._accept(self.desired.with_items(items), idempotency_key, "items")

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
        return self._accept(self.desired.with_state(state, attachments), idempotency_key, "state")

    def append_attachments(
        self, attachments: Sequence[Attachment], *, idempotency_key: str | None = None
    ) -> list[ClientEvent]:
        """Add inline attachments; the state is unchanged.

        :returns: events the change settles at once (usually none).
        :raises LocalProtocolError: empty list, invalid or duplicate names, invalid data URLs;
            nothing changes.
        """
        return self._accept(self.desired.with_attachments(attachments), idempotency_key, "attachments")

    def set_desired(self, state: Any, *, idempotency_key: str | None = None) -> list[ClientEvent]:
        """Make ``state`` the desired state (a reconciling source); the minimal mutation is planned.

        Unlike :meth:`replace`, nothing happens when the state is unchanged — byte for byte as
        JSON: ``[1]`` and ``[true]`` are different states although Python calls them equal.
        """
        if self.desired.is_current(state, idempotency_key):
            return []
        return self.replace(state, idempotency_key=idempotency_key)

    # ------------------------------------------------------------------ decide intents

    def request_decision(self) -> int:
        """Ask for a decision covering the desired state as it is now; returns the intent ID.

        on_request: a ``decide`` is sent once the gateway acknowledged everything up to now.
        on_change: nothing is sent (every change schedules); the intent resolves with the first
        decision covering it.
        """
        return self.outcomes.request(self.desired.generation)

    def cancel_intent(self, intent_id: int) -> None:
        """Forget an intent (its waiter gave up). on_request: once none waits, a held ``decide``
        may be asked again (admission is decided anew)."""
        self.outcomes.cancel(intent_id)
        if not self.outcomes.intents and self.decision_mode == "on_request":
            self._held = False

    # ------------------------------------------------------------------ admission

    @property
    def admission_wanted(self) -> AdmissionWanted | None:
        """The session's open question, if it asked one: it would write this message, which can
        start a dispatch, and writes nothing more until :meth:`admit` answers."""
        asking = self._asking
        return None if asking is None else AdmissionWanted(asking)

    @property
    def admission_held(self) -> bool:
        """Whether the last answer was a refusal that still holds (see :meth:`retry_admission`)."""
        return self._held

    def admit(self, admitted: bool) -> None:
        """Answer :attr:`admission_wanted`.

        :param admitted: ``True``: the message is written by the next :meth:`outgoing` (and what
            follows it); ``False``: it is held — on_change no mutation is written, on_request no
            ``decide`` (mutations still are) — until :meth:`retry_admission`.
        :raises RuntimeError: no question is open (a bug of the adapter).
        """
        asking, self._asking = self._asking, None
        if asking is None:
            raise RuntimeError(
                "admit() answers the session's open question (admission_wanted), and none is open"
            )
        if admitted:
            self._admitted = asking
        else:
            self._held = True

    def retry_admission(self) -> None:
        """A refusal no longer holds (the caller's reason for it changed): the next message that
        can start a dispatch is asked about again."""
        self._held = False

    def _may_dispatch(self, message: ClientMessage) -> bool:
        """Whether ``message`` may be written now: without admission, always; else once the
        adapter admitted this very message (a newer plan is asked about anew)."""
        if not self.admission:
            return True
        if self._admitted is not None and self._admitted == message:
            self._admitted = None
            return True
        self._asking = message
        return False

    @property
    def current_decision(self) -> DecisionResult | None:
        """The last decision if it covers the desired state as it is now (no change since), else ``None``.

        on_change needs no new dispatch for such a state: a caller asking for its decision can
        have this one.
        """
        return self.outcomes.current_decision(self.desired.generation)

    @property
    def current_failure(self) -> Error | None:
        """on_change: the final failure of the desired state's dispatch, if nothing changed since.

        The gateway does not dispatch a state again after a non-retryable failure; a caller asking
        for this state's decision gets the failure at once instead of waiting for nothing.
        """
        return self.outcomes.current_failure(self.desired.generation)

    @property
    def last_decision(self) -> DecisionResult | None:
        """The last decision received, on any connection."""
        return self.outcomes.last_decision

    @property
    def pending_intents(self) -> int:
        """Intents not yet resolved."""
        return len(self.outcomes.intents)

    def has_work(self) -> bool:
        """Whether the session needs a connection: a change to send or a decision to wait for.

        Answered across connections: after a connection ends with everything acknowledged (and,
        on_change, decided), there is no work until the caller changes the state or asks for a
        decision — so a client can stay disconnected after an ``idle_timeout`` goodbye.
        """
        if self.outcomes.intents:
            return True
        if self.phase is Phase.FAILED:
            return False
        conn = self._conn
        if self.phase in (Phase.AWAITING_HELLO, Phase.STARTING):
            return True
        if conn is not None:
            synced = conn.in_flight is None and conn.acked_generation == self.desired.generation
        else:
            synced = self.outcomes.acked == self.desired.generation
        if not synced:
            return True
        return self.decision_mode == "on_change" and self.outcomes.settled < self.desired.generation

    # ------------------------------------------------------------------ connection lifecycle

    def connection_opened(self, now: float) -> None:
        """A WebSocket connection is open; wait for ``hello``."""
        if self.phase is Phase.FAILED:
            raise RuntimeError("the stream failed: no new connection")
        self._move(Phase.AWAITING_HELLO)
        self.connections += 1
        self._conn = ConnectionState(last_receipt=now, replay=self.connections > 1)
        self.server_delay_ms = None

    def connection_lost(self) -> None:
        """The connection ended; everything not acknowledged stays desired and is replayed (a
        question about admission is dropped with it: the next connection asks its own)."""
        self._conn = None
        self._asking = self._admitted = None
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

    def next_connection_delay_ms(self, now: float) -> int | None:
        """How long, from ``now`` (the end of a connection, or a failed opening), before the next
        connection: the longest of :attr:`server_delay_ms` and what is left of
        :attr:`retry_not_before`, in ms (``None``: the gateway named no delay)."""
        named = self.server_delay_ms if self._conn is not None else None
        left = self.retry_not_before - now
        if left <= 0:
            return named
        return max(named or 0, math.ceil(left * 1000))

    def recycle_due(self, now: float) -> bool:
        """Whether the session wants this connection closed and its state replayed on a new one
        (see :class:`~.connection_state.Recycle` for when; :attr:`recycle_reason` says why)."""
        plan = self._conn.recycle_plan() if self._conn is not None else None
        return plan is not None and now >= plan[0]

    @property
    def recycle_reason(self) -> str | None:
        """Why the session wants the connection recycled (a sentence for the log), if it does."""
        plan = self._conn.recycle_plan() if self._conn is not None else None
        return plan[1].value if plan is not None else None

    # ------------------------------------------------------------------ output

    def _wanted(self, conn: ConnectionState) -> tuple[ClientMessage | None, bool]:
        """The next mutation or ``decide`` the session would send, ignoring time: (message, is_mutation).

        The single answer behind :meth:`outgoing` and :meth:`next_wakeup`.
        """
        if self.phase not in (Phase.STARTING, Phase.STREAMING) or conn.in_flight is not None:
            return None, False
        on_change = self.decision_mode == "on_change"
        decide_possible = (
            not on_change
            and not self._held
            and conn.decide_outstanding is None
            and self.phase is Phase.STREAMING
            and conn.blocked_until != math.inf
        )
        if decide_possible and conn.drain:
            # the gateway holds too many undispatched events: a decide freezes them, then the
            # rejected mutation fits (WIRE.md §8)
            return Decide(conn.acked_version), False
        wanted = self.outcomes.oldest_wanted()
        if decide_possible and wanted is not None and conn.acked_generation >= wanted:
            # "send decide for the current accepted version": with nothing in flight, the
            # acknowledged version is the gateway's current one, and it holds what the caller
            # asked about. The decide goes before the next change, or a caller who keeps
            # changing the state faster than a round trip would never have it sent.
            return Decide(conn.acked_version), False
        if not (on_change and self._held):
            mutation = self._plan(conn)
            if mutation is not None:
                return mutation, True
        return None, False

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
        # at most a decide, then a mutation: each sets what stops the next _wanted from
        # answering the same (a decide outstanding, a mutation in flight)
        while True:
            message, is_mutation = self._wanted(conn)
            if message is None or conn.ready_at(is_mutation, now) > now:
                return out
            # what can start a dispatch at the gateway: on_change every mutation, on_request a decide
            starts_dispatch = is_mutation == (self.decision_mode == "on_change")
            if starts_dispatch and not self._may_dispatch(message):
                return out
            assert conn.event_bucket is not None and conn.message_bucket is not None
            conn.message_bucket.try_take(now)
            out.append(message)
            if is_mutation:
                conn.event_bucket.try_take(now)
                conn.in_flight = InFlightMutation(message, self.desired.current, self.desired.generation)  # type: ignore[arg-type]
                return out
            assert isinstance(message, Decide)
            conn.decide_outstanding = message.state_version
            conn.decide_read = False
            conn.drain = False

    def _plan(self, conn: ConnectionState) -> Mutation | None:
        if self.phase is Phase.STARTING:
            return self.desired.start()
        if conn.acked_generation == self.desired.generation:
            return None
        assert conn.acked is not None  # every path that makes them equal adopts at once
        return self.desired.mutation_from(conn.acked, conn.acked_version)

    def next_wakeup(self, now: float) -> float | None:
        """When :meth:`outgoing` may have something new to send without any input, or ``None``.

        Also the time :meth:`recycle_due` becomes true. Never ``<= now`` unless :meth:`outgoing`
        (or :meth:`recycle_due`) has something to do now.
        """
        conn = self._conn
        if conn is None:
            return None
        times = []
        if (plan := conn.recycle_plan()) is not None:
            times.append(plan[0])
        if conn.pongs:
            times.append(now)
        message, is_mutation = self._wanted(conn)
        if message is not None:
            times.append(conn.ready_at(is_mutation, now))
        return min(times) if times else None

    def data_to_send(self, now: float) -> list[str]:
        """:meth:`outgoing`, encoded as text frames."""
        return [encode_message(m) for m in self.outgoing(now)]
