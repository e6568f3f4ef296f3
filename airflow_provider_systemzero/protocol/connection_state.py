"""The phases of a client connection, the legal moves between them, and what a session keeps per connection.

:class:`~airflow_provider_systemzero.protocol.client.ClientSession` holds one
:class:`ConnectionState` while a WebSocket is open and drops it when the connection ends;
everything in it is about that connection alone, and so are its methods: the sequence check,
the pacing buckets set from ``hello``, and the bookkeeping of an ack, a decision and a
rejection. :data:`TRANSITIONS` is the whole phase graph: the session checks every move against it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_systemzero.protocol.errors import RemoteProtocolError
from airflow_provider_systemzero.protocol.messages import (
    PROTOCOL,
    Ack,
    Error,
    Hello,
    Mutation,
    Pong,
    event_number,
)
from airflow_provider_systemzero.protocol.ratelimit import TokenBucket
from airflow_provider_systemzero.protocol.state import StreamState

__all__ = ["TRANSITIONS", "ConnectionState", "InFlightMutation", "Phase", "Recycle", "check_hello"]

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
        raise RemoteProtocolError(
            f"the first server message must be hello, got {message.TYPE}", code="hello_expected", field="type"
        )
    if message.protocol != PROTOCOL:
        raise RemoteProtocolError(
            f"hello.protocol {message.protocol[:40]!r} is not {PROTOCOL!r}",
            code="unsupported_protocol",
            field="protocol",
        )
    return message


class Phase(enum.Enum):
    """Where a session is with its current connection."""

    #: No connection. :meth:`~.client.ClientSession.has_work` says whether one is needed.
    DISCONNECTED = "disconnected"
    #: The WebSocket is open; the gateway speaks first (``hello``). Nothing is sent but pongs.
    AWAITING_HELLO = "awaiting_hello"
    #: ``hello`` arrived; ``start`` (the full desired state) is being sent or awaits its ack.
    STARTING = "starting"
    #: ``start`` was acknowledged: mutations and ``decide`` flow, at most one mutation in flight.
    STREAMING = "streaming"
    #: A non-retryable rejection: the desired state cannot be streamed. Terminal.
    FAILED = "failed"


class Recycle(enum.Enum):
    """Why the session wants its connection closed and the desired state replayed on a new one
    (WIRE.md §8: the client never waits on the server for something the server has said it will
    not do). The value is the log line."""

    #: on_change: a decide failed and the gateway does not retry it on this connection (503
    #: ``maintenance``), and no goodbye followed by the server's delay.
    DECIDE_NOT_RETRIED = (
        "the gateway does not retry the failed decision on this connection and said no goodbye: "
        "reconnecting to replay the state"
    )
    #: A ``goodbye`` or a fatal ``error`` arrived ("A fatal error requires a following close"),
    #: and the gateway has not closed within the close handshake timeout.
    CLOSE_EXPECTED = (
        "the gateway said goodbye (or sent a fatal error) but did not close the connection: "
        "closing it and reconnecting after the delay it named"
    )
    #: The gateway refused a message (``message_rate_limited``) without naming it, and a mutation
    #: or a ``decide`` is still unanswered: it may be the one refused, and nothing would answer it.
    MESSAGE_REFUSED = (
        "the gateway refused a message (message_rate_limited) without saying which, and a change "
        "or a decide is still unanswered: reconnecting to replay the state"
    )
    #: A ``decide`` naming the acknowledged version (nothing in flight) was refused as
    #: ``stale_state_version``: the gateway's version and ours disagree; a replay agrees again.
    VERSION_DISAGREES = (
        "the gateway refused a decide for the acknowledged version as stale: its state version "
        "and this client's disagree; reconnecting to replay the state"
    )


#: The legal phase changes. Every connection ends in DISCONNECTED; FAILED is never left.
TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.DISCONNECTED: frozenset({Phase.AWAITING_HELLO}),
    Phase.AWAITING_HELLO: frozenset({Phase.STARTING, Phase.DISCONNECTED}),
    Phase.STARTING: frozenset({Phase.STREAMING, Phase.FAILED, Phase.DISCONNECTED}),
    Phase.STREAMING: frozenset({Phase.FAILED, Phase.DISCONNECTED}),
    Phase.FAILED: frozenset(),
}


@dataclass(slots=True)
class InFlightMutation:
    """The one mutation sent and not yet acknowledged or rejected."""

    message: Mutation
    #: The state the gateway holds once it is accepted.
    result: StreamState
    #: The caller generation it carries.
    generation: int


@dataclass(slots=True)
class ConnectionState:
    """Everything that is forgotten when a connection ends."""

    #: The gateway's ``hello`` (``None`` until it arrives).
    hello: Hello | None = None
    #: The ``seq`` of the last server message (``hello`` is 1; each next one is exactly one more).
    seq: int = 0
    #: What the gateway holds (``None`` before the ``start`` ack) and its version.
    acked: StreamState | None = None
    acked_version: int = 0
    #: The caller generation the acknowledged state stands for (a later generation whose state is
    #: byte-identical is adopted: see :meth:`~.client.ClientSession._adopt`).
    acked_generation: int = -1
    in_flight: InFlightMutation | None = None
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
    #: When to close and replay on a new connection, per reason (see :class:`Recycle`): each is
    #: kept and cancelled on its own (:meth:`cancel_recycle`), the earliest is due first;
    #: :attr:`Recycle.CLOSE_EXPECTED` is never cancelled.
    recycles: dict[Recycle, float] = field(default_factory=dict)
    #: on_request: the gateway answered the outstanding ``decide`` with ``scheduled`` (it read it:
    #: no refusal can have dropped it).
    decide_read: bool = False
    last_receipt: float = 0.0
    event_bucket: TokenBucket | None = None
    message_bucket: TokenBucket | None = None
    pongs: list[Pong] = field(default_factory=list)
    #: version → the caller generation it stands for, for versions a decision may still cover.
    version_generation: dict[int, int] = field(default_factory=dict)
    #: A reconnect (the ``start`` is a replay).
    replay: bool = False

    def greeted(self, hello: Hello, now: float) -> None:
        """Take the connection's ``hello``: pace this client under the gateway's rates from now.

        :param hello: the checked ``hello`` (see :func:`check_hello`).
        :param now: the current time.
        """
        self.hello = hello
        lim = hello.limits
        self.event_bucket = TokenBucket(
            max(0.1, lim.max_events_per_second * _PACING_RATE_FACTOR),
            max(1, lim.event_burst - _EVENT_BURST_RESERVE),
            now,
        )
        self.message_bucket = TokenBucket(
            max(0.1, lim.max_messages_per_second * _PACING_RATE_FACTOR),
            max(1, lim.message_burst - _MESSAGE_BURST_RESERVE),
            now,
        )

    def check_sequence(self, message: Any) -> None:
        """Every server message names this connection's stream and the next ``seq`` (WIRE.md §2).

        :raises RemoteProtocolError: another stream, or a ``seq`` out of order.
        """
        if self.hello is not None and message.stream_id != self.hello.stream_id:
            raise RemoteProtocolError(
                f"{message.TYPE} names stream {message.stream_id[:40]!r}, not this "
                f"connection's {self.hello.stream_id!r}",
                code="unexpected_stream_id",
                field="stream_id",
            )
        if message.seq != self.seq + 1:
            raise RemoteProtocolError(
                f"{message.TYPE}.seq is {message.seq}, expected {self.seq + 1}: server "
                "messages are numbered 1, 2, 3 … over the connection",
                code="seq_out_of_order",
                field="seq",
            )
        self.seq = message.seq

    def ready_at(self, is_mutation: bool, now: float) -> float:
        """When a message of that kind may be written under the buckets (and, for a mutation, the
        delay of the last rejection)."""
        assert self.event_bucket is not None and self.message_bucket is not None
        at = max(now, now + self.message_bucket.delay(now))
        if is_mutation:
            at = max(at, self.blocked_until, now + self.event_bucket.delay(now))
        return at

    def acknowledge(self, ack: Ack) -> InFlightMutation:
        """The ack of the mutation in flight: its result is what the gateway holds now.

        :returns: the acknowledged mutation.
        :raises RemoteProtocolError: no such mutation is in flight, or the version is not its.
        """
        flight = self.in_flight
        if flight is None or ack.event_id != flight.message.event_id:
            expected = flight.message.event_id if flight else None
            raise RemoteProtocolError(
                f"ack for {ack.event_id[:40]!r} but the mutation in flight is {expected!r}",
                code="unexpected_ack",
                field="event_id",
            )
        if ack.state_version != event_number(ack.event_id):
            raise RemoteProtocolError(
                f"ack.state_version {ack.state_version} does not match {ack.event_id!r}: "
                "each accepted mutation increments state_version once",
                code="invalid_ack",
                field="state_version",
            )
        self.in_flight = None
        self.acked = flight.result
        self.acked_version = ack.state_version
        self.acked_generation = flight.generation
        self.version_generation[ack.state_version] = flight.generation
        self.refusal_answered()
        return flight

    def decided(self, version: int) -> int:
        """A new decision covers ``version``: nothing older can be decided any more.

        :returns: the caller generation that version stands for (-1: not known here).
        """
        self.decided_version = version
        self.cancel_recycle(Recycle.DECIDE_NOT_RETRIED, Recycle.VERSION_DISAGREES)
        generation = self.version_generation.get(version, -1)
        for older in [v for v in self.version_generation if v < version]:
            del self.version_generation[older]
        if self.decide_outstanding is not None and version >= self.decide_outstanding:
            self.decide_outstanding = None
        self.drain = False
        self.refusal_answered()
        return generation

    def scheduled(self, version: int) -> None:
        """The gateway answered ``decide`` for ``version`` with ``scheduled``: it read it."""
        if version == self.decide_outstanding:
            self.decide_read = True
            self.refusal_answered()

    def unanswered(self) -> bool:
        """Whether a message sent may still be unread by the gateway: the change in flight, or a
        ``decide`` not yet answered with ``scheduled``."""
        return self.in_flight is not None or (self.decide_outstanding is not None and not self.decide_read)

    def refusal_answered(self) -> None:
        """An answer came: with nothing left unanswered, an unnamed refusal dropped nothing of ours."""
        if Recycle.MESSAGE_REFUSED in self.recycles and not self.unanswered():  # (every ack: cheap first)
            self.cancel_recycle(Recycle.MESSAGE_REFUSED)

    def plan_recycle(self, at: float, why: Recycle) -> None:
        """Close this connection and replay on a new one at ``at`` for ``why`` (an earlier plan
        for the same reason stands)."""
        self.recycles[why] = min(at, self.recycles.get(why, at))

    def recycle_plan(self) -> tuple[float, Recycle] | None:
        """The earliest planned recycle and its reason (``None``: none; asked on every writer's
        turn, so with nothing planned it allocates nothing)."""
        recycles = self.recycles
        if not recycles:
            return None
        why = min(recycles, key=recycles.__getitem__)
        return recycles[why], why

    def cancel_recycle(self, *whys: Recycle) -> None:
        """Drop the recycles planned for ``whys`` (they no longer hold); the others stand."""
        for why in whys:
            self.recycles.pop(why, None)

    def rejected_for_now(self, error: Error, delay_s: float, now: float, *, drain: bool) -> None:
        """The mutation in flight was rejected for now: plan it again after ``delay_s``.

        :param error: the rejection.
        :param delay_s: seconds before the next mutation.
        :param now: the current time.
        :param drain: on_request after ``too_many_pending_events``: a ``decide`` drains first.
        """
        self.in_flight = None
        self.blocked_until = now + delay_s
        if drain:
            self.drain = True
