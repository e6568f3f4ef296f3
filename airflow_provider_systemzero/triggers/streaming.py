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
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from airflow_provider_systemzero.decisions.relevance import DecisionFilter, DecisionGate, Relevance
from airflow_provider_systemzero.decisions.watch import DecisionWatch
from airflow_provider_systemzero.protocol.reply import DecisionResult
from airflow_provider_systemzero.triggers.currency import DEFAULT_MAX_STALENESS, Currency
from airflow_provider_systemzero.triggers.sources import StateSource

__all__ = ["NO_CHANGE", "SourceFeeder", "StreamLease", "TriggerStream", "error_payload", "gate_change"]

log = logging.getLogger(__name__)

#: What :attr:`StreamLease.covered` is before any decision (equal to no state).
_NOTHING: Any = object()

#: What :meth:`TriggerStream.wait_for_change` returns when only time passed (no change).
NO_CHANGE: Any = object()

T = TypeVar("T")


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


def _retrieved(task: asyncio.Future[Any]) -> None:
    """Mark a stopped task's outcome as seen (its error, if any, no longer matters)."""
    if not task.cancelled():
        task.exception()


class TriggerStream:
    """A trigger's stream: opened with the task's budget, closed on every exit, and let go while the
    source is quiet.

    A waiting trigger alternates between two phases:

    * **holding a stream** — :meth:`open` builds a
      :class:`~airflow_provider_systemzero.stream.decision_stream.DecisionStream` about the current
      state, and :meth:`until_quiet` runs the trigger's work on it until the work ends or the
      :class:`StreamLease` says the stream is quiet; the trigger then closes the stream (close
      1000), which frees its slot of ``max_streams_per_process`` for the next waiter;
    * **dormant** — :meth:`wait_for_change` is the trigger's one await, on the source's next change:
      no stream, session, connection, task or timer is held, only what resuming needs (the source
      with its offset, the state the last decision covered, the key namespace, the condition). A
      change rebuilds the rest; the same key namespace makes a state already decided replay unbilled.

    :param systemzero_conn_id: the System Zero connection.
    :param request: the request dict.
    :param key_namespace: the deterministic namespace of the task's keys.
    :param deadline: absolute deadline in epoch seconds, or ``None``.
    :param budget: :meth:`~airflow_provider_systemzero.decisions.budget.DecisionBudget.to_kwargs` from
        the task (``None``: no budget, no usage report).
    """

    __slots__ = (
        "_budget",
        "_budget_kwargs",
        "_dormant",
        "_settings",
        "deadline",
        "key_namespace",
        "request",
        "stream",
        "systemzero_conn_id",
    )

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
        #: the open stream (``None`` before the first and while dormant)
        self.stream: Any = None
        self._budget_kwargs = budget
        self._budget: Any = None
        self._settings: Any = None  # the connection's settings, resolved once per trigger run
        self._dormant = False

    @property
    def dormant(self) -> bool:
        """Whether the trigger holds no stream and waits for its source to change."""
        return self._dormant

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
        """Open the stream about ``state`` (``kwargs`` go to the hook's ``stream()``).

        The connection is looked up once per trigger run: a stream rebuilt after a dormant phase
        reuses the settings the first one resolved.
        """
        from airflow_provider_systemzero.hooks.systemzero import SystemZeroHook

        hook = SystemZeroHook(systemzero_conn_id=self.systemzero_conn_id)
        self.stream = hook.stream(
            self.request,
            state=state,
            key_namespace=self.key_namespace,
            identity=self.key_namespace,
            budget=self.budget,
            settings=self._settings,
            **kwargs,
        )
        return self.stream

    async def until_quiet(self, lease: StreamLease, feeder: SourceFeeder, work: Awaitable[T]) -> T | None:
        """Run ``work`` on the open stream until it ends (its result, or its error) or ``lease``
        says the stream is quiet (``None``: close the stream and :meth:`wait_for_change`).

        :param lease: the stream's lease.
        :param feeder: the feeder ``work`` reads the decisions from.
        :param work: what the trigger does with the stream (it is cancelled when the stream is quiet).
        """
        quiet = lease.watch(feeder.currency)
        task = asyncio.ensure_future(work)
        try:
            await asyncio.wait((task, quiet), return_when=asyncio.FIRST_COMPLETED)
        finally:
            quiet.cancel()
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if task.cancelled():
            return None
        return task.result()

    async def wait_for_change(
        self,
        source: StateSource,
        lease: StreamLease,
        *,
        min_interval: float = 0.0,
        time_left: float | None = None,
        since: Any = NO_CHANGE,
    ) -> Any:
        """The dormant phase: wait, holding no stream, until ``source`` has a state other than the
        one the last decision covered (:attr:`StreamLease.covered`, or ``since`` when given); the
        state to open the next stream with.

        The only thing the trigger does meanwhile is this one await on the source's change
        notification (its ``changes()``): no task, no timer, no stream — unless the condition itself
        waits on time (``time_left``).

        :param source: the trigger's source.
        :param lease: the lease of the stream just closed (it knows what the last decision covered).
        :param min_interval: seconds that must pass between the last decision and the next stream's
            (the trigger's ``min_interval_ms``): a change sooner waits out the rest, and says so.
        :param time_left: seconds until only time can end the wait (hysteresis's ``min_true_for``);
            :data:`NO_CHANGE` is returned when they pass first.
        :param since: the state to wait for a change from, when it is not the one the last decision
            covered (a dormant trigger with ``decide_when`` saw a change that starts no decision).
        """
        if self.stream is not None and self.stream.settings is not None:
            self._settings = self.stream.settings  # the next stream reuses them: no second lookup
        self.stream = None
        self._dormant = True
        covered = lease.covered if since is NO_CHANGE else since
        changes = source.changes()
        try:
            if time_left is None:
                async for state in changes:  # the one await of a dormant trigger
                    if state is not covered and state != covered:
                        break
            else:
                try:
                    async with asyncio.timeout(time_left):
                        async for state in changes:
                            if state is not covered and state != covered:
                                break
                except TimeoutError:
                    return NO_CHANGE
        finally:
            self._dormant = False
            await changes.aclose()  # type: ignore[attr-defined]
        if min_interval > 0:
            loop = asyncio.get_running_loop()
            # the lease stamped the last decision; a change before min_interval waits out the rest
            wait = min_interval - (loop.time() - lease.decided_at)
            if wait > 0:
                log.info("the source changed: deciding the new state in %.1f s (min_interval_ms)", wait)
                await asyncio.sleep(wait)
        return state

    @contextlib.asynccontextmanager
    async def held(self, state: Any, **kwargs: Any) -> AsyncIterator[Any]:
        """Open and enter the stream about ``state``, and leave it open on exit: :meth:`aclose`
        (the trigger's ``cleanup()``) closes it, so an event goes out before the close handshake."""
        stream = self.open(state, **kwargs)
        yield await stream.__aenter__()

    async def within_deadline(
        self,
        work: Callable[[], Awaitable[dict[str, Any]]],
        extra: dict[str, Any],
        *,
        owner: str,
        late: str,
        timed_out: str,
        cleanup: Callable[[], Awaitable[None]],
        keep_open: bool = False,
    ) -> dict[str, Any]:
        """Run ``work`` until the deadline and turn every outcome into one small event payload.

        A failure becomes an ``error`` event naming its cause (:func:`error_payload`), the deadline a
        ``timeout`` event; ``CancelledError`` propagates; ``cleanup`` runs on every exit — with
        ``keep_open``, on every exit but ``work``'s success, after which the caller yields its event
        first and then cleans up.
        """
        succeeded = False
        try:
            remaining = None if self.deadline is None else self.deadline - time.time()
            if remaining is not None and remaining <= 0:
                return {"status": "timeout", "error_type": "timeout", **extra, "message": late}
            if remaining is None:
                payload = await work()
            else:
                async with asyncio.timeout(remaining):
                    payload = await work()
            succeeded = True
            return payload
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
            if not (keep_open and succeeded):
                await cleanup()

    async def aclose(self) -> None:
        """Close the stream (errors are ignored: this runs on every exit)."""
        stream, self.stream = self.stream, None
        if stream is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(stream.aclose(), timeout=5)


