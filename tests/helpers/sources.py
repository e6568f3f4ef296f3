"""What the source tests share: a file source's spec, a source's successive states, the first of
them that passes, and the loop's live timers."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from airflow_provider_systemzero.sources import StateSource, base, build_source
from tests.helpers import live_timers


def inotify_descriptors() -> int:
    """Open inotify descriptors of this process."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify":
                count += 1
        except OSError:
            continue
    return count


def scheduled_callbacks() -> list[Any]:
    """What the running loop's live timers will call."""
    return [callback for _, callback in live_timers()]


def poll_timers() -> int:
    """Live timers of sources' polls: those :func:`~airflow_provider_systemzero.sources.base.after`
    sets, the one timer its module schedules."""
    return sum(getattr(callback, "__module__", None) == base.__name__ for callback in scheduled_callbacks())


#: A file source's ``poll_interval`` in the tests: a change that arrives at all arrived by notification.
HOUR = 3600.0


def spec(path: Path, **extra: Any) -> dict[str, Any]:
    """A file source on ``path`` (polled only once an hour), with ``extra`` keys."""
    return {"type": "file", "path": str(path), "poll_interval": HOUR, **extra}


async def states(source: StateSource) -> AsyncIterator[Any]:
    """The successive distinct states of ``source`` that are not withheld, read as a trigger's
    driver reads them: ``read()``, then ``changed()``, then ``read()`` again and compare."""
    last: Any = _NOTHING_YET
    while True:
        state = await source.read()
        if state != last and not source.withheld(state):
            last = state
            yield state
        await source.changed()


_NOTHING_YET: Any = object()


@contextlib.asynccontextmanager
async def tailing(
    source_spec: dict[str, Any], initial: Any = ""
) -> AsyncIterator[tuple[Any, AsyncIterator[Any]]]:
    """The source built from ``source_spec`` and its :func:`states`, both closed on the way out."""
    source = build_source(source_spec, initial)
    read = states(source)
    try:
        yield source, read
    finally:
        await read.aclose()
        await source.aclose()


async def value_where(
    changes: AsyncIterator[Any], predicate: Callable[[Any], bool], within: float = 10
) -> Any:
    """The first value of ``changes`` that ``predicate`` accepts (bounded)."""
    async with asyncio.timeout(within):
        async for value in changes:
            if predicate(value):
                return value
    raise AssertionError("the source ended")
