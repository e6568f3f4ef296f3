"""The phases of a client connection, the legal moves between them, and what a session keeps per connection.

:class:`~airflow_provider_systemzero.protocol.client.ClientSession` holds one
:class:`ConnectionState` while a WebSocket is open and drops it when the connection ends;
everything in it is about that connection alone. :data:`TRANSITIONS` is the whole phase graph:
the session checks every move against it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_systemzero.protocol.errors import RemoteProtocolError
from airflow_provider_systemzero.protocol.messages import PROTOCOL, Hello, Mutation, Pong
from airflow_provider_systemzero.protocol.ratelimit import TokenBucket
from airflow_provider_systemzero.protocol.state import StreamState

__all__ = ["TRANSITIONS", "ConnectionState", "InFlightMutation", "Phase", "check_hello"]


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
