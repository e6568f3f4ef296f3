"""A state source the fault matrix's sensor triggers poll (the ``callable`` source takes a dotted path)."""

from __future__ import annotations

from typing import Any

#: source name -> the state it returns now; a case changes an entry to make the source change.
STATES: dict[str, Any] = {}


def state(name: str) -> Any:
    """The current state of source ``name`` (a sync callable: the trigger runs it in a thread)."""
    return STATES[name]
