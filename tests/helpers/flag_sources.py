"""State sources importable by triggers under test (the ``callable`` source takes a dotted path)."""

from __future__ import annotations

from collections.abc import AsyncIterator

#: name -> current state; tests flip entries to make a source change.
STATES: dict[str, str] = {}


async def flag_state(name: str) -> str:
    """The current state of ``name`` (an async callable source)."""
    return STATES.get(name, "waiting\n")


def sync_flag_state(name: str) -> str:
    """The same, as a sync callable (run in a thread by the trigger)."""
    return STATES.get(name, "waiting\n")


async def pushed_states(steps: list[str]) -> AsyncIterator[str]:
    """An async generator source: yields each state in turn."""
    for step in steps:
        yield step
