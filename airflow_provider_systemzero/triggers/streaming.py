"""The parts a System Zero trigger holds: its stream, the lease on it, and the source that feeds it.

A trigger class is its ``serialize()``, its ``run()`` and its ``cleanup()``; what they share is
here, as plain classes each trigger *holds* (no mixin):

* :class:`TriggerStream` — opens the stream through the hook with the task's budget, turns every
  outcome into one small event payload before the deadline, and closes the stream;
* :class:`~airflow_provider_systemzero.triggers.lease.StreamLease` (in ``lease.py``) — gives a quiet stream back (close 1000) so a triggerer holds many waiting
  tasks within ``max_streams_per_process``; the next change reconnects with a byte-identical replay;
* :class:`~airflow_provider_systemzero.triggers.reading.SourceReading` (in ``reading.py``) — the
  one task reading the source while a stream opens (its changes become the state it opens with)
  and, for its feeder, while it is held;
* :class:`~airflow_provider_systemzero.triggers.feeder.SourceFeeder` (in ``feeder.py``) — hands
  the source's changes to the stream and feeds the decisions to a
  :class:`~airflow_provider_systemzero.decisions.watch.DecisionWatch`.

Nothing here blocks the event loop; :class:`asyncio.CancelledError` always propagates.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from airflow_provider_systemzero.triggers.lease import StreamLease
from airflow_provider_systemzero.triggers.opening import OPENINGS, Opening
from airflow_provider_systemzero.triggers.payloads import error_payload, timeout_payload
from airflow_provider_systemzero.triggers.reading import SourceReading, retrieved
from airflow_provider_systemzero.triggers.sources import StateSource
from airflow_provider_systemzero.triggers.state_source import NO_CHANGE

if TYPE_CHECKING:  # the feeder holds a lease: imported for annotations only, to keep imports acyclic
    from airflow_provider_systemzero.decisions.relevance import DecisionGate, Relevance
    from airflow_provider_systemzero.decisions.watch import DecisionWatch
    from airflow_provider_systemzero.triggers.feeder import SourceFeeder

__all__ = [
    "NO_CHANGE",
    "TriggerStream",
    "gate_change",
    "retrieved",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: What :attr:`TriggerStream.covered` is before any decision (equal to no state).
_NOTHING: Any = object()


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


#: Per connection ID, the settings its triggers last resolved (immutable, so shared).
_SETTINGS: dict[str | None, Any] = {}


def _shared(settings: Any) -> Any:
    """``settings``, or an equal object other triggers already keep (a frozen
    :class:`~airflow_provider_systemzero.stream.settings.StreamSettings`): a thousand waiting
    triggers of one connection keep one object, not a thousand; changed settings replace it."""
    kept = _SETTINGS.get(settings.conn_id)
    if kept is not None and kept == settings:
        return kept
    _SETTINGS[settings.conn_id] = settings
    return settings


def _stream_options() -> tuple[float, float, bool, bool]:
    """What a trigger's streams take from Airflow's configuration (each read costs tens of
    microseconds, so a trigger reads it once per run, as it looks its connection up once): the
    reconnect backoff's base and cap, whether spans are emitted, and whether they carry content."""
    from airflow_provider_systemzero.hooks.systemzero import backoff_config
    from airflow_provider_systemzero.utils.observability import capture_content_enabled, spans_enabled

    base, cap = backoff_config()
    spans = spans_enabled()
    return base, cap, spans, capture_content_enabled() if spans else False


