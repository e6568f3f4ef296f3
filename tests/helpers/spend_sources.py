"""A push source the tests change by hand, and decide_when callables (importable by dotted path)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

_QUEUES: dict[str, asyncio.Queue[str]] = {}
_CURRENT: dict[str, str] = {}


def publish(channel: str, state: str) -> None:
    """Make ``state`` the channel's state (the trigger's source yields it next)."""
    _CURRENT[channel] = state
    _QUEUES.setdefault(channel, asyncio.Queue()).put_nowait(state)


async def channel(name: str) -> AsyncIterator[str]:
    """An async-generator source: the channel's current state, then each published state."""
    queue = _QUEUES.setdefault(name, asyncio.Queue())
    while not queue.empty():  # what was published before the trigger started is its current state
        queue.get_nowait()
    yield _CURRENT.get(name, "starting\n")
    while True:
        yield await queue.get()


def says_ready(previous: str, new: str) -> bool:
    """A decide_when callable: the change appends a line saying the job is ready."""
    return "job is ready" in new[len(previous) :].lower()
