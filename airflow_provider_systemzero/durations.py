"""Durations: what counts as a number of seconds an author, a connection or the configuration
gives, and how a duration reads in a message.

One rule for every duration the provider takes — a task's ``decision_timeout``, a sensor's
``lease_after`` and ``max_staleness``, a source's ``poll_interval``, a connection's
``open_timeout``, the configured reconnect backoff: a real number (not ``True``/``False``), not
negative, and finite. ``inf`` and ``nan`` parse as floats, but a wait of ``inf`` never ends: it
is refused where it is given, with the argument named by the caller, instead of a wait that
cannot end or a crash when the task runs (``timedelta(seconds=inf)``).

Every message that states a duration says it the way people read one (:func:`readable`): ``350
ms``, ``2.5 s``, ``7.99 s``, ``45 s``, ``4 min 10 s``, ``4 h``, ``2 d 3 h``.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["is_seconds", "parse_seconds", "readable"]

#: The units :func:`readable` writes above a minute: its name and its length in seconds.
_UNITS = (("d", 86_400), ("h", 3_600), ("min", 60))


def is_seconds(value: Any, *, positive: bool = False, at_most: float = math.inf) -> bool:
    """Whether ``value`` is a finite number of seconds: 0 or more (more than 0 when ``positive``),
    at most ``at_most``.

    :param value: what was given.
    :param positive: refuse 0 too (a timeout, an interval).
    :param at_most: the largest value allowed.
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return False
    return (value > 0 if positive else value >= 0) and value <= at_most


def parse_seconds(raw: Any, default: float) -> float | None:
    """A duration given as text or a number (a connection's extra, a configuration value):
    ``default`` when it is missing or blank, the number when it reads as one, else ``None`` (the
    caller names the field; a number is then checked with :func:`is_seconds`).

    :param raw: the value as stored.
    :param default: the value when none is given.
    """
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return default
    if isinstance(raw, bool):
        return None
    try:
        return float(raw)
    except (TypeError, ValueError):
        return None


def readable(seconds: float) -> str:
    """A duration as people read it: milliseconds under a second, seconds (at most two decimals
    under ten) under a minute, then the two largest units (``4 min 10 s``, ``1 h 5 min``, ``2 d 3 h``); a
    unit that is zero is left out (``4 h``).

    :param seconds: the duration (a negative one reads as its size; a non-finite one as written).
    """
    if not math.isfinite(seconds):
        return f"{seconds} s"
    seconds = abs(seconds)
    if round(seconds, 3) < 1:
        return f"{round(seconds * 1000)} ms"
    if round(seconds, 2) < 10:
        return f"{seconds:.2f}".rstrip("0").removesuffix(".") + " s"
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    for index, (name, size) in enumerate(_UNITS):
        if whole >= size:
            big, rest = divmod(whole, size)
            small_name, small_size = (*_UNITS, ("s", 1))[index + 1]
            small = rest // small_size
            return f"{big} {name}" + (f" {small} {small_name}" if small else "")
    raise AssertionError("unreachable")  # pragma: no cover