class StreamLease:
    """Says when a trigger gives its quiet stream back: ``after`` seconds after the last decision
    with nothing new, or at once when another stream of the process waits for a slot.

    Nothing polls. After each decision about the current state (:meth:`arm`) the lease sets one
    timer and *offers* the stream's slot to the process's
    :class:`~airflow_provider_systemzero.stream.capacity.StreamCapacity`, which calls the offer the
    moment a waiter queues; either way the future of :meth:`watch` completes (the trigger then
    closes the stream and goes dormant). A change handed to the stream :meth:`disarm` s it.

    :param enabled: lease at all (``False``: keep the stream).
    :param after: seconds without a change before the stream is given back.
    """

    __slots__ = (
        "_offer",
        "_pending",
        "_quiet",
        "_stream",
        "_timer",
        "_unevaluated",
        "after",
        "covered",
        "decided_at",
        "enabled",
    )

    def __init__(self, enabled: bool, after: float) -> None:
        self.enabled = enabled
        self.after = after
        #: the state the last decision covered (what a dormant trigger compares the source with)
        self.covered: Any = _NOTHING
        #: the loop time of the last decision
        self.decided_at = -math.inf
        self._stream: Any = None
        self._timer: asyncio.TimerHandle | None = None
        self._offer: Any = None
        self._quiet: asyncio.Future[str] | None = None
        self._unevaluated = 0  # decisions armed on and not evaluated yet
        self._pending: str | None = None  # why to give the stream back once they are

    def watch(self, currency: Currency) -> asyncio.Future[str]:
        """A future that completes, with the reason, when the stream should be given back.

        The stream is given back only once every decision the lease was armed on was evaluated
        (``currency`` says so), so a decision that ends the wait is never dropped with its stream.

        :param currency: the feeder's :class:`~airflow_provider_systemzero.triggers.currency.Currency`.
        """
        self._quiet = asyncio.get_running_loop().create_future()
        self._unevaluated, self._pending = 0, None
        currency.on_evaluated = self._evaluated
        return self._quiet

    def _evaluated(self) -> None:
        self._unevaluated = max(0, self._unevaluated - 1)
        if not self._unevaluated and self._pending is not None:
            reason, self._pending = self._pending, None
            self._give_back(reason)

    def arm(self, stream: Any) -> None:
        """A decision about the current state came back: start the quiet-time countdown and offer
        the slot to a waiter (every decision re-arms it)."""
        self.disarm()
        loop = asyncio.get_running_loop()
        self.covered = stream.state
        self.decided_at = loop.time()
        self._unevaluated += 1
        if not self.enabled:
            return
        self._stream = stream
        self._timer = loop.call_later(self.after, self._quiet_for_long)
        capacity = getattr(stream, "capacity", None)
        if capacity is not None:
            self._offer = capacity.offer(self._wanted)

    def disarm(self) -> None:
        """Stop the countdown and withdraw the offer (the state changed, the stream was given back,
        or the trigger ends)."""
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        offer, self._offer = self._offer, None
        if offer is not None:
            self._stream.capacity.withdraw(offer)
        self._stream = None

    def _quiet_for_long(self) -> None:
        self._timer = None
        self._give_back(f"nothing new for {self.after:.1f} s")

    def _wanted(self) -> None:
        if self._quiet is not None and self._quiet.done():
            return  # already giving the stream back: the waiter gets its slot
        if not self._give_back("another stream waits for a slot"):
            offer, self._offer = self._offer, None  # busy after all: let another idle stream go
            if offer is not None:
                self._stream.capacity.withdraw(offer)

    def _give_back(self, reason: str) -> bool:
        stream, quiet = self._stream, self._quiet
        if stream is None or quiet is None or quiet.done():
            return False
        if stream.has_work() or not (stream.connected or stream.dormant):
            return False  # a change is on its way (its decision re-arms), or the stream reconnects
        if self._unevaluated:
            self._pending = reason  # the decision just in may end the wait: give back once it did not
            return True
        log.info("%s: giving the stream back until the state changes", reason)
        quiet.set_result(reason)
        return True


