"""The base classes of the provider's triggers: :class:`StreamTrigger` (every trigger over a System
Zero stream: its kwargs, its streams, the run that ends in one event, and its cleanup) and
:class:`WatchingTrigger` (the decision trigger, the event trigger: what it builds from its kwargs,
the watch its run starts, where that wait stands); and how an asset watch, which has no task to
fail, goes on after a failure (:func:`wait_to_watch_again`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.triggers.base import BaseTrigger

from airflow_provider_systemzero.decisions.conditions import DecisionCondition
from airflow_provider_systemzero.decisions.relevance import DecisionFilter
from airflow_provider_systemzero.decisions.source_watch import Rules, SourceWatch, validate_max_staleness
from airflow_provider_systemzero.decisions.timeline import DecisionTimeline
from airflow_provider_systemzero.decisions.watch import VerdictRules
from airflow_provider_systemzero.exceptions import SystemZeroArgumentError
from airflow_provider_systemzero.protocol.reconnect import doubled
from airflow_provider_systemzero.sources.base import StateSource
from airflow_provider_systemzero.sources.spec import build_source
from airflow_provider_systemzero.tasks.payloads import error_payload
from airflow_provider_systemzero.timestamps import iso_time
from airflow_provider_systemzero.triggers.driver import WatchDriver
from airflow_provider_systemzero.triggers.kwargs import TriggerKwargs
from airflow_provider_systemzero.triggers.streaming import TriggerStream

if TYPE_CHECKING:
    from airflow_provider_systemzero.stream.decision_stream import DecisionStream

__all__ = [
    "WATCH_HEALTHY_S",
    "WATCH_RETRY_FIRST_S",
    "WATCH_RETRY_MAX_S",
    "StreamTrigger",
    "WatchProgress",
    "WatchingTrigger",
    "announce_wait",
    "failures_in_a_row",
    "new_timeline",
    "wait_to_watch_again",
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
    :param read_state: the newest state the watch read from its source (``None`` before the first
        read).
    """

    running: bool = False
    dormant: bool = False
    decided_at: float = -math.inf
    decided_state: Any = None
    read_state: Any = None


