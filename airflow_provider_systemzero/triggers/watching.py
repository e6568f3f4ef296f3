"""What a trigger that watches a source (the decision trigger, the event trigger) builds from its
kwargs, with each stream it holds, and tears down: its ``decide_when`` filter, its lease, its
source feeder, and the closing of its stream and source; and how an asset watch, which has no
task to fail, goes on after a failure (:func:`wait_to_watch_again`)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import time
from collections.abc import Mapping
from typing import Any

from airflow_provider_systemzero.decisions.relevance import DecisionFilter, DecisionGate
from airflow_provider_systemzero.protocol.reconnect import doubled
from airflow_provider_systemzero.triggers.currency import validate_max_staleness
from airflow_provider_systemzero.triggers.feeder import SourceFeeder
from airflow_provider_systemzero.triggers.lease import StreamLease
from airflow_provider_systemzero.triggers.sources import StateSource

__all__ = [
    "WATCH_HEALTHY_S",
    "WATCH_RETRY_FIRST_S",
    "WATCH_RETRY_MAX_S",
    "announce_wait",
    "close_watching",
    "end_lease",
    "failures_in_a_row",
    "new_feeder",
    "new_lease",
    "wait_to_watch_again",
    "watch_source",
]

log = logging.getLogger(__name__)

#: After an asset watch's first failure in a row it tries again in this many seconds, twice as
#: long after each further one, up to :data:`WATCH_RETRY_MAX_S`. A watcher trigger that ended
#: would be started again by the triggerer within seconds, over and over, each time with a
#: traceback and "Dependent tasks will be failed" (a watcher has none); so it stays and waits.
WATCH_RETRY_FIRST_S = 5.0
#: The longest wait between two tries: a connection fixed, or a gateway back, is picked up within it.
WATCH_RETRY_MAX_S = 60.0
#: A try that lasted this long was healthy: its failure counts as the first in a row again (a
#: watch that ran for days without a transition does not start its next outage at the cap).
WATCH_HEALTHY_S = 120.0


def new_feeder(
    trigger: Any, stream: Any, source: StateSource, mode: str, gate: DecisionGate | None
) -> SourceFeeder:
    """The feeder of one of ``trigger``'s streams (a decision or an event trigger): its lease,
    staleness bound and ``decide_when`` filter, with the gate it keeps across streams."""
    return SourceFeeder(
        stream,
        source,
        decision_mode=mode,
        lease=trigger._lease,
        max_staleness=trigger.max_staleness,
        decision_filter=trigger.decision_filter,
        gate=gate,
        reading=trigger._stream.take_reading(),
    )


#: The filter of every trigger without ``decide_when``, ``debounce_ms`` or ``decide_initial``
#: (shared: a waiting trigger keeps one object fewer).
_NO_FILTER = DecisionFilter()


def announce_wait(condition: Mapping[str, Any], source: StateSource, deadline: float | None = None) -> None:
    """The line a trigger's wait starts with: what it waits for, where the state comes from, and
    until when.

    :param condition: the trigger's condition (its dict form).
    :param source: the trigger's source.
    :param deadline: the task's deadline (epoch seconds; ``None``: an asset watch, which has none).
    """
    until = ""
    if deadline is not None:
        at = datetime.datetime.fromtimestamp(deadline, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        until = f"; the task's deadline is {at} (in {max(0.0, deadline - time.time()):.0f} s)"
    log.info(
        "waiting until %s = %r; the state comes from %s%s",
        condition.get("question"),
        condition.get("expect"),
        source.describe(),
        until,
    )


def watch_source(trigger: Any, given: Mapping[str, Any]) -> None:
    """What a trigger that watches a source (a decision or an event trigger) builds from its kwargs
    (``given``, its ``__init__``'s ``locals()``): the ``decide_when`` filter, the validated
    ``max_staleness``; the source is built when the trigger runs, a lease with each stream
    (:func:`new_lease`)."""
    decision_filter = DecisionFilter(
        decide_when=given["decide_when"],
        debounce_ms=given["debounce_ms"],
        decide_initial=given["decide_initial"],
    )
    # without decide_when, debounce_ms and decide_initial the filter is never changed: one for all
    trigger.decision_filter = _NO_FILTER if not decision_filter.to_kwargs() else decision_filter
    trigger.max_staleness = validate_max_staleness(given["max_staleness"])
    trigger._lease = None
    trigger._source = None


def new_lease(trigger: Any) -> StreamLease:
    """The lease of the stream ``trigger`` is about to hold: it lives as long as that stream (a
    dormant trigger keeps what it needs of it in its :class:`TriggerStream`, :func:`end_lease`)."""
    trigger._lease = lease = StreamLease(trigger.lease, trigger.lease_after)
    return lease


def end_lease(trigger: Any) -> None:
    """End the lease of ``trigger``'s stream (closed, or the trigger ends), keeping what the last
    decision covered and when."""
    lease, trigger._lease = trigger._lease, None
    if lease is not None:
        lease.end()
        trigger._stream.remember(lease)


async def close_watching(trigger: Any) -> None:
    """Close a watching trigger's stream and source (its ``cleanup()``: every exit, errors ignored)."""
    end_lease(trigger)
    source, trigger._source = trigger._source, None
    try:
        await trigger._stream.aclose()
    finally:  # also when cancelled during the close handshake: a push source's read stops
        if source is not None:
            with contextlib.suppress(Exception):
                await source.aclose()


def failures_in_a_row(failures: int, lasted: float) -> int:
    """The count of failures in a row, this one included, after a try that lasted ``lasted``
    seconds (``failures``: the count before it)."""
    return 1 if lasted >= WATCH_HEALTHY_S else failures + 1


async def wait_to_watch_again(watch_id: str, failures: int, exc: BaseException) -> None:
    """An asset watch failed (``failures`` times in a row, the last with ``exc``): say why and
    when it tries again, then wait that long. Nothing is lost: whether the watch fired is kept.

    :param watch_id: the watch's name.
    :param failures: consecutive failures, this one included.
    :param exc: the failure (its message names the cause and the fix; a failure that is not one
        of the provider's errors is logged with its traceback).
    """
    from airflow_provider_systemzero.exceptions import ARGUMENT_ERRORS
    from airflow_provider_systemzero.stream.exceptions import SystemZeroError

    delay = doubled(WATCH_RETRY_FIRST_S, WATCH_RETRY_MAX_S, failures - 1)
    known = isinstance(exc, (SystemZeroError, *ARGUMENT_ERRORS))
    log.error(
        "asset watch %r failed%s: %s. It keeps watching: it tries again in %.0f s (fix the cause and "
        "it goes on without a restart)",
        watch_id,
        "" if failures == 1 else f" ({failures} times in a row)",
        exc if known else f"{type(exc).__name__}: {exc}",
        delay,
        exc_info=None if known else exc,
    )
    await asyncio.sleep(delay)
