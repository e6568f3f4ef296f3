"""Legal sequences that once stalled or spun the client, each run against the emulator over loopback.

Every test asserts that the decision about the current state arrives in bounded time and, where
the client waits, that the process used well under a core meanwhile (a spinning serve loop
burns all of one; a waiting stream nearly nothing).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from airflow_provider_systemzero.emulator import Emulator
from airflow_provider_systemzero.identity import state_hash
from airflow_provider_systemzero.protocol import compact_json
from airflow_provider_systemzero.stream import (
    Backoff,
    DecisionFailed,
    DecisionStream,
    StreamCapacity,
    SystemZeroValidationError,
)
from airflow_provider_systemzero.stream.connection import probe
from tests.helpers.stream import QUESTIONS, TEST_LIMITS, EmulatorFactory, settings_for

REQUEST = {"model": "MODEL_ID", "questions": QUESTIONS}
#: A waiting stream (and the in-process emulator pinging it) must stay below this share of a core.
MAX_WAITING_CPU = 0.20


def make_stream(
    emu: Emulator, backoff: Backoff, *, state: Any = "Initial log\n", mode: str = "on_request", **kwargs: Any
) -> DecisionStream:
    return DecisionStream(
        settings_for(emu),
        REQUEST,
        state=state,
        decision_mode=mode,
        identity="liveness",
        backoff=backoff,
        open_deadline=15,
        **kwargs,
    )


async def cpu_share_while(seconds: float, check: Callable[[], Awaitable[None]] | None = None) -> float:
    """The process's CPU time over ``seconds`` of wall time, as a share of one core."""
    cpu, wall = time.process_time(), time.monotonic()
    await asyncio.sleep(seconds)
    if check is not None:
        await check()
    return (time.process_time() - cpu) / (time.monotonic() - wall)


def gateway_state(emu: Emulator, stream: DecisionStream) -> Any:
    accepted = emu.latest_state(stream.session.request.prompt_cache_key)
    assert accepted is not None
    return accepted.state


