"""When something happened, as the provider's records and events say it: ISO 8601 text in UTC, to
the millisecond (``2026-12-04T20:37:28.506Z``), the form the decision history writes its times in
(:func:`~airflow_provider_systemzero.decisions.timeline.iso_time`, in ``pendulum``'s UTC).

A time comes from System Zero (a reply's ``created``, epoch seconds), from Airflow (a reviewer's
``responded_at``, a ``datetime`` or ISO text) or from the clock; :func:`utc_iso` reads each the
same way, so a record never holds a naive or local time.
"""

from __future__ import annotations

import math
import time
from datetime import datetime
from typing import Any

import pendulum

from airflow_provider_systemzero.decisions.timeline import iso_time

__all__ = ["now_iso", "utc_iso"]


def _epoch(value: Any) -> float | None:
    """``value`` as epoch seconds, or ``None`` when it is no time."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) and value > 0 else None
    if isinstance(value, datetime):
        return (value if value.tzinfo is not None else value.replace(tzinfo=pendulum.UTC)).timestamp()
    if isinstance(value, str) and value.strip():
        moment = pendulum.parse(value.strip(), tz="UTC")
        return moment.timestamp() if isinstance(moment, pendulum.DateTime) else None  # not a date alone
    return None


def utc_iso(value: Any) -> str | None:
    """``value`` as UTC ISO 8601 text to the millisecond, or ``None`` when it is no time.

    :param value: epoch seconds (a positive finite number), a ``datetime`` (a naive one is taken as
        UTC), or ISO 8601 text; anything else, or a time out of range, is no time.
    """
    try:
        epoch = _epoch(value)
        return None if epoch is None else iso_time(epoch)
    except (ValueError, OverflowError, OSError):  # pendulum's ParserError is a ValueError
        return None


def now_iso() -> str:
    """The time now, as :func:`utc_iso` writes it."""
    return iso_time(time.time())
