"""What a :class:`~airflow_provider_systemzero.stream.decision_stream.DecisionStream` tells
about itself: the stream's observer interface, with no Airflow.

The Airflow metrics and spans observer
(:class:`~airflow_provider_systemzero.tasks.observability.AirflowStreamObserver`) implements it
next to the Airflow classes. :class:`ObserverRelay` is how a stream tells it, in order.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

from airflow_provider_systemzero.protocol.reconnect import GoodbyeReason

if TYPE_CHECKING:
    from airflow_provider_systemzero.protocol.body import JSONValue
    from airflow_provider_systemzero.protocol.messages import Ack, Hello, StreamRequest
    from airflow_provider_systemzero.protocol.reply import DecisionResult
    from airflow_provider_systemzero.stream.exceptions import SystemZeroError

__all__ = ["GOODBYE_REASONS", "ObservedStream", "ObserverRelay", "StreamObserver"]

log = logging.getLogger(__name__)

#: Goodbye reasons of the public document; any other reason a gateway sends is ``other``.
GOODBYE_REASONS = frozenset(GoodbyeReason)


class ObservedStream(Protocol):
    """What an observer may read of the stream it watches (for content capture only)."""

    @property
    def request(self) -> StreamRequest:
        """The request as streamed."""
        ...

    @property
    def state(self) -> JSONValue:
        """The desired state."""
        ...


class StreamObserver:
    """What a stream reports about itself; every method does nothing here.

    A stream calls :meth:`bind` once, then the other methods from its event loop. An observer
    must never raise (the stream ignores what it raises anyway).
    """

    def bind(self, stream: ObservedStream) -> None:
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


class ObserverRelay:
    """Tells a stream's :class:`StreamObserver` what happened, in order, and never lets it break
    the stream: :meth:`now` for what it hears at once, :meth:`later` for what it hears once the
    tasks a frame woke have run (an ack or a decision is counted after the task waiting for it got
    it, so the caller's event does not wait for the metrics).

    :param observer: the observer told.
    """

    def __init__(self, observer: StreamObserver) -> None:
        self.observer = observer
        #: What the observer hears once the tasks this loop turn woke have run, in order (added by
        #: :meth:`later`, told by :meth:`flush`).
        self._pending: deque[tuple[str, tuple[Any, ...], dict[str, Any]]] = deque()

    def now(self, method: str, *args: Any, **kwargs: Any) -> None:
        """Tell the observer now (after what it was told to hear later, in order).

        :param method: the :class:`StreamObserver` method.
        """
        if self._pending:
            self.flush()
        self._tell(method, args, kwargs)

    def later(self, method: str, *args: Any, **kwargs: Any) -> None:
        """Tell the observer once whatever this frame woke has run.

        :param method: the :class:`StreamObserver` method.
        """
        pending = self._pending
        pending.append((method, args, kwargs))
        if len(pending) == 1:
            loop = asyncio.get_running_loop()
            loop.call_soon(loop.call_soon, self.flush)  # behind the tasks woken this turn

    def flush(self) -> None:
        """Tell the observer what it was to hear later, now."""
        pending = self._pending
        while pending:
            method, args, kwargs = pending.popleft()
            self._tell(method, args, kwargs)

    def _tell(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            getattr(self.observer, method)(*args, **kwargs)
        except Exception as exc:  # an observer never breaks the stream
            log.debug("stream observer %s failed: %s", method, exc)
