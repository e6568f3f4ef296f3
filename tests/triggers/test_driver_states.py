"""The code a trigger runs — the real :class:`~airflow_provider_systemzero.triggers.driver.WatchDriver`
and :class:`~airflow_provider_systemzero.decisions.source_watch.SourceWatch` — as a hypothesis state
machine, against a scripted source, gateway and threads on a clock the test moves
(:mod:`tests.helpers.scripted`).

It runs the driver as the asset watcher's trigger does (``once=False``: fire, go on; a failure is
said, waited out with the trigger's own :func:`~airflow_provider_systemzero.triggers.watching.wait_to_watch_again`,
and the driver reset), or as the sensor's (``once=True``: the first verdict or failure ends it);
and drives, in every order: source changes, rotations and slow reads; streams that open, fail to
open, reconnect (what was dispatched before arrives late), fail, and close slowly; decisions
that succeed, fail, time out, or come back superseded; ``decide_when`` callables that answer,
raise or hang; other triggers queueing for the process's slots; time; and a cancellation wherever
the run is waiting. After every step it checks:

* **currency** — every decision the rules judge is about the state the source held at its last
  read, or about the stream's state while a newer read waits behind the decision in flight, for
  less than ``max_staleness`` (the documented hold); and it is judged as about the state it is
  really about;
* **one event per transition** — every false → true transition of the judged decisions gives
  exactly one event (at most one owed while the run is failing or waiting to try again);
* **leasing** — no stream that owes nothing keeps its slot while another trigger waits for one;
* **no spin** — once nothing happens, the driver does nothing (its watch is not asked again);

and at the end, once the source and the world go quiet: the newest state (with ``decide_when``, a
relevant one) gets a current decision, within the retry delay after a failure (plus the gate's
and ``min_interval``'s own waits); and after the trigger's ``aclose()`` nothing of the run is
left — no task, no timer, no slot, no place among the streams being built, no offer, no stream
open, no wait on the source.

``make test`` runs a modest number of examples; ``HYPOTHESIS_PROFILE=thorough`` runs thousands.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from airflow_provider_systemzero.decisions.conditions import DecisionCondition
from airflow_provider_systemzero.decisions.relevance import MAX_HOLD_FACTOR, DecisionDebounce, Relevance
from airflow_provider_systemzero.decisions.source_watch import Action, SourceWatch
from airflow_provider_systemzero.decisions.watch import VerdictRules
from airflow_provider_systemzero.protocol.reply import DecisionResult
from airflow_provider_systemzero.protocol.state import same_json
from airflow_provider_systemzero.sources import threads
from airflow_provider_systemzero.stream.capacity import StreamCapacity
from airflow_provider_systemzero.triggers.driver import WatchDriver
from airflow_provider_systemzero.triggers.watching import failures_in_a_row, wait_to_watch_again
from tests.helpers import examples
from tests.helpers.places import building
from tests.helpers.scripted import (
    ClockLoop,
    ScriptedSource,
    ScriptedStream,
    ScriptedStreams,
    ScriptedThreads,
)
from tests.helpers.trigger_callables import decisive

EXAMPLES = examples(80, thorough=5000)

# Every time of the machine (steps, latencies, debounce_ms, lease_after, max_staleness, timeouts)
# is a binary fraction, so the clock's sums are exact: a real clock passes a timer's time within
# the loop iteration that runs it, while this one stays where the machine put it, and a timer a
# rounding error after it would fire again and again (asyncio runs a timer up to its clock's
# resolution early).

#: Lines a source may gain: the decisive ones match the decide_when callable (and the rules).
LINES = ("working\n", "heartbeat\n", "READY\n", "FAILED\n")
GATE = {"callable": "tests.helpers.trigger_callables.decisive"}
#: Loop iterations the machine lets run before it looks whether the driver is still busy.
TURNS = 12
#: Batches of :data:`TURNS` after which a driver still asking its watch for actions spins.
SPIN = 40


class CountingWatch(SourceWatch):
    """The real watch, counting how often the driver asks it for actions (each turn of the driver does)."""

    __slots__ = ("asked",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.asked = 0

    def actions(self, now: float) -> list[Action]:
        self.asked += 1
        return super().actions(now)


@dataclass
class Judged:
    met: bool
    state: Any
    at: float


class RecordingRules:
    """The asset watch's rules (a met decision fires, once per run), telling the machine about
    every decision the watch judges current."""

    def __init__(self, machine: DriverMachine) -> None:
        self.rules = VerdictRules(DecisionCondition("ready", True, min_confidence=0.5), reviews=False)
        self.machine = machine

    def observe(
        self, decision: DecisionResult, state_key: str, state: Any, now: float, *, generation: int
    ) -> Any:
        self.machine.judging(decision, state, now)
        return self.rules.observe(decision, state_key, state, now, generation=generation)

    def due(self, now: float) -> Any:
        return self.rules.due(now)

    def wait_time(self, now: float) -> float | None:
        return self.rules.wait_time(now)


def transitions(judged: list[Judged]) -> int:
    """How many times the judged decisions went from "not met" (or nothing yet) to "met"."""
    return sum(1 for i, j in enumerate(judged) if j.met and (i == 0 or not judged[i - 1].met))


async def _building(capacity: StreamCapacity) -> None:
    """Another trigger building its stream: it holds a place among the streams being built."""
    async with building(capacity):
        await asyncio.get_running_loop().create_future()  # until cancelled


class DriverMachine(RuleBasedStateMachine):
    """One trigger's run of the real driver, its world scripted, on a clock the machine moves."""

    def __init__(self) -> None:
        super().__init__()
        # thousands of runs, each failing and trying again: their log lines (with tracebacks, and
        # so every object of the run) would pile up in the test's captured log
        self._logging_disabled = logging.root.manager.disable
        logging.disable(logging.CRITICAL)
        self.loop = ClockLoop()
        self.threads = ScriptedThreads()
        self._real_threads, threads.THREADS = threads.THREADS, self.threads  # type: ignore[assignment]
        self.started = False
        self.ended = False  # the run was cancelled and cleaned up
        self.violations: list[str] = []
        #: reply id -> the state the decision is really about
        self.about: dict[str, Any] = {}
        self.judged: list[Judged] = []
        self.events: list[Any] = []
        #: the run: watching, resetting (after a failure), sleeping (before it tries again), done
        self.consumer_state = "watching"
        self.failures = 0
        self.ended_by_error = False
        #: when the run last tried again after a failure
        self.resumed_at = -1.0
        #: when the newest read started waiting unsent while a decision was in flight
        self.unsent_since: float | None = None
        self.handover: asyncio.Future[None] | None = None
        self.others_waiting: list[asyncio.Task[None]] = []
        self.others_holding = 0
        self.first_read: Any = None
        self.may_cancel = False

    # ------------------------------------------------------------------ the run

    @initialize(
        mode=st.sampled_from(["on_change", "on_request", "gate", "no_initial", "debounce"]),
        lease=st.booleans(),
        lease_after=st.sampled_from([0.0, 0.5, 5.0]),
        max_staleness=st.sampled_from([0.0, 3.0, 30.0]),
        min_interval=st.sampled_from([0.0, 0.0, 1.0]),
        once=st.sampled_from([False, False, True]),
        slots=st.sampled_from([1, 2]),
        manual_open=st.booleans(),
        slow_close=st.booleans(),
        slow_handover=st.booleans(),
        may_cancel=st.sampled_from([False, False, True]),
        initial=st.sampled_from(["working\n", "READY\n", ""]),
    )
    def start(
        self,
        mode: str,
        lease: bool,
        lease_after: float,
        max_staleness: float,
        min_interval: float,
        once: bool,
        slots: int,
        manual_open: bool,
        slow_close: bool,
        initial: str,
        slow_handover: bool = False,
        may_cancel: bool = False,
    ) -> None:
        now = self.loop.time()
        gate = relevance = None
        if mode in ("gate", "no_initial"):
            gate = DecisionDebounce(debounce_ms=None, decide_initial=mode == "gate", now=now)
            relevance = Relevance(GATE)
        elif mode == "debounce":
            gate = DecisionDebounce(debounce_ms=750, decide_initial=True, now=now)
        self.mode, self.once, self.min_interval, self.slow_handover = mode, once, min_interval, slow_handover
        self.may_cancel = may_cancel
        self.debounce = 0.75 if mode == "debounce" else 0.0
        self.capacity = StreamCapacity(slots)
        self.source_ = ScriptedSource(initial)
        self.first_read = initial
        self.streams = ScriptedStreams(self.capacity, manual_open=manual_open, slow_close=slow_close)
        self.rules = RecordingRules(self)
        self.watch = CountingWatch(
            self.rules,  # type: ignore[arg-type]
            decision_mode="on_change" if mode == "on_change" else "on_request",
            debounce=gate,
            relevance=relevance,
            lease=lease,
            lease_after=lease_after,
            max_staleness=max_staleness,
            min_interval=min_interval,
            once=once,
        )
        self.driver = WatchDriver(self.watch, self.source_, self.streams, relevance=relevance)  # type: ignore[arg-type]
        self.consumer = self.loop.create_task(self._consume())
        self.started = True
        self._settle()

    async def _consume(self) -> None:
        """What the event trigger's ``run()`` does with its driver (``once``: the sensor's trigger)."""
        loop = asyncio.get_running_loop()
        failures = 0
        while True:
            started = loop.time()
            try:
                while True:
                    self.consumer_state = "watching"
                    verdict = await self.driver.next_verdict()
                    self.events.append(verdict)
                    failures = 0
                    if self.once:
                        self.consumer_state = "done"
                        return
                    if self.slow_handover:  # the triggerer takes the event when it gets to it
                        self.consumer_state = "handing over"
                        self.handover = loop.create_future()
                        await self.handover
            except Exception as exc:
                self.failures += 1
                if self.once:  # the sensor's trigger ends with an error event
                    self.consumer_state, self.ended_by_error = "done", True
                    return
                failures = failures_in_a_row(failures, loop.time() - started)
                self.consumer_state = "resetting"
                await self.driver.reset()
                self.consumer_state = "sleeping"
                await wait_to_watch_again("model", failures, exc)
                self.resumed_at = loop.time()

    # ------------------------------------------------------------------ what the machine sees

    def judging(self, decision: DecisionResult, state: Any, now: float) -> None:
        """The watch judges ``decision`` current, as about ``state``: currency, checked at once."""
        truth = self.about.get(decision.reply_id, "<a decision the gateway never made>")
        if not same_json(truth, state):
            self.violations.append(f"a decision about {truth!r} was judged as about {state!r}")
        latest = self.source_.last_read
        if not same_json(truth, latest):
            # the one exception: the stream's state, while the newest read waits unsent behind
            # the decision (a window that opened in this step, or less than max_staleness ago)
            stream = self.streams.stream
            since = now if self.unsent_since is None else self.unsent_since
            held = (
                self.watch.max_staleness > 0
                and latest != ""
                and stream is not None
                and same_json(truth, stream.state)
                and now - since < self.watch.max_staleness
            )
            if not held:
                self.violations.append(
                    f"a decision about {truth!r} was judged current at {now} while the source's last "
                    f"read was {latest!r} (and no hold applies; unsent since {self.unsent_since})"
                )
        self.judged.append(Judged(decision.answers["ready"].decision is True, truth, now))

    def _in_flight(self, stream: ScriptedStream) -> bool:
        return bool(stream.owed if stream.decision_mode == "on_change" else stream.requests)

    def _track_unsent(self) -> None:
        """The hold's window: it opens when the newest read is left unsent while a decision about
        the stream's state is in flight, and closes when the stream holds the newest read again
        (or nothing is in flight, or the stream goes)."""
        stream, read = self.streams.stream, self.source_.last_read
        if (
            stream is None
            or not stream.opened
            or read == ""
            or same_json(read, stream.state)
            or not self._in_flight(stream)
        ):
            self.unsent_since = None
        elif self.unsent_since is None:
            self.unsent_since = self.loop.time()

    def _settle(self) -> None:
        """Let the run go until it waits on something only the machine (or time) can give; fail
        on a driver that keeps asking its watch for actions meanwhile (a spin)."""
        for _ in range(SPIN):
            before = self.watch.asked
            self.loop.turns(TURNS)
            if self.watch.asked == before:
                break
        else:
            raise AssertionError("the driver kept turning with nothing new (a spin)")
        self._track_unsent()
        self._check()

    def _check(self) -> None:
        assert not self.violations, self.violations
        consumer = self.consumer
        if consumer.done() and not consumer.cancelled() and consumer.exception() is not None:
            raise consumer.exception()  # type: ignore[misc]
        expected = transitions(self.judged)
        if self.once:
            expected = min(1, expected)
        owed = expected - len(self.events)
        if self.consumer_state in ("resetting", "sleeping") or self.ended_by_error:
            assert owed in (0, 1), f"{owed} events owed for {expected} transitions"
        else:
            assert owed == 0, f"{len(self.events)} events for {expected} transitions of the judged decisions"
        for event in self.events:
            assert event.decision.reply_id in self.about
        stream = self.streams.stream
        if (
            self.watch.lease
            and self.capacity.waiting > 0
            and stream is not None
            and stream.holds_slot
            and not stream.closing
            and self.consumer_state == "watching"
        ):
            assert not self.watch.owes_nothing(self.loop.time()), (
                "a stream that owes nothing keeps its slot while another trigger waits"
            )

    def _running(self) -> bool:
        return self.started and not self.ended and self.consumer_state != "done"

    def _stream(self) -> ScriptedStream | None:
        stream = self.streams.stream
        return stream if stream is not None and stream.opened and stream.failure is None else None

    # ------------------------------------------------------------------ the world, one actor a rule

    @precondition(lambda self: self._running())
    @rule(
        change=st.sampled_from([*LINES, *LINES, "rotate", "rewrite"]),
        slow=st.sampled_from([False, False, True]),
    )
    def source(self, change: str, slow: bool) -> None:
        """The source gains a line, is rotated away (no content), or rewritten; ``slow``: the read
        that sees it waits until :meth:`read_returns`."""
        self.source_.hold_reads = slow
        if change in LINES:
            self.source_.set(self.source_.state + change)
        else:
            self.source_.set("" if change == "rotate" else "rerun\n")
        self._settle()
        self.source_.hold_reads = False

    @precondition(lambda self: self.started and not self.ended and bool(self.source_.held))
    @rule()
    def read_returns(self) -> None:
        self.source_.finish_read()
        self._settle()

    def _gateway_can(self) -> list[str]:
        """What the gateway can do now."""
        can = []
        if self.streams.entering is not None:
            can += ["opens", "opens", "refuses to open"]
        if self.streams.closing():
            can.append("ends a close")
        stream = self._stream()
        if stream is not None and self._in_flight(stream):
            can += ["decides met", "decides met", "decides unmet", "decides unmet", "fails a decision"]
            if stream.decision_mode == "on_request":
                can.append("lets a decide time out")
        if stream is not None:
            can += ["reconnects", "fails the stream"]
        return can

    @precondition(lambda self: self._running() and bool(self._gateway_can()))
    @rule(data=st.data(), latency=st.sampled_from([0.0, 0.0, 0.5, 2.0]))
    def gateway(self, data: st.DataObject, latency: float) -> None:
        """The gateway opens a stream (or refuses to), ends a close handshake, answers the oldest
        decision in flight (after ``latency``: met, not met, failed, or — on_request — its deadline
        passed), reconnects a stream (what was dispatched on the old connection may still arrive,
        late), or fails it for good."""
        self.gateway_does(data.draw(st.sampled_from(self._gateway_can()), label="what"), latency)

    def gateway_does(self, what: str, latency: float = 0.0) -> None:
        """What :meth:`gateway` does, named (one of :meth:`_gateway_can`)."""
        assert what in self._gateway_can(), f"the gateway cannot {what} now"
        if what.startswith("decides") or what == "lets a decide time out":
            self._advance(10.0 if what == "lets a decide time out" else latency)
            if what not in self._gateway_can():
                return  # time moved the run on (a failure, a stream given back)
        stream = self._stream()
        if what == "opens":
            self.streams.finish_open()
        elif what == "refuses to open":
            self.streams.fail_open()
        elif what == "ends a close":
            self.streams.finish_close()
        elif what.startswith("decides"):
            assert stream is not None
            answer = stream.answer_dispatch if stream.decision_mode == "on_change" else stream.answer_request
            decision, about = answer(what == "decides met")
            self.about[decision.reply_id] = about
        elif what == "fails a decision":
            assert stream is not None
            if stream.decision_mode == "on_change":
                stream.fail_dispatch()
            else:
                stream.fail_request(timed_out=False)
        elif what == "lets a decide time out":
            assert stream is not None
            stream.fail_request(timed_out=True)
        elif what == "reconnects":
            assert stream is not None
            stream.reconnect()
        else:
            assert stream is not None
            stream.fail()
        self._settle()

    def _calls(self, *, hung: bool) -> list[Any]:
        return [call for call in self.threads.pending() if call.hung is hung]

    @precondition(lambda self: self.started and not self.ended and bool(self.threads.pending()))
    @rule(outcome=st.sampled_from(["answers", "answers", "raises", "hangs", "returns after hanging"]))
    def gate_callable(self, outcome: str) -> None:
        """The ``decide_when`` callable answers the call under way, raises, or hangs (the driver's
        timeout ends the wait for it, once time gets there); or a call that hung returns."""
        hung = self._calls(hung=True)
        if outcome == "returns after hanging" and hung:
            self.threads.answer(hung[0])
        elif calls := self._calls(hung=False):
            if outcome == "raises":
                self.threads.fail(calls[0])
            elif outcome == "hangs":
                calls[0].hung = True
            else:
                self.threads.answer(calls[0])
        self._settle()

    def _others(self) -> int:
        """Other triggers waiting for a slot, building a stream, or holding a slot."""
        return self.others_holding + sum(not task.done() for task in self.others_waiting)

    def _others_can(self) -> list[str]:
        can = ["waits", "waits", "builds"] if self._others() < 1 else []
        return can + (["gives its slot back"] if self.others_holding else [])

    @precondition(lambda self: self._running() and bool(self._others_can()))
    @rule(data=st.data())
    def another_trigger(self, data: st.DataObject) -> None:
        """Another trigger of the process (one at a time) queues for a slot, builds a stream
        (a place among the streams being built, held until the end), or gives a slot it got back."""
        kind = data.draw(st.sampled_from(self._others_can()), label="kind")
        if kind == "gives its slot back":
            self.others_holding -= 1
            self.capacity.release()
        elif kind == "waits":
            task = self.loop.create_task(self.capacity.acquire())
            task.add_done_callback(self._other_got_a_slot)
            self.others_waiting.append(task)
        else:
            self.others_waiting.append(self.loop.create_task(_building(self.capacity)))
        self._settle()

    def _other_got_a_slot(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is None:
            self.others_holding += 1

    def _advance(self, seconds: float) -> None:
        self.loop.advance(seconds)
        self._settle()

    @precondition(lambda self: self._running())
    @rule(
        how=st.sampled_from([0.125, 0.5, 2.0, 6.0, "to the next timer", "to the next timer"]),
        then=st.sampled_from([None, None, "met", "unmet"]),
    )
    def time_passes(self, how: float | str, then: str | None) -> None:
        """Time passes (``how`` long, or to the next timer set); ``then`` the decisions in flight,
        if any, come back, oldest first, met or not."""
        if how == "to the next timer":
            at = self.loop.next_timer()
            how = 0.0 if at is None else at - self.loop.time()
        assert isinstance(how, float)
        self._advance(how)
        while then is not None and (stream := self._stream()) is not None and self._in_flight(stream):
            answer = stream.answer_dispatch if stream.decision_mode == "on_change" else stream.answer_request
            decision, about = answer(then == "met")
            self.about[decision.reply_id] = about
            self._settle()

    @precondition(
        lambda self: (
            self.started and not self.ended and (self.consumer_state == "handing over" or self.may_cancel)
        )
    )
    @rule(
        what=st.sampled_from(["takes the event", "takes the event", "cancels"]),
        during=st.sampled_from(["a wait", "a change", "a decision"]),
        turns=st.integers(0, 6),
    )
    def triggerer(self, what: str, during: str, turns: int) -> None:
        """The triggerer takes the event the trigger yielded (it goes on with what the watch asked
        for after it), or cancels the trigger wherever it is — parked on a wait, or ``turns`` loop
        turns into handling a change or a decision; the cancelled trigger's cleanup leaves nothing."""
        if what == "takes the event" or not self.may_cancel:
            if self.consumer_state == "handing over" and self.handover is not None:
                self.handover.set_result(None)
            self._settle()
            return
        stream = self._stream()
        if during == "a change":
            self.source_.set(self.source_.state + "working\n")
        elif during == "a decision" and stream is not None and self._in_flight(stream):
            answer = stream.answer_request if stream.requests else stream.answer_dispatch
            decision, about = answer(True)
            self.about[decision.reply_id] = about
        self.loop.turns(turns)
        self._clean_up()

    @precondition(lambda self: self.ended or (self.started and self.consumer_state == "done"))
    @rule()
    def after_the_end(self) -> None:
        """A run that ended (a sensor's verdict or error) does nothing more; one cleaned up stays
        so: nothing of it wakes up again."""
        asked = self.watch.asked
        self.loop.turns(TURNS)
        assert self.watch.asked == asked, "the driver ran after the run ended"
        if self.ended:
            assert not asyncio.all_tasks(self.loop) and self.loop.live_timers() == []

    def _others_go(self) -> None:
        for task in self.others_waiting:
            task.cancel()
        self.loop.turns(TURNS)
        while self.others_holding:
            self.others_holding -= 1
            self.capacity.release()

    def _clean_up(self) -> None:
        self.ended = True
        self._others_go()
        self.consumer.cancel()
        closing = self.loop.create_task(self.driver.aclose())
        for _ in range(50):
            self.loop.turns(TURNS)
            if closing.done():
                break
            if self.streams.closing():
                self.streams.finish_close()
        assert closing.done(), "the driver's aclose() did not end"
        closing.result()
        self.loop.turns(TURNS)
        left = asyncio.all_tasks(self.loop)
        assert not left, left
        assert all(stream.closed and not stream.holds_slot for stream in self.streams.built)
        capacity = self.capacity
        assert (capacity.in_use, capacity.waiting, capacity.building, capacity.waiting_to_build) == (
            0,
            0,
            0,
            0,
        )
        assert capacity.offered == 0, "an offer of a slot outlived the run"
        assert all(waiter.done() for waiter in self.source_.waiters)
        assert self.loop.live_timers() == [], self.loop.live_timers()
        assert not self.violations, self.violations

    def _drain(self) -> None:
        """The world goes quiet: other triggers go, every read, open, close, check and decision
        completes (decisions do not meet the condition), and time moves only to the next timer."""
        self._others_go()
        self.source_.hold_reads = False
        for _ in range(400):
            self._settle()
            stream = self._stream()
            if self.consumer_state == "done":
                return
            if self.consumer_state == "handing over" and self.handover is not None:
                self.handover.set_result(None)
            elif self.source_.held:
                self.source_.finish_read()
            elif self.streams.entering is not None:
                self.streams.finish_open()
            elif self.streams.closing():
                self.streams.finish_close()
            elif self.threads.pending():
                self.threads.answer(self.threads.pending()[0])
            elif stream is not None and stream.requests:
                decision, about = stream.answer_request(False)
                self.about[decision.reply_id] = about
            elif stream is not None and stream.decision_mode == "on_change" and stream.owed:
                decision, about = stream.answer_dispatch(False)
                self.about[decision.reply_id] = about
            elif (at := self.loop.next_timer()) is not None:
                self.loop.advance(at - self.loop.time())
            else:
                return
        raise AssertionError("the run kept working after the world went quiet (400 steps)")

    def teardown(self) -> None:
        try:
            if self.started and not self.ended:
                quiet_from = self.loop.time()
                self._drain()
                self._check()
                if self.consumer_state != "done":
                    self._newest_state_decided(quiet_from)
                self._clean_up()
        finally:
            self.put_back()

    def put_back(self) -> None:
        """Give the process back what the machine took for its run: the provider's threads, its
        logging, and the loop (safe to call twice)."""
        threads.THREADS = self._real_threads  # type: ignore[assignment]
        logging.disable(self._logging_disabled)
        if not self.loop.is_closed():
            self.loop.close()

    def _newest_state_decided(self, quiet_from: float) -> None:
        """Liveness: the newest state (with ``decide_when``, a relevant one) has a current
        decision, judged as soon as the world went quiet or — when the run was failing — it tried
        again after the retry delay, give or take the gate's and ``min_interval``'s own waits."""
        newest = self.source_.state
        if newest == "":
            return  # a file without content: nothing to decide
        if self.mode in ("gate", "no_initial") and not decisive(None, newest):
            return  # a change decide_when passes over starts no decision
        if self.mode == "no_initial" and same_json(newest, self.first_read):
            return  # the initial state is not decided
        assert self.judged and same_json(self.judged[-1].state, newest), (
            f"the newest state {newest!r} never got a current decision (the last judged was about "
            f"{self.judged[-1].state if self.judged else None!r})"
        )
        since = max(quiet_from, self.resumed_at)
        bound = since + self.min_interval + MAX_HOLD_FACTOR * self.debounce + 1e-6
        assert self.judged[-1].at <= bound, (
            f"the newest state was decided at {self.judged[-1].at}, later than {bound} (quiet from "
            f"{quiet_from}, tried again after its last failure at {self.resumed_at})"
        )


TestDriver = DriverMachine.TestCase
TestDriver.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@contextlib.contextmanager
def _machine(**given: Any) -> Iterator[DriverMachine]:
    """A machine started with the arguments of the path spelled out (the rest: a plain run); the
    process gets back what it took even when a step fails before the machine's teardown."""
    machine = DriverMachine()
    arguments: dict[str, Any] = {
        "mode": "on_request",
        "lease": False,
        "lease_after": 0.0,
        "max_staleness": 0.0,
        "min_interval": 0.0,
        "once": False,
        "slots": 1,
        "manual_open": False,
        "slow_close": False,
        "initial": "working\n",
    }
    try:
        machine.start(**(arguments | given))
        yield machine
    finally:
        machine.put_back()


def test_a_gate_call_that_hung_answers_only_the_change_it_was_asked_about() -> None:
    """One path of the machine, spelled out: a ``decide_when`` call hangs on an irrelevant change;
    the ready line comes while it hangs; the call times out and the watch tries again. When the
    hung call returns, its answer (about the irrelevant change) is not taken for the ready line's:
    that change is checked with its own arguments, and decided."""
    with _machine(mode="gate") as machine:
        machine.gateway_does("decides unmet")  # the initial state: not ready
        machine.source("working\n", slow=False)  # irrelevant: its check hangs
        machine.gate_callable("hangs")
        machine.source("READY\n", slow=False)  # read while the check hangs
        machine.time_passes("to the next timer", then=None)  # the check's timeout: the run fails
        machine.time_passes("to the next timer", then=None)  # it tries again: waits for the hung call
        machine.gate_callable("returns after hanging")
        machine.teardown()  # the ready line gets a current decision


def test_a_decision_kept_for_a_state_is_not_judged_for_the_next_state_the_stream_holds() -> None:
    """Another path the machine found: a decision comes back about the stream's state after the
    source left it for a file without content, and is kept in case the source comes back to that
    state. The stream is then handed a new state, whose decide fails; once the watch tries again,
    the source goes without content and back to the new state. The kept decision is about the
    old state: it must not be judged as the new state's."""
    with _machine(initial="READY\n") as machine:
        machine.source("rotate", slow=False)  # no content: not sent; the decide in flight goes on
        machine.gateway_does("decides met")  # about READY, which the source left: kept
        machine.source("rewrite", slow=False)  # sent, and decided
        machine.gateway_does("fails a decision")  # the run fails, and waits to try again
        machine.source("rotate", slow=False)
        machine.time_passes("to the next timer", then=None)  # it tries again, and reads no content
        machine.source("rewrite", slow=False)  # back to the state the stream was handed
        machine.teardown()


def test_with_decide_initial_false_the_first_content_of_a_source_that_had_none_is_a_change() -> None:
    """A third path the machine found: the source starts without content (a file not written
    yet), and its first content matches ``decide_when``: it is a change like any other (as the
    docs say), and is decided."""
    with _machine(mode="no_initial", lease=True, initial="") as machine:
        machine.source("READY\n", slow=False)
        machine.teardown()  # the first content gets a current decision
