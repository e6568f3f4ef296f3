"""Spare connections: an upgraded connection kept ready while streams queue for slots.

A stream carries one subject: ``start`` fixes its questions, routing, scheduling and cache key for
the connection, so an open stream is never handed to another trigger. What *can* be done ahead is
the part that is the same for every stream of a gateway and key: TCP, TLS, the upgrade and the
gateway's ``hello``. When the streams of a process contend for the ``max_streams_per_process``
slots (many dormant triggers waking up), :class:`Spares` keeps one such connection ready; the next
stream to that gateway that needs a connection takes it and sends its ``start`` at once, instead of
waiting for a connection to open.

The rules, so that a spare never costs what it is meant to save:

* a spare holds a slot of the process's :class:`~airflow_provider_systemzero.stream.capacity.StreamCapacity`
  like any stream (the process never holds more than ``max_streams_per_process``); one is opened
  only while streams contended for slots in the last :data:`WINDOW` seconds, only when a slot
  would still be free after it, and never while a stream waits for a slot;
* a spare is *offered* to the capacity: a stream that queues for a slot (another gateway or key)
  makes the spare close at once and takes its slot;
* a spare reads the gateway's ``hello`` (handed to the stream that takes it) and the gateway
  expects ``start`` within its ``start_timeout_ms``: a spare is closed (1000) unused after half of
  it, and replaced only while contention lasts, so a quiet process holds none;
* a gateway that refuses the upgrade of a spare (its account's streams are taken, say) gets no
  spare for :data:`REFUSED_PAUSE` seconds.

Spares are off unless the process turns them on: a spare holds one of the *account's* streams
(``max(1, floor(max_concurrent / 2))``, shared by every process on the key), so it is a deployment's
choice. Set ``AIRFLOW__SYSTEMZERO__SPARE_CONNECTIONS=true`` in the triggerer's environment (or
:meth:`Spares.enable`). Only the process-wide capacity keeps spares, each for the event loop that
opened it, and only for connections without a CA bundle; anything else connects as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.protocol import State

from airflow_provider_systemzero.protocol.limits import Limits
from airflow_provider_systemzero.protocol.reconnect import CloseCode
from airflow_provider_systemzero.stream.capacity import SlotOffer, StreamCapacity, default_capacity
from airflow_provider_systemzero.stream.connection import (
    NoRedirectsConnect,
    connect_options,
    subprotocol_violation,
)
from airflow_provider_systemzero.stream.settings import StreamSettings

__all__ = ["ENVIRONMENT", "REFUSED_PAUSE", "WINDOW", "Spares", "spares"]

log = logging.getLogger(__name__)

#: Seconds after the last contention for a slot during which a spare is kept.
WINDOW = 5.0
#: Seconds without spares for a gateway and key after the upgrade of a spare failed.
REFUSED_PAUSE = 60.0
#: The environment variable that turns spares on for the process (``true``/``1``/``yes``).
ENVIRONMENT = "AIRFLOW__SYSTEMZERO__SPARE_CONNECTIONS"


@dataclass(slots=True)
class _Spare:
    ws: ClientConnection
    hello: str
    origin: str
    expires_at: float
    offer: SlotOffer | None = None
    timer: asyncio.TimerHandle | None = None


class Spares:
    """Upgraded connections kept ready per gateway and key (see the module's rules).

    :param capacity: the slots the spares hold (the process-wide one).
    :param enabled: keep spares at all (default: :data:`ENVIRONMENT` says so).
    """

    def __init__(self, capacity: StreamCapacity, enabled: bool | None = None) -> None:
        self.capacity = capacity
        if enabled is None:
            enabled = os.environ.get(ENVIRONMENT, "").strip().lower() in ("1", "true", "yes", "on")
        self.enabled = enabled
        self._ready: dict[Any, _Spare] = {}  # key → the spare ready for it
        self._opening: set[Any] = set()
        self._paused_until: dict[Any, float] = {}
        self._contended_at = -float("inf")
        self._tasks: set[asyncio.Task[None]] = set()
        #: spares opened, taken by a stream, and closed unused (for tests and benchmarks)
        self.opened = self.taken = self.expired = 0

    def enable(self, enabled: bool = True) -> None:
        """Turn spares on or off for this process (off: the spares held are closed soon after).

        :param enabled: keep spares.
        """
        self.enabled = enabled
        if not enabled:
            self._contended_at = -float("inf")

    def key(self, settings: StreamSettings, limits: Limits) -> Any:
        """What a spare must share with the stream that takes it: the event loop, the settings
        (gateway, key, proxy …) and the largest message it accepts (its other options — native
        ping timing — may come from another ``hello``'s limits); ``None``: no spare for these."""
        if not self.enabled or settings.ca_bundle:
            return None
        return (asyncio.get_running_loop(), settings, limits.max_message_bytes)

    def contended(self) -> None:
        """A stream found no free slot: keep spares for the next :data:`WINDOW` seconds."""
        if self.enabled:
            self._contended_at = time.monotonic()

    def pause(self, key: Any) -> None:
        """The gateway refused an upgrade for ``key`` as over capacity: no spare for it for
        :data:`REFUSED_PAUSE` seconds (the account's streams go to streams with a subject)."""
        if key is not None:
            self._paused_until[key] = time.monotonic() + REFUSED_PAUSE

    def take(self, key: Any, capacity: StreamCapacity) -> tuple[ClientConnection, str] | None:
        """The ready connection for ``key`` and the ``hello`` it read, with its slot, now the
        caller's (released with ``capacity.release(origin)`` as any slot), or ``None``.

        :param key: :meth:`key` of the stream's settings and limits.
        :param capacity: the stream's capacity (spares serve the process-wide one only).
        """
        if key is None or capacity is not self.capacity:
            return None
        spare = self._ready.pop(key, None)
        if spare is None:
            return None
        self._unhook(spare)
        if spare.ws.state is State.OPEN and time.monotonic() < spare.expires_at:
            self.taken += 1
            return spare.ws, spare.hello
        self._discard(spare)  # closed by the gateway, or too close to its start deadline
        return None

    def refill(self, key: Any, settings: StreamSettings, limits: Limits, capacity: StreamCapacity) -> None:
        """Open a spare for ``key`` if the rules allow one now (never waits, never blocks).

        :param key: :meth:`key` of ``settings`` and ``limits``.
        :param settings: where and how to connect.
        :param limits: the limits the connection options come from.
        :param capacity: the stream's capacity (spares serve the process-wide one only).
        """
        if key is None or capacity is not self.capacity or key in self._ready or key in self._opening:
            return
        now = time.monotonic()
        if now - self._contended_at > WINDOW or now < self._paused_until.get(key, 0.0):
            return
        origin = settings.url
        # a slot stays free after the spare's, and nobody waits for one
        if capacity.waiting or capacity.in_use + 2 > capacity.limit_for(origin):
            return
        if not capacity.try_acquire(origin):
            return
        self._opening.add(key)
        task = asyncio.get_running_loop().create_task(
            self._open(key, settings, limits, origin), name="systemzero-spare"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _open(self, key: Any, settings: StreamSettings, limits: Limits, origin: str) -> None:
        ws: ClientConnection | None = None
        try:
            ws = await NoRedirectsConnect(origin, **connect_options(settings, limits))
            if subprotocol_violation(ws, origin) is not None:
                raise ConnectionError("the gateway did not select the subprotocol")
            async with asyncio.timeout(settings.open_timeout):
                hello = await ws.recv()
            # the stream that takes the spare checks the hello in full; its start deadline is needed now
            start_timeout_ms = json.loads(hello)["limits"]["start_timeout_ms"]
            if not isinstance(hello, str) or not isinstance(start_timeout_ms, int) or start_timeout_ms <= 0:
                raise ValueError("no start_timeout_ms in hello")
        except asyncio.CancelledError:
            if ws is not None:
                ws.transport.abort()
            self.capacity.release(origin)
            raise
        except Exception as exc:  # the streams connect as before: they report what is wrong
            self._paused_until[key] = time.monotonic() + REFUSED_PAUSE
            log.debug("no spare connection to %s for %.0f s: %s", origin, REFUSED_PAUSE, type(exc).__name__)
            if ws is not None:
                ws.transport.abort()
            self.capacity.release(origin)
            return
        finally:
            self._opening.discard(key)
        self.opened += 1
        lifetime = start_timeout_ms / 1000 / 2  # half the gateway's deadline for start: never near it
        spare = _Spare(ws, hello, origin, time.monotonic() + lifetime)
        self._ready[key] = spare
        spare.timer = asyncio.get_running_loop().call_later(
            lifetime, self._expire, key, spare, settings, limits
        )
        spare.offer = self.capacity.offer(lambda: self._wanted(key, spare))

    def _unhook(self, spare: _Spare) -> None:
        if spare.timer is not None:
            spare.timer.cancel()
            spare.timer = None
        offer, spare.offer = spare.offer, None
        self.capacity.withdraw(offer)

    def _expire(self, key: Any, spare: _Spare, settings: StreamSettings, limits: Limits) -> None:
        spare.timer = None
        if self._ready.get(key) is spare:
            del self._ready[key]
            self._unhook(spare)
            self.expired += 1
            self._discard(spare, then=lambda: self.refill(key, settings, limits, self.capacity))

    def _wanted(self, key: Any, spare: _Spare) -> None:
        """A stream queues for a slot: the spare gives its slot back."""
        if self._ready.get(key) is spare:
            del self._ready[key]
            self._unhook(spare)
            self._discard(spare)
        else:
            self._unhook(spare)

    def _discard(self, spare: _Spare, then: Any = None) -> None:
        """Close an unused spare (1000) and release its slot once the connection is closed."""

        async def close() -> None:
            try:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(spare.ws.close_timeout or 5.0):
                        await spare.ws.close(CloseCode.NORMAL_CLOSURE)
            finally:
                if spare.ws.state is not State.CLOSED:
                    spare.ws.transport.abort()
                self.capacity.release(spare.origin)
                if then is not None:
                    then()

        task = asyncio.get_running_loop().create_task(close(), name="systemzero-spare-close")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def aclose(self) -> None:
        """Close every spare and wait for the closes (tests; a process that ends)."""
        for key in list(self._ready):
            spare = self._ready.pop(key)
            self._unhook(spare)
            self._discard(spare)
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


_DEFAULT = Spares(default_capacity())


def spares() -> Spares:
    """The process-wide :class:`Spares` (for the process-wide capacity)."""
    return _DEFAULT
