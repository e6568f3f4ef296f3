"""The code a trigger runs — the real :class:`~airflow_provider_systemzero.triggers.driver.WatchDriver`
and :class:`~airflow_provider_systemzero.decisions.source_watch.SourceWatch` — as a hypothesis state
machine, against a scripted source, gateway and threads on a clock the test moves
(:mod:`tests.triggers.scripted`).

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
import os
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from airflow_provider_systemzero.decisions.conditions import DecisionCondition
from airflow_provider_systemzero.decisions.relevance import MAX_HOLD_FACTOR, DecisionGate, Relevance
from airflow_provider_systemzero.decisions.source_watch import Action, SourceWatch
from airflow_provider_systemzero.decisions.watch import DecisionWatch
from airflow_provider_systemzero.protocol.reply import DecisionResult
from airflow_provider_systemzero.protocol.state import same_json
from airflow_provider_systemzero.sources import threads
from airflow_provider_systemzero.stream.capacity import StreamCapacity
from airflow_provider_systemzero.triggers.driver import WatchDriver
from airflow_provider_systemzero.triggers.watching import failures_in_a_row, wait_to_watch_again
from tests.triggers.callables import decisive
from tests.triggers.scripted import (
    ClockLoop,
    ScriptedSource,
    ScriptedStream,
    ScriptedStreams,
    ScriptedThreads,
)

EXAMPLES = 5000 if os.environ.get("HYPOTHESIS_PROFILE") == "thorough" else 150

#: Lines a source may gain: the decisive ones match the decide_when callable (and the rules).
LINES = ("working\n", "heartbeat\n", "READY\n", "FAILED\n")
GATE = {"callable": "tests.triggers.callables.decisive"}
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
        self.rules = DecisionWatch(DecisionCondition("ready", True, min_confidence=0.5), reviews=False)
        self.machine = machine

    def observe(self, decision: DecisionResult, state_key: str, state: Any, now: float) -> Any:
        self.machine.judging(decision, state, now)
        return self.rules.observe(decision, state_key, state, now)

    def due(self, now: float) -> Any:
        return self.rules.due(now)

    def wait_time(self, now: float) -> float | None:
        return self.rules.wait_time(now)


def transitions(judged: list[Judged]) -> int:
    """How many times the judged decisions went from "not met" (or nothing yet) to "met"."""
    return sum(1 for i, j in enumerate(judged) if j.met and (i == 0 or not judged[i - 1].met))


async def _building(capacity: StreamCapacity) -> None:
    """Another trigger building its stream: it holds a place among the streams being built."""
    async with capacity.opening():
        await asyncio.get_running_loop().create_future()  # until cancelled


class DriverMachine(RuleBasedStateMachine):
    """One trigger's run of the real driver, its world scripted, on a clock the machine moves."""

    def __init__(self) -> None:
        super().__init__()
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
        self.others_waiting: list[asyncio.Task[None]] = []
        self.others_holding = 0
        self.first_read: Any = None

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
    ) -> None:
        now = self.loop.time()
        gate = relevance = None
        if mode in ("gate", "no_initial"):
            gate = DecisionGate(debounce_ms=None, decide_initial=mode == "gate", now=now)
            relevance = Relevance(GATE)
        elif mode == "debounce":
            gate = DecisionGate(debounce_ms=700, decide_initial=True, now=now)
        self.mode, self.once, self.min_interval = mode, once, min_interval
        self.debounce = 0.7 if mode == "debounce" else 0.0
        self.capacity = StreamCapacity(slots)
        self.source = ScriptedSource(initial)
        self.first_read = initial
        self.streams = ScriptedStreams(self.capacity, manual_open=manual_open, slow_close=slow_close)
        self.rules = RecordingRules(self)
        self.watch = CountingWatch(
            self.rules,  # type: ignore[arg-type]
            decision_mode="on_change" if mode == "on_change" else "on_request",
            gate=gate,
            relevance=relevance,
            lease=lease,
            lease_after=lease_after,
            max_staleness=max_staleness,
            min_interval=min_interval,
            once=once,
        )
        self.driver = WatchDriver(self.watch, self.source, self.streams, relevance=relevance)  # type: ignore[arg-type]
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
        latest = self.source.last_read
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
        stream, read = self.streams.stream, self.source.last_read
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

    # ------------------------------------------------------------------ the source

    @precondition(lambda self: self._running())
    @rule(line=st.sampled_from(LINES))
    def append(self, line: str) -> None:
        self.source.set(self.source.state + line)
        self._settle()

    @precondition(lambda self: self._running())
    @rule(kind=st.sampled_from(["rotate", "rewrite"]))
    def replace(self, kind: str) -> None:
        self.source.set("" if kind == "rotate" else "rerun\n")
        self._settle()

    @precondition(lambda self: self._running())
    @rule(slow=st.booleans())
    def slow_reads(self, slow: bool) -> None:
        self.source.hold_reads = slow
        self._settle()

    @precondition(lambda self: self.started and not self.ended and bool(self.source.held))
    @rule()
    def read_returns(self) -> None:
        self.source.finish_read()
        self._settle()

    # ------------------------------------------------------------------ the streams

    @precondition(lambda self: self.started and not self.ended and self.streams.entering is not None)
    @rule(fails=st.sampled_from([False, False, True]))
    def stream_opens(self, fails: bool) -> None:
        if fails:
            self.streams.fail_open()
        else:
            self.streams.finish_open()
        self._settle()

    @precondition(lambda self: self.started and not self.ended and bool(self.streams.closing()))
    @rule()
    def close_handshake_ends(self) -> None:
        self.streams.finish_close()
        self._settle()

    @precondition(
        lambda self: (
            self._running()
            and (s := self._stream()) is not None
            and s.decision_mode == "on_change"
            and bool(s.owed)
        )
    )
    @rule(met=st.booleans())
    def dispatch_decided(self, met: bool) -> None:
        stream = self._stream()
        assert stream is not None
        decision, about = stream.answer_dispatch(met)
        self.about[decision.reply_id] = about
        self._settle()

    @precondition(
        lambda self: (
            self._running()
            and (s := self._stream()) is not None
            and s.decision_mode == "on_change"
            and bool(s.owed)
        )
    )
    @rule()
    def dispatch_fails(self) -> None:
        stream = self._stream()
        assert stream is not None
        stream.fail_dispatch()
        self._settle()

    @precondition(lambda self: self._running() and (s := self._stream()) is not None and bool(s.requests))
    @rule(met=st.booleans(), latency=st.sampled_from([0.0, 0.5, 2.0]))
    def decide_answered(self, met: bool, latency: float) -> None:
        self._advance(latency)
        stream = self._stream()
        if stream is None or not stream.requests:
            return
        decision, about = stream.answer_request(met)
        self.about[decision.reply_id] = about
        self._settle()

    @precondition(lambda self: self._running() and (s := self._stream()) is not None and bool(s.requests))
    @rule(timed_out=st.booleans())
    def decide_fails(self, timed_out: bool) -> None:
        if timed_out:
            self._advance(10.0)
        stream = self._stream()
        if stream is None or not stream.requests:
            return
        stream.fail_request(timed_out=timed_out)
        self._settle()

    @precondition(lambda self: self._running() and self._stream() is not None)
    @rule()
    def reconnects(self) -> None:
        stream = self._stream()
        assert stream is not None
        stream.reconnect()
        self._settle()

    @precondition(lambda self: self._running() and self._stream() is not None)
    @rule()
    def stream_fails(self) -> None:
        stream = self._stream()
        assert stream is not None
        stream.fail()
        self._settle()

    # ------------------------------------------------------------------ decide_when callables

    def _calls(self, *, hung: bool) -> list[Any]:
        return [call for call in self.threads.pending() if call.hung is hung]

    @precondition(lambda self: self.started and not self.ended and bool(self._calls(hung=False)))
    @rule(outcome=st.sampled_from(["answers", "answers", "raises", "hangs"]))
    def gate_called(self, outcome: str) -> None:
        call = self._calls(hung=False)[0]
        if outcome == "answers":
            self.threads.answer(call)
        elif outcome == "raises":
            self.threads.fail(call)
        else:
            call.hung = True  # the driver's timeout ends the wait for it, once time gets there
        self._settle()

    @precondition(lambda self: self.started and not self.ended and bool(self._calls(hung=True)))
    @rule()
    def hung_gate_returns(self) -> None:
        self.threads.answer(self._calls(hung=True)[0])
        self._settle()

    # ------------------------------------------------------------------ other triggers

    @precondition(lambda self: self._running())
    @rule(kind=st.sampled_from(["waits", "builds"]))
    def another_trigger(self, kind: str) -> None:
        if kind == "waits":
            task = self.loop.create_task(self.capacity.acquire())
            task.add_done_callback(self._other_got_a_slot)
        else:
            task = self.loop.create_task(_building(self.capacity))
        self.others_waiting.append(task)
        self._settle()

    def _other_got_a_slot(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is None:
            self.others_holding += 1

    @precondition(lambda self: self._running() and self.others_holding > 0)
    @rule()
    def another_trigger_gives_its_slot_back(self) -> None:
        self.others_holding -= 1
        self.capacity.release()
        self._settle()

    # ------------------------------------------------------------------ time

    def _advance(self, seconds: float) -> None:
        self.loop.advance(seconds)
        self._settle()

    @precondition(lambda self: self._running())
    @rule(seconds=st.sampled_from([0.1, 0.5, 2.0, 6.0]))
    def tick(self, seconds: float) -> None:
        self._advance(seconds)

    @precondition(lambda self: self._running() and self.loop.next_timer() is not None)
    @rule()
    def wake_up(self) -> None:
        at = self.loop.next_timer()
        assert at is not None
        self._advance(at - self.loop.time())

    # ------------------------------------------------------------------ the end

    @precondition(lambda self: self.started and not self.ended)
    @rule()
    def cancelled(self) -> None:
        """The triggerer cancels the trigger wherever it waits; its cleanup leaves nothing."""
        self._clean_up()

    @precondition(lambda self: self.ended)
    @rule()
    def after_the_end(self) -> None:
        """A run cleaned up stays so: nothing of it wakes up again."""
        self.loop.turns(TURNS)
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
        assert all(waiter.done() for waiter in self.source.waiters)
        assert self.loop.live_timers() == [], self.loop.live_timers()

    def _drain(self) -> None:
        """The world goes quiet: other triggers go, every read, open, close, check and decision
        completes (decisions do not meet the condition), and time moves only to the next timer."""
        self._others_go()
        self.source.hold_reads = False
        for _ in range(400):
            self._settle()
            stream = self._stream()
            if self.consumer_state == "done":
                return
            if self.source.held:
                self.source.finish_read()
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
            threads.THREADS = self._real_threads  # type: ignore[assignment]
            self.loop.close()

    def _newest_state_decided(self, quiet_from: float) -> None:
        """Liveness: the newest state (with ``decide_when``, a relevant one) has a current
        decision, judged as soon as the world went quiet or — when the run was failing — it tried
        again after the retry delay, give or take the gate's and ``min_interval``'s own waits."""
        newest = self.source.state
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
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def test_a_gate_call_that_hung_answers_only_the_change_it_was_asked_about() -> None:
    """One path of the machine, spelled out: a ``decide_when`` call hangs on an irrelevant change;
    the ready line comes while it hangs; the call times out and the watch tries again. When the
    hung call returns, its answer (about the irrelevant change) is not taken for the ready line's:
    that change is checked with its own arguments, and decided."""
    machine = DriverMachine()
    machine.start(
        mode="gate",
        lease=False,
        lease_after=0.0,
        max_staleness=0.0,
        min_interval=0.0,
        once=False,
        slots=1,
        manual_open=False,
        slow_close=False,
        initial="working\n",
    )
    machine.decide_answered(met=False, latency=0.0)  # the initial state: not ready
    machine.append("working\n")  # irrelevant: its check hangs
    machine.gate_called("hangs")
    machine.append("READY\n")  # read while the check hangs
    machine.wake_up()  # the check's timeout: the run fails, and waits to try again
    machine.wake_up()  # it tries again: the ready line's check waits for the hung call
    machine.hung_gate_returns()
    machine.teardown()  # the ready line gets a current decision
