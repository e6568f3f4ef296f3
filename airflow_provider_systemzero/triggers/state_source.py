"""The base of every state source: the desired state over time, and the state that never changes.

See :mod:`~airflow_provider_systemzero.triggers.sources` for how a source is described and built.

A source is read two ways. While a trigger holds a stream, :meth:`StateSource.changes` yields each
new state to the stream's feeder. While it holds none (dormant), the trigger awaits
:meth:`StateSource.next_change` itself, one awaitable at a time, and hands what it gives to
:meth:`StateSource.taken` (or an error to :meth:`StateSource.failed`): no iterator or
coroutine of the provider's stays between the trigger and the source's own wait — a file's
notification future, a push generator's one read (a task of its own, so that no waiter's
cancellation reaches the author's generator) — so a waiting trigger keeps as few objects as the
source needs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_POLL_INTERVAL", "NO_CHANGE", "StateSource", "StaticSource"]

#: Seconds between checks of a polled source.
DEFAULT_POLL_INTERVAL = 1.0

#: What :meth:`StateSource.failed` returns when the source recovered but has no new state yet
#: (and what a dormant wait returns as the state when only time passed).
NO_CHANGE: Any = object()


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

    def read_now(self) -> Any:
        """The desired state now, read in the calling thread, without an event loop: a poking
        sensor's read on its worker, poke after poke with the same source, so a poke reads what
        a trigger would (:meth:`withheld` and :meth:`waiting_on` apply to it alike)."""
        raise NotImplementedError

    def next_change(self, *, kept: bool = False) -> Awaitable[Any]:
        """What a dormant trigger awaits: one awaitable that completes when the source may have a
        new state (its value goes to :meth:`taken`, an exception to :meth:`failed`).

        Called, not awaited, by the trigger: a source that can hands out its own wait (a push
        generator's read, a notification future), so nothing of the provider's sits between the
        waiting trigger and the source. The state it leads to may equal the last one. This
        default polls: ``poll_interval`` seconds, then :meth:`current`.

        :param kept: whether the source must outlive the wait: ``False`` when only the trigger's
            end cancels the wait (the source is closed next), ``True`` when a timer may end it
            while the trigger goes on. A source whose wait holds what must not be lost (a push
            generator's read) hands out a shield of it only when ``kept``.
        """
        return self._polled()

    async def _polled(self) -> Any:
        await asyncio.sleep(self.poll_interval)
        return await self.current()

    def withheld(self, state: Any) -> bool:
        """Whether ``state`` holds nothing to decide (this default: it always holds something).

        A trigger opens no stream about a withheld state and sends none to an open stream; it
        waits for the source's next state instead, so nothing is decided or billed meanwhile (a
        file source whose file is missing or empty: :meth:`FileSource.withheld
        <airflow_provider_systemzero.triggers.file_source.FileSource.withheld>`).

        :param state: a state the source gave.
        """
        return False

    def waiting_on(self) -> str | None:
        """What a wait on this source may be stuck on, for the message of a deadline that passed
        (``None``: nothing this source knows of)."""
        return None

    def describe(self) -> str:
        """Where the state comes from, in a few words for the log line a wait starts with."""
        return f"a {type(self).__name__}"

    async def taken(self, value: Any) -> Any:
        """The state that the value :meth:`next_change` gave stands for (this default: the value).

        :param value: what the awaitable of :meth:`next_change` returned.
        """
        return value

    async def failed(self, exc: Exception) -> Any:
        """The awaitable of :meth:`next_change` raised ``exc``: raise (the trigger ends with an error
        event), or return :data:`NO_CHANGE` once the source may be waited on again (this default
        raises).

        :param exc: the exception (a cancellation is never passed: it propagates).
        """
        raise exc

    async def aclose(self) -> None:
        """Release what the source holds (open files, generators)."""


@dataclass
class StaticSource(StateSource):
    """A state that never changes."""

    state: Any

    async def current(self) -> Any:
        return self.state

    def read_now(self) -> Any:
        return self.state

    async def changes(self) -> AsyncIterator[Any]:
        yield self.state
        await asyncio.Event().wait()  # nothing ever changes

    def next_change(self, *, kept: bool = False) -> Awaitable[Any]:
        return asyncio.get_running_loop().create_future()  # nothing ever completes it

    def describe(self) -> str:
        return "the task (it never changes)"
