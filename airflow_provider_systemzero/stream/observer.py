"""What a :class:`~airflow_provider_systemzero.stream.decision_stream.DecisionStream` tells
about itself: the stream's observer interface, with no Airflow.

The Airflow metrics and spans observer
(:class:`~airflow_provider_systemzero.utils.observability.AirflowStreamObserver`) implements it
next to the Airflow classes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_provider_systemzero.protocol.messages import Ack, Hello
    from airflow_provider_systemzero.protocol.reply import DecisionResult
    from airflow_provider_systemzero.stream.exceptions import SystemZeroError

__all__ = ["GOODBYE_REASONS", "StreamObserver"]

#: Goodbye reasons of the public document; any other reason a gateway sends is ``other``.
GOODBYE_REASONS = frozenset({"shutdown", "overload", "idle_timeout", "max_duration", "event_limit"})


class StreamObserver:
    """What a stream reports about itself; every method does nothing here.

    A stream calls :meth:`bind` once, then the other methods from its event loop. An observer
    must never raise (the stream ignores what it raises anyway).
    """

    def bind(self, stream: Any) -> None:
        """The stream this observer watches (read its ``request`` and ``state`` only for content capture)."""

    def unbind(self) -> None:
        """The stream closed: let go of it (no event follows)."""

    def connecting(self, url: str, attempt: int) -> None:
        """A connection attempt starts (``attempt`` 0 after a connection that got going)."""

    def connected(self, url: str, replay: bool) -> None:
        """The WebSocket is open (``replay``: the stream's state is replayed on it)."""

    def hello(self, hello: Hello) -> None:
        """The gateway said ``hello``."""

    def closed(self, close_code: int | None, reason: str) -> None:
        """The connection ended (any way)."""

    def reconnecting(self, reason: str, close_code: int | None, delay: float) -> None:
        """A reconnect is planned after ``delay`` seconds."""

    def acknowledged(self, ack: Ack, message_type: str, replayed: bool) -> None:
        """A mutation was acknowledged."""

    def decided(self, result: DecisionResult, *, billed: bool) -> None:
        """A decision arrived (``billed``: counted as billed, else a recognised replay)."""

    def decision_failed(
        self, http_status: int | None, code: str, retryable: bool, state_version: int | None
    ) -> None:
        """A dispatch failed."""

    def budget_exceeded(self, exc: SystemZeroError) -> None:
        """The budget refused a dispatch."""

    def rate_limited(self, kind: str, delay: float | None) -> None:
        """A rate limit made the client wait (``kind``: ``upgrade``, ``event`` or ``decide``)."""
