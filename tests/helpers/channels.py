"""A push source the dormant-trigger tests change at will (``{"type": "callable", "path":
"tests.helpers.channels.pushed", "kwargs": {"channel": ...}}``).

The smallest correct push source: a waiting reader awaits one future of its own, resolved by
:func:`publish`, and yields the channel's newest state (a state superseded meanwhile is skipped,
as a trigger skips it), so what a dormant trigger keeps is the provider's and little else.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any


class _Channel:
    __slots__ = ("readers", "state", "version", "waiters")

    def __init__(self) -> None:
        self.state: Any = "waiting\n"
        self.version = 0
        self.readers = 0
        self.waiters: tuple[asyncio.Future[None], ...] = ()


#: channel name -> its state and readers
_CHANNELS: dict[str, _Channel] = {}


def _without(
    waiters: tuple[asyncio.Future[None], ...], waiter: asyncio.Future[None]
) -> tuple[asyncio.Future[None], ...]:
    """``waiters`` but ``waiter`` (a function, not a comprehension in the generator: that would make
    ``waiter`` a closure cell the waiting generator keeps)."""
    return tuple(w for w in waiters if w is not waiter)


def publish(channel: str, state: Any) -> None:
    """Make ``state`` the channel's current state and wake every source reading it."""
    entry = _CHANNELS.setdefault(channel, _Channel())
    entry.state = state
    entry.version += 1
    waiters, entry.waiters = entry.waiters, ()
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(None)


def waiters(channel: str) -> tuple[asyncio.Future[None], ...]:
    """The futures the sources reading the channel wait on now (each resolved by :func:`publish`)."""
    entry = _CHANNELS.get(channel)
    return () if entry is None else entry.waiters


def readers(channel: str) -> int:
    """How many sources read the channel now."""
    entry = _CHANNELS.get(channel)
    return 0 if entry is None else entry.readers


async def pushed(channel: str) -> AsyncIterator[Any]:
    """The channel's current state, then its newest state after each publish."""
    entry = _CHANNELS.setdefault(channel, _Channel())
    entry.readers += 1
    try:
        seen = entry.version
        yield entry.state
        while True:
            if entry.version == seen:
                waiter = asyncio.get_running_loop().create_future()
                entry.waiters = (*entry.waiters, waiter)
                try:
                    await waiter
                finally:
                    entry.waiters = _without(entry.waiters, waiter)
            seen = entry.version
            yield entry.state
    finally:
        entry.readers -= 1


#: channel -> how many times :func:`flaky` was called for it
CALLS: dict[str, int] = {}


async def flaky(channel: str) -> AsyncIterator[Any]:
    """As :func:`pushed`, but a published state starting with ``FAIL`` makes it raise (a dropped
    feed) instead of yielding it; called again, it yields the channel's state first, whatever it is."""
    CALLS[channel] = CALLS.get(channel, 0) + 1
    entry = _CHANNELS.setdefault(channel, _Channel())
    seen = entry.version
    yield entry.state
    while True:
        if entry.version == seen:
            waiter = asyncio.get_running_loop().create_future()
            entry.waiters = (*entry.waiters, waiter)
            try:
                await waiter
            finally:
                entry.waiters = _without(entry.waiters, waiter)
        seen = entry.version
        if str(entry.state).startswith("FAIL"):
            raise ConnectionError("the feed dropped")
        yield entry.state


def source(channel: str) -> dict[str, Any]:
    """The trigger's ``source`` kwarg for ``channel``."""
    return {"type": "callable", "path": "tests.helpers.channels.pushed", "kwargs": {"channel": channel}}
