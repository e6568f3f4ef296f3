"""The base of every state source: the desired state over time, and the state that never changes.

See :mod:`~airflow_provider_systemzero.triggers.sources` for how a source is described and built.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_POLL_INTERVAL", "StateSource", "StaticSource"]

#: Seconds between checks of a polled source.
DEFAULT_POLL_INTERVAL = 1.0


class StateSource:
    """The desired state over time: :meth:`changes` yields every new desired state."""

    #: seconds between polls (0 for push sources).
    poll_interval: float = DEFAULT_POLL_INTERVAL

    async def current(self) -> Any:
        """The desired state now."""
        raise NotImplementedError

    async def changes(self) -> AsyncIterator[Any]:
        """Yield the desired state each time it changes (never the same value twice in a row)."""
        last = await self.current()
        yield last
        while True:
            await asyncio.sleep(self.poll_interval)
            value = await self.current()
            if value is not last and value != last:
                last = value
                yield value

    async def aclose(self) -> None:
        """Release what the source holds (open files, generators)."""


@dataclass
class StaticSource(StateSource):
    """A state that never changes."""

    state: Any

    async def current(self) -> Any:
        return self.state

    async def changes(self) -> AsyncIterator[Any]:
        yield self.state
        await asyncio.Event().wait()  # nothing ever changes
