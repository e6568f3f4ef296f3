"""State sources the budget tests' sensors stream (imported by dotted path in the trigger)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

#: source name -> how many times it was started (one per try).
STARTS: dict[str, int] = {}


async def ticking(
    name: str, lines: list[str], gap: float, fail_first_try_after: int | None = None
) -> AsyncIterator[str]:
    """A log that grows by one line every ``gap`` seconds; on the first try it can break after
    ``fail_first_try_after`` lines (a lost source the task's retry gets over)."""
    STARTS[name] = STARTS.get(name, 0) + 1
    state = ""
    for index, line in enumerate(lines):
        if fail_first_try_after is not None and STARTS[name] == 1 and index == fail_first_try_after:
            raise RuntimeError("the log source went away (first try only)")
        state += line
        yield state
        await asyncio.sleep(gap)
