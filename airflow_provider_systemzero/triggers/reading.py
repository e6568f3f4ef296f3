"""The read of a trigger's source handed from one reader to the next.

While a stream waits to open, its trigger reads the source so that the stream opens with the
newest state (:meth:`SourceReading.follow`); once it is open, the feeder reads on from the same
place (:meth:`SourceReading.rest`): nothing is read twice and a push source is not restarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

__all__ = ["SourceReading"]

log = logging.getLogger("airflow_provider_systemzero.triggers.streaming")  # the triggers' stream log


class SourceReading:
    """A source's ``changes()`` being read, one value at a time, by one reader after another.

    The read of the next value survives its reader's cancellation (it is shielded), so the next
    reader gets that value: nothing is lost and a push source is not restarted between readers.

    :param changes: the source's ``changes()``.
    """

    __slots__ = ("_changes", "_pending", "usable")

    def __init__(self, changes: AsyncIterator[Any]) -> None:
        self._changes = changes
        self._pending: asyncio.Future[Any] | None = None
        #: ``False`` once a value could not be handed over (the next reader reads the source anew)
        self.usable = True

    def __aiter__(self) -> SourceReading:
        return self

    async def __anext__(self) -> Any:
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._next())
        value = await asyncio.shield(self._pending)
        self._pending = None
        return value

    async def _next(self) -> Any:
        return await anext(self._changes)

    async def rest(self) -> AsyncIterator[Any]:
        """The values from here on for the last reader: the value a cancelled reader began to read,
        then the source's own iterator, read in the caller's task (no task, no shield per value)."""
        if self._pending is not None:
            try:
                value = await self.__anext__()
            except StopAsyncIteration:
                return
            yield value
        async for value in self._changes:
            yield value

    async def follow(self, stream: Any) -> None:
        """Make each value the desired state of ``stream`` while it opens (until cancelled)."""
        said = False
        try:
            async for state in self:
                if state != stream.state:
                    if not said:
                        said = True
                        log.info(
                            "the source changed while the stream waits to open: it opens with the newest state"
                        )
                    await stream.set_state(state)
        except Exception as exc:  # the feeder reads the source anew once the stream is open, and says why
            self.usable = False
            log.debug("not following the source while the stream opens: %s", exc)

    async def aclose(self) -> None:
        """Stop the read in progress and close the source's iterator."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self._changes.aclose()  # type: ignore[attr-defined]
