"""The source feeder a trigger holds while it has a stream: the source's changes go to the stream,
the decisions that cover the complete current state come back to a
:class:`~airflow_provider_systemzero.decisions.watch.DecisionWatch`.

Newer content is held back while a decision is in flight (see
:class:`~airflow_provider_systemzero.triggers.currency.Currency`), and with ``decide_when`` /
``debounce_ms`` a decision starts only when the
:class:`~airflow_provider_systemzero.decisions.relevance.DecisionGate` says one is due.

Nothing here blocks the event loop; :class:`asyncio.CancelledError` always propagates.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from airflow_provider_systemzero.decisions.relevance import DecisionFilter, DecisionGate, Relevance
from airflow_provider_systemzero.decisions.watch import DecisionWatch
from airflow_provider_systemzero.protocol.reply import DecisionResult
from airflow_provider_systemzero.triggers.currency import DEFAULT_MAX_STALENESS, Currency
from airflow_provider_systemzero.triggers.lease import StreamLease
from airflow_provider_systemzero.triggers.reading import SourceReading
from airflow_provider_systemzero.triggers.sources import StateSource
from airflow_provider_systemzero.triggers.streaming import gate_change, retrieved

__all__ = ["SourceFeeder"]

log = logging.getLogger("airflow_provider_systemzero.triggers.streaming")  # the triggers' stream log


class _Wakeup:
    """One future a task waits on, resolved by whichever callback comes first (a decision, the
    source, the lease, a timer): the waiting task is the next to run, with no task in between.

    Calling it resolves the current wait (once); :meth:`wait` starts the next one.
    """

    __slots__ = ("future",)

    def __init__(self) -> None:
        self.future: asyncio.Future[None] | None = None

    def wait(self) -> asyncio.Future[None]:
        """A new future to await (the previous one is forgotten)."""
        self.future = asyncio.get_running_loop().create_future()
        return self.future

    def __call__(self, *_: Any) -> None:
        future = self.future
        if future is not None and not future.done():
            future.set_result(None)


def _covers_current(stream: Any, decision: DecisionResult) -> bool:
    """Whether ``decision`` covers the complete state the stream holds now: on_change, or a decide
    that waited for its start under the account ceiling (it names the newest version when it starts)."""
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
    :param reading: the source's read the stream's opening began
        (:meth:`~airflow_provider_systemzero.triggers.streaming.TriggerStream.take_reading`), read on
        instead of a new one (``None``: the source's ``changes()``).
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
        reading: SourceReading | None = None,
    ) -> None:
        chosen = decision_filter or DecisionFilter()
        self.gate: DecisionGate | None = gate or chosen.gate(asyncio.get_running_loop().time())
        if self.gate is not None and decision_mode != "on_request":
            raise ValueError("decide_when/debounce_ms decide on request: open the stream in on_request mode")
        self.relevance: Relevance | None = chosen.relevance()
        self.stream = stream
        self.source = source
        self.reading = reading
        self.decision_mode = decision_mode
        self.lease = lease
        self._arrivals: deque[Any] = deque()  # the source's states not handed over yet, oldest first
        self._coordinator: asyncio.Task[None] | None = None  # hands the arrivals over (see _arrived)
        self._fed: asyncio.Future[None] | None = None  # completes when the feeding ends (see _start)
        self._deciding = False
        self._decided = asyncio.Event()  # set whenever no decide is in flight
        self._decided.set()
        # on_change: the opening state schedules a decision, so one is in flight from the start
        self.currency = Currency(max_staleness, deciding=decision_mode == "on_change")
        self.changed = asyncio.Event()

    async def race(self, body: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``body`` while the source feeds the stream; the first to finish wins."""
        fed = self._start()
        consumer = asyncio.ensure_future(body())
        try:
            await asyncio.wait({fed, consumer}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            consumer.cancel()
            await self._stop()
            await asyncio.gather(consumer, return_exceptions=True)
            raise
        if consumer.done() and not consumer.cancelled() and consumer.exception() is None:
            # the answer is in: it goes out now, and the feeding stops meanwhile (nothing it does
            # matters any more; its source and stream are closed by the trigger's cleanup)
            await self._stop(wait=False)
            return consumer.result()
        consumer.cancel()
        await self._stop()
        await asyncio.gather(consumer, return_exceptions=True)
        if consumer.done() and not consumer.cancelled():
            return consumer.result()
        return fed.result()  # the source failed (or ended): raise its error

    @property
    def direct(self) -> bool:
        """Whether :meth:`first_verdict` serves this feeder (on_change without a decision filter)."""
        return self.decision_mode == "on_change" and self.gate is None

    async def first_verdict(self, watch: DecisionWatch) -> Any:
        """The first verdict of ``watch`` that ends the wait, or ``None`` once the lease says the
        stream is quiet (or the source ended); only for a :attr:`direct` feeder.

        The decisions are taken in the caller's task: the stream's reader resolves the one future
        this task waits on (:meth:`~airflow_provider_systemzero.stream.decision_stream.DecisionStream.wake_on_decision`),
        so a decision reaches the condition one loop turn after its frame was read. The source is
        fed meanwhile (:meth:`_start`: the reading's one task); a decision about a state already
        superseded is dropped, the lease is armed on each current one, and the wait ends when
        only time was missing (hysteresis). :class:`asyncio.CancelledError` propagates, and no
        task outlives the call but a feeder being cancelled after a verdict (it stops on its own:
        the event goes out first). Every outcome ends the stream, so its close begins on the way
        out (:meth:`~airflow_provider_systemzero.stream.decision_stream.DecisionStream.close_soon`):
        the slot goes back to a waiting trigger without waiting for the caller's ``aclose()``.

        :param watch: the rules that end the wait.
        :raises DecisionFailed: a dispatch failed and the gateway will not retry it.
        :raises StreamClosed: the stream ended without a verdict.
        """
        assert self.direct, "first_verdict serves on_change without a decision filter"
        loop = asyncio.get_running_loop()
        stream, currency, lease = self.stream, self.currency, self.lease
        wakeup = _Wakeup()
        quiet = lease.watch(currency)
        quiet.add_done_callback(wakeup)
        fed = self._start()
        fed.add_done_callback(wakeup)
        timer: asyncio.TimerHandle | None = None
        verdict = None
        try:
            while True:
                decision = stream.take_decision()
                while decision is not None:
                    if self._current(decision):
                        verdict = watch.observe(decision, stream.state_hash, stream.state, loop.time())
                        if verdict is not None:
                            return verdict  # the wait ends with it: no lease to arm on the way out
                        lease.arm(stream)
                        currency.evaluated()  # it did not end the wait: held changes may go
                    decision = stream.take_decision()
                if quiet.done():
                    return None
                if fed.done():
                    return fed.result()  # the source ended (None) or raises why it failed
                wait = watch.wait_time(loop.time())
                if wait is not None and wait <= 0:
                    verdict = watch.due(loop.time())
                    if verdict is not None:
                        return verdict
                waited = wakeup.wait()
                stream.wake_on_decision(waited)
                if wait is not None:  # only time is missing: the timer ends the wait, unless a decision comes
                    log.debug("the condition holds: waiting %.3f s for it to have held long enough", wait)
                    timer = loop.call_later(wait, wakeup)
                await waited  # a decision, the lease, the source, or the time a run of decisions needs
                if timer is not None:
                    timer.cancel()
                    timer = None
        finally:
            # every way out ends this stream (a verdict ends the trigger; a quiet lease or the
            # source's end makes it dormant): its close begins without waiting for the trigger's
            # aclose(), so its slot goes back sooner. With a verdict, the event goes out first and
            # the close frame follows in the next loop turn: the answer does not wait for a write.
            if verdict is None:
                stream.close_soon()
            else:
                loop.call_soon(stream.close_soon)
            if timer is not None:
                timer.cancel()
            quiet.cancel()
            # with a verdict the answer goes out now, and the reading stops meanwhile
            await self._stop(wait=verdict is None)

    def _start(self) -> asyncio.Future[None]:
        """Begin feeding: each state the source gives goes to the stream (:meth:`_arrived`). The
        reading the stream's opening began reads on (a push source is not restarted), else a new
        one reads the source's ``changes()``.

        :return: a future that completes when the feeding ends on its own: the source ended
            (``None``), or it failed, or a state could not be handed over (the error).
        """
        self._fed = asyncio.get_running_loop().create_future()
        reading = self.reading
        if reading is None:
            reading = self.reading = SourceReading(self.source.changes())
        reading.hand_to(self._arrived)
        reading.task.add_done_callback(self._read_ended)
        return self._fed

    async def _arrived(self, state: Any) -> None:
        """A state the source gave: handed over at once when nothing is held or queued (no
        ``decide_when``: the usual case), in the reading's own task; else it queues behind the
        hold, and one task (started only then) hands the queue over while the reading goes on."""
        if (
            self.gate is None
            and not self._arrivals
            and not (state != self.stream.state and self.currency.starved)
        ):
            await self._hand_over(state)
            return
        self._arrivals.append(state)
        if self._coordinator is None:
            self._coordinate_soon()

    def _coordinate_soon(self) -> None:
        """Start the one task that hands the queued states over (:meth:`_coordinate`)."""
        self._coordinator = asyncio.ensure_future(self._coordinate())
        self._coordinator.add_done_callback(self._coordinated)

    async def _coordinate(self) -> None:
        """Hand the queued states over in order; when the source changes faster than a decision
        takes, hold them back while a decision is in flight and then hand over the newest."""
        stream, currency, arrivals = self.stream, self.currency, self._arrivals
        assert self.reading is not None
        reader = self.reading.task
        while arrivals:
            if arrivals[0] != stream.state and self.gate is not None and self._deciding:
                await self._hold_while_deciding(reader)
                while len(arrivals) > 1:  # the newest covers what arrived meanwhile
                    arrivals.popleft()
            elif arrivals[0] != stream.state and currency.starved:
                await currency.hold(reader)
                while len(arrivals) > 1:  # what arrived meanwhile is covered by the newest
                    arrivals.popleft()
            await self._hand_over(arrivals.popleft())

    def _coordinated(self, task: asyncio.Task[None]) -> None:
        if self._coordinator is task:
            self._coordinator = None
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            self._end(error)
        elif self._arrivals:  # queued as the last hand-over finished
            self._coordinate_soon()
        elif self.reading is not None and self.reading.task.done():
            self._read_ended(self.reading.task)

    def _read_ended(self, task: asyncio.Task[None]) -> None:
        """The reading ended: the feeding ends with it, once the queued states are handed over."""
        if task.cancelled():
            self._end(None, cancelled=True)
        elif (error := task.exception()) is not None:
            self._end(error)
        elif self._coordinator is None:
            self._end(None)

    def _end(self, error: BaseException | None, *, cancelled: bool = False) -> None:
        fed = self._fed
        if fed is None or fed.done():
            return
        if cancelled:
            fed.cancel()
        elif error is not None:
            fed.set_exception(error)
        else:
            fed.set_result(None)

    async def aclose(self) -> None:
        """Stop the feeding and the source's reading, whether or not they began (safe to call
        again): what a stream's holder runs as the stream is given back."""
        await self._stop()

    async def _stop(self, *, wait: bool = True) -> None:
        """Stop the feeding (the reading and any hand-over under way); ``wait=False``: without
        waiting for them to end (an answer goes out first)."""
        reading = self.reading
        tasks = [t for t in (self._coordinator, reading.task if reading else None) if t is not None]
        for task in tasks:
            task.cancel()
            task.add_done_callback(retrieved)  # no cycle through their frames outlives them
        if reading is not None:
            reading.deliver = None  # it held this feeder's hand-over
        if self._fed is not None:
            self._fed.add_done_callback(retrieved)  # its outcome no longer matters
        if wait and tasks:
            await asyncio.wait(tasks)

    async def _hand_over(self, state: Any) -> None:
        """Make the source's ``state`` the stream's desired state (nothing when it already is)."""
        stream = self.stream
        if state == stream.state:  # the first value usually equals the state the stream opened with
            return
        self.lease.disarm()
        if self.gate is not None:
            await self._gate_change(stream.state, state)
        # currency changes before the stream takes the change: set_state yields, and a decision
        # arriving meanwhile is about the previous state
        self.currency.changed(deciding=self.decision_mode == "on_change")
        self.changed.set()
        await stream.set_state(state)
        if self.gate is not None and not self.gate.pending and not self._deciding:
            self.lease.arm(stream)  # nothing to decide: the stream may go back when quiet

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

    def _current(self, decision: DecisionResult) -> bool:
        """Whether an on_change ``decision`` covers the complete desired state (counted current);
        one about a state already superseded is skipped, and said so."""
        if not _covers_current(self.stream, decision):
            log.debug("skipping decision for version %s: newer state was sent", decision.state_version)
            self.currency.skipped(settle=False)
            return False
        self.currency.current()
        return True

    async def current_decisions(self) -> AsyncIterator[DecisionResult]:
        """Decisions that cover the complete desired state, leasing the stream in between."""
        stream, currency = self.stream, self.currency
        if self.decision_mode == "on_change":
            async for decision in stream.decisions():
                if not self._current(decision):
                    continue
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
        loop = asyncio.get_running_loop()
        stream, currency = self.stream, self.currency
        queue: asyncio.Queue[tuple[DecisionResult, str, Any]] = asyncio.Queue()

        async def pump() -> None:
            async for decision in self.current_decisions():
                # the stream's state now is the state this decision covers (it is current)
                await queue.put((decision, stream.state_hash, stream.state))
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
