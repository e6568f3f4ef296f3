"""Poke mode and deferred mode give the same verdict on the same sequence of states and decisions.

A differential test through both paths a sensor's wait can take: the poke path
(:meth:`~airflow_provider_systemzero.sensors.decision.SystemZeroDecisionSensor.poke_event`, one
on_request decide per poke, of a real ``SystemZeroDecisionSensor``) and the deferred path (the trigger's watch as
:meth:`~airflow_provider_systemzero.triggers.watching.WatchingTrigger.watch_driver` builds it, run by the real
:class:`~airflow_provider_systemzero.triggers.driver.WatchDriver` against a scripted stream on a
clock the test moves, on_change or on_request, holding its stream or giving it back between
decisions). Hypothesis draws the condition (hysteresis, a policy, states a person said no about)
and the sequence: each step the source holds a state (sometimes the one before again) and
System Zero's decision about it (or its failure, HTTP 500); both paths must end the wait at the
same step with the same event (or the same failure), or both not at all.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_systemzero.decisions.policy import DecisionPolicy
from airflow_provider_systemzero.decisions.watch import VerdictRules, WatchEvent
from airflow_provider_systemzero.identity import state_hash
from airflow_provider_systemzero.sensors.decision import SystemZeroDecisionSensor
from airflow_provider_systemzero.sensors.poking import PokeWatch
from airflow_provider_systemzero.stream.exceptions import DecisionFailed
from airflow_provider_systemzero.triggers.decision import SystemZeroDecisionTrigger
from airflow_provider_systemzero.triggers.watching import new_timeline
from tests.helpers import trigger_callables as callables
from tests.helpers.scripted import (
    ClockLoop,
    ScriptedSource,
    ScriptedStreams,
    decision_failed,
    ready_decision,
)

#: How many sequences ``make test`` runs (each is a handful of pokes and a short deferred run).
EXAMPLES = 60

_CONTEXT = {"ti": SimpleNamespace(dag_id="d", task_id="wait", run_id="r", map_index=-1)}

POLICIES = {
    "none": None,
    "fail below": DecisionPolicy(act_above=0.8, review_above=0.5, below="fail"),
    "skip below": DecisionPolicy(act_above=0.8, below="skip"),
    "default below": DecisionPolicy(act_above=0.8, below="default", default=True),
}


class ScriptedSensor(SystemZeroDecisionSensor):
    """The sensor in poke mode; each decide returns the decision the test scripted for the state
    the poke read (nothing goes over the network)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.answers: list[Any] = []

    def decide_with_budget(self, context: Any, call: Any, body_bytes: int | None = None) -> Any:
        answer, confidence = self.answers.pop(0)
        if answer == "fails":
            raise decision_failed(1)
        return ready_decision(answer == "met", 1, confidence=confidence)


def _sensor(consecutive: int, policy: str) -> ScriptedSensor:
    return ScriptedSensor(
        task_id="wait",
        systemzero_conn_id="systemzero_default",
        model="sz-test",
        question="ready",
        instructions="Is the job ready?",
        source={"type": "callable", "path": "tests.helpers.trigger_callables.read_value"},
        min_confidence=0.5,
        consecutive=consecutive,
        policy=POLICIES[policy],
        deferrable=False,
        mode="poke",
    )


def _summary(event: WatchEvent | None, step: int | None) -> tuple[Any, ...] | None:
    """What must agree: the step the wait ended at and what its event says."""
    if event is None:
        return None
    payload = event.to_payload()
    streak = dict(payload.get("streak") or {})
    streak.pop("true_for", None)  # how long the run held: the poke's wall clock, the test's clock
    return (
        step,
        payload["status"],
        payload.get("action"),
        payload.get("decision"),
        payload.get("state_hash"),
        streak,
    )