async def test_replacing_with_the_acknowledged_state_is_in_sync_at_once(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    emu = await make_emulator()
    async with make_stream(emu, fast_backoff) as stream:
        await stream.replace("Initial log\n")  # what the gateway already holds
        assert stream.in_sync
        assert await cpu_share_while(1.0) < MAX_WAITING_CPU
        decision = await stream.decide(timeout=5)
        assert decision.state_version == 1 and emu.stats.events_accepted == 1


async def test_a_to_b_to_a_inside_one_pacing_window_sends_nothing_and_decides(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    # one mutation per ~1.1 s: B waits for a token, and the caller returns to A before it comes
    emu = await make_emulator(limits=TEST_LIMITS.replace(max_events_per_second=1, event_burst=1))
    async with make_stream(emu, fast_backoff, mode="on_change") as stream:
        first = await stream.decide(timeout=5)
        await stream.set_state("Something else\n")
        await stream.set_state("Initial log\n")
        assert stream.in_sync
        assert await cpu_share_while(1.5) < MAX_WAITING_CPU
        assert await stream.decide(timeout=5) is first  # the decision about A covers A again
        assert emu.stats.events_accepted == 1


async def test_on_request_past_max_pending_events_decides_to_drain(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    emu = await make_emulator(limits=TEST_LIMITS.replace(max_pending_events=3))
    async with make_stream(emu, fast_backoff) as stream:
        for n in range(6):
            await stream.append_text(f"line {n}\n")
            if n < 2:
                await stream.wait_in_sync(timeout=5)  # one event each: start + 2 fill the gateway's 3
        decision = await stream.decide(timeout=10)
        assert decision.state_version == stream.state_version and stream.in_sync
        assert gateway_state(emu, stream) == stream.state


async def test_on_change_maintenance_failure_without_goodbye_is_replayed(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    emu = await make_emulator()
    emu.faults.fail_decides(1, status=503, code="maintenance", retry_after_ms=200)
    async with make_stream(emu, fast_backoff, mode="on_change") as stream:
        decision = await stream.decide(timeout=10)  # no restart follows the failure: the client acts
        assert decision.state_version == stream.state_version
        [reconnect] = stream.reconnects
        assert reconnect.reason == "recycled" and reconnect.close_code == 1000


async def test_a_second_decide_after_a_final_on_change_failure_fails_at_once(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    emu = await make_emulator()
    emu.faults.fail_decides(1, status=400, code="invalid_request", retryable=False)
    async with make_stream(emu, fast_backoff, mode="on_change") as stream:
        with pytest.raises(DecisionFailed):
            await stream.decide(timeout=10)
        started = time.monotonic()
        with pytest.raises(DecisionFailed) as caught:
            await stream.decide(timeout=10)
        assert time.monotonic() - started < 1.0 and caught.value.http_status == 400


async def test_a_lone_surrogate_is_a_validation_error_and_changes_nothing(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    emu = await make_emulator()
    async with make_stream(emu, fast_backoff) as stream:
        hashed = stream.state_hash
        with pytest.raises(SystemZeroValidationError, match="not valid Unicode"):
            await stream.append_text("\ud800")
        with pytest.raises(SystemZeroValidationError, match="not valid Unicode"):
            await stream.replace({"text": "\udfff"})
        assert stream.state_hash == hashed == state_hash("Initial log\n")
        await stream.append_text("fine\n")
        decision = await stream.decide(timeout=5)
        assert decision.state_version == 2 and stream.state == "Initial log\nfine\n"
        assert stream.state_hash == state_hash(stream.state)


async def test_states_equal_in_python_but_not_as_json_are_sent(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    emu = await make_emulator()
    async with make_stream(emu, fast_backoff, state=[1]) as stream:
        await stream.set_state([True])
        await stream.decide(timeout=5)
        assert compact_json(gateway_state(emu, stream)) == "[true]"
        await stream.set_state({"n": 1.0})
        await stream.decide(timeout=5)
        assert compact_json(gateway_state(emu, stream)) == '{"n":1.0}'


async def test_a_list_changed_in_place_after_it_was_handed_over_is_still_sent(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    emu = await make_emulator()
    items = ["a"]
    async with make_stream(emu, fast_backoff, state=items) as stream:
        items.append("b")  # the session holds its own copy: this changes nothing yet
        assert stream.state == ["a"] and stream.state_hash == state_hash(["a"])
        await stream.set_state(items)
        decision = await stream.decide(timeout=5)
        assert decision.state_version == 2 and gateway_state(emu, stream) == ["a", "b"]


async def test_probe_holds_a_slot_of_the_stream_cap(make_emulator: EmulatorFactory) -> None:
    emu = await make_emulator()
    capacity = StreamCapacity(1)
    await capacity.acquire()
    probing = asyncio.create_task(probe(settings_for(emu), capacity))
    await asyncio.sleep(0.3)
    assert not probing.done() and emu.stats.streams_total == 0
    capacity.release()
    hello = await asyncio.wait_for(probing, 5)
    assert hello.stream_id.startswith("szws_") and capacity.in_use == 0


@pytest.mark.parametrize("mode", ["on_request", "on_change"])
async def test_a_decision_the_gateway_owes_for_long_is_said_in_the_log(
    make_emulator: EmulatorFactory,
    fast_backoff: Backoff,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    mode: str,
) -> None:
    """A slow gateway is a visible wait: while a decision is owed the log says so, ever less often
    (the first report after DECISION_WAIT_REPORT_S, then twice as long each time); once it
    arrives, nothing more is said."""
    from airflow_provider_systemzero.stream import stream_connection

    monkeypatch.setattr(stream_connection, "DECISION_WAIT_REPORT_S", 0.2)
    emu = await make_emulator()
    emu.faults.delay_decisions_ms = 1_500
    said = "waiting for the System Zero gateway's decision for"
    with caplog.at_level("INFO", logger="airflow_provider_systemzero.stream"):
        async with make_stream(emu, fast_backoff, mode=mode) as stream:
            assert stream.deciding_for is None or mode == "on_change"
            decision = await stream.decide(timeout=10)
            reports = [r.getMessage() for r in caplog.records if said in r.getMessage()]
            # at 0.2, 0.6 and 1.4 s of the 1.5 s decide: the gap doubles
            assert 2 <= len(reports) <= 4, reports
            assert decision.state_version == 1 and stream.deciding_for is None
            caplog.clear()
            await asyncio.sleep(0.5)
            assert not [r for r in caplog.records if said in r.getMessage()]
