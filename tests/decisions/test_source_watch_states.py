"""The watch as a state machine, on a simulated clock: hypothesis drives a source, a gateway, the
process's slots and the driver's pieces of work in every order, and checks the rules the watch
owes a DAG author after every step.

* **Currency**: no verdict fires on a decision about a state the source no longer holds, beyond
  the documented ``max_staleness`` hold (a decision in flight while a newer read waits unsent, for
  less than ``max_staleness``).
* **Leasing**: no stream that owes nothing keeps its slot while another trigger waits for one.
* **Liveness**: a watch that wants a decision always has a piece of work under way or a time to
  wake up at; it never spins (what is due now is done now, and the next wake-up is later); and
  once the source stops changing, the newest state gets a current decision (or a timer, or
  nothing is due) within a bounded number of steps.

``make test`` runs a modest number of examples; ``HYPOTHESIS_PROFILE=thorough`` runs thousands.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from airflow_provider_systemzero.decisions.conditions import DecisionCondition
from airflow_provider_systemzero.decisions.relevance import DecisionDebounce, Relevance
from airflow_provider_systemzero.decisions.source_watch import (
    Check,
    Decide,
    Fire,
    Offer,
    Open,
    Phase,
    Release,
    Send,
    SourceWatch,
    Withdraw,
)
from airflow_provider_systemzero.decisions.watch import VerdictRules
from airflow_provider_systemzero.identity import state_hash
from airflow_provider_systemzero.protocol.reply import Answer, DecisionResult
from airflow_provider_systemzero.protocol.state import same_json
from tests.helpers import examples

EXAMPLES = examples(300, thorough=4000)

#: Lines a source may gain: the decisive ones match decide_when.
LINES = ("working\n", "heartbeat\n", "READY\n", "FAILED\n")
MATCH = r"READY|FAILED"


def _decision(state: Any, qualifies: bool, version: int) -> DecisionResult:
    """A decision about ``state`` answering ``ready`` as ``qualifies``."""
    answer = Answer("ready", "boolean", qualifies, 0.9, 0.9)
    return DecisionResult(
        reply={"id": f"szd_{version:032x}", "answers": {"ready": {"decision": qualifies}}},
        state_version=version,
        covered_event_ids=(),
        request_id=f"req-{version}",
        stream_id="szws_sim",
        answers={"ready": answer},
    )


@dataclass
class Gateway:
    """What the simulated gateway owes the stream: decisions about the states it was sent."""

    #: decisions in flight, oldest first: the state each is about
    pending: list[Any] = field(default_factory=list)


@dataclass
class Fired:
    state: Any
    at: float


class WatchMachine(RuleBasedStateMachine):
    """One watch, its environment and a simulated clock."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 1000.0
        self.source: Any = ""
        self.unread = False  # the source changed since the last read
        self.read_ever = False
        self.watch: SourceWatch
        self.gateway = Gateway()
        self.sent: Any = None  # what the stream holds (the simulated stream's desired state)
        self.opening = False
        self.closing = False
        self.deciding = False  # an on_request decide under way
        self.checking: Check | None = None
        self.offered = False
        self.waiter = False  # a trigger waits for a slot
        self.fired: list[Fired] = []
        #: when the newest read first waited unsent while a decision was in flight (the exception's window)
        self.unsent_since: float | None = None
        self.ended = False
        self.versions = 0

    @initialize(
        mode=st.sampled_from(["on_change", "on_request", "gate", "gate_callable", "debounce", "no_initial"]),
        consecutive=st.sampled_from([1, 1, 2]),
        min_true_for=st.sampled_from([0.0, 0.0, 2.5]),
        lease=st.booleans(),
        lease_after=st.sampled_from([0.0, 0.5, 5.0]),
        max_staleness=st.sampled_from([0.0, 3.0, 30.0]),
        min_interval=st.sampled_from([0.0, 0.0, 1.0]),
        once=st.booleans(),
        initial=st.sampled_from(["", "working\n", "READY\n"]),
    )
    def start(
        self,
        mode: str,
        consecutive: int,
        min_true_for: float,
        lease: bool,
        lease_after: float,
        max_staleness: float,
        min_interval: float,
        once: bool,
        initial: str,
    ) -> None:
        rules = VerdictRules(
            DecisionCondition("ready", True, consecutive=consecutive, min_true_for=min_true_for),
            reviews=False,
        )
        gate = relevance = None
        decision_mode = "on_request" if mode != "on_change" else "on_change"
        if mode in ("gate", "gate_callable"):
            gate = DecisionDebounce(debounce_ms=None, decide_initial=True, now=self.now)
            relevance = Relevance(MATCH if mode == "gate" else {"callable": "re.search"})
        elif mode == "debounce":
            gate = DecisionDebounce(debounce_ms=700, decide_initial=True, now=self.now)
        elif mode == "no_initial":
            gate = DecisionDebounce(debounce_ms=None, decide_initial=False, now=self.now)
            relevance = Relevance(MATCH)
        self.mode = mode
        self.watch = SourceWatch(
            rules,
            decision_mode=decision_mode,
            debounce=gate,
            relevance=relevance,
            lease=lease,
            lease_after=lease_after,
            max_staleness=max_staleness,
            min_interval=min_interval,
            once=once,
        )
        self.source = initial
        self.unread = True

    # ------------------------------------------------------------------ the driver's part

    def _withheld(self, state: Any) -> bool:
        return state == ""  # a file without content

    def _act(self) -> None:
        """Run the watch's actions at ``now`` as the driver does: an input that comes while they
        run (a slot asked for as it is offered) is fed, and the watch asked again."""
        for _ in range(20):
            actions = self.watch.actions(self.now)
            if not actions:
                break
            for action in actions:
                self._apply(action)
        else:
            pytest.fail("the watch kept asking for work at one instant (a spin)")
        self._check_invariants_after_actions()
        self._track_unsent()

    def _apply(self, action: Any) -> None:
        watch = self.watch
        if isinstance(action, Open):
            assert not self.opening and self.sent is None and not self.closing
            self.opening = True
            self.sent = watch.sent
            if watch.decision_mode == "on_change":
                self.gateway.pending.append(self.sent)
        elif isinstance(action, Send):
            assert self.sent is not None, "a state sent with no stream"
            assert not same_json(action.state, self.sent), "a state sent twice"
            self.sent = action.state
            if watch.decision_mode == "on_change":
                self.gateway.pending = [*self.gateway.pending[:1], self.sent]  # one in flight, one pending
        elif isinstance(action, Decide):
            assert watch.decision_mode == "on_request" and not self.deciding and not self.opening
            self.deciding = True
            self.gateway.pending = [self.sent]
        elif isinstance(action, Check):
            assert self.checking is None, "two decide_when checks at once"
            self.checking = action
        elif isinstance(action, Offer):
            assert not self.offered
            self.offered = True
            if self.waiter:
                watch.slot_wanted(self.now)  # the capacity calls the offer at once
        elif isinstance(action, Withdraw):
            self.offered = False
        elif isinstance(action, Release):
            assert self.sent is not None and not self.opening
            self.offered = False
            self.closing = True
            self.sent = None
            self.gateway.pending = []
            self.deciding = False
        elif isinstance(action, Fire):
            self._fired(action.verdict)

    def _fired(self, verdict: Any) -> None:
        """Currency: the verdict's decision is about what the source held at its last read, or
        the documented hold applies."""
        state = verdict.state
        latest = self.watch.latest
        if not same_json(state, latest):
            # the one exception: the stream's state, while the newest read waits unsent behind the
            # decision (a window that opened in this step, or less than max_staleness ago)
            held = (
                self.watch.max_staleness > 0
                and not self._withheld(latest)
                and self.sent is not None
                and same_json(state, self.sent)
                and (self.unsent_since is None or self.now - self.unsent_since < self.watch.max_staleness)
            )
            assert held, f"fired on {state!r} while the source holds {latest!r} (and no hold applies)"
        self.fired.append(Fired(state, self.now))
        if self.watch.once:
            self.ended = True
            self.sent = None if not self.opening else self.sent

    def _check_invariants_after_actions(self) -> None:
        watch = self.watch
        # no spin: what is due now was done now, and the next wake-up is later
        assert watch.actions(self.now) == []
        wake = watch.next_wakeup(self.now)
        assert wake is None or wake > self.now
        # leasing: a stream that owes nothing never keeps its slot while another trigger waits
        if self.waiter and watch.lease:
            assert not watch.owes_nothing(self.now), "an idle stream keeps its slot while another waits"

    # ------------------------------------------------------------------ rules

    @precondition(lambda self: not self.ended)
    @rule(line=st.sampled_from(LINES))
    def append(self, line: str) -> None:
        self.source = self.source + line
        self.unread = True

    @precondition(lambda self: not self.ended)
    @rule(kind=st.sampled_from(["rotate", "rewrite"]))
    def replace(self, kind: str) -> None:
        self.source = "" if kind == "rotate" else "rerun\n"
        self.unread = True

    @precondition(lambda self: not self.ended and self.unread)
    @rule()
    def read(self) -> None:
        """The driver reads the source (it noticed a change)."""
        self.unread = False
        self.read_ever = True
        self.watch.read(self.source, self.now, withheld=self._withheld(self.source))
        self._act()

    def _track_unsent(self) -> None:
        """The exception's window: it opens when the newest read is left unsent while a decision
        is in flight, and closes when what the stream holds is what the source holds (or nothing
        is in flight any more)."""
        read = self.watch.latest
        if self.ended or self.sent is None or self._withheld(read) or same_json(read, self.sent):
            self.unsent_since = None
        elif self.gateway.pending:
            if self.unsent_since is None:
                self.unsent_since = self.now
        else:
            self.unsent_since = None

    @precondition(lambda self: not self.ended and self.read_ever)
    @rule(seconds=st.sampled_from([0.1, 0.4, 1.0, 3.0]))
    def tick(self, seconds: float) -> None:
        self.now += seconds
        self._act()

    @precondition(
        lambda self: not self.ended and self.read_ever and self.watch.next_wakeup(self.now) is not None
    )
    @rule()
    def wake_up(self) -> None:
        wake = self.watch.next_wakeup(self.now)
        assert wake is not None
        self.now = wake
        self._act()

    @precondition(lambda self: not self.ended and self.opening)
    @rule()
    def opened(self) -> None:
        self.opening = False
        self.watch.opened(self.now)
        self._act()

    @precondition(lambda self: not self.ended and self.closing)
    @rule()
    def closed(self) -> None:
        self.closing = False
        self.watch.released(self.now)
        self._act()

    @precondition(lambda self: not self.ended and self.checking is not None)
    @rule()
    def checked(self) -> None:
        check, self.checking = self.checking, None
        assert check is not None
        self.watch.checked(Relevance(MATCH).matches(check.previous, check.new), self.now)
        self._act()

    @precondition(lambda self: not self.ended and not self.opening and bool(self.gateway.pending))
    @rule(qualifies=st.booleans(), latency=st.sampled_from([0.0, 0.5, 1.5]))
    def decision(self, qualifies: bool, latency: float) -> None:
        """The gateway answers its oldest decision in flight (a slow one takes ``latency``)."""
        self.now += latency
        about = self.gateway.pending.pop(0)
        if self.watch.decision_mode == "on_request":
            self.deciding = False
        self.versions += 1
        covers = self.sent is not None and same_json(about, self.sent) and not self.gateway.pending
        self.watch.decided(
            _decision(about, qualifies, self.versions),
            self.now,
            covers=covers,
            state_hash=state_hash(about),
        )
        self._act()

    @precondition(lambda self: not self.ended and self.sent is not None and not self.opening)
    @rule()
    def reconnect(self) -> None:
        """The connection drops and the stream replays: the gateway decides the replayed state anew
        (on_change), or the decide is re-sent (on_request)."""
        if self.watch.decision_mode == "on_change" and self.gateway.pending:
            self.gateway.pending = [self.sent]
        self._act()

    @precondition(lambda self: not self.ended)
    @rule(waits=st.booleans())
    def contention(self, waits: bool) -> None:
        """Another trigger queues for a slot (or gets one)."""
        self.waiter = waits
        if waits and self.offered:
            self.watch.slot_wanted(self.now)
        self._act()

    @precondition(lambda self: self.ended)
    @rule()
    def after_the_end(self) -> None:
        """A watch that ended does nothing more."""
        assert self.watch.actions(self.now) == [] and self.watch.next_wakeup(self.now) is None

    # ------------------------------------------------------------------ liveness

    @invariant()
    def progress_is_pending_when_a_decision_is_wanted(self) -> None:
        if self.ended or not self.read_ever or self.unread:
            return
        watch = self.watch
        if watch.phase is Phase.ENDED:
            return
        unsent = watch.phase is Phase.STREAMING and watch.latest_gen != watch.sent_gen
        wants = watch.wants_decision(self.now, soon=True) or unsent
        under_way = (
            self.opening
            or self.closing
            or bool(self.gateway.pending)
            or self.checking is not None
            or watch.next_wakeup(self.now) is not None
        )
        if wants and not watch.latest_withheld:
            assert under_way, f"the watch wants a decision but nothing is under way ({watch.phase})"

    def teardown(self) -> None:
        """The source goes quiet: every piece of work completes, and the newest state gets a
        current decision, unless nothing is due for it."""
        if self.ended or not self.read_ever:
            return
        if self.unread:
            self.read()
        for _ in range(200):
            if self.ended:
                return
            if self.opening:
                self.opened()
            elif self.closing:
                self.closed()
            elif self.checking is not None:
                self.checked()
            elif self.gateway.pending:
                self.decision(qualifies=False, latency=0.1)
            elif self.watch.next_wakeup(self.now) is not None:
                self.wake_up()
            else:
                break
        else:
            pytest.fail("the watch kept working after its source went quiet (200 steps)")
        watch = self.watch
        if watch.latest_withheld:
            return
        assert not watch.wants_decision(self.now, soon=True), "the newest state never got a current decision"


TestSourceWatch = WatchMachine.TestCase
TestSourceWatch.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
