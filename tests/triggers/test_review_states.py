"""The wait of a sensor while a person is asked — the real
:class:`~airflow_provider_systemzero.triggers.review.ReviewWatch` over the real
:class:`~airflow_provider_systemzero.decisions.watch.VerdictRules` — against a world hypothesis
scripts: between two reads of the request the source may change, a person may answer, the watch
may decide the state the source holds, and time may pass. Whatever the order, the wait ends, and:

* a person's answer counts exactly when the source still holds the state the request shows;
* a decision about a newer state ends the wait only after the request was closed by the sensor,
  or was answered by a person first (their answer then counts for nothing);
* the reviewed state never ends the wait by a decision (the person decides it);
* ``review_timeout`` writes the policy's default (when there is one) and nothing else;
* the sensor writes to the request at most once, and never over a person's answer.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_systemzero.decisions.conditions import DecisionCondition
from airflow_provider_systemzero.decisions.watch import VerdictRules
from airflow_provider_systemzero.identity import state_hash
from airflow_provider_systemzero.tasks.review_wait import SYSTEMZERO_ANSWER, OpenReview, closed_by_the_sensor
from airflow_provider_systemzero.triggers.review import ReviewWatch
from tests.helpers import examples
from tests.helpers.scripted import ready_decision

POLICY = {"act_above": 0.8, "review_above": 0.5, "below": "wait"}
REVIEWED = "tick 1: unsure"
#: The confidence each newer state is decided with: above the act bar (fires), in the review
#: band (a newer review), below the bars (waits).
CONFIDENCE = {"act": 0.9, "review": 0.6, "below": 0.3}

steps = st.one_of(
    st.tuples(st.just("change"), st.sampled_from(sorted(CONFIDENCE))),
    st.tuples(st.just("answer"), st.sampled_from(["Yes", "No"])),
    st.tuples(st.just("decide"), st.none()),
    st.tuples(st.just("tick"), st.floats(0.5, 40)),
)


@dataclass
class World:
    """The source, the person, the watch's decisions and the clock, moved one step per read."""

    script: list[tuple[str, Any]]
    rules: VerdictRules
    state: str = REVIEWED
    kind: str = "review"
    now: float = 1000.0
    version: int = 1
    person: dict[str, Any] | None = None
    written: list[dict[str, Any]] = field(default_factory=list)
    verdicts: asyncio.Future[Any] | None = None
    judged: list[str] = field(default_factory=list)
    finale: bool = False

    def step(self) -> None:
        if not self.script:  # the end of the script: a person answers, or the source turns ready
            self.now += 5.0
            if self.person is None and not self.written:
                self._answer("Yes")
            elif not self.finale:
                self.finale = True
                self.script += [("change", "act"), ("decide", None)]
            return
        what, value = self.script.pop(0)
        if what == "change":
            self.version += 1
            self.state, self.kind = f"tick {self.version}: {value}", value
        elif what == "answer" and self.person is None and not self.written:
            self._answer(value)
        elif what == "decide" and self.verdicts is not None and not self.verdicts.done():
            decision = ready_decision(True, self.version, confidence=CONFIDENCE.get(self.kind, 0.6))
            verdict = self.rules.observe(decision, state_hash(self.state), self.state, self.now)
            if verdict is not None:
                self.judged.append(self.state)
                self.verdicts.set_result(verdict)
        elif what == "tick":
            self.now += value

    def _answer(self, label: str) -> None:
        self.person = {
            "chosen_options": [label],
            "params_input": {},
            "responded_at": "2026-12-07T00:00:00+00:00",
            "responded_by_user": {"id": "alice", "name": "Alice"},
            "timedout": False,
        }


class ScriptedRequest(OpenReview):
    """The request as Airflow keeps it, over the world: each read lets the world move a step; a
    write on a request that has an answer is refused, as Airflow's API refuses it (409)."""

    def __init__(self, world: World) -> None:
        super().__init__("ti")
        self.world = world

    async def read(self) -> dict[str, Any] | None:
        self.world.step()
        if self.world.person is not None:
            return self.world.person
        return self.world.written[0] if self.world.written else None

    async def write(self, chosen: list[str], params: dict[str, Any]) -> None:
        if self.world.person is not None or self.world.written:
            raise RuntimeError("409: the request has an answer")
        self.world.written.append({"chosen_options": chosen, "params_input": params})


