"""When something happened, as the provider's records and events say it: ISO 8601 text in UTC,
with its offset (``2026-12-04T20:37:28+00:00``), made with ``pendulum``.

A time comes from System Zero (a reply's ``created``, epoch seconds), from Airflow (a reviewer's
``responded_at``, a ``datetime`` or ISO text) or from the clock; :func:`utc_iso` reads each the
same way, so a record never holds a naive or local time.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

import pendulum

__all__ = ["now_iso", "utc_iso"]


def utc_iso(value: Any) -> str | None:
    """``value`` as ISO 8601 text in UTC, or ``None`` when it is no time.

    :param value: epoch seconds (a positive finite number), a ``datetime`` (a naive one is taken as
        UTC), or ISO 8601 text; anything else, or a time out of range, is no time.
    """
    try:
        if isinstance(value, bool):
            return None
        if isinstance(value, int | float):
            if not math.isfinite(value) or value <= 0:
                return None
            moment = pendulum.from_timestamp(value, tz="UTC")
        elif isinstance(value, datetime):
            moment = pendulum.instance(value, tz="UTC")
        elif isinstance(value, str) and value.strip():
            moment = pendulum.parse(value.strip(), tz="UTC")
        else:
            return None
    except (ValueError, OverflowError, OSError, TypeError):  # pendulum's ParserError is a ValueError
        return None
    if not isinstance(moment, pendulum.DateTime):  # a date or a duration written as text
        return None
    return moment.in_timezone("UTC").isoformat()


def now_iso() -> str:
    """The time now, as :func:`utc_iso` writes it."""
    return pendulum.now("UTC").isoformat()
