"""Values no gateway should send (issue 24 items 4, 6 and 8): huge integers, non-finite numbers,
out-of-range shares, replies that do not answer the questions asked, a decision repeated.

Each is a contract breach: the frame is refused, the connection is closed with 1002 and, after
three such connections in a row, the caller gets a :class:`ProtocolViolation` — always a
:class:`SystemZeroError`, never ``OverflowError`` or a decision built on the bad value.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

import pytest

from airflow_provider_systemzero.decisions.conditions import DecisionCondition
from airflow_provider_systemzero.decisions.policy import DecisionPolicy
from airflow_provider_systemzero.protocol.messages import Decision
from airflow_provider_systemzero.protocol.reply import DecisionResult
from airflow_provider_systemzero.stream.exceptions import ProtocolViolation
from tests.helpers.hostile_gateway import ANSWER, REQUEST, HostileGateway, Peer, Raw, decide_and_fail

HUGE = "9" * 400


# ------------------------------------------------------------------------------------ item 4


@pytest.mark.parametrize("where", ["goodbye", "retry", "hello"])
async def test_a_400_digit_integer_is_a_protocol_violation_not_an_overflow(
    where: str, gateway: Callable[..., HostileGateway], connect: Callable[..., Any]
) -> None:
    async def script(peer: Peer) -> None:
        if where == "hello":
            await peer.hello({"max_duration_ms": Raw(HUGE)})
            await peer.drain()
            return
        await peer.open()
        message = await peer.recv()
        assert message["type"] == "decide"
        if where == "goodbye":
            await peer.goodbye("shutdown", retry_after_ms=Raw(HUGE))
        else:
            await peer.error(
                "rate_limit_error",
                "rate_limited",
                "slow down",
                http_status=429,
                retryable=True,
                retry_after_ms=Raw(HUGE),
            )
        await peer.drain()

    gw = gateway(script)
    error = await decide_and_fail(connect(gw))
    assert isinstance(error, ProtocolViolation)
    assert "2**53" in str(error)
    assert gw.connections == 3  # three breaches in a row, then the caller hears it


# ------------------------------------------------------------------------------------ item 6


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999999", "7.5", "-0.5"])
async def test_a_share_that_is_not_a_number_from_0_to_1_never_becomes_a_decision(
    number: str, gateway: Callable[..., HostileGateway], connect: Callable[..., Any]
) -> None:
    async def script(peer: Peer) -> None:
        await peer.open()
        message = await peer.recv()
        await peer.send({"type": "scheduled", "state_version": message["state_version"], "in_flight": False})
        await peer.decision(1, answers={"ready": {**ANSWER, "confidence": Raw(number)}})
        await peer.drain()

    error = await decide_and_fail(connect(gateway(script)))
    assert isinstance(error, ProtocolViolation)
    assert "confidence" in str(error) or "finite" in str(error) or "infinity" in str(error)


def _result(confidence: Any, probability: Any = 0.95) -> DecisionResult:
    answer = {**ANSWER, "confidence": confidence, "probability": probability}
    message = Decision("szws_" + "0" * 32, 2, 1, ("evt_1",), {"answers": {"ready": answer}}, "r")
    return DecisionResult.from_message(message)  # no questions: read leniently, as a stored reply is


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 7.5, -1.0, True])
def test_no_gate_is_met_by_a_value_that_is_not_a_number_from_0_to_1(value: Any) -> None:
    condition = DecisionCondition("ready", True, min_confidence=0.99)
    assert not condition.evaluate(_result(value)).met
    assert not DecisionCondition("ready", True, min_probability=0.5).evaluate(_result(0.99, value)).met
    policy = DecisionPolicy(act_above=0.9)
    outcome = policy.evaluate({"decision": True, "confidence": value, "probability": value})
    assert outcome.action != "act" and outcome.code == "missing_measure"
    assert (
        DecisionCondition("ready", True, min_confidence=0.99).evaluate(_result(0.995)).met
    )  # the bar still works


# ------------------------------------------------------------------------------------ item 8


_BAD_REPLIES: dict[str, dict[str, Any]] = {
    "maybe for a boolean question": {"answers": {"ready": {**ANSWER, "decision": "maybe"}}},
    "an answer to a question never asked": {"answers": {"ready": ANSWER, "other": ANSWER}},
    "no answer to the question asked": {"answers": {}},
    "a choice answer to a boolean question": {"answers": {"ready": {**ANSWER, "type": "choice"}}},
    "http_status 500 with a reply": {"http_status": 500},
}


@pytest.mark.parametrize("case", sorted(_BAD_REPLIES))
async def test_a_reply_that_does_not_answer_the_questions_asked_is_refused(
    case: str, gateway: Callable[..., HostileGateway], connect: Callable[..., Any]
) -> None:
    fields = dict(_BAD_REPLIES[case])

    async def script(peer: Peer) -> None:
        await peer.open()
        await peer.decide_then(**fields)
        await peer.drain()

    error = await decide_and_fail(connect(gateway(script)))
    assert isinstance(error, ProtocolViolation)
    assert "questions asked" in str(error)


async def test_decisions_never_yields_a_repeated_decision(
    gateway: Callable[..., HostileGateway], connect: Callable[..., Any]
) -> None:
    async def script(peer: Peer) -> None:
        await peer.open()
        for _ in range(3):
            await peer.decision(1)
        await peer.ack("evt_2", 2, scheduled=True) if (await peer.recv())["type"] == "append_text" else None
        await peer.decision(2, covered_event_ids=["evt_2"])
        await peer.drain()

    seen = []
    async with asyncio.timeout(20):
        async with connect(gateway(script)).stream(REQUEST, state="log\n", open_deadline=10) as stream:
            decisions = stream.decisions()
            seen.append(await anext(decisions))
            await stream.append_text("more\n")
            seen.append(await anext(decisions))
    assert [d.state_version for d in seen] == [1, 2]
