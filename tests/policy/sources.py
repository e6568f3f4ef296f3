"""State sources for the sensor tests (importable in the triggerer: ``tests.policy.sources.…``)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator

#: how many times each ``stepping`` source was read
READS: Counter[str] = Counter()


async def paced(states: list[str], interval: float = 0.3) -> AsyncIterator[str]:
    """Each state in turn, ``interval`` seconds apart (then the last one stays)."""
    for index, state in enumerate(states):
        if index:
            await asyncio.sleep(interval)
        yield state


def stepping(name: str, states: list[str]) -> str:
    """The next state on every read (a poking sensor's source); the last one stays."""
    READS[name] += 1
    return states[min(READS[name], len(states)) - 1]
