"""The process-wide stream cap (the reconnect backoff lives in the core, re-exported here).

The public document limits a client process to ``max_streams_per_process`` open streams (4).
A triggerer runs many triggers in one process and one event loop, and a worker may run sync
decides on helper threads with their own loops, so :class:`StreamCapacity` is thread-safe and
loop-agnostic: waiters queue in FIFO order, each woken on its own loop, and a waiter that is
cancelled leaves the queue (or hands a slot it was just granted to the next waiter).

A stream that holds a slot while it has nothing to do can *offer* it (:meth:`StreamCapacity.offer`):
the moment a waiter queues, the oldest offer is called (on its own loop) and its holder gives the
slot back, and a queued waiter gets the freed slot within one loop iteration of the release. No
one polls: a waiting stream costs nothing per tick, and an idle holder is asked only when someone
waits.

A gateway may advertise a lower ``max_streams_per_process`` in ``hello``: that cap holds for the
streams to *that* gateway (its origin), from its ``hello`` on and until it advertises another —
never for the streams to other gateways, and never above the process's own limit.

A stream is built only once its slot is near (:meth:`StreamCapacity.ask_opening`, given back
with :meth:`StreamCapacity.leave_opening`): a caller with many streams to open — a triggerer
where a thousand triggers start, or wake on one change, together — builds at most twice a
gateway's cap of them at once, first come first served, and each place is held until the stream
is open. A caller waiting for its place holds the place and its future only (a trigger's run
links its wake-up to that future: no task waits). A stream waiting for a slot holds its session, tasks and
buffers; built all at once and opened four at a time, a thousand of them would only be freed
one slot at a time, and the allocator keeps the memory they took between what stays (the
waiting triggers' own objects). Twice the cap keeps a built stream queued for every slot, so an
idle holder is still asked to give its slot back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from airflow_provider_systemzero.deprecations import warn_once
from airflow_provider_systemzero.protocol.limits import Limits
from airflow_provider_systemzero.protocol.reconnect import Backoff

__all__ = ["Backoff", "OpeningPlace", "SlotOffer", "StreamCapacity", "default_capacity"]

log = logging.getLogger(__name__)


class _Waiter:
    __slots__ = ("future", "granted", "loop", "origin")

    def __init__(self, loop: asyncio.AbstractEventLoop, origin: str) -> None:
        self.loop = loop
        self.origin = origin
        self.future: asyncio.Future[None] = loop.create_future()
        self.granted = False


class OpeningPlace(_Waiter):
    """A caller's place among the streams being built and opened to one gateway
    (:meth:`StreamCapacity.ask_opening`): :attr:`future` completes once the place is the caller's.

    While it waits, it is all the caller holds of the stream it will build: one small object and
    its future, which the caller may link a callback to (no task waits on it).
    """

    __slots__ = ("left",)

    def __init__(self, loop: asyncio.AbstractEventLoop, origin: str) -> None:
        super().__init__(loop, origin)
        self.left = False


class SlotOffer:
    """An idle holder's offer to give its slot back when a waiter queues (see :meth:`StreamCapacity.offer`).

    :attr:`called` says whether the capacity asked for the slot; the holder then gives it back (or
    keeps it because it got work) and :meth:`StreamCapacity.withdraw` s the offer either way.
    """

    __slots__ = ("called", "callback", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], object]) -> None:
        self.loop = loop
        self.callback = callback
        self.called = False


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class StreamCapacity:
    """A fair (FIFO), cancellable counting semaphore shared by every stream of a process.

    :param limit: how many streams may be open at once (at least 1).
    """

    def __init__(self, limit: int = Limits().max_streams_per_process) -> None:
        self._lock = threading.Lock()
        self._limit = self._check(limit)
        self._in_use = 0
        self._max_in_use = 0
        self._waiters: deque[_Waiter] = deque()
        self._origin_caps: dict[str, int] = {}  # origin → the cap its gateway advertised
        self._origin_use: dict[str, int] = {}  # origin → slots held
        self._offers: deque[SlotOffer] = deque()  # idle holders, oldest first
        self._handing_over = 0  # offers called whose holder has not withdrawn yet
        self._opening: dict[str, int] = {}  # origin → streams being built and opened
        self._openers: dict[str, deque[_Waiter]] = {}  # origin → callers waiting to build one, oldest first

    @staticmethod
    def _check(limit: int) -> int:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"the stream limit must be a positive integer, got {limit!r}")
        return limit

    @property
    def limit(self) -> int:
        """How many streams may be open at once."""
        return self._limit

    @property
    def in_use(self) -> int:
        """Slots currently held."""
        return self._in_use

    @property
    def max_in_use(self) -> int:
        """The most slots ever held at once (since the last :meth:`set_limit`)."""
        return self._max_in_use

    @property
    def waiting(self) -> int:
        """Waiters queued for a slot."""
        return len(self._waiters)

    @property
    def building(self) -> int:
        """Streams being built and opened now (places of :meth:`ask_opening` held)."""
        return sum(self._opening.values())

    @property
    def waiting_to_build(self) -> int:
        """Callers queued for a place of :meth:`ask_opening`."""
        return sum(len(queue) for queue in self._openers.values())

    @property
    def offered(self) -> int:
        """Idle holders that offered their slot and have not been asked for it yet."""
        return len(self._offers)

    def offer(self, callback: Callable[[], object]) -> SlotOffer:
        """Offer the caller's slot to the next waiter: ``callback`` runs (on the caller's loop, once)
        when a waiter queues and no other hand-over is under way for it — at once if one waits now.

        The holder gives the slot back (or keeps it, having found work) and then calls
        :meth:`withdraw` with the returned offer, in every case.

        :param callback: what asks the holder to give its slot back (it must not block).
        """
        offer = SlotOffer(asyncio.get_running_loop(), callback)
        with self._lock:
            self._offers.append(offer)
            self._ask_locked()
        return offer

    def withdraw(self, offer: SlotOffer | None) -> None:
        """End an offer: its holder got work, gave the slot back, or ends (safe to call twice).

        :param offer: what :meth:`offer` returned (``None`` is ignored).
        """
        if offer is None:
            return
        with self._lock:
            if offer.called:
                offer.called = False
                self._handing_over -= 1
            else:
                with contextlib.suppress(ValueError):
                    self._offers.remove(offer)
            offer.callback = _nothing  # a callback already scheduled does nothing now
            self._ask_locked()

    def _ask_locked(self) -> None:
        # one idle holder per waiter that no hand-over is under way for
        while self._offers and len(self._waiters) > self._handing_over:
            offer = self._offers.popleft()
            offer.called = True
            self._handing_over += 1
            try:
                _schedule(offer.loop, _call, offer)
            except RuntimeError:  # the holder's loop is closed: it holds nothing any more
                offer.called = False
                self._handing_over -= 1

    def limit_for(self, origin: str | None) -> int:
        """How many streams to ``origin`` may be open at once: the process's limit, or less when
        that gateway advertised less.

        :param origin: the gateway (its stream URL); ``None``: the process's limit.
        """
        return min(self._limit, self._origin_caps.get(origin or "", self._limit))

    def set_limit(self, limit: int) -> None:
        """Change the limit (tests; a deployment that knows better) and forget the caps gateways
        advertised; queued waiters may proceed.

        :param limit: the new limit (at least 1).
        """
        with self._lock:
            self._limit = self._check(limit)
            self._origin_caps.clear()
            self._max_in_use = self._in_use
            self._grant_locked()
            for key in list(self._openers):
                self._grant_openers_locked(key)

    def adopt_advertised(self, limit: int, origin: str | None = None) -> None:
        """Take the cap a gateway advertised in ``hello`` for the streams to that gateway.

        It replaces what the same gateway advertised before (so a gateway can raise it back, up
        to the process's limit) and never touches the streams to other gateways.

        :param limit: ``hello.limits.max_streams_per_process`` (ignored unless a positive integer).
        :param origin: the gateway (its stream URL).
        """
        if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 1:
            with self._lock:
                self._origin_caps[origin or ""] = limit
                self._grant_locked()
                self._grant_openers_locked(origin or "")

    async def acquire(self, origin: str | None = None) -> None:
        """Wait for a slot, first come first served (among the waiters a slot can go to).

        Cancelling the waiting task removes it from the queue; a slot granted at the moment of
        cancellation is passed on, never lost.

        :param origin: the gateway the slot is for (its stream URL), bound by its advertised cap.
        """
        loop = asyncio.get_running_loop()
        key = origin or ""
        with self._lock:
            if self._take_if_free_locked(key):
                return
            waiter = _Waiter(loop, key)
            self._waiters.append(waiter)
            self._grant_locked()
            if not waiter.granted:
                log.info(
                    "waiting for a stream slot: %d of %d in use in this process, %d waiting "
                    "(max_streams_per_process); the next slot given back goes to the oldest waiter",
                    self._in_use,
                    self._limit,
                    len(self._waiters),
                )
                self._ask_locked()
        try:
            await waiter.future
        except BaseException:
            with self._lock:
                granted = waiter.granted
                if not granted:
                    self._waiters.remove(waiter)
            if granted:
                self.release(origin)
            raise

    def try_acquire(self, origin: str | None = None) -> bool:
        """Take a slot if one is free and nobody waits for one, without waiting.

        :param origin: the gateway the slot is for (its stream URL), bound by its advertised cap.
        :returns: whether a slot was taken (give it back with :meth:`release`).
        """
        with self._lock:
            return self._take_if_free_locked(origin or "")

    def release(self, origin: str | None = None) -> None:
        """Give a slot back; the oldest waiter it can go to gets it.

        :param origin: the gateway the slot was for (as given to :meth:`acquire`).
        """
        key = origin or ""
        with self._lock:
            if self._in_use <= 0 or self._origin_use.get(key, 0) <= 0:
                raise RuntimeError("StreamCapacity.release() without a matching acquire()")
            self._in_use -= 1
            _count(self._origin_use, key, -1)
            self._grant_locked()

    @asynccontextmanager
    async def slot(self, origin: str | None = None) -> AsyncIterator[None]:
        """``async with capacity.slot():`` holds one slot for the block.

        :param origin: the gateway the slot is for.
        """
        await self.acquire(origin)
        try:
            yield
        finally:
            self.release(origin)

    def opening_room(self, origin: str | None = None) -> int:
        """How many streams to ``origin`` may be built and opened at once: twice its cap.

        :param origin: the gateway (its stream URL); ``None``: the process's limit.
        """
        return 2 * self.limit_for(origin)

    def ask_opening(self, origin: str | None = None) -> OpeningPlace:
        """Ask for one of the :meth:`opening_room` places to ``origin`` (first come first served),
        to build and open one stream in: the place's future completes once it is the caller's —
        at once when one is free. Whatever happens next (the stream opened, its opening failed, or
        the caller no longer waits), the caller hands it to :meth:`leave_opening`.

        A caller that queues says so in the log (the wait's reason).

        :param origin: the gateway the stream is for (its stream URL).
        """
        key = origin or ""
        place = OpeningPlace(asyncio.get_running_loop(), key)
        with self._lock:
            if key not in self._openers and self._opening.get(key, 0) < self.opening_room(key):
                _count(self._opening, key, 1)
                place.granted = True
                place.future.set_result(None)
                return place
            queue = self._openers.setdefault(key, deque())
            queue.append(place)
            log.info(
                "waiting to build a stream: %d streams to this gateway are being opened (at most "
                "%d at once, twice max_streams_per_process), %d callers waiting; first come first served",
                self._opening.get(key, 0),
                self.opening_room(key),
                len(queue),
            )
        return place

    def leave_opening(self, place: OpeningPlace) -> None:
        """Give ``place`` up (safe to call twice): a place held goes to the next caller in line; a
        caller still queued leaves the queue (a place granted to it at that very moment is passed
        on, never lost); its future is cancelled if it had not completed.

        :param place: what :meth:`ask_opening` returned.
        """
        with self._lock:
            if place.left:
                return
            place.left = True
            if place.granted:
                _count(self._opening, place.origin, -1)
                self._grant_openers_locked(place.origin)
            elif (queue := self._openers.get(place.origin)) is not None and place in queue:
                # (not queued: its loop closed as it was granted, and it left already)
                queue.remove(place)
                if not queue:
                    del self._openers[place.origin]
        place.future.cancel()

    def opening(self, origin: str | None = None) -> AbstractAsyncContextManager[None]:
        """``async with capacity.opening(url):`` a place of :meth:`ask_opening` held for the block.

        .. deprecated:: 0.2.0
            Use :meth:`ask_opening` and :meth:`leave_opening`, as the triggers do.

        :param origin: the gateway the stream is for (its stream URL).
        """
        warn_once(
            "StreamCapacity.opening()", "StreamCapacity.ask_opening() and StreamCapacity.leave_opening()"
        )
        return self._opening_block(origin)

    @asynccontextmanager
    async def _opening_block(self, origin: str | None) -> AsyncIterator[None]:
        place = self.ask_opening(origin)
        try:
            await place.future
            yield
        finally:
            self.leave_opening(place)

    def _grant_openers_locked(self, key: str) -> None:
        queue = self._openers.get(key)
        while queue and self._opening.get(key, 0) < self.opening_room(key):
            waiter = queue.popleft()
            waiter.granted = True
            _count(self._opening, key, 1)
            try:
                _schedule(waiter.loop, _wake, waiter.future)
            except RuntimeError:  # the caller's loop is closed: it will never build
                waiter.granted = False
                _count(self._opening, key, -1)
        if queue is not None and not queue:
            del self._openers[key]

    def _take_if_free_locked(self, key: str) -> bool:
        if self._waiters or not self._fits_locked(key):
            return False
        self._take_locked(key)
        return True

    def _fits_locked(self, key: str) -> bool:
        return self._in_use < self._limit and self._origin_use.get(key, 0) < self._origin_caps.get(
            key, self._limit
        )

    def _take_locked(self, key: str) -> None:
        self._in_use += 1
        _count(self._origin_use, key, 1)
        self._max_in_use = max(self._max_in_use, self._in_use)

    def _grant_locked(self) -> None:
        if self._in_use >= self._limit or not self._waiters:
            return  # nothing to hand over: no walk of the queue
        for waiter in list(self._waiters):
            if self._in_use >= self._limit:
                return
            if not self._fits_locked(waiter.origin):
                continue  # its gateway's cap is reached: a waiter for another gateway may go first
            self._waiters.remove(waiter)
            waiter.granted = True
            self._take_locked(waiter.origin)
            try:
                _schedule(waiter.loop, _wake, waiter.future)
            except RuntimeError:  # the waiter's loop is closed: it will never take the slot
                waiter.granted = False
                self._in_use -= 1
                _count(self._origin_use, waiter.origin, -1)


def _count(counts: dict[str, int], key: str, change: int) -> None:
    """Add ``change`` to ``key``'s count (slots held, places of ``ask_opening`` held); a count
    back at 0 is dropped."""
    count = counts.get(key, 0) + change
    if count:
        counts[key] = count
    else:
        del counts[key]


def _nothing() -> None:
    return None


def _schedule(loop: asyncio.AbstractEventLoop, callback: Callable[..., object], *args: Any) -> None:
    """Run ``callback(*args)`` on ``loop`` soon: from that loop's own thread with ``call_soon`` (no
    wake-up of the loop through its self-pipe, a system call each way), from any other thread with
    ``call_soon_threadsafe``.

    :raises RuntimeError: ``loop`` is closed.
    """
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        loop.call_soon(callback, *args)
    else:
        loop.call_soon_threadsafe(callback, *args)


def _call(offer: SlotOffer) -> None:
    offer.callback()


_DEFAULT = StreamCapacity()


def default_capacity() -> StreamCapacity:
    """The process-wide :class:`StreamCapacity` every stream uses unless given another."""
    return _DEFAULT
