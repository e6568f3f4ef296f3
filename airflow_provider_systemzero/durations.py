"""What counts as a number of seconds an author, a connection or the configuration gives.

One rule for every duration the provider takes — a task's ``decision_timeout``, a sensor's
``lease_after`` and ``max_staleness``, a source's ``poll_interval``, a connection's
``open_timeout``, the configured reconnect backoff: a real number (not ``True``/``False``), not
negative, and finite. ``inf`` and ``nan`` parse as floats, but a wait of ``inf`` never ends: it
is refused where it is given, with the argument named by the caller, instead of a wait that
cannot end or a crash when the task runs (``timedelta(seconds=inf)``).
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["is_seconds", "parse_seconds"]


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
