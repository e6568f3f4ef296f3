"""The parts a System Zero trigger holds: its stream, the lease on it, and the source that feeds it.

A trigger class is its ``serialize()``, its ``run()`` and its ``cleanup()``; what they share is
here, as plain classes each trigger *holds* (no mixin):

* :class:`TriggerStream` — opens the stream through the hook with the task's budget, turns every
  outcome into one small event payload before the deadline, and closes the stream;
* :class:`StreamLease` — gives a quiet stream back (close 1000) so a triggerer holds many waiting
  tasks within ``max_streams_per_process``; the next change reconnects with a byte-identical replay;
* :class:`SourceFeeder` — hands the source's changes to the stream (holding newer content back
  while a decision is in flight, see :class:`~airflow_provider_systemzero.triggers.currency.Currency`),
  yields the decisions that cover the complete current state, and feeds them to a
  :class:`~airflow_provider_systemzero.decisions.watch.DecisionWatch`.

Nothing here blocks the event loop; :class:`asyncio.CancelledError` always propagates.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from airflow_provider_systemzero.decisions.watch import DecisionWatch
from airflow_provider_systemzero.protocol.reply import DecisionResult
from airflow_provider_systemzero.triggers.currency import DEFAULT_MAX_STALENESS, Currency
from airflow_provider_systemzero.triggers.sources import StateSource

__all__ = ["SourceFeeder", "StreamLease", "TriggerStream", "error_payload"]

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

    payload: dict[str, Any] = {
        "status": "error",
        "error_type": "unexpected",
        "message": str(exc) or repr(exc),
        **extra,
    }
    if isinstance(exc, DeadlineExceeded | TimeoutError):
        payload.update(status="timeout", error_type="timeout")
    elif isinstance(exc, AuthenticationFailed):
        payload["error_type"] = "authentication"
    elif isinstance(exc, ARGUMENT_ERRORS):
        payload.update(error_type="validation", field=exc.field, code=exc.code)
    elif isinstance(exc, DecisionFailed):
        payload.update(
            error_type="decision_failed",
            http_status=exc.http_status,
            code=exc.envelope.code,
            retryable=exc.retryable,
        )
    elif isinstance(exc, UpgradeRefused):
        payload.update(error_type="upgrade_refused", http_status=exc.status)
    elif isinstance(exc, SystemZeroError):
        payload["error_type"] = "stream_failed"
    elif type(exc).__name__ == "AirflowNotFoundException":
        payload["error_type"] = "configuration"
    return payload


class TriggerStream:
    """A trigger's stream: opened with the task's budget, closed on every exit.

    :param systemzero_conn_id: the System Zero connection.
    :param request: the request dict.
    :param key_namespace: the deterministic namespace of the task's keys.
    :param deadline: absolute deadline in epoch seconds, or ``None``.
    :param budget: :meth:`~airflow_provider_systemzero.decisions.budget.DecisionBudget.to_kwargs` from
        the task (``None``: no budget, no usage report).
    """

    def __init__(
        self,
        systemzero_conn_id: str,
        request: dict[str, Any],
        *,
        key_namespace: str,
        deadline: float | None = None,
        budget: dict[str, Any] | None = None,
    ) -> None:
        self.systemzero_conn_id = systemzero_conn_id
        self.request = request
        self.key_namespace = key_namespace
        self.deadline = deadline
        self.stream: Any = None
        self._budget_kwargs = budget
        self._budget: Any = None

    @property
    def budget(self) -> Any:
        """This run's :class:`~airflow_provider_systemzero.decisions.budget.DecisionBudget` (``None`` without one)."""
        if self._budget is None and self._budget_kwargs:
            from airflow_provider_systemzero.decisions.budget import DecisionBudget

            self._budget = DecisionBudget.from_kwargs(self._budget_kwargs)
        return self._budget

    def with_usage(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The event payload plus what this run spent (the worker adds it to the task's total)."""
        from airflow_provider_systemzero.decisions.budget import event_usage

        return {**payload, **event_usage(self._budget)}

    def open(self, state: Any, **kwargs: Any) -> Any:
        """Open the stream about ``state`` (``kwargs`` go to the hook's ``stream()``)."""
        from airflow_provider_systemzero.hooks.systemzero import SystemZeroHook

        hook = SystemZeroHook(systemzero_conn_id=self.systemzero_conn_id)
        self.stream = hook.stream(
            self.request,
            state=state,
            key_namespace=self.key_namespace,
            identity=self.key_namespace,
            budget=self.budget,
            **kwargs,
        )
        return self.stream

    async def within_deadline(
        self,
        work: Callable[[], Awaitable[dict[str, Any]]],
        extra: dict[str, Any],
        *,
        owner: str,
        late: str,
        timed_out: str,
        cleanup: Callable[[], Awaitable[None]],
    ) -> dict[str, Any]:
        """Run ``work`` until the deadline and turn every outcome into one small event payload.

        A failure becomes an ``error`` event naming its cause (:func:`error_payload`), the deadline a
        ``timeout`` event; ``CancelledError`` propagates; ``cleanup`` runs on every exit.
        """
        try:
            remaining = None if self.deadline is None else self.deadline - time.time()
            if remaining is not None and remaining <= 0:
                return {"status": "timeout", "error_type": "timeout", **extra, "message": late}
            async with asyncio.timeout(remaining):
                return await work()
        except TimeoutError:
            last = getattr(self.stream, "last_error_text", None)  # why the wait had no decision
            return {
                "status": "timeout",
                "error_type": "timeout",
                **extra,
                "message": f"{timed_out}; last error: {last}" if last else timed_out,
            }
        except Exception as exc:
            # the event carries the message and the task raises it: said once, by the task
            log.info("%s ends with an error event (%s)", owner, type(exc).__name__)
            return error_payload(exc, **extra)
        finally:
            await cleanup()

    async def aclose(self) -> None:
        """Close the stream (errors are ignored: this runs on every exit)."""
        stream, self.stream = self.stream, None
        if stream is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(stream.aclose(), timeout=5)


class StreamLease:
    """Gives a stream back after ``after`` quiet seconds, or at once when another stream waits.

    :param enabled: lease at all (``False``: keep the stream).
    :param after: seconds without a change before the stream is given back.
    """

    def __init__(self, enabled: bool, after: float) -> None:
        self.enabled = enabled
        self.after = after
        self._timer: asyncio.Task[None] | None = None

    def arm(self, stream: Any) -> None:
        """Start (or restart) the quiet-time countdown: every decision re-arms it."""
        self.disarm()
        if self.enabled:
            self._timer = asyncio.ensure_future(self._release_when_quiet(stream))

    def disarm(self) -> None:
        """Stop the countdown (the state changed, or the trigger ends)."""
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()

    async def _release_when_quiet(self, stream: Any) -> None:
        # Hold the stream for ``after`` quiet seconds (a busy source keeps its connection), but give
        # it back at once when another stream of this process waits for a slot: a slot held for a
        # quiet trigger must never keep a waiting one from its first decision.
        loop = asyncio.get_running_loop()
        until = loop.time() + self.after
        capacity = getattr(stream, "capacity", None)
        reason = f"nothing new for {self.after:.1f} s"
        while (left := until - loop.time()) > 0:
            if capacity is not None and capacity.waiting:
                reason = "another stream waits for a slot"
                break
            await asyncio.sleep(min(_LEASE_POLL_SECONDS, left))
        if stream.connected and not stream.has_work():
            log.info("%s: giving the stream back until the state changes", reason)
            await stream.release()


def _covers_current(stream: Any, decision: DecisionResult) -> bool:
    """Whether ``decision`` covers the complete state the stream holds now (a decide that waited
    for its start under the account ceiling names the newest version when it starts)."""
    return (
        stream.in_sync
        and decision.stream_id == stream.stream_id
        and decision.state_version == stream.state_version
    )


class SourceFeeder:
    """Feeds a source's changes to a stream and yields the decisions about the current state.

    :param stream: the open stream.
    :param source: the state source.
    :param decision_mode: ``on_change`` or ``on_request``.
    :param lease: the stream's lease (disarmed on a change, re-armed after a decision).
    :param max_staleness: seconds newer source content may be held back while a decision is in flight.
    """

    def __init__(
        self,
        stream: Any,
        source: StateSource,
        *,
        decision_mode: str,
        lease: StreamLease,
        max_staleness: float = DEFAULT_MAX_STALENESS,
    ) -> None:
        self.stream = stream
        self.source = source
        self.decision_mode = decision_mode
        self.lease = lease
        # on_change: the opening state schedules a decision, so one is in flight from the start
        self.currency = Currency(max_staleness, deciding=decision_mode == "on_change")
        self.changed = asyncio.Event()

    async def race(self, body: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``body`` while the source feeds the stream; the first to finish wins."""
        feeder = asyncio.ensure_future(self._feed())
        consumer = asyncio.ensure_future(body())
        try:
            await asyncio.wait({feeder, consumer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (feeder, consumer):
                task.cancel()
            await asyncio.gather(feeder, consumer, return_exceptions=True)
        if consumer.done() and not consumer.cancelled():
            return consumer.result()
        return feeder.result()  # the source failed (or ended): raise its error

    async def _feed(self) -> None:
        """Hand the source's changes to the stream in order; when the source changes faster than a
        decision takes, hold them back while a decision is in flight and then hand over the newest."""
        stream, currency = self.stream, self.currency
        arrivals: deque[Any] = deque()  # the source's states not handed over yet, oldest first
        arrived = asyncio.Event()

        async def read() -> None:
            async for state in self.source.changes():
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
                    self.lease.disarm()
                    # currency changes before the stream takes the change: set_state yields, and a
                    # decision arriving meanwhile is about the previous state
                    currency.changed(deciding=self.decision_mode == "on_change")
                    self.changed.set()
                    await stream.set_state(state)
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    async def current_decisions(self) -> AsyncIterator[DecisionResult]:
        """Decisions that cover the complete desired state, leasing the stream in between."""
        stream, currency = self.stream, self.currency
        if self.decision_mode == "on_change":
            async for decision in stream.decisions():
                if not (
                    stream.in_sync
                    and decision.stream_id == stream.stream_id
                    and decision.state_version == stream.state_version
                ):
                    log.debug(
                        "skipping decision for version %s: newer state was sent", decision.state_version
                    )
                    currency.skipped(settle=False)
                    continue
                currency.current()
                yield decision
                self.lease.arm(stream)
        else:
            while True:
                self.changed.clear()
                started = currency.generation
                currency.deciding()
                try:
                    decision = await stream.decide()
                except BaseException:
                    currency.skipped(settle=True)
                    raise
                if currency.generation != started and not _covers_current(stream, decision):
                    log.debug(
                        "skipping decision for version %s: the state changed while it was decided",
                        decision.state_version,
                    )
                    currency.skipped(settle=True)
                    continue
                currency.current()
                yield decision
                self.lease.arm(stream)
                await self.changed.wait()

    async def verdicts(self, watch: DecisionWatch) -> AsyncIterator[Any]:
        """Each verdict of ``watch`` that ends the wait, fed the stream's current decisions.

        The rules (condition, policy, skip states, hysteresis) are the watch's; this loop adds the
        timer that ends a wait when only time is missing.
        """
        from airflow_provider_systemzero.identity import state_hash

        loop = asyncio.get_running_loop()
        stream, currency = self.stream, self.currency
        queue: asyncio.Queue[tuple[DecisionResult, str, Any]] = asyncio.Queue()

        async def pump() -> None:
            async for decision in self.current_decisions():
                # the stream's state now is the state this decision covers (it is current)
                await queue.put((decision, state_hash(stream.state), stream.state))
            raise RuntimeError("the stream ended without a decision")

        pumper = asyncio.ensure_future(pump())
        evaluated = False
        try:
            while True:
                if evaluated:  # the last decision did not end the wait: held changes may go
                    currency.evaluated()
                    evaluated = False
                getter = asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait(
                    {getter, pumper},
                    timeout=watch.wait_time(loop.time()),
                    return_when=asyncio.FIRST_COMPLETED,
                )
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
