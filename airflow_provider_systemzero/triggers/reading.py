"""The one task that reads a trigger's source while the trigger opens and holds a stream.

A woken trigger reads its source from the moment it builds a stream until it gives the stream
back: first so that the stream opens with the newest state (:meth:`SourceReading.follow`: each
change becomes the stream's desired state while it waits for a slot, the connection or
``start``'s acknowledgement), then for the stream's feeder (:attr:`SourceReading.deliver`
switched to the feeder's hand-over). One task reads the whole way, so nothing is read twice, no
value falls between two readers, and a push source is not restarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

__all__ = ["SourceReading", "retrieved"]

log = logging.getLogger("airflow_provider_systemzero.triggers.streaming")  # the triggers' stream log

Deliver = Callable[[Any], Awaitable[None]]


def retrieved(task: asyncio.Future[Any]) -> None:
    """Mark a stopped task's outcome as seen: its error no longer matters, and a cancelled task lets
    go of its cancellation, whose traceback holds the task's frames (and what they referenced)
    until then — a cycle through whoever holds the task."""
    if task.cancelled():
        with contextlib.suppress(asyncio.CancelledError):
            task.result()  # hands over (and so drops) the stored cancellation
    else:
        task.exception()


class SourceReading:
    """A source's ``changes()`` read in one task, each value handed to :attr:`deliver`.

    The task (:attr:`task`) ends when the source ends (its result ``None``) or fails (its
    exception), or when :meth:`aclose` stops it. While it :meth:`follow` s a stream, a failure
    (the source's, or the stream refusing a state) only stops the reading and makes it
    :attr:`usable` no more: the feeder then reads the source anew once the stream is open, and
    says why.

    :param changes: the source's ``changes()``.
    :param deliver: what takes each value (awaited before the next value is read).
    """

    __slots__ = ("_changes", "_following", "deliver", "task", "usable")

    def __init__(self, changes: AsyncIterator[Any], deliver: Deliver | None = None) -> None:
        self._changes = changes
        #: takes each value the source gives (``None``: the value is dropped)
        self.deliver = deliver
        #: ``False`` once the follow phase failed (the next reader reads the source anew)
        self.usable = True
        self._following = False
        #: the reading task
        self.task: asyncio.Task[None] = asyncio.ensure_future(self._run())

    def follow(self, stream: Any) -> None:
        """Make each value the desired state of ``stream`` while it opens (until :attr:`deliver`
        is given to someone else)."""
        said = False

        async def into_stream(state: Any) -> None:
            nonlocal said
            if state != stream.state:
                if not said:
                    said = True
                    log.info(
                        "the source changed while the stream waits to open: it opens with the newest state"
                    )
                await stream.set_state(state)

        self._following = True
        self.deliver = into_stream

    def hand_to(self, deliver: Deliver) -> None:
        """From now on each value goes to ``deliver`` (the follow phase, if any, ends)."""
        self._following = False
        self.deliver = deliver

    async def _run(self) -> None:
        changes = self._changes
        try:
            async for value in changes:
                if self.deliver is not None:  # no local keeps a past receiver alive
                    await self.deliver(value)
        except Exception as exc:
            if not self._following:
                raise
            # the feeder reads the source anew once the stream is open, and says why
            self.usable = False
            log.debug("not following the source while the stream opens: %s", exc)
        finally:
            with contextlib.suppress(Exception):
                await changes.aclose()  # type: ignore[attr-defined]

    async def aclose(self) -> None:
        """Stop the reading and close the source's iterator (errors are the caller's no more)."""
        task = self.task
        task.cancel()
        task.add_done_callback(retrieved)
        await asyncio.wait((task,))
