"""Budgets enforced by the stream client before dispatch, against the real emulator over loopback."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from airflow_provider_systemzero.decisions.budget import BudgetExceeded, DecisionBudget
from airflow_provider_systemzero.emulator import Emulator
from airflow_provider_systemzero.stream import Backoff, DecisionStream
from tests.helpers.observability import ledger_of
from tests.helpers.stream import QUESTIONS, settings_for

REQUEST = {"model": "MODEL_ID", "questions": QUESTIONS}


def stream_for(
    emu: Emulator,
    backoff: Backoff,
    mode: str,
    budget: DecisionBudget | None = None,
    identity: str = "budget-test",
    state: Any = "Initial log\n",
    **settings: Any,
) -> DecisionStream:
    return DecisionStream(
        settings_for(emu, **settings),
        REQUEST,
        state=state,
        decision_mode=mode,
        identity=identity,
        backoff=backoff,
        open_deadline=15,
        budget=budget,
    )


def ledger_usage(emu: Emulator) -> dict[str, int]:
    """What the emulator billed, summed from its ledger (billed entries only)."""
    totals = {"billed": 0, "input_tokens": 0, "cached_input_tokens": 0, "media_tokens": 0}
    for entry in ledger_of(emu):
        if entry.billed:
            totals["billed"] += 1
            for name in ("input_tokens", "cached_input_tokens", "media_tokens"):
                totals[name] += (entry.usage or {}).get(name, 0)
    return totals


async def test_on_change_budget_of_two_stops_the_third_before_dispatch(
    emu: Emulator, fast_backoff: Backoff
) -> None:
    budget = DecisionBudget(max_decisions=2, scope="the test stream")
    async with stream_for(emu, fast_backoff, "on_change", budget) as stream:
        await stream.decide(timeout=10)
        await stream.append_text("Step one done.\n")
        await stream.decide(timeout=10)
        await stream.append_text("Step two done.\n")
        with pytest.raises(BudgetExceeded) as raised:
            await stream.decide(timeout=10)
        assert stream.failure is raised.value  # the stream ends (and closes) rather than schedule more
    assert raised.value.limit == "max_decisions" and "max_decisions=2" in str(raised.value)
    assert "2 decisions spent" in str(raised.value)
    assert [e.billed for e in ledger_of(emu)] == [True, True]
    assert (
        emu.stats.decisions_dispatched == 2 and emu.stats.events_accepted == 2
    )  # the third change never left
    usage = stream.usage
    assert (usage.billed, usage.replayed, usage.refused, usage.dispatched) == (2, 0, 1, 2)
    expected = ledger_usage(emu)
    assert (usage.input_tokens, usage.cached_input_tokens, usage.media_tokens) == (
        expected["input_tokens"],
        expected["cached_input_tokens"],
        expected["media_tokens"],
    )
    assert usage.input_tokens > 0


async def test_on_change_lets_scheduled_dispatches_settle_before_failing(
    emu: Emulator, fast_backoff: Backoff
) -> None:
    emu.faults.delay_decisions_ms = 200
    budget = DecisionBudget(max_decisions=2)
    async with stream_for(emu, fast_backoff, "on_change", budget) as stream:
        await stream.append_text("a\n")  # start and this change: at most two dispatches, both allowed
        decisions = stream.decisions()
        received = [await anext(decisions)]
        await stream.append_text("b\n")  # one in flight or pending plus this one could make three: held
        with pytest.raises(BudgetExceeded):
            async with asyncio.timeout(10):
                async for decision in decisions:
                    received.append(decision)
    billed = [e for e in ledger_of(emu) if e.billed]
    assert len(billed) == len(received) == stream.usage.billed == 2  # the outstanding one was received
    assert emu.stats.events_accepted == 2 and stream.usage.refused == 1


async def test_on_request_refuses_the_decide_and_keeps_the_stream(
    emu: Emulator, fast_backoff: Backoff
) -> None:
    async with stream_for(emu, fast_backoff, "on_request", DecisionBudget(max_decisions=1)) as stream:
        await stream.decide(timeout=10)
        await stream.append_text("More.\n")
        with pytest.raises(BudgetExceeded, match="max_decisions=1"):
            await stream.decide(timeout=10)
        assert stream.failure is None and stream.connected
        await stream.wait_in_sync(timeout=5)  # changes still flow: they dispatch nothing on_request
        with pytest.raises(BudgetExceeded):
            await stream.decide(timeout=10)
    assert emu.stats.decisions_dispatched == 1 and len(ledger_of(emu)) == 1
    assert stream.usage.refused == 2


async def test_a_replay_answered_unbilled_does_not_count(emu: Emulator, fast_backoff: Backoff) -> None:
    async with stream_for(emu, fast_backoff, "on_request") as first:
        original = await first.decide(timeout=10)
    # another try of the same task: same identity and state, so the same key and body
    budget = DecisionBudget(max_decisions=2, spent=first.usage)
    async with stream_for(emu, fast_backoff, "on_request", budget) as second:
        again = await second.decide(timeout=10)
    assert again.reply_id == original.reply_id
    assert [e.billed for e in ledger_of(emu)] == [True, False]
    assert (second.usage.billed, second.usage.replayed) == (0, 1)
    assert budget.total.billed == 1 and budget.total.input_tokens == original.usage["input_tokens"]


async def test_input_token_cap_refuses_before_dispatch(emu: Emulator, fast_backoff: Backoff) -> None:
    async with stream_for(emu, fast_backoff, "on_request") as probe:
        first = await probe.decide(timeout=10)
    tokens = first.usage["input_tokens"]
    budget = DecisionBudget(max_input_tokens=tokens + tokens // 2)
    async with stream_for(emu, fast_backoff, "on_request", budget, identity="tokens") as stream:
        await stream.decide(timeout=10)
        await stream.append_text("x" * 10)
        with pytest.raises(BudgetExceeded) as raised:
            await stream.decide(timeout=10)
    assert raised.value.limit == "max_input_tokens"
    assert stream.usage.billed == 1 and sum(e.billed for e in ledger_of(emu)) == 2


async def test_connection_window_is_shared_by_the_streams_of_a_process(
    emu: Emulator, fast_backoff: Backoff
) -> None:
    async with stream_for(
        emu, fast_backoff, "on_request", identity="one", conn_id="sz_window", budget_decisions_per_hour=1
    ) as one:
        await one.decide(timeout=10)
    async with stream_for(
        emu, fast_backoff, "on_request", identity="two", conn_id="sz_window", budget_decisions_per_hour=1
    ) as two:
        with pytest.raises(BudgetExceeded) as raised:
            await two.decide(timeout=10)
    assert raised.value.limit == "budget_decisions_per_hour" and "'sz_window'" in str(raised.value)
    assert "per process" in str(raised.value)
    assert sum(e.billed for e in ledger_of(emu)) == 1


async def _window_held_one(emu: Emulator, backoff: Backoff, window: dict[str, Any]) -> None:
    """One decision was billed, and the connection's window of two per hour counts only it: a
    second stream of the process may decide once more."""
    assert sum(e.billed for e in ledger_of(emu)) == 1
    async with stream_for(emu, backoff, "on_request", identity="two", **window) as two:
        await two.decide(timeout=10)  # the second of two per hour
    assert sum(e.billed for e in ledger_of(emu)) == 2


async def test_usage_settled_before_the_close_is_not_counted_twice_when_the_decision_comes(
    emu: Emulator, fast_backoff: Backoff
) -> None:
    """A trigger reports its usage before it closes the stream (DecisionStream.settle_usage): the
    dispatch in flight counts as unconfirmed. When its decision still arrives before the close,
    it is that same decision, not another: the connection's hourly window counts one, and the
    next stream of the process is not refused for a decision billed once."""
    emu.faults.delay_decisions_ms = 400
    window = {"conn_id": "sz_settled", "budget_decisions_per_hour": 2}
    async with stream_for(emu, fast_backoff, "on_request", identity="one", **window) as one:
        deciding = asyncio.ensure_future(one.decide(timeout=10))
        await emu.wait_for(lambda e: one.deciding_for is not None, timeout=5)
        one.settle_usage()
        assert one.usage.unconfirmed == 1
        await deciding  # the decision comes before the close
        assert one.usage.billed + one.usage.unconfirmed == 1, one.usage
    await _window_held_one(emu, fast_backoff, window)


async def test_usage_settled_before_a_replayed_decision_comes_is_not_counted(
    emu: Emulator, fast_backoff: Backoff
) -> None:
    """The dispatch counted as unconfirmed by settle_usage comes back as a replay of a reply
    already billed (the same state decided again: same key, byte-identical body): it cost
    nothing, so the unconfirmed count it stood for is taken back. Before, the stream's usage said
    1 billed and 1 unconfirmed for one billed decision, and the connection's hourly window held
    two: the next stream of the process was refused."""
    window = {"conn_id": "sz_settled_replay", "budget_decisions_per_hour": 2}
    async with stream_for(emu, fast_backoff, "on_request", identity="one", **window) as one:
        first = await one.decide(timeout=10)
        emu.faults.delay_decisions_ms = 400
        deciding = asyncio.ensure_future(one.decide(timeout=10))  # the same state: a replay
        await emu.wait_for(lambda e: one.deciding_for is not None, timeout=5)
        one.settle_usage()
        assert one.usage.unconfirmed == 1
        again = await deciding
        assert again.reply_id == first.reply_id
        assert (one.usage.billed, one.usage.replayed, one.usage.unconfirmed) == (1, 1, 0), one.usage
    emu.faults.delay_decisions_ms = 0
    await _window_held_one(emu, fast_backoff, window)
