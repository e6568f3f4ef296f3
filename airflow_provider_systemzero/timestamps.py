"""When something happened, as the provider's records and events say it: ISO 8601 text in UTC, to
the millisecond (``2026-12-04T20:37:28.506Z``), the form the decision history writes its times in.

This module is the one place that turns a number into a time, and none of its functions raises:

* :func:`iso_time` writes epoch seconds as that text. A time outside the range a record holds
  (:data:`EARLIEST` to :data:`LATEST`: 1970 to the end of year 9999) is written as the nearest end
  of it, ``NaN`` as the earliest, so a record is always written;
* :func:`back_dated` is the moment some milliseconds before another (a billed start, dated from
  the time the gateway says the dispatch waited and took), within that range however many
  milliseconds a gateway names;
* :func:`utc_iso` reads what System Zero (a reply's ``created``, epoch seconds) or Airflow (a
  reviewer's ``responded_at``, a ``datetime`` or ISO text) gives as a time, or says there is none,
  so a record never holds a naive or local time.

The protocol core bounds every number a gateway sends before any of it reaches here
(``protocol/messages.py``); these functions hold whatever a number is anyway.
"""

from __future__ import annotations

import math
import time
from datetime import datetime
from typing import Any

import pendulum

from airflow_provider_systemzero.protocol.reply import MAX_CREATED

__all__ = ["EARLIEST", "LATEST", "back_dated", "iso_time", "now_iso", "utc_iso"]

#: The earliest time a record holds (epoch seconds): 1970-01-01T00:00:00.000Z.
EARLIEST = 0.0
#: The latest time a record holds (epoch seconds): 9999-12-31T23:59:59.000Z.
LATEST = float(MAX_CREATED)


def _clamped(value: Any, low: float, high: float) -> float:
    """``value`` as a float moved into ``low`` … ``high`` (``NaN``, or no number at all: ``low``)."""
    try:
        number = float(value)
    except OverflowError:  # an integer beyond any float
        return high if value > 0 else low
    except (TypeError, ValueError):
        return low
    if not number >= low:  # NaN too
        return low
    return min(number, high)


def iso_time(at: float) -> str:
    """Epoch seconds as UTC ISO 8601 with milliseconds (``2026-09-21T14:02:00.123Z``), in pendulum's
    UTC whatever the machine's zone; a time out of range is written as the nearest end of it
    (:data:`EARLIEST`, :data:`LATEST`). Never raises.

    :param at: epoch seconds.
    """
    # datetime's own formatting, in pendulum's UTC: a full history is 400 of these at an event,
    # and pendulum's formatter takes three times as long in the triggerer's loop
    moment = datetime.fromtimestamp(round(_clamped(at, EARLIEST, LATEST), 3), pendulum.UTC)
    return moment.isoformat(timespec="milliseconds")[:-6] + "Z"


def back_dated(now: float, milliseconds: float | None) -> float:
    """The moment ``milliseconds`` before ``now`` (epoch seconds), within :data:`EARLIEST` …
    :data:`LATEST`; a duration that is not a finite number of milliseconds from 0 (``None``, a
    negative one, ``NaN``) counts as none. Never raises.

    :param now: epoch seconds.
    :param milliseconds: how long before ``now``.
    """
    if isinstance(milliseconds, bool):
        milliseconds = None
    before = _clamped(milliseconds, 0.0, LATEST * 1000) / 1000
    return _clamped(_clamped(now, EARLIEST, LATEST) - before, EARLIEST, LATEST)


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
        UTC), or ISO 8601 text; anything else, or a time out of range (:data:`EARLIEST` …
        :data:`LATEST`), is no time.
    """
    try:
        epoch = _epoch(value)
    except (ValueError, OverflowError, OSError):  # pendulum's ParserError is a ValueError
        return None
    return None if epoch is None or not EARLIEST <= epoch <= LATEST else iso_time(epoch)


def now_iso() -> str:
    """The time now, as :func:`utc_iso` writes it."""
    return iso_time(time.time())
