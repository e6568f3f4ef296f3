"""What a trigger that watches a source (the decision trigger, the event trigger) builds from its
kwargs, runs its watch with, and tears down; and how an asset watch, which has no task to fail,
goes on after a failure (:func:`wait_to_watch_again`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from airflow_provider_systemzero.decisions.relevance import DecisionFilter
from airflow_provider_systemzero.decisions.source_watch import SourceWatch, validate_max_staleness
from airflow_provider_systemzero.decisions.timeline import DecisionTimeline
from airflow_provider_systemzero.decisions.watch import DecisionWatch
from airflow_provider_systemzero.protocol.reconnect import doubled
from airflow_provider_systemzero.sources.base import StateSource
from airflow_provider_systemzero.timestamps import iso_time
from airflow_provider_systemzero.triggers.driver import WatchDriver
from airflow_provider_systemzero.triggers.streaming import TriggerStream

__all__ = [
    "WATCH_HEALTHY_S",
    "WATCH_RETRY_FIRST_S",
    "WATCH_RETRY_MAX_S",
    "WatchProgress",
    "WatchingTrigger",
    "announce_wait",
    "close_watching",
    "failures_in_a_row",
    "new_timeline",
    "start_watch",
    "wait_to_watch_again",
    "watch_progress",
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


class WatchingTrigger(Protocol):
    """What a trigger that watches a source has, for the functions here: its kwargs that shape the
    watch (built by :func:`watch_source`), its streams, and its run's driver and source."""

    decision_filter: DecisionFilter
    decision_mode: str
    lease: bool
    lease_after: float
    max_staleness: float
    _stream: TriggerStream
    _driver: WatchDriver | None
    _source: StateSource | None


def watch_source(trigger: WatchingTrigger, given: Mapping[str, Any]) -> None:
    """What a trigger that watches a source (a decision or an event trigger) builds from its kwargs
    (``given``, its ``__init__``'s ``locals()``): the checked ``decide_when`` filter and
    ``max_staleness``; the source and the watch are built when the trigger runs (:func:`start_watch`)."""
    trigger.decision_filter = DecisionFilter(
        decide_when=given["decide_when"],
        debounce_ms=given["debounce_ms"],
        decide_initial=given["decide_initial"],
    )
    trigger.max_staleness = validate_max_staleness(given["max_staleness"])
    trigger._source = None
    trigger._driver = None


@dataclass(frozen=True, slots=True)
class WatchProgress:
    """Where a running trigger's wait stands, seen from outside its run: a snapshot.

    The seam the benchmarks read a trigger through (and a debugger may): it says what the wait has
    reached, not how the trigger gets there, so it stays the same whatever the trigger's parts.

    :param running: the wait has started (its source built, its watch running) and not ended.
    :param dormant: the wait holds no stream: it gave its stream back (or has not opened one) and
        waits for its source, or for time.
    :param decided_at: when the newest current decision arrived, on the event loop's clock
        (``loop.time()``); ``-inf`` before the first.
    :param decided_state: the state that decision was about (``None`` before the first).
    """

    running: bool = False
    dormant: bool = False
    decided_at: float = -math.inf
    decided_state: Any = None


def watch_progress(trigger: WatchingTrigger) -> WatchProgress:
    """Where ``trigger``'s wait stands now (:class:`WatchProgress`).

    :param trigger: a decision or an event trigger.
    """
    driver = trigger._driver
    if driver is None:
        return WatchProgress()
    watch = driver.watch
    return WatchProgress(
        running=True, dormant=driver.dormant, decided_at=watch.decided_at, decided_state=watch.decided_state
    )


def new_timeline() -> DecisionTimeline:
    """A wait's history, keeping state content only where ``[systemzero] capture_content`` says so."""
    from airflow_provider_systemzero.utils.observability import capture_content_enabled

    return DecisionTimeline(capture_content=capture_content_enabled())


def start_watch(
    trigger: WatchingTrigger,
    source: StateSource,
    rules: DecisionWatch,
    *,
    once: bool,
    min_interval_ms: int | None = None,
) -> WatchDriver:
    """The watch of ``trigger``'s run and its driver (kept as ``trigger._driver`` for its cleanup).

    :param trigger: a decision or an event trigger (its kwargs: ``decision_mode``, ``lease``,
        ``lease_after``, ``max_staleness`` and the ``decide_when`` filter).
    :param source: the trigger's source, built.
    :param rules: what ends the wait (its condition's :class:`~airflow_provider_systemzero.decisions.watch.DecisionWatch`).
    :param once: the first verdict ends the watch (a sensor); ``False``: an asset watch.
    :param min_interval_ms: the trigger's ``min_interval_ms`` (between dispatch starts, and between
        the last decision and the next stream).
    :raises SystemZeroArgumentError: the ``decide_when`` callable cannot be imported.
    """
    decision_filter: DecisionFilter = trigger.decision_filter
    relevance = decision_filter.relevance()  # a callable that cannot be imported ends the wait here
    watch = SourceWatch(
        rules,
        decision_mode=decision_filter.stream_mode(trigger.decision_mode),
        gate=decision_filter.gate(asyncio.get_running_loop().time()),
        relevance=relevance,
        lease=trigger.lease,
        lease_after=trigger.lease_after,
        max_staleness=trigger.max_staleness,
        min_interval=(min_interval_ms or 0) / 1000,
        once=once,
        timeline=rules.timeline,
        question=rules.condition.question,
    )
    stream_kwargs = None if min_interval_ms is None else {"min_interval_ms": min_interval_ms}
    trigger._driver = driver = WatchDriver(
        watch, source, trigger._stream, stream_kwargs=stream_kwargs, relevance=relevance
    )
    return driver


def announce_wait(condition: Mapping[str, Any], source: StateSource, deadline: float | None = None) -> None:
    """The line a trigger's wait starts with: what it waits for, where the state comes from, and
    until when.

    :param condition: the trigger's condition (its dict form).
    :param source: the trigger's source.
    :param deadline: the task's deadline (epoch seconds; ``None``: an asset watch, which has none).
    """
    until = ""
    if deadline is not None:
        at = iso_time(deadline)[:19].replace("T", " ") + " UTC"
        until = f"; the task's deadline is {at} (in {max(0.0, deadline - time.time()):.0f} s)"
    log.info(
        "waiting until %s = %r; the state comes from %s%s",
        condition.get("question"),
        condition.get("expect"),
        source.describe(),
        until,
    )


async def close_watching(trigger: WatchingTrigger) -> None:
    """Close a watching trigger's run, stream and source (its ``cleanup()``: every exit, errors
    ignored; safe to run twice)."""
    driver, trigger._driver = trigger._driver, None
    source, trigger._source = trigger._source, None
    try:
        if driver is not None:
            await driver.aclose()
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
