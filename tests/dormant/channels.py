"""A push source the dormant-trigger tests change at will (``{"type": "callable", "path":
"tests.dormant.channels.pushed", "kwargs": {"channel": ...}}``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

#: channel -> (current state, the queues of the sources reading it)
_CHANNELS: dict[str, tuple[list[Any], set[asyncio.Queue[Any]]]] = {}


def publish(channel: str, state: Any) -> None:
    """Make ``state`` the channel's current state and push it to every source reading it."""
    current, readers = _CHANNELS.setdefault(channel, (["waiting\n"], set()))
    current[0] = state
    for queue in readers:
        queue.put_nowait(state)


def readers(channel: str) -> int:
    """How many sources read the channel now."""
    return len(_CHANNELS.get(channel, ([], set()))[1])


async def pushed(channel: str) -> AsyncIterator[Any]:
    """The channel's current state, then each state published to it."""
    current, subscribers = _CHANNELS.setdefault(channel, (["waiting\n"], set()))
    queue: asyncio.Queue[Any] = asyncio.Queue()
    subscribers.add(queue)
    try:
        yield current[0]
        while True:
            yield await queue.get()
    finally:
        subscribers.discard(queue)


def source(channel: str) -> dict[str, Any]:
    """The trigger's ``source`` kwarg for ``channel``."""
    return {"type": "callable", "path": "tests.dormant.channels.pushed", "kwargs": {"channel": channel}}