class TriggerStream:
    """A trigger's stream: opened with the task's budget, closed on every exit, and let go while the
    source is quiet.

    A waiting trigger alternates between two phases:

    * **holding a stream** — :meth:`open` builds a
      :class:`~airflow_provider_systemzero.stream.decision_stream.DecisionStream` about the current
      state, and :meth:`until_quiet` runs the trigger's work on it until the work ends or the
      :class:`StreamLease` says the stream is quiet; the trigger then closes the stream (close
      1000), which frees its slot of ``max_streams_per_process`` for the next waiter;
    * **dormant** — the trigger's ``run()`` itself awaits its source's next change
      (:meth:`~airflow_provider_systemzero.triggers.state_source.StateSource.next_change`), with no
      coroutine of this class or the source's in between; this record keeps what the wait needs
      between wake-ups (:meth:`let_go`, :meth:`changed`, :meth:`woken`). No stream, session,
      connection, task or timer is held, only what resuming needs (the source with its offset,
      the state the last decision covered, the key namespace, the condition). A change rebuilds
      the rest; the same key namespace makes a state already decided replay unbilled.

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
        "_options",
        "_reading",
        "_settings",
        "_since",
        "covered",
        "deadline",
        "decided_at",
        "dormant",
        "key_namespace",
        "reached",
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
        self._options: tuple[float, float, bool, bool] | None = None  # see _stream_options
        #: whether the trigger holds no stream and waits for its source to change (its ``run()``
        #: sets it around the await)
        self.dormant = False
        #: one of the trigger's streams opened: the gateway exists, and a loopback one that
        #: refuses a later stream is restarting (that stream keeps reconnecting, see ``reached``
        #: of :class:`~airflow_provider_systemzero.stream.DecisionStream`)
        self.reached = False
        self._reading: SourceReading | None = None  # what enter() read of the source, for the feeder
        self._since: Any = (
            NO_CHANGE  # a dormant wait's state to compare changes with (NO_CHANGE: the covered one)
        )
        #: the state the last decision covered, and its loop time (kept from each stream's lease:
        #: :meth:`remember`; what a dormant trigger compares the source with, and ``min_interval_ms``)
        self.covered: Any = _NOTHING
        self.decided_at = -math.inf

    @property
    def budget(self) -> Any:
        """This run's :class:`~airflow_provider_systemzero.decisions.budget.DecisionBudget` (``None`` without one)."""
        if self._budget is None and self._budget_kwargs:
            from airflow_provider_systemzero.decisions.budget import DecisionBudget

            self._budget = DecisionBudget.from_kwargs(self._budget_kwargs)
        return self._budget

    def with_usage(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The final event's payload plus what this run spent (the worker adds it to the task's
        total). A dispatch still in flight is counted as unconfirmed first: the stream closes
        after this event, and its reply, billed or not, will never reach the task."""
        from airflow_provider_systemzero.decisions.budget import event_usage

        if self._budget is not None and self.stream is not None:
            self.stream.settle_usage()
        return {**payload, **event_usage(self._budget)}

    def open(self, state: Any, **kwargs: Any) -> Any:
        """Open the stream about ``state`` (``kwargs`` go to the hook's ``stream()``).

        The connection and Airflow's configuration are looked up once per trigger run: a stream
        rebuilt after a dormant phase reuses the settings and the options the first one resolved.
        """
        from airflow_provider_systemzero.hooks.systemzero import SystemZeroHook
        from airflow_provider_systemzero.stream import Backoff
        from airflow_provider_systemzero.utils.observability import AirflowStreamObserver

        if self._options is None:
            self._options = _stream_options()
        base, cap, spans, capture = self._options
        hook = SystemZeroHook(systemzero_conn_id=self.systemzero_conn_id, backoff=Backoff(base=base, cap=cap))
        observer = AirflowStreamObserver(
            kwargs.get("decision_mode", "on_change"), spans=spans, capture_content=capture
        )
        self.stream = hook.stream(
            self.request,
            state=state,
            reached=self.reached,
            key_namespace=self.key_namespace,
            identity=self.key_namespace,
            budget=self.budget,
            settings=self._settings,
            observer=observer,
            **kwargs,
        )
        return self.stream

    async def until_quiet(self, lease: StreamLease, feeder: SourceFeeder, work: Awaitable[T]) -> T | None:
        """Run ``work`` on the open stream until it ends (its result, or its error) or ``lease``
        says the stream is quiet (``None``: close the stream and :meth:`wait_until_due`).

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

    def remember(self, lease: StreamLease) -> None:
        """The lease of a stream ends: keep what its last decision covered and when (a stream that
        had no decision leaves the last ones), and nothing else of the lease.

        :param lease: the lease of the stream (:class:`StreamLease`; one per stream).
        """
        if math.isfinite(lease.decided_at):
            self.covered, self.decided_at = lease.covered, lease.decided_at

    def let_go(self, gate: DecisionGate | None = None) -> None:
        """The stream just closed and the trigger goes dormant: keep the connection's settings for
        the next stream (no second lookup) and what the dormant wait compares changes with, and
        nothing else of the stream.

        A change is the source's state other than the one the last decision covered
        (:attr:`covered`); with ``gate`` (``decide_when``), other than the one the last
        stream ended with, and only a change that makes a decision due ends the wait (the others
        become the state the next change is compared with: :meth:`woken`).

        :param gate: the trigger's ``decide_when`` gate (``None``: every change is due).
        """
        stream, self.stream = self.stream, None
        if stream is not None:
            if stream.settings is not None:
                self._settings = _shared(stream.settings)
            self._since = stream.state if gate is not None else NO_CHANGE

    def changed(self, state: Any, source: StateSource) -> bool:
        """Whether ``state`` (what the source gave a dormant trigger) ends the dormant wait: a state
        other than the one the wait compares with (:meth:`let_go`) that holds something to decide
        (:meth:`StateSource.withheld`); :data:`NO_CHANGE` never does.

        :param state: the source's state.
        :param source: the source that gave it.
        """
        if state is NO_CHANGE:
            return False
        covered = self.covered if self._since is NO_CHANGE else self._since
        return state is not covered and state != covered and not source.withheld(state)

    @staticmethod
    def time_left(watch: DecisionWatch | None) -> float | None:
        """Seconds until ``watch``'s run of qualifying decisions may be due (hysteresis's
        ``min_true_for``: then a dormant wait is bounded, by the one timer it may keep), or ``None``.

        :param watch: the trigger's watch while a run of qualifying decisions is under way.
        """
        return None if watch is None else watch.wait_time(asyncio.get_running_loop().time())

    async def change(self, source: StateSource, *, kept: bool = False) -> Any:
        """The dormant wait: the source's first state that :meth:`changed` accepts.

        The triggers' ``run()`` runs these same lines inline (a coroutine of its own would be one
        more object per waiting trigger, with its frame); this method is the bounded wait's body.

        :param source: the trigger's source.
        :param kept: the wait may end while the trigger goes on (a timer bounds it): see
            :meth:`StateSource.next_change`.
        """
        state = await source.current()
        while not self.changed(state, source):
            try:
                state = await source.taken(await source.next_change(kept=kept))
            except Exception as exc:
                state = await source.failed(exc)
        return state

    async def first_state(
        self, source: StateSource, gate: DecisionGate | None = None, relevance: Relevance | None = None
    ) -> Any:
        """The state a trigger's first stream opens with: the source's state now, unless it holds
        nothing to decide (:meth:`StateSource.withheld`: a file that does not exist yet or is
        empty). Then the trigger waits as a dormant one does, with no stream, for the first state
        that holds something and, with ``gate``, makes a decision due (matched against the state it
        started with): nothing is decided or billed meanwhile.

        :param source: the trigger's source.
        :param gate: the trigger's ``decide_when`` gate (``None``: every change is due).
        :param relevance: what ``gate`` matches a change with.
        """
        state = await source.current()
        if not source.withheld(state):
            return state
        self._since = state  # what the first content is a change from
        while True:
            self.dormant = True
            try:
                state = await self.change(source)
            finally:
                self.dormant = False
            state, _ = await self.woken(state, gate=gate, relevance=relevance)
            if state is not NO_CHANGE:
                return state

    async def change_within(self, seconds: float, source: StateSource) -> Any:
        """:meth:`change`, for at most ``seconds`` (:data:`NO_CHANGE` once they passed).

        :param seconds: the :meth:`time_left` of the trigger's watch.
        :param source: the trigger's source.
        """
        timeout = asyncio.timeout(seconds)
        try:
            async with timeout:
                return await self.change(source, kept=True)
        except TimeoutError:
            if not timeout.expired():
                raise  # the source's own
            return NO_CHANGE

    async def woken(
        self,
        state: Any,
        watch: DecisionWatch | None = None,
        *,
        gate: DecisionGate | None = None,
        relevance: Relevance | None = None,
        min_interval: float = 0.0,
    ) -> tuple[Any, Any]:
        """What the end of one dormant wait means (the source changed, or only time passed).

        :param state: the changed state, or :data:`NO_CHANGE` when :meth:`change_within` ran out of time.
        :param watch: the trigger's watch, when a run of qualifying decisions waits on time.
        :param gate: the trigger's ``decide_when`` gate, kept across streams.
        :param relevance: what ``gate`` matches a change with.
        :param min_interval: seconds that must pass between the last decision and the next stream's
            (the trigger's ``min_interval_ms``): a change sooner waits out the rest, and says so.
        :return: ``(state, None)``: open the next stream about ``state``; ``(NO_CHANGE, verdict)``:
            ``watch``'s verdict, due now; ``(NO_CHANGE, None)``: wait again.
        """
        loop = asyncio.get_running_loop()
        if state is NO_CHANGE:  # only time was missing: maybe enough of it passed
            return NO_CHANGE, None if watch is None else watch.due(loop.time())
        if min_interval > 0:
            # the last stream's lease stamped its last decision; a change sooner waits out the rest
            wait = min_interval - (loop.time() - self.decided_at)
            if wait > 0:
                log.info("the source changed: deciding the new state in %.1f s (min_interval_ms)", wait)
                await asyncio.sleep(wait)
        if gate is not None:
            await gate_change(gate, relevance, self._since, state)
            if not gate.pending:  # no decision is due: no stream for this change either
                self._since = state
                return NO_CHANGE, None
        self._since = NO_CHANGE  # the next stream sets it again: no old state is kept meanwhile
        log.info("the source changed: opening a new stream to decide the new state")
        return state, None

    @contextlib.asynccontextmanager
    async def held(
        self, state: Any, *, follow: StateSource | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        """Open and enter the stream about ``state``, and leave it open on exit: :meth:`aclose`
        (the trigger's ``cleanup()``) closes it, so an event goes out before the close handshake.

        :param follow: the trigger's source, whose changes become the stream's desired state while
            it waits to open (see :meth:`enter`).
        """
        yield await self._let_in_and_enter(state, follow, kwargs)

    @contextlib.asynccontextmanager
    async def opened(
        self, state: Any, *, follow: StateSource | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        """Like :meth:`held`, but the stream is closed on exit."""
        stream = await self._let_in_and_enter(state, follow, kwargs)
        try:
            yield stream
        finally:
            await stream.aclose()

    async def _let_in_and_enter(self, state: Any, follow: StateSource | None, kwargs: dict[str, Any]) -> Any:
        """Wait to be let in (:class:`~airflow_provider_systemzero.triggers.opening.Opening`), then
        build and :meth:`enter` the stream about ``state``."""
        openings = OPENINGS.setdefault(asyncio.get_running_loop(), {})
        opening = openings.get(self.systemzero_conn_id)
        if opening is None:
            opening = openings[self.systemzero_conn_id] = Opening()
        await opening.let_in()
        try:
            if follow is not None:
                await self.resolve_settings()
            return await self.enter(self.open(state, **kwargs), follow)
        finally:
            opening.leave()

    def forget_settings(self) -> None:
        """Look the connection up again for the next stream (an asset watch trying again after a
        failure: a connection fixed meanwhile is used without a restart). What the trigger knew of
        the gateway goes too: the connection may now name another, never reached."""
        self._settings = None
        self.reached = False

    async def resolve_settings(self) -> None:
        """Look the connection up before the stream is built, so its session exists while it opens
        (a change can then be made its desired state before the first connection); an asset watch
        also does it when it starts, so a connection that does not exist is found then, not when
        the source first has something to decide.

        :raises SystemZeroValidationError: the connection does not exist, or is not a System Zero one.
        """
        if self._settings is None:
            from airflow_provider_systemzero.hooks.systemzero import SystemZeroHook

            self._settings = _shared(
                await SystemZeroHook(systemzero_conn_id=self.systemzero_conn_id).aget_settings()
            )

    async def enter(self, stream: Any, follow: StateSource | None) -> Any:
        """Enter ``stream``; while it waits to open (for a slot of ``max_streams_per_process``, the
        connection, ``start``'s acknowledgement), each change of ``follow`` becomes its desired state.

        A trigger wakes on a change, but the slot may come many seconds later: its first connection
        then starts with the source's newest state, and on_change never starts a decision about
        the state it woke on once that is superseded. Only a stream without a decision filter
        follows (with ``decide_when`` every change goes through the trigger's gate, fed once open).
        The source's reading goes on into the stream's feeder (:meth:`take_reading`): one task reads
        the whole way, so a push source is not restarted and no change falls between two readers.

        :param stream: the stream, built and not entered.
        :param follow: the trigger's source (``None``: enter only).
        """
        if follow is None:
            result = await stream.__aenter__()
            self.reached = True
            return result
        # one task reads the source from here on; it first runs once entering awaits something,
        # so the stream counts as entered before the reading hands it a change
        reading = SourceReading(follow.changes())
        reading.follow(stream)
        opened = False
        try:
            result = await stream.__aenter__()
            opened = self.reached = True
            return result
        finally:
            if opened and reading.usable:
                self._reading = reading  # the feeder takes it over, with no await in between
            else:
                await reading.aclose()

    def take_reading(self) -> SourceReading | None:
        """The source's read :meth:`enter` began, for the stream's feeder (once; ``None``: none)."""
        reading, self._reading = self._reading, None
        return reading

    def late(self, extra: dict[str, Any], message: str) -> dict[str, Any] | None:
        """The ``timeout`` payload when the deadline passed before the trigger started, else ``None``.

        :param extra: fields every event of the trigger carries.
        :param message: what the event says.
        """
        if self.deadline is None or self.deadline - time.time() > 0:
            return None
        return timeout_payload(message, **extra)

    def deadline_scope(self) -> asyncio.Timeout | None:
        """The scope of the trigger's work: a timeout at the deadline (one timer, which ends the
        wait), or ``None`` without a deadline (no scope, no timer)."""
        return None if self.deadline is None else asyncio.timeout(self.deadline - time.time())

    def timed_out(
        self,
        extra: dict[str, Any],
        message: str,
        source: StateSource | None = None,
        last_decision: str | None = None,
        *,
        more_time: str = "give the task more time",
    ) -> dict[str, Any]:
        """The ``timeout`` payload of a deadline reached, with what the wait may have been stuck
        on: the source's condition (a file that never appeared), why the last decision did not
        meet the condition, a decision the gateway was still making, and the stream's last error.

        :param extra: fields every event of the trigger carries.
        :param message: what the event says.
        :param source: the trigger's source, if it has one.
        :param last_decision: why the newest decision did not end the wait, if there was one.
        :param more_time: the fix when the gateway was still deciding (which argument to raise).
        """
        causes = [source.waiting_on() if source is not None else None, last_decision]
        deciding = getattr(self.stream, "deciding_for", None)
        if deciding is not None:
            causes.append(
                f"the gateway was still deciding (for {deciding:.1f} s): {more_time}, or find out "
                "why its decisions take this long"
            )
        last = getattr(self.stream, "last_error_text", None)  # why the wait had no decision
        causes.append(f"last error: {last}" if last else None)
        return timeout_payload("; ".join([message, *(cause for cause in causes if cause)]), **extra)

    @staticmethod
    def failure(trigger: Any, exc: Exception, extra: dict[str, Any]) -> dict[str, Any]:
        """The ``error`` payload of a failure that ends ``trigger`` (:func:`error_payload`).

        :param trigger: the trigger (its class names it in the log).
        :param exc: the failure.
        :param extra: fields every event of the trigger carries.
        """
        # the event carries the message and the task raises it: said once, by the task
        log.info("%s ends with an error event (%s)", type(trigger).__name__, type(exc).__name__)
        return error_payload(exc, **extra)

    async def within_deadline(
        self,
        trigger: Any,
        work: Coroutine[Any, Any, dict[str, Any]],
        extra: dict[str, Any],
        *,
        late: str,
        timed_out: str,
        more_time: str = "give the task more time",
    ) -> dict[str, Any]:
        """Run ``work`` until the deadline and turn every outcome into one small event payload.

        A failure becomes an ``error`` event naming its cause (:func:`error_payload`), the deadline a
        ``timeout`` event; ``CancelledError`` propagates. The stream is not closed here: the caller
        yields the event, then runs ``trigger.cleanup()``, so the close handshake never delays the
        event nor runs inside the deadline. (The decision triggers do all this in their ``run()``
        itself, with :meth:`late` and the methods after it: no coroutine of this class stays
        between a dormant trigger and its source.)

        :param trigger: the trigger ``work`` belongs to (named in the log).
        :param work: the trigger's work, a coroutine.
        :param extra: fields every event of the trigger carries.
        :param late: the message when the deadline passed before the trigger started.
        :param timed_out: the message when the deadline passes.
        :param more_time: the fix when the gateway was still deciding (see :meth:`timed_out`).
        """
        try:
            payload = self.late(extra, late)
            if payload is not None:
                work.close()  # never started: no "never awaited" warning
                return payload
            deadline = self.deadline_scope()
            if deadline is None:
                return await work
            async with deadline:
                return await work
        except TimeoutError:
            return self.timed_out(extra, timed_out, more_time=more_time)
        except Exception as exc:
            return self.failure(trigger, exc, extra)

    async def aclose(self) -> None:
        """Close the stream (errors are ignored: this runs on every exit)."""
        stream, self.stream = self.stream, None
        reading = self.take_reading()
        if reading is not None:
            await reading.aclose()
        if stream is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(stream.aclose(), timeout=5)