class WorldSource:
    def __init__(self, world: World) -> None:
        self.world = world

    async def read(self) -> str:
        return self.world.state


class WorldDriver:
    """The watch's next verdict: resolved by the world when it decides a newer state."""

    def __init__(self, world: World) -> None:
        self.world = world

    async def next_verdict(self) -> Any:
        """Let the world move, a step per loop turn, until it decides a newer state (the driver
        runs beside the reads of the request, and goes on when nothing reads it)."""
        self.world.verdicts = verdicts = asyncio.get_running_loop().create_future()
        while not verdicts.done():
            await asyncio.sleep(0)
            if not verdicts.done():
                self.world.step()
        return verdicts.result()


@settings(max_examples=examples(150, 3000), deadline=None)
@given(
    script=st.lists(steps, max_size=14),
    timeout=st.one_of(st.none(), st.floats(5, 60)),
    defaults=st.sampled_from([None, ["No"], ["Yes"]]),
    closed_before=st.booleans(),
)
def test_the_review_follows_the_state_the_source_holds(
    script: list[tuple[str, Any]], timeout: float | None, defaults: list[str] | None, closed_before: bool
) -> None:
    """:param closed_before: an earlier run of the trigger closed the request (a newer state was
    decided) and its event never reached the task: this run watches on and fires again, writing
    nothing."""
    rules = VerdictRules(
        DecisionCondition("ready", True, policy=POLICY), reviews=True, reviewing=state_hash(REVIEWED)
    )
    world = World(list(script), rules)
    if closed_before:
        world.written.append({"chosen_options": ["Yes"], "params_input": {SYSTEMZERO_ANSWER: "superseded"}})
    gate = {
        "question": "ready",
        "kind": "boolean",
        "state_version": 1,
        "state_hash": state_hash(REVIEWED),
        "extra": {},
    }
    review = {
        "ti_id": "ti",
        "gate": gate,
        "outcome": {"action": "review"},
        "defaults": defaults,
        "timeout_at": None if timeout is None else world.now + timeout,
        "open": True,
    }
    watch = ReviewWatch(
        review, rules, WorldSource(world), request=ScriptedRequest(world), clock=lambda: world.now, interval=0
    )

    async def wait() -> dict[str, Any]:
        return await asyncio.wait_for(
            watch.next_event(WorldDriver(world), {"key_namespace": "ns"}, deadline=None), 10
        )

    event = asyncio.run(wait())
    ended = event["review"]
    assert ended["open"] is False and ended["state_hash"] == state_hash(REVIEWED)
    assert REVIEWED not in world.judged  # the reviewed state never ends the wait by a decision
    if event["status"] == "review":
        answer = event["review"]["answer"]
        if ended["ended"] == "answered":
            assert answer == world.person and not world.written and not closed_before
        else:
            assert ended["ended"] == "timed_out" and world.now >= review["timeout_at"]
            written = [entry["chosen_options"] for entry in world.written]
            assert not closed_before
            assert written == ([] if not defaults or world.person else [defaults])
            assert (answer.get("chosen_options") == defaults) if defaults else "error" in answer
        # an answer (or the default) counts exactly when the source still holds the reviewed state
        assert ended["counted"] is (world.state == REVIEWED)
    else:
        # a newer state's verdict: closed by the sensor, or answered first by a person (not counted)
        assert world.judged and world.judged[-1] != REVIEWED
        if world.person is None:  # closed now, or by the earlier run: written once either way
            assert ended["ended"] == "superseded" and len(world.written) == 1
            assert closed_by_the_sensor(world.written[0])
            assert world.written[0]["chosen_options"] in (["Yes"], ["No"])
        else:
            assert ended["ended"] == "answered" and ended["counted"] is False and not world.written
