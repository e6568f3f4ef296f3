"""Triggers that hold a System Zero stream in the triggerer.

* :class:`SystemZeroDecisionTrigger` — the deferrable sensor's trigger: streams a changing state
  and fires once, when a decision about the *current* state meets the condition.
* :class:`SystemZeroDecideTrigger` — the deferrable operator's trigger: one on_request decision
  about a fixed state, with every answer.
* :class:`SystemZeroDecisionEventTrigger` — an :class:`~airflow.triggers.base.BaseEventTrigger`
  for an ``AssetWatcher``: an asset event each time the condition becomes true.

The rules they follow (the triggerer runs hundreds of them in one event loop):

* ``run()`` never blocks the loop (files are read in a thread, connections are looked up with
  ``aget_connection``) and lets :class:`asyncio.CancelledError` propagate; ``cleanup()`` closes the
  socket on every exit.
* Kwargs are plain JSON with no secret: a connection ID, the request, the state and its source,
  the condition, an absolute ``deadline`` (epoch seconds, so a rebuilt trigger keeps it) and a
  ``key_namespace`` derived from the task instance. The same namespace gives the same
  ``prompt_cache_key`` and the same per-state idempotency keys in every process, so a triggerer
  restart or two copies running at once (HA) replay byte-identically and are billed once.
* A decision only counts when it covers the complete desired state (never a stale one). When a
  source changes faster than a decision takes (decisions keep coming back stale), newer source
  content is held back while a decision is in flight, for up to ``max_staleness`` seconds, so the
  source is still decided about (see :class:`~airflow_provider_systemzero.triggers.currency.Currency`).
* **Stream leasing**: once a decision about the current state settled and the source has nothing
  new, the trigger gives its stream back (close 1000) and reconnects — with a byte-identical
  replay — only when the source changes, so a triggerer holds many waiting sensors within
  ``max_streams_per_process``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from typing import Any

from airflow.triggers.base import BaseEventTrigger, BaseTrigger, TriggerEvent

from airflow_provider_systemzero.decisions.conditions import DecisionCondition
from airflow_provider_systemzero.decisions.watch import DecisionWatch
from airflow_provider_systemzero.protocol.reply import DecisionResult
from airflow_provider_systemzero.triggers.currency import (
    DEFAULT_MAX_STALENESS,
    Currency,
    validate_max_staleness,
)
from airflow_provider_systemzero.triggers.sources import StateSource, build_source

__all__ = ["SystemZeroDecideTrigger", "SystemZeroDecisionEventTrigger", "SystemZeroDecisionTrigger",
           "error_payload", "owned_event"]

log = logging.getLogger(__name__)

#: How often a trigger holding a quiet stream checks whether another stream waits for a slot
#: (only the few triggers holding a slot poll: at most ``max_streams_per_process`` per process).
_LEASE_POLL_SECONDS = 0.05
def error_payload(exc: BaseException, **extra: Any) -> dict[str, Any]:
    """A small JSON error event for an exception (never carries request headers or the key)."""
    from airflow_provider_systemzero.exceptions import ARGUMENT_ERRORS
    from airflow_provider_systemzero.stream.exceptions import (
        AuthenticationFailed,
        DeadlineExceeded,
        DecisionFailed,
        SystemZeroError,
        UpgradeRefused,
    )

    payload: dict[str, Any] = {"status": "error", "error_type": "unexpected", "message": str(exc) or repr(exc),
                               **extra}
    if isinstance(exc, DeadlineExceeded | TimeoutError):
        payload.update(status="timeout", error_type="timeout")
    elif isinstance(exc, AuthenticationFailed):
        payload["error_type"] = "authentication"
    elif isinstance(exc, ARGUMENT_ERRORS):
        payload.update(error_type="validation", field=exc.field, code=exc.code)
    elif isinstance(exc, DecisionFailed):
        payload.update(error_type="decision_failed", http_status=exc.http_status, code=exc.envelope.code,
                       retryable=exc.retryable)
    elif isinstance(exc, UpgradeRefused):
        payload.update(error_type="upgrade_refused", http_status=exc.status)
    elif isinstance(exc, SystemZeroError):
        payload["error_type"] = "stream_failed"
    elif type(exc).__name__ == "AirflowNotFoundException":
        payload["error_type"] = "configuration"
    return payload


class _StreamingTrigger:
    """What the three triggers share: the stream, the source, leasing and cleanup."""

    systemzero_conn_id: str
    request: dict[str, Any]
    state: Any
    source: dict[str, Any] | None
    decision_mode: str
    key_namespace: str
    lease: bool
    lease_after: float
    deadline: float | None
    #: minimum milliseconds between dispatch starts (fewer decisions billed on a busy source)
    min_interval_ms: int | None = None
    #: seconds newer source content may be held back while a decision is in flight (0: never)
    max_staleness: float = DEFAULT_MAX_STALENESS
    _currency: Currency | None = None

    _stream: Any = None
    _source_obj: StateSource | None = None
    #: :meth:`DecisionBudget.to_kwargs` from the task (``None``: no budget, no usage report)
    budget: dict[str, Any] | None = None
    _budget_obj: Any = None

    def _run_budget(self) -> Any:
        """This run's :class:`~airflow_provider_systemzero.budget.DecisionBudget` (``None`` without one)."""
        if self._budget_obj is None and self.budget:
            from airflow_provider_systemzero.decisions.budget import DecisionBudget

            self._budget_obj = DecisionBudget.from_kwargs(self.budget)
        return self._budget_obj

    def _with_usage(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The event payload plus what this run spent (the worker adds it to the task's total)."""
        from airflow_provider_systemzero.decisions.budget import event_usage

        return {**payload, **event_usage(self._budget_obj)}
    _lease_timer: asyncio.Task[None] | None = None

    def _arm_lease(self, stream: Any) -> None:
        """Give the stream back after ``lease_after`` quiet seconds (re-armed by every decision)."""
        self._disarm_lease()
        if self.lease:
            self._lease_timer = asyncio.ensure_future(self._release_when_quiet(stream))

    def _disarm_lease(self) -> None:
        timer, self._lease_timer = self._lease_timer, None
        if timer is not None:
            timer.cancel()

    async def _release_when_quiet(self, stream: Any) -> None:
        # Hold the stream for ``lease_after`` quiet seconds (a busy source keeps its connection),
        # but give it back at once when another stream of this process waits for a slot: a slot
        # held for a quiet trigger must never keep a waiting one from its first decision.
        loop = asyncio.get_running_loop()
        until = loop.time() + self.lease_after
        capacity = getattr(stream, "capacity", None)
        reason = f"nothing new for {self.lease_after:.1f} s"
        while (left := until - loop.time()) > 0:
            if capacity is not None and capacity.waiting:
                reason = "another stream waits for a slot"
                break
            await asyncio.sleep(min(_LEASE_POLL_SECONDS, left))
        if stream.connected and not stream.has_work():
            log.info("%s: giving the stream back until the state changes", reason)
            await stream.release()

    def _open_stream(self, initial: Any) -> Any:
        from airflow_provider_systemzero.hooks.systemzero import SystemZeroHook

        hook = SystemZeroHook(systemzero_conn_id=self.systemzero_conn_id)
        self._stream = hook.stream(self.request, state=initial, decision_mode=self.decision_mode,
                                   key_namespace=self.key_namespace, identity=self.key_namespace,
                                   budget=self._run_budget(), min_interval_ms=self.min_interval_ms)
        return self._stream

    def _remaining(self) -> float | None:
        if self.deadline is None:
            return None
        return self.deadline - time.time()

    async def _feed(self, stream: Any, source: StateSource, changed: asyncio.Event) -> None:
        """Hand the source's changes to the stream in order; when the source changes faster than a
        decision takes, hold them back while a decision is in flight and then hand over the newest."""
        currency = self._currency
        assert currency is not None
        arrivals: deque[Any] = deque()  # the source's states not handed over yet, oldest first
        arrived = asyncio.Event()

        async def read() -> None:
            async for state in source.changes():
                arrivals.append(state)
                arrived.set()

        reader = asyncio.ensure_future(read())
        try:
            while True:
                if not arrivals:
                    if reader.done():
                        return reader.result()  # the source ended (or raises why it failed)
                    arrived.clear()
                    waiter = asyncio.ensure_future(arrived.wait())
                    try:
                        await asyncio.wait({waiter, reader}, return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        waiter.cancel()
                    continue
                if arrivals[0] != stream.state and currency.starved:
                    await currency.hold(reader)
                    while len(arrivals) > 1:  # what arrived meanwhile is covered by the newest
                        arrivals.popleft()
                state = arrivals.popleft()
                if state != stream.state:  # the first value usually equals the state the stream opened with
                    self._disarm_lease()
                    # currency changes before the stream takes the change: set_state yields, and a
                    # decision arriving meanwhile is about the previous state
                    currency.changed(deciding=self.decision_mode == "on_change")
                    changed.set()
                    await stream.set_state(state)
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    async def _current_decisions(self, stream: Any, changed: asyncio.Event) -> AsyncIterator[DecisionResult]:
        """Decisions that cover the complete desired state, leasing the stream in between."""
        currency = self._currency
        assert currency is not None
        if self.decision_mode == "on_change":
            async for decision in stream.decisions():
                if not (stream.in_sync and decision.stream_id == stream.stream_id
                        and decision.state_version == stream.state_version):
                    log.debug("skipping decision for version %s: newer state was sent", decision.state_version)
                    currency.skipped(settle=False)
                    continue
                currency.current()
                yield decision
                self._arm_lease(stream)
        else:
            while True:
                changed.clear()
                started = currency.generation
                currency.deciding()
                try:
                    decision = await stream.decide()
                except BaseException:
                    currency.skipped(settle=True)
                    raise
                if currency.generation != started:
                    log.debug("skipping decision for version %s: the state changed while it was decided",
                              decision.state_version)
                    currency.skipped(settle=True)
                    continue
                currency.current()
                yield decision
                self._arm_lease(stream)
                await changed.wait()

    async def _race(self, stream: Any, source: StateSource, body: Any) -> Any:
        """Run ``body`` while the source feeds the stream; the first to finish wins."""
        changed = asyncio.Event()
        # on_change: the opening state schedules a decision, so one is in flight from the start
        self._currency = Currency(self.max_staleness, deciding=self.decision_mode == "on_change")
        feeder = asyncio.ensure_future(self._feed(stream, source, changed))
        consumer = asyncio.ensure_future(body(changed))
        try:
            await asyncio.wait({feeder, consumer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (feeder, consumer):
                task.cancel()
            await asyncio.gather(feeder, consumer, return_exceptions=True)
        if consumer.done() and not consumer.cancelled():
            return consumer.result()
        return feeder.result()  # the source failed (or ended): raise its error

    async def _debounced(self, stream: Any, changed: asyncio.Event, watch: DecisionWatch) -> AsyncIterator[Any]:
        """Each verdict of ``watch`` that ends the wait, fed the stream's current decisions.

        The rules (condition, policy, skip states, hysteresis) are the watch's
        (:class:`~airflow_provider_systemzero.decisions.watch.DecisionWatch`); this loop adds the
        timer that ends a wait when only time is missing.
        """
        from airflow_provider_systemzero.identity import state_hash

        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[DecisionResult, str, Any]] = asyncio.Queue()

        async def pump() -> None:
            async for decision in self._current_decisions(stream, changed):
                # the stream's state now is the state this decision covers (it is current)
                await queue.put((decision, state_hash(stream.state), stream.state))
            raise RuntimeError("the stream ended without a decision")

        pumper = asyncio.ensure_future(pump())
        currency = self._currency
        assert currency is not None
        evaluated = False
        try:
            while True:
                if evaluated:  # the last decision did not end the wait: held changes may go
                    currency.evaluated()
                    evaluated = False
                getter = asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait({getter, pumper}, timeout=watch.wait_time(loop.time()),
                                             return_when=asyncio.FIRST_COMPLETED)
                if getter in done:
                    decision, key, state = getter.result()
                    evaluated = True
                    verdict = watch.observe(decision, key, state, loop.time())
                else:
                    getter.cancel()
                    if pumper in done:
                        pumper.result()  # raises why the stream ended
                    verdict = watch.due(loop.time())
                if verdict is not None:
                    yield verdict
        finally:
            pumper.cancel()
            await asyncio.gather(pumper, return_exceptions=True)

    async def _within_deadline(self, work: Callable[[], Awaitable[dict[str, Any]]], extra: dict[str, Any], *,
                               late: str, timed_out: str) -> dict[str, Any]:
        """Run ``work`` until the deadline and turn every outcome into one small event payload.

        A failure becomes an ``error`` event naming its cause (:func:`error_payload`), the deadline a
        ``timeout`` event; ``CancelledError`` propagates; the stream is closed on every exit.
        """
        try:
            remaining = self._remaining()
            if remaining is not None and remaining <= 0:
                return {"status": "timeout", "error_type": "timeout", **extra, "message": late}
            async with asyncio.timeout(remaining):
                return await work()
        except TimeoutError:
            last = getattr(self._stream, "last_error_text", None)  # why the wait had no decision
            return {"status": "timeout", "error_type": "timeout", **extra,
                    "message": f"{timed_out}; last error: {last}" if last else timed_out}
        except Exception as exc:
            # the event carries the message and the task raises it: said once, by the task
            log.info("%s ends with an error event (%s)", type(self).__name__, type(exc).__name__)
            return error_payload(exc, **extra)
        finally:
            await self.cleanup()

    async def cleanup(self) -> None:
        """Close the stream and the source (runs on every exit; exceptions are ignored by Airflow)."""
        self._disarm_lease()
        stream, self._stream = self._stream, None
        source, self._source_obj = self._source_obj, None
        if stream is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(stream.aclose(), timeout=5)
        if source is not None:
            with contextlib.suppress(Exception):
                await source.aclose()


class SystemZeroDecisionTrigger(_StreamingTrigger, BaseTrigger):
    """Waits until System Zero decides the watched question as expected about a changing state.

    Fires once: a ``success`` event with the watched answer, or an ``error``/``timeout`` event
    whose ``message`` names the cause.

    :param systemzero_conn_id: the System Zero connection (origin and key are read in the triggerer).
    :param request: ``{"model", "questions", "route", "mode", "prompt_cache_key"}`` (plain JSON).
    :param condition: :meth:`DecisionCondition.to_dict` — question, expect, min_confidence, min_probability,
        and optionally a policy and hysteresis (``consecutive``, ``min_true_for``).
    :param state: the initial state (string, array or object).
    :param source: where the state comes from (see :mod:`~airflow_provider_systemzero.triggers.sources`).
    :param key_namespace: deterministic namespace of this task instance's keys and cache key.
    :param decision_mode: ``on_change`` (every change is decided) or ``on_request`` (decide after changes).
    :param deadline: absolute deadline in epoch seconds, or ``None``.
    :param lease: give the stream back between decisions when nothing changes.
    :param lease_after: seconds without a change before the stream is given back.
    :param budget: the task's spend caps and what it spent so far
        (:meth:`~airflow_provider_systemzero.budget.DecisionBudget.to_kwargs`); the event reports the usage.
    :param skip_states: hashes of states a person already answered "no" about: decisions about them
        do not fire the trigger again.
    :param min_interval_ms: minimum milliseconds between dispatch starts: on a busy source, fewer
        decisions are billed (each one covers more changes) at the cost of latency.
    :param max_staleness: when the source changes faster than a decision takes (decisions keep
        coming back about an outdated state), seconds its newer state may be held back while a
        decision is in flight, so that decision is current when it returns (``0``: never hold; such a
        source is then never decided about).
    :param end_when_unmet: a static state: a decision that does not meet the condition ends the wait
        with an ``unmet`` event (no later decision could differ).

    Under a policy the ``success`` event carries ``action``: ``act``/``default`` (fire), or
    ``review`` (the sensor asks a person); a ``fail``/``skip`` verdict is a ``policy`` event.
    """

    def __init__(self, *, systemzero_conn_id: str, request: dict[str, Any], condition: dict[str, Any],
                 state: Any, key_namespace: str, source: dict[str, Any] | None = None,
                 decision_mode: str = "on_change", deadline: float | None = None, lease: bool = True,
                 budget: dict[str, Any] | None = None, lease_after: float = 5.0,
                 skip_states: list[str] | None = None, min_interval_ms: int | None = None,
                 max_staleness: float = DEFAULT_MAX_STALENESS, end_when_unmet: bool = False) -> None:
        super().__init__()
        self.end_when_unmet = end_when_unmet
        self.skip_states = list(skip_states or [])
        self.min_interval_ms = min_interval_ms
        self.max_staleness = validate_max_staleness(max_staleness)
        self.systemzero_conn_id = systemzero_conn_id
        self.request = request
        self.condition = condition
        self.state = state
        self.source = source
        self.key_namespace = key_namespace
        self.decision_mode = decision_mode
        self.deadline = deadline
        self.lease = lease
        self.lease_after = lease_after
        self.budget = budget

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Class path and plain-JSON kwargs (no secret)."""
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"systemzero_conn_id": self.systemzero_conn_id, "request": self.request,
                 "condition": self.condition, "state": self.state, "source": self.source,
                 "key_namespace": self.key_namespace, "decision_mode": self.decision_mode,
                 **({"budget": self.budget} if self.budget else {}),
                 "deadline": self.deadline, "lease": self.lease, "lease_after": self.lease_after,
                 **({"skip_states": self.skip_states} if self.skip_states else {}),
                 **({"end_when_unmet": True} if self.end_when_unmet else {}),
                 "min_interval_ms": self.min_interval_ms, "max_staleness": self.max_staleness})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Stream the state and yield one event."""
        payload = await self._wait_for_condition()
        yield TriggerEvent(self._with_usage(payload))

    async def _wait_for_condition(self) -> dict[str, Any]:
        extra = {"key_namespace": self.key_namespace}

        async def wait() -> dict[str, Any]:
            condition = DecisionCondition.from_dict(self.condition)
            self._source_obj = source = build_source(self.source, self.state)
            initial = await source.current()
            async with self._open_stream(initial) as stream:

                async def consume(changed: asyncio.Event) -> dict[str, Any]:
                    watch = DecisionWatch(condition, reviews=True, skip_states=self.skip_states,
                                          end_when_unmet=self.end_when_unmet)
                    fired = self._debounced(stream, changed, watch)
                    async with contextlib.aclosing(fired):
                        async for verdict in fired:
                            review = {}
                            if verdict.result.action == "review":
                                # what the sensor needs to ask a person, and to wait on if they say no
                                from airflow_provider_systemzero.decisions.policy import state_info

                                review = {"state_info": state_info(verdict.state), "deadline": self.deadline,
                                          "skip_states": list(self.skip_states)}
                            return watch.event(verdict, extra={**extra, **review}).to_payload()
                    raise RuntimeError("the stream ended without a decision")

                return await self._race(stream, source, consume)

        return await self._within_deadline(wait, extra, late="the sensor's deadline passed before the trigger started",
                                           timed_out="no decision met the condition before the deadline")


class SystemZeroDecideTrigger(_StreamingTrigger, BaseTrigger):
    """One on_request decision about a fixed state, with every answer (the deferrable operator).

    :param systemzero_conn_id: the System Zero connection.
    :param request: ``{"model", "questions", "route", "mode", "prompt_cache_key"}``.
    :param state: the complete state.
    :param key_namespace: deterministic namespace (task instance + state hash).
    :param idempotency_key: the state's key (derived from the namespace when ``None``).
    :param attachments: inline attachments ``[{"name", "data"}]``.
    :param deadline: absolute deadline in epoch seconds, or ``None``.
    :param budget: the task's spend caps and what it spent so far; the event reports the usage.
    """

    def __init__(self, *, systemzero_conn_id: str, request: dict[str, Any], state: Any, key_namespace: str,
                 idempotency_key: str | None = None, attachments: list[dict[str, str]] | None = None,
                 deadline: float | None = None, budget: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.systemzero_conn_id = systemzero_conn_id
        self.request = request
        self.state = state
        self.key_namespace = key_namespace
        self.idempotency_key = idempotency_key
        self.attachments = attachments or []
        self.deadline = deadline
        self.source = None
        self.decision_mode = "on_request"
        self.lease = False
        self.lease_after = 0.0
        self.budget = budget

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Class path and plain-JSON kwargs (no secret)."""
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"systemzero_conn_id": self.systemzero_conn_id, "request": self.request, "state": self.state,
                 "key_namespace": self.key_namespace, "idempotency_key": self.idempotency_key,
                 "attachments": self.attachments, "deadline": self.deadline,
                 **({"budget": self.budget} if self.budget else {})})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Decide once and yield one event."""
        payload = await self._decide()
        yield TriggerEvent(self._with_usage(payload))

    async def _decide(self) -> dict[str, Any]:
        from airflow_provider_systemzero.decisions.policy import state_info
        from airflow_provider_systemzero.hooks.systemzero import SystemZeroHook
        from airflow_provider_systemzero.protocol.messages import Attachment

        extra = {"key_namespace": self.key_namespace}

        async def decide() -> dict[str, Any]:
            hook = SystemZeroHook(systemzero_conn_id=self.systemzero_conn_id)
            self._stream = hook.stream(self.request, state=self.state, decision_mode="on_request",
                                       attachments=[Attachment(**a) for a in self.attachments],
                                       idempotency_key=self.idempotency_key, key_namespace=self.key_namespace,
                                       identity=self.key_namespace, budget=self._run_budget())
            async with self._stream as stream:
                decision = await stream.decide()
            # the state's hash, size and a short preview, for the operator's ``decision`` record
            return {"status": "success", **extra, **decision_payload(decision), "state_info": state_info(self.state)}

        return await self._within_deadline(decide, extra, late="the task's deadline passed before the trigger started",
                                           timed_out="no decision before the task's deadline")


class SystemZeroDecisionEventTrigger(_StreamingTrigger, BaseEventTrigger):
    """Schedules Dags on a decision: an asset event each time the condition becomes true.

    Use it in an ``AssetWatcher``. Its kwargs are its identity, so ``watch_id`` names the
    watch (and its keys) across triggerer restarts. An event is produced on each transition
    from "not met" to "met" (the first decision counts as a transition); a decision that
    stays true does not fire again.

    :param systemzero_conn_id: the System Zero connection.
    :param request: ``{"model", "questions", "route", "mode", "prompt_cache_key"}``.
    :param condition: :meth:`DecisionCondition.to_dict`.
    :param state: the initial state.
    :param watch_id: a stable name for this watch (namespace of its keys and cache key).
    :param source: where the state comes from.
    :param decision_mode: ``on_change`` or ``on_request``.
    :param lease: give the stream back between decisions when nothing changes.
    :param lease_after: seconds without a change before the stream is given back.
    :param max_staleness: seconds the source's newer state may be held back while a decision is in flight.
    """

    def __init__(self, *, systemzero_conn_id: str, request: dict[str, Any], condition: dict[str, Any],
                 state: Any, watch_id: str, source: dict[str, Any] | None = None,
                 decision_mode: str = "on_change", lease: bool = True, lease_after: float = 5.0,
                 max_staleness: float = DEFAULT_MAX_STALENESS) -> None:
        super().__init__()
        self.max_staleness = validate_max_staleness(max_staleness)
        self.systemzero_conn_id = systemzero_conn_id
        self.request = request
        self.condition = condition
        self.state = state
        self.watch_id = watch_id
        self.source = source
        self.decision_mode = decision_mode
        self.lease = lease
        self.lease_after = lease_after
        self.deadline = None
        from airflow_provider_systemzero.identity import task_namespace

        self.key_namespace = task_namespace("asset-watch", watch_id, "", -1)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Class path and plain-JSON kwargs (no secret); they are the watcher's identity."""
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"systemzero_conn_id": self.systemzero_conn_id, "request": self.request,
                 "condition": self.condition, "state": self.state, "watch_id": self.watch_id,
                 "source": self.source, "decision_mode": self.decision_mode, "lease": self.lease,
                 "lease_after": self.lease_after,
                 **({"max_staleness": self.max_staleness} if self.max_staleness != DEFAULT_MAX_STALENESS else {})})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Yield an event each time the condition becomes true; runs until cancelled."""
        condition = DecisionCondition.from_dict(self.condition)
        self._source_obj = source = build_source(self.source, self.state)
        initial = await source.current()
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        try:
            async with self._open_stream(initial) as stream:

                async def consume(changed: asyncio.Event) -> None:
                    # fires on each transition to "met" (after hysteresis, when the condition has it);
                    # nobody can review an asset event, so only a met decision counts
                    watch = DecisionWatch(condition, reviews=False)
                    fired = self._debounced(stream, changed, watch)
                    async with contextlib.aclosing(fired):
                        async for verdict in fired:
                            policy_fields = condition.policy is not None or condition.has_hysteresis
                            payload = watch.event(verdict, policy_fields=policy_fields,
                                                  extra={"watch_id": self.watch_id}).to_payload()
                            await queue.put(payload)

                race = asyncio.ensure_future(self._race(stream, source, consume))
                try:
                    while True:
                        getter = asyncio.ensure_future(queue.get())
                        await asyncio.wait({getter, race}, return_when=asyncio.FIRST_COMPLETED)
                        if getter.done():
                            yield TriggerEvent(getter.result())
                            continue
                        getter.cancel()
                        race.result()  # raises the failure
                        return
                finally:
                    race.cancel()
                    await asyncio.gather(race, return_exceptions=True)
        finally:
            await self.cleanup()


def owned_event(task_id: str, event: Any, accepted: Collection[str]) -> dict[str, Any]:
    """Check that a resumed task got a usable event of its own (events may be redelivered, and a
    misrouted one must never be taken for this task's decision).

    :param task_id: the resuming task (for the message).
    :param event: the trigger's payload.
    :param accepted: the key namespaces that identify this task's request.
    :raises AirflowException: the event is unusable or belongs to another request.
    """
    from airflow_provider_systemzero.compat import AirflowException

    if not isinstance(event, dict) or "status" not in event:
        raise AirflowException(f"{task_id}: the trigger sent no usable event ({event!r})")
    if event.get("key_namespace") not in accepted:
        raise AirflowException(f"{task_id}: the event belongs to another task instance or request "
                               f"({event.get('key_namespace')!r}, expected one of {sorted(accepted)!r})")
    return event


def decision_payload(decision: DecisionResult) -> dict[str, Any]:
    """Everything the operator needs from a decision, as plain JSON (no state content)."""
    return {"reply_id": decision.reply_id, "state_version": decision.state_version,
            "covered_event_ids": list(decision.covered_event_ids), "request_id": decision.request_id,
            "stream_id": decision.stream_id, "answers": {n: a.to_dict() for n, a in decision.answers.items()},
            "reply": decision.reply}
