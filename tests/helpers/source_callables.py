"""Callable sources importable by the tests (a ``callable`` source takes a dotted path)."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator

#: name -> how many times the source was called.
CALLS: dict[str, int] = {}
#: name -> calls running now, and the most ever running at once.
RUNNING: dict[str, int] = {}
MOST_RUNNING: dict[str, int] = {}
#: Set it to let every :func:`hang` call return.
RELEASE = threading.Event()
_LOCK = threading.Lock()


def hang(name: str) -> str:
    """A sync source that blocks until :data:`RELEASE` is set, counting concurrent calls."""
    with _LOCK:
        CALLS[name] = CALLS.get(name, 0) + 1
        RUNNING[name] = RUNNING.get(name, 0) + 1
        MOST_RUNNING[name] = max(MOST_RUNNING.get(name, 0), RUNNING[name])
    try:
        RELEASE.wait(60)
        return "released\n"
    finally:
        with _LOCK:
            RUNNING[name] -= 1


def sleep_for(seconds: float) -> str:
    """A sync source that sleeps (used by a child process that must not wait for it to exit)."""
    time.sleep(seconds)
    return "slept\n"


def quick(name: str) -> str:
    """A sync source that answers at once."""
    return f"{name} is fine\n"


def flaky(name: str, failures: int) -> str:
    """Fails (a network blip) on its first ``failures`` calls, then says the job is ready."""
    with _LOCK:
        CALLS[name] = CALLS.get(name, 0) + 1
        count = CALLS[name]
    if count <= failures:
        raise ConnectionError(f"network blip number {count}")
    return "Job is ready.\n"


async def flaky_generator(name: str) -> AsyncIterator[str]:
    """An async generator that fails after its first value on the first run, then yields ready."""
    CALLS[name] = CALLS.get(name, 0) + 1
    yield "waiting\n"
    if CALLS[name] == 1:
        raise ConnectionError("the feed dropped")
    yield "Job is ready.\n"


async def two_then_end(name: str) -> AsyncIterator[str]:
    """An async generator that yields twice and returns (counted in :data:`CALLS`)."""
    CALLS[name] = CALLS.get(name, 0) + 1
    yield "waiting\n"
    yield "still waiting\n"
