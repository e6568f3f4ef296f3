"""A caller who asks for a decision while it keeps changing the state, and a dispatch that fails
for good while a newer state waits — the session core alone, on a simulated clock.

* on_request: "send decide for the current accepted version". With nothing in flight, the
  acknowledged version is the gateway's current one; the decide goes before the next change,
  or a caller that changes the state faster than a round trip would never have it sent.
* A final failure answers whoever asked about that state or an older one. A caller who asked
  after a newer change waits for the newer state's own dispatch.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_systemzero.protocol import (
    ClientSession,
    DecideFailure,
    ErrorEnvelope,
    RetryHint,
    StreamRequest,
)
from airflow_provider_systemzero.protocol.client_events import DecisionFailedEvent, DecisionReceived
from airflow_provider_systemzero.protocol.gateway import DecideOutcome, DispatchDecide
from tests.helpers.latent_pair import QUESTIONS, LatentPair, decided
from tests.helpers.pair import Pair


def busy_caller(one_way_s: float, every_s: float, horizon_s: float) -> tuple[LatentPair, int, str]:
    """An on_request stream whose caller appends a line every ``every_s`` from t = 1 s, and asks
    for a decision at t = 3 s (past the pacing burst); run until ``horizon_s`` after the ask.
    Returns the pair, the intent, and the state when the caller asked."""
    pair = LatentPair("on_request", one_way_s=one_way_s)
    pair.run_until(1.0)
    pair.every(1.0, every_s, lambda n: pair.client.append_text(f"line {n}\n"))
    pair.run_until(3.0)
    intent = pair.client.request_decision()
    asked_about = pair.client.desired_state
    pair.write()
    pair.run_until(3.0 + horizon_s)
    return pair, intent, asked_about


def answered(pair: LatentPair, intent: int) -> DecisionReceived | None:
    return next(
        (e for _, e in pair.events if isinstance(e, DecisionReceived) and intent in e.intents),
        None,
    )


@pytest.mark.parametrize(
    ("one_way_s", "every_s"),
    [
        (0.05, 0.05),  # 100 ms round trip, 20 changes a second
        (0.05, 0.09),
        (0.1, 0.15),
        (0.15, 0.25),  # 4 changes a second: under the client's own pacing
        (0.005, 0.008),  # a fast network and a faster caller
    ],
)
def test_a_decide_goes_out_while_the_caller_keeps_changing_the_state(
    one_way_s: float, every_s: float
) -> None:
    pair, intent, asked_about = busy_caller(one_way_s, every_s, horizon_s=10.0)
    [first, *_] = pair.sent("decide")
    # the ask waits for the changes it covers: the one in flight, then the rest coalesced in one
    assert first - 3.0 <= 4 * one_way_s + 0.3
    decision = answered(pair, intent)
    assert decision is not None and pair.client.pending_intents == 0
    # the first dispatch covers what the caller had when it asked
    assert json.loads(pair.bodies[0])["state"].startswith(asked_about)


@settings(max_examples=40, deadline=None)
@given(one_way_ms=st.integers(1, 200), ratio=st.floats(0.1, 3.0))
def test_an_asked_decision_is_answered_whatever_the_latency_and_the_pace_of_changes(
    one_way_ms: int, ratio: float
) -> None:
    """No spin on the way (the pair checks every wake-up), and the decision comes."""
    one_way = one_way_ms / 1000
    pair, intent, _ = busy_caller(one_way, every_s=2 * one_way * ratio, horizon_s=5.0)
    assert answered(pair, intent) is not None, (
        f"{2 * one_way_ms} ms round trip, a change every {2 * one_way * ratio * 1000:.1f} ms: "
        f"decides sent {len(pair.sent('decide'))}, acknowledged version {pair.client.state_version}"
    )


def on_request_pair() -> tuple[ClientSession, Pair]:
    request = StreamRequest.build(model="m", questions=QUESTIONS, prompt_cache_key="p")
    client = ClientSession(request=request, state="log\n", decision_mode="on_request", key_namespace="ns")
    pair = Pair(client, auto_decide=False)
    pair.pump()
    return client, pair


BROKEN = DecideFailure(500, ErrorEnvelope("api_error", "internal", "broken"), RetryHint(False), "r")


def test_an_on_request_failure_answers_only_who_asked_about_that_state() -> None:
    client, pair = on_request_pair()
    first = client.request_decision()  # about version 1
    pair.pump()
    client.append_text("Job is ready.\n")
    pair.pump()
    second = client.request_decision()  # about version 2, asked while version 1's decide runs
    pair.pump()
    [dispatch] = pair.dispatches
    assert dispatch.state_version == 1
    pair.finish(pair.dispatches.pop(), BROKEN)
    pair.pump()
    [failed] = [e for e in pair.client_events if isinstance(e, DecisionFailedEvent)]
    assert (failed.error.state_version, failed.intents) == (1, (first,))
    # the second caller's own decide names version 2, and its decision answers it
    [dispatch] = pair.dispatches
    assert dispatch.state_version == 2
    pair.finish(dispatch)
    [received] = [e for e in pair.client_events if isinstance(e, DecisionReceived)]
    assert received.intents == (second,) and client.pending_intents == 0


def fail_first(action: DispatchDecide) -> DecideOutcome:
    if action.state_version == 1:
        return DecideFailure(
            400, ErrorEnvelope("invalid_request_error", "invalid_request", "no"), RetryHint(False), "r"
        )
    return decided(action)


def test_an_on_change_final_failure_of_an_older_state_leaves_the_newer_one_waiting() -> None:
    pair = LatentPair("on_change", one_way_s=0.01, decide_s=0.5, state="log\n", outcome=fail_first)
    pair.run_until(0.1)  # version 1 acknowledged; its dispatch runs until t = 0.52
    old = pair.client.request_decision()
    pair.client.append_text("Job is ready.\n")
    new = pair.client.request_decision()
    pair.write()
    pair.run_until(3.0)
    [failed] = [e for _, e in pair.events if isinstance(e, DecisionFailedEvent)]
    assert failed.intents == (old,) and not failed.current  # the state has changed since
    decision = answered(pair, new)
    assert decision is not None and decision.result.state_version == 2 and decision.current
    assert len(pair.bodies) == 2


def test_an_on_change_final_failure_of_the_current_state_answers_everyone_waiting() -> None:
    pair = LatentPair("on_change", one_way_s=0.01, decide_s=0.5, state="log\n", outcome=fail_first)
    pair.run_until(0.1)
    waiting = (pair.client.request_decision(), pair.client.request_decision())
    pair.run_until(3.0)
    [failed] = [e for _, e in pair.events if isinstance(e, DecisionFailedEvent)]
    assert failed.intents == waiting and failed.current and pair.client.pending_intents == 0


def test_an_on_change_final_failure_answers_a_waiter_once_the_caller_returns_to_its_state() -> None:
    """Version 1's dispatch fails for good while the next change is still local (paced): the
    failure is about an older state. The caller then changes back to version 1's state, which the
    gateway holds and will not dispatch again: nothing would ever answer the waiter, so the
    inherited failure does, and is reported as the current state's."""
    request = StreamRequest.build(model="m", questions=QUESTIONS, prompt_cache_key="p")
    client = ClientSession(request=request, state="log\n", decision_mode="on_change", key_namespace="ns")
    pair = Pair(client, auto_decide=False)
    pair.pump()
    [dispatch] = pair.dispatches
    client.append_text("Job is ready.\n")  # not written yet
    waiting = client.request_decision()
    pair.finish(pair.dispatches.pop(), fail_first(dispatch))
    [failed] = [e for e in pair.client_events if isinstance(e, DecisionFailedEvent)]
    assert failed.intents == () and not failed.current
    [inherited] = client.replace("log\n")
    assert isinstance(inherited, DecisionFailedEvent)
    assert inherited.intents == (waiting,) and inherited.current and inherited.repeated
    assert client.pending_intents == 0 and not client.has_work()
    assert client.current_failure is failed.error
    # once reported, a later return to that state answers waiters without reporting it again
    client.append_text("more\n")
    again = client.request_decision()
    [second] = client.replace("log\n")
    assert isinstance(second, DecisionFailedEvent)
    assert second.intents == (again,) and not second.current
