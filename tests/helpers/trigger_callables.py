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


#: How many more calls of :func:`flaky_gate` raise (the test sets it).
GATE_FAILURES = 0
#: How many more calls of :func:`flaky_gate` hang until :data:`RELEASE` is set (the test sets it).
GATE_HANGS = 0


def flaky_gate(previous: Any, new: Any) -> bool:
    """A decide_when callable: a change whose newest line says ready or failed matters. While
    :data:`GATE_FAILURES` is above 0 a call raises instead (and counts it down); while
    :data:`GATE_HANGS` is, a call blocks until :data:`RELEASE` is set first."""
    global GATE_FAILURES, GATE_HANGS
    with _lock:
        hang, GATE_HANGS = GATE_HANGS > 0, max(0, GATE_HANGS - 1)
        fail, GATE_FAILURES = GATE_FAILURES > 0, max(0, GATE_FAILURES - 1)
    if hang:
        RELEASE.wait(60)
    if fail:
        raise ConnectionError("the gate's lookup failed")
    return decisive(previous, new)


def decisive(previous: Any, new: Any) -> bool:
    """A decide_when callable: a change matters when the newest line of the new state says the
    job is ready or failed (whatever came before)."""
    last = str(new).rstrip("\n").rsplit("\n", 1)[-1].lower()
    return "ready" in last or "failed" in last