async def gate_change(gate: DecisionGate, relevance: Relevance | None, previous: Any, state: Any) -> None:
    """Tell ``gate`` that the source changed from ``previous`` to ``state``, and whether the change
    matches ``decide_when`` (``relevance``; an author's callable runs in a thread, never on the loop)."""
    relevant = True
    if relevance is not None:
        if relevance.is_callable:
            relevant = await asyncio.to_thread(relevance.matches, previous, state)
        else:
            relevant = relevance.matches(previous, state)
    if not relevant:
        log.debug("a change does not match decide_when: streamed, no decision started")
    gate.changed(relevant, asyncio.get_running_loop().time())


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

    With an active ``decision_filter`` (``decide_when``, ``debounce_ms`` or ``decide_initial=False``)
    the stream runs on_request: every change is streamed, and a decision starts only when its
    :class:`~airflow_provider_systemzero.decisions.relevance.DecisionGate` says one is due (a relevant
    change, after the quiet time), always about the newest state; a change that arrives while that
    decision runs waits for it (at most ``max_staleness``).

    :param stream: the open stream.
    :param source: the state source.
    :param decision_mode: ``on_change`` or ``on_request`` (``on_request`` with an active filter).
    :param lease: the stream's lease (disarmed on a change, re-armed after a decision).
    :param max_staleness: seconds newer source content may be held back while a decision is in flight.
    :param decision_filter: ``decide_when``, ``debounce_ms`` and ``decide_initial``
        (:class:`~airflow_provider_systemzero.decisions.relevance.DecisionFilter`); when active, the
        stream must have been opened with :meth:`DecisionFilter.stream_mode` (``on_request``).
    :param gate: the trigger's :class:`~airflow_provider_systemzero.decisions.relevance.DecisionGate`,
        kept across its streams (a dormant trigger reopens one without deciding its initial state
        again); ``None``: a fresh one from ``decision_filter``.
    :raises SystemZeroArgumentError: the ``decide_when`` callable cannot be imported.
    """

    def __init__(
        self,
        stream: Any,
        source: StateSource,
        *,
        decision_mode: str,
        lease: StreamLease,
        max_staleness: float = DEFAULT_MAX_STALENESS,
        decision_filter: DecisionFilter | None = None,
        gate: DecisionGate | None = None,
    ) -> None:
        chosen = decision_filter or DecisionFilter()
        self.gate: DecisionGate | None = gate or chosen.gate(asyncio.get_running_loop().time())
        if self.gate is not None and decision_mode != "on_request":
            raise ValueError("decide_when/debounce_ms decide on request: open the stream in on_request mode")
        self.relevance: Relevance | None = chosen.relevance()
        self.stream = stream
        self.source = source
        self.decision_mode = decision_mode
        self.lease = lease
        self._deciding = False
        self._decided = asyncio.Event()  # set whenever no decide is in flight
        self._decided.set()
        # on_change: the opening state schedules a decision, so one is in flight from the start
        self.currency = Currency(max_staleness, deciding=decision_mode == "on_change")
        self.changed = asyncio.Event()

    async def race(self, body: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``body`` while the source feeds the stream; the first to finish wins."""
        feeder = asyncio.ensure_future(self._feed())
        consumer = asyncio.ensure_future(body())
        try:
            await asyncio.wait({feeder, consumer}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            for task in (feeder, consumer):
                task.cancel()
            await asyncio.gather(feeder, consumer, return_exceptions=True)
            raise
        if consumer.done() and not consumer.cancelled() and consumer.exception() is None:
            # the answer is in: it goes out now, and the feeder stops meanwhile (nothing it does
            # matters any more; its source and stream are closed by the trigger's cleanup)
            feeder.cancel()
            feeder.add_done_callback(_retrieved)
            return consumer.result()
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
                if arrivals[0] != stream.state and self.gate is not None and self._deciding:
                    await self._hold_while_deciding(reader)
                    while len(arrivals) > 1:  # the newest covers what arrived meanwhile
                        arrivals.popleft()
                elif arrivals[0] != stream.state and currency.starved:
                    await currency.hold(reader)
                    while len(arrivals) > 1:  # what arrived meanwhile is covered by the newest
                        arrivals.popleft()
                state = arrivals.popleft()
                if state != stream.state:  # the first value usually equals the state the stream opened with
                    self.lease.disarm()
                    if self.gate is not None:
                        await self._gate_change(stream.state, state)
                    # currency changes before the stream takes the change: set_state yields, and a
                    # decision arriving meanwhile is about the previous state
                    currency.changed(deciding=self.decision_mode == "on_change")
                    self.changed.set()
                    await stream.set_state(state)
                    if self.gate is not None and not self.gate.pending and not self._deciding:
                        self.lease.arm(stream)  # nothing to decide: the stream may go back when quiet
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    async def _hold_while_deciding(self, reader: asyncio.Future[Any]) -> None:
        """A change arrived while a decide is in flight: hold it until the decision is back (at most
        ``max_staleness``), so that decision is about the newest state and counts, and is never
        billed about a state superseded while it ran."""
        limit = self.currency.max_staleness
        if limit <= 0:
            return
        log.info("holding a change while a decision is in flight (at most %.1f s)", limit)
        decided = asyncio.ensure_future(self._decided.wait())
        try:
            await asyncio.wait({decided, reader}, timeout=limit, return_when=asyncio.FIRST_COMPLETED)
        finally:
            decided.cancel()

    async def _gate_change(self, previous: Any, state: Any) -> None:
        """Tell the gate about a change, and whether it matches ``decide_when``."""
        assert self.gate is not None
        await gate_change(self.gate, self.relevance, previous, state)

    async def _until_due(self) -> None:
        """Wait until the gate says a decision is due (a relevant change, then the quiet time)."""
        assert self.gate is not None
        gate, loop = self.gate, asyncio.get_running_loop()
        said: bool | None = None  # the reason last logged: said once per reason, not per change
        while True:
            self.changed.clear()
            due = gate.due_at()
            if due is not None and due <= loop.time():
                return
            if (due is None) != said:
                said = due is None
                if due is None:
                    log.info("waiting for a change that matches decide_when")
                else:
                    log.info(
                        "debounce: deciding once the source is quiet (in %.3f s at most)", due - loop.time()
                    )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(None if due is None else due - loop.time()):
                    await self.changed.wait()

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
            gate = self.gate
            while True:
                if gate is not None:
                    await self._until_due()
                    gate.started()
                self.changed.clear()
                started = currency.generation
                currency.deciding()
                self._deciding = True
                self._decided.clear()
                try:
                    decision = await stream.decide()
                except BaseException:
                    currency.skipped(settle=True)
                    raise
                finally:
                    self._deciding = False
                    self._decided.set()
                if currency.generation != started and not _covers_current(stream, decision):
                    log.debug(
                        "skipping decision for version %s: the state changed while it was decided",
                        decision.state_version,
                    )
                    currency.skipped(settle=True)
                    if gate is not None:
                        gate.superseded(asyncio.get_running_loop().time())
                    continue
                currency.current()
                yield decision
                self.lease.arm(stream)
                if gate is None:
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
        getter: asyncio.Future[Any] | None = None
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
            if getter is not None:
                getter.cancel()  # cancelled while waiting: the queue's getter must not outlive the wait
            pumper.cancel()
            await asyncio.gather(pumper, return_exceptions=True)
