"""What a :class:`~airflow_provider_systemzero.protocol.gateway.GatewaySession` asks its I/O
adapter to do (:data:`GatewayAction`), and what the adapter reports back about a decide call
(:data:`DecideOutcome`).

The adapter performs the actions in order: :class:`SendMessage` writes one server message,
:class:`DispatchDecide` calls the ordinary decide API and later reports a :class:`DecideSuccess`
or :class:`DecideFailure` with
:meth:`~airflow_provider_systemzero.protocol.gateway.GatewaySession.dispatch_finished`,
:class:`CloseConnection` closes the WebSocket (always last).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeAlias

from airflow_provider_systemzero.protocol.errors import ErrorEnvelope, RetryHint
from airflow_provider_systemzero.protocol.messages import Decision, Error, ServerMessage

__all__ = [
    "CloseConnection",
    "DecideFailure",
    "DecideOutcome",
    "DecideSuccess",
    "DispatchDecide",
    "GatewayAction",
    "SendMessage",
]


@dataclass(frozen=True, slots=True)
class SendMessage:
    """Write ``message`` as one text frame."""

    message: ServerMessage


@dataclass(frozen=True, slots=True)
class DispatchDecide:
    """Call the decide API (``POST`` ``body`` with ``Idempotency-Key: idempotency_key``)."""

    dispatch_id: int
    state_version: int
    body: str
    idempotency_key: str | None


@dataclass(frozen=True, slots=True)
class CloseConnection:
    """Close the WebSocket with ``code`` and ``reason``."""

    code: int
    reason: str


GatewayAction: TypeAlias = SendMessage | DispatchDecide | CloseConnection


@dataclass(frozen=True, slots=True)
class DecideSuccess:
    """A decide call answered 200 with ``reply``."""

    reply: dict[str, Any]
    request_id: str
    decide_ms: float = 0
    http_status: int = 200
    server_timing: Any = None
    latency_ms: Any = None
    rate_limit: Any = None

    def decision(
        self, stream_id: str, seq: int, state_version: int, covered: tuple[str, ...], queue_ms: float
    ) -> Decision:
        """The ``decision`` message that delivers this reply.

        :param stream_id: the connection's stream.
        :param seq: the message's ``seq``.
        :param state_version: the version the dispatch decided (the coverage watermark).
        :param covered: the event IDs it newly covers.
        :param queue_ms: how long the intent waited for the dispatch.
        """
        return Decision(
            stream_id,
            seq,
            state_version,
            covered,
            self.reply,
            self.request_id,
            self.http_status,
            self.server_timing,
            self.latency_ms,
            self.rate_limit,
            round(queue_ms),
            round(self.decide_ms),
        )


@dataclass(frozen=True, slots=True)
class DecideFailure:
    """A decide call failed with an HTTP status and the API's error envelope."""

    http_status: int
    envelope: ErrorEnvelope
    retry: RetryHint
    request_id: str

    def error(self, stream_id: str, seq: int, state_version: int, *, fatal: bool) -> Error:
        """The ``error`` message that reports this failure (no ``event_id``: a failed dispatch).

        :param stream_id: the connection's stream.
        :param seq: the message's ``seq``.
        :param state_version: the version the dispatch was for.
        :param fatal: a goodbye and a close follow.
        """
        return Error(
            stream_id,
            seq,
            None,
            state_version,
            self.http_status,
            self.request_id,
            fatal,
            self.envelope,
            self.retry,
        )


DecideOutcome: TypeAlias = DecideSuccess | DecideFailure
