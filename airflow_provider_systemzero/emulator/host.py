"""What the emulator's parts use of each other, named by protocol.

The :class:`~airflow_provider_systemzero.emulator.server.Emulator` builds a websocket connection
(:mod:`.websocket`) and a stream (:mod:`.connection`) for each client, and answers the control
surface (:mod:`.control`); each of those reads the emulator's limits, faults and counters, and the
websocket connection hands frames to its stream. Each names the other side by a protocol here, not
by its class, so the server imports them and none of them imports the server (or each other) back.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from airflow_provider_systemzero.emulator.backend import DecideBackend
    from airflow_provider_systemzero.emulator.faults import Faults
    from airflow_provider_systemzero.emulator.stats import EmulatorStats
    from airflow_provider_systemzero.protocol.gateway import GatewayAction
    from airflow_provider_systemzero.protocol.limits import Limits
    from airflow_provider_systemzero.protocol.state import StreamState

__all__ = ["EmulatorHost", "FrameReceiver"]


class EmulatorHost(Protocol):
    """The :class:`~airflow_provider_systemzero.emulator.server.Emulator` as its streams, their
    websocket connections and its control surface see it. The underscored members are the
    emulator's own bookkeeping, shared only with these parts of it."""

    limits: Limits
    faults: Faults
    backend: DecideBackend
    admin_token: str
    action_tap: Callable[[Any, list[GatewayAction]], list[GatewayAction]] | None
    #: Native ping and pong counts, control floods.
    _counters: Counter[str]
    #: Open streams per account, reserved at the upgrade.
    _reserved: Counter[str]
    _messages_sent: Counter[str]
    _closes: Counter[int]
    _latest_by_cache_key: dict[str, str]
    _streams: Mapping[str, Any]
    _shutting_down: bool
    _shutdown_retry_after_ms: int

    @property
    def stats(self) -> EmulatorStats:
        """A snapshot of the counters."""
        ...

    def _notify(self) -> None:
        """Wake a ``wait_for`` that waits on the emulator's state."""
        ...

    def _spawn(self, coroutine: Awaitable[Any]) -> None:
        """Run ``coroutine`` as a task the emulator awaits when it stops."""
        ...

    def _note_state(self, stream_id: str, state: StreamState) -> None:
        """Remember the state a stream accepted."""
        ...

    async def restart(self, retry_after_ms: int = 500) -> None:
        """Send every open stream the shutdown sequence."""
        ...

    async def drop_all(self) -> None:
        """Abort every stream's connection without a close frame."""
        ...


class FrameReceiver(Protocol):
    """A stream (:class:`~airflow_provider_systemzero.emulator.connection.StreamLoop`) as its
    websocket connection sees it."""

    def receive_text(self, text: str, size: int | None = None) -> None:
        """Handle one complete text message, as it is parsed."""
        ...

    def start_reader(self) -> None:
        """Start the task that reads what websockets' own reader delivers."""
        ...

    def transport_lost(self) -> None:
        """The TCP connection is gone."""
        ...