class StreamTrigger(BaseTrigger):
    """A trigger over a System Zero stream: its declared kwargs (``_kwargs``), its streams, and the
    source and driver of its run's watch, closed by ``cleanup()``; a trigger that fires once ends
    early through :meth:`_ended_early`.

    :param systemzero_conn_id: the System Zero connection.
    :param request: the decide request (plain JSON).
    :param key_namespace: the namespace of the run's keys and cache key.
    :param deadline: absolute deadline in epoch seconds, or ``None``.
    :param budget: the task's spend caps and what it spent so far (``None``: none).
    """

    #: the subclass's kwargs, in their serialized order
    _kwargs: ClassVar[TriggerKwargs]

    def __init__(
        self,
        *,
        systemzero_conn_id: str,
        request: dict[str, Any],
        key_namespace: str,
        deadline: float | None = None,
        budget: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self._stream = TriggerStream(
            systemzero_conn_id, request, key_namespace=key_namespace, deadline=deadline, budget=budget
        )
        #: the run's source and the driver of its watch (``None`` outside a run)
        self._source: StateSource | None = None
        self._driver: WatchDriver | None = None

    @property
    def systemzero_conn_id(self) -> str:
        """The ``systemzero_conn_id`` kwarg: the connection its streams are built on."""
        return self._stream.systemzero_conn_id

    @property
    def request(self) -> dict[str, Any]:
        """The ``request`` kwarg (kept as compact JSON text by the trigger's streams)."""
        return self._stream.request

    @property
    def deadline(self) -> float | None:
        """The ``deadline`` kwarg (epoch seconds, or ``None``): the one its streams keep."""
        return self._stream.deadline

    @property
    def key_namespace(self) -> str:
        """The namespace of the run's keys and cache key: the one its streams use. A sensor that
        starts from the triggerer passes a template, which the triggerer renders by setting this
        attribute before the run: the streams take the rendered value."""
        return self._stream.key_namespace

    @key_namespace.setter
    def key_namespace(self, value: str) -> None:
        self._stream.key_namespace = value

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Class path and plain-JSON kwargs (no secret)."""
        return self._kwargs.serialized(self)

    def _extra(self) -> dict[str, Any]:
        """The fields every event of this trigger carries."""
        return {"key_namespace": self.key_namespace}

    async def _ended_early(self, exc: BaseException, scope: asyncio.Timeout) -> dict[str, Any]:
        """The payload of a run that fires once and ended before its work gave one, by ``exc``
        raised within its deadline ``scope``: :meth:`_timed_out`'s at the deadline, else the
        error's. A cancellation (or any other ``BaseException``) closes the run and propagates: no
        event.

        The run awaits its work in its own frame, in a ``try`` that hands what it raised to this
        method: a waiting trigger, of which a triggerer holds thousands, keeps no frame or
        closure for its skeleton."""
        if isinstance(exc, TimeoutError):
            return self._timed_out() if scope.expired() else self._failure(exc)
        if isinstance(exc, Exception):
            return self._failure(exc)
        await self.cleanup()
        raise exc

    def _timed_out(self) -> dict[str, Any]:
        """The event of the deadline (a trigger that fires once says what it was waiting for)."""
        raise NotImplementedError

    def _failure(self, exc: BaseException) -> dict[str, Any]:
        # the event carries the message and the task raises it: said once, by the task
        self.log.info("%s ends with an error event (%s)", type(self).__name__, type(exc).__name__)
        return error_payload(exc, **self._extra())

    async def cleanup(self) -> None:
        """Close the run, the stream and the source (runs on every exit, errors ignored by Airflow;
        safe to run twice)."""
        driver, self._driver = self._driver, None
        source, self._source = self._source, None
        try:
            if driver is not None:
                await driver.aclose()
            await self._stream.aclose()
        finally:  # also when cancelled during the close handshake: a push source's read stops
            if source is not None:
                with contextlib.suppress(Exception):
                    await source.aclose()


class WatchingTrigger(StreamTrigger):
    """A trigger that watches a source: the decision trigger and the event trigger.

    It carries what both do over their watch: the kwargs that shape it (the ``decide_when`` filter
    and ``max_staleness``, checked here), ``serialize()``, the watch a run starts over the source
    (:meth:`watch_driver`) and where the wait stands (:attr:`progress`). A subclass declares its
    kwargs (``_kwargs``), keeps them, and runs: ``run()`` builds the source (:meth:`_open_source`),
    starts the watch (:meth:`_start_watch`) and turns its verdicts into events.

    :param stream: :class:`StreamTrigger`'s arguments.
    :param decide_when: start a decision only for a change that matches (``None``: every change).
    :param debounce_ms: decide once the source has been quiet this many milliseconds.
    :param decide_initial: decide the initial state (``False``: wait for the first relevant change).
    :param max_staleness: seconds the source's newer state may be held back while a decision is in flight.
    """

    # the kwargs every watching trigger keeps (a subclass sets them), and its condition parsed
    condition: dict[str, Any]
    decision_condition: DecisionCondition
    state: Any
    source: dict[str, Any] | None
    decision_mode: str
    lease: bool
    lease_after: float

    def __init__(
        self,
        *,
        decide_when: str | dict[str, str] | None,
        debounce_ms: int | None,
        decide_initial: bool,
        max_staleness: float,
        **stream: Any,
    ) -> None:
        super().__init__(**stream)
        self.decision_filter = DecisionFilter(
            decide_when=decide_when, debounce_ms=debounce_ms, decide_initial=decide_initial
        )
        self.max_staleness = validate_max_staleness(max_staleness)

    @staticmethod
    def _parsed_condition(condition: Any) -> tuple[dict[str, Any], DecisionCondition]:
        """The ``condition`` kwarg as the trigger keeps it (plain JSON), and as it is checked: from a
        :class:`~airflow_provider_systemzero.decisions.conditions.DecisionCondition` or its
        :meth:`~airflow_provider_systemzero.decisions.conditions.DecisionCondition.to_dict`.

        :param condition: the kwarg, as the author or the sensor gave it.
        :raises SystemZeroArgumentError: anything else, or a dict that is not a condition.
        """
        if isinstance(condition, DecisionCondition):
            return condition.to_dict(), condition
        if not isinstance(condition, Mapping):
            raise SystemZeroArgumentError(
                f"condition must be a DecisionCondition or its to_dict(), got {type(condition).__name__}: "
                "pass e.g. condition=DecisionCondition('ready', True, min_confidence=0.8)",
                code="invalid_condition",
                field="condition",
            )
        try:
            built = DecisionCondition.from_dict(condition)
        except TypeError as exc:  # an unknown or a missing key
            raise SystemZeroArgumentError(
                f"condition {dict(condition)!r} is not a condition ({exc}): build it with "
                "DecisionCondition(question, expect, ...).to_dict()",
                code="invalid_condition",
                field="condition",
            ) from None
        return dict(condition), built

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Class path and plain-JSON kwargs (no secret): the declared kwargs, then the
        ``decide_when`` filter's."""
        return self._kwargs.serialized(self, self.decision_filter.to_kwargs())

    @property
    def progress(self) -> WatchProgress:
        """Where the wait stands while the trigger runs: whether it holds a stream, and the newest
        current decision's time and state (a snapshot: :class:`WatchProgress`)."""
        driver = self._driver
        if driver is None:
            return WatchProgress()
        watch = driver.watch
        return WatchProgress(
            running=True,
            dormant=driver.dormant,
            decided_at=watch.decided_at,
            decided_state=watch.decided_state,
            read_state=watch.read_state,
        )

    @property
    def open_stream(self) -> DecisionStream | None:
        """The stream the run holds open now: ``None`` outside a run and while the watch is
        dormant (it waits for its source with no stream)."""
        return self._stream.stream

    def watch_driver(
        self,
        source: StateSource,
        rules: Rules,
        streams: TriggerStream,
        *,
        once: bool,
        min_interval_ms: int | None = None,
    ) -> WatchDriver:
        """A watch over ``source`` shaped by this trigger's kwargs (``decision_mode``, ``lease``,
        ``lease_after``, ``max_staleness`` and the ``decide_when`` filter), and its driver on ``streams``.

        :param source: the source, built.
        :param rules: what ends the wait (its condition's :class:`~airflow_provider_systemzero.decisions.watch.VerdictRules`,
            whose history the watch adds to; or the shared stream's
            :class:`~airflow_provider_systemzero.decisions.source_watch.EveryDecision`, which keeps none).
        :param streams: the streams the driver opens (the trigger's own in its run).
        :param once: the first verdict ends the watch (a sensor); ``False``: an asset watch.
        :param min_interval_ms: the trigger's ``min_interval_ms`` (between dispatch starts, and between
            the last decision and the next stream).
        :raises SystemZeroArgumentError: the ``decide_when`` callable cannot be imported.
        """
        decision_filter = self.decision_filter
        relevance = decision_filter.relevance()  # a callable that cannot be imported ends the wait here
        watch = SourceWatch(
            rules,
            decision_mode=decision_filter.stream_mode(self.decision_mode),
            debounce=decision_filter.debounce(asyncio.get_running_loop().time()),
            relevance=relevance,
            lease=self.lease,
            lease_after=self.lease_after,
            max_staleness=self.max_staleness,
            min_interval=(min_interval_ms or 0) / 1000,
            once=once,
            timeline=rules.timeline if isinstance(rules, VerdictRules) else None,
            question=rules.condition.question if isinstance(rules, VerdictRules) else None,
        )
        stream_kwargs = None if min_interval_ms is None else {"min_interval_ms": min_interval_ms}
        return WatchDriver(watch, source, streams, stream_kwargs=stream_kwargs, relevance=relevance)

    def _open_source(self, *, announce: bool = True) -> StateSource:
        """Build the run's source (kept for ``cleanup()``) and say what the wait waits for
        (``announce``; a shared stream waits for no condition of its own)."""
        self._source = source = build_source(self.source, self.state)
        if announce:
            announce_wait(self.condition, source, self.deadline)
        return source

    def _start_watch(self, rules: Rules, *, once: bool, min_interval_ms: int | None = None) -> WatchDriver:
        """Start the run's watch over its source (:meth:`watch_driver`), kept for ``cleanup()``."""
        assert self._source is not None, "the run builds its source first (_open_source)"
        self._driver = self.watch_driver(
            self._source, rules, self._stream, once=once, min_interval_ms=min_interval_ms
        )
        return self._driver


def new_timeline() -> DecisionTimeline:
    """A wait's history, keeping state content only where ``[systemzero] capture_content`` says so."""
    from airflow_provider_systemzero.tasks.observability import capture_content_enabled

    return DecisionTimeline(capture_content=capture_content_enabled())


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
