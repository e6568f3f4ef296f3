"""Authors' functions the trigger tests name by dotted path: sources and decide_when gates."""

from __future__ import annotations

import threading
from typing import Any

#: A list a source returns itself, appended to in place by the test (the same object each call).
GROWING: list[Any] = []
#: What :func:`read_value` returns (a sync source the test changes).
VALUE: dict[str, Any] = {"state": "job started\n"}
#: Set to let every hung gate return.
RELEASE = threading.Event()
#: How many gate calls are hanging now.
HANGING = 0
_lock = threading.Lock()


def growing_list() -> list[Any]:
    """The same list object every call (the test appends to it)."""
    return GROWING


def read_value() -> str:
    """The test's value (a sync source polled by the trigger)."""
    return VALUE["state"]


def hang(previous: Any, new: Any) -> bool:
    """A decide_when callable that blocks until :data:`RELEASE` is set."""
    global HANGING
    with _lock:
        HANGING += 1
    try:
        RELEASE.wait(60)
    finally:
        with _lock:
            HANGING -= 1
    return True