def _poked(sensor: ScriptedSensor, steps: list[tuple[str, str, float]], skip: list[str]) -> Any:
    """The poke path: one poke per step, each deciding (when the watch wants a decision) with the
    step's decision."""
    sensor.poke_watch = PokeWatch(skip)
    for index, (state, answer, confidence) in enumerate(steps):
        callables.VALUE["state"] = state
        sensor.answers = [(answer, confidence)]
        try:
            event = sensor.poke_event(_CONTEXT)  # type: ignore[arg-type]
        except DecisionFailed:
            return ("error", index)
        if event is not None:
            return _summary(event, index)
    return None


def _deferred(
    sensor: ScriptedSensor,
    steps: list[tuple[str, str, float]],
    skip: list[str],
    decision_mode: str,
    lease: bool,
    lease_after: float,
) -> Any:
    """The deferred path: the trigger's watch and driver; each step the source holds the step's
    state, and the stream's decision about it (when one is asked for) is the step's."""
    inputs = sensor.parse_inputs()
    trigger = SystemZeroDecisionTrigger(
        systemzero_conn_id=sensor.systemzero_conn_id,
        request=inputs.request,
        condition=inputs.condition.to_dict(),
        state=steps[0][0],
        key_namespace="k",
        decision_mode=decision_mode,
        lease=lease,
        lease_after=lease_after,
    )
    rules = VerdictRules(inputs.condition, reviews=True, skip_states=skip, timeline=new_timeline())
    loop = ClockLoop()
    try:
        source, streams = ScriptedSource(steps[0][0]), ScriptedStreams()

        async def started() -> asyncio.Task[Any]:
            driver = trigger.watch_driver(source, rules, streams, once=True)  # type: ignore[arg-type]
            return asyncio.ensure_future(driver.next_verdict())

        run = loop.run_until_complete(started())
        for index, (state, answer, confidence) in enumerate(steps):
            source.set(state)
            loop.turns(20)
            stream = streams.stream
            if stream is not None and answer == "fails" and (stream.owed or stream.requests):
                if decision_mode == "on_change":
                    stream.fail_dispatch()
                else:
                    stream.fail_request(timed_out=False)
            elif stream is not None and (stream.owed or stream.requests):
                decided = stream.answer_dispatch if decision_mode == "on_change" else stream.answer_request
                decided(answer == "met", confidence=confidence)
            loop.advance(lease_after)  # a stream given back after lease_after quiet seconds
            loop.turns(20)
            if run.done():
                if isinstance(run.exception(), DecisionFailed):
                    return ("error", index)
                verdict = run.result()
                return _summary(rules.sensor_event(verdict, key_namespace="k", deadline=None), index)
        run.cancel()
        loop.turns(5)
        return None
    finally:
        loop.close()


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    consecutive=st.sampled_from([1, 1, 2, 3]),
    policy=st.sampled_from(list(POLICIES)),
    steps=st.lists(
        st.tuples(
            st.booleans(),  # the source changed (else it holds the state before again)
            st.sampled_from(["met", "unmet"] * 4 + ["fails"]),  # the decision (HTTP 500: it fails)
            st.sampled_from([0.3, 0.6, 0.9]),  # its confidence
        ),
        min_size=1,
        max_size=8,
    ),
    declined=st.sets(st.integers(0, 7), max_size=2),
    decision_mode=st.sampled_from(["on_change", "on_request"]),
    lease=st.booleans(),
    lease_after=st.sampled_from([0.0, 5.0]),
)
def test_poke_and_defer_end_the_wait_at_the_same_decision(
    consecutive: int,
    policy: str,
    steps: list[tuple[bool, str, float]],
    declined: set[int],
    decision_mode: str,
    lease: bool,
    lease_after: float,
) -> None:
    states: list[tuple[str, str, float]] = []
    for index, (changed, answer, confidence) in enumerate(steps):
        state = f"tick {index}: job step\n" if changed or not states else states[-1][0]
        states.append((state, answer, confidence))
    skip = [state_hash(states[i][0]) for i in sorted(declined) if i < len(states)]
    sensor = _sensor(consecutive, policy)
    poked = _poked(sensor, states, skip)
    deferred = _deferred(sensor, states, skip, decision_mode, lease, lease_after)
    assert poked == deferred, f"poke mode: {poked}; deferred mode: {deferred}"
