"""Races the session itself must close, through the stream against the emulator:

* a state mutated in place after it was handed over is still a change (the session snapshots
  what it accepts);
* after an on_change dispatch failed for good, another ``decide()`` on the unchanged state
  answers at once (the stored failure, or a replay) instead of waiting for the idle timeout;
* a final failure of an older state's dispatch does not fail the wait for a newer state;
* a gateway restart does not make a decided stream decide its state again;
* an on_request ``decide()`` goes out while the caller keeps changing the state faster than a
  round trip.
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit

import pytest

from airflow_provider_systemzero.stream import Backoff, DecisionFailed, DecisionStream, StreamSettings
from tests.helpers.latency_proxy import LatencyProxy
from tests.helpers.stream import QUESTIONS, SECRET_KEY, TEST_LIMITS, EmulatorFactory, loopback_stream


@pytest.mark.parametrize("mode", ["on_request", "on_change"])
async def test_a_state_mutated_in_place_after_it_was_handed_over_is_sent(
    make_emulator: EmulatorFactory, fast_backoff: Backoff, mode: str
) -> None:
    emu = await make_emulator()
    items = ["build 7 started"]
    async with loopback_stream(emu, fast_backoff, f"mutated-{mode}", state=items, mode=mode) as stream:
        await stream.decide(timeout=5)
        items.append("Job is ready.")  # the caller's own list, changed after the stream took it
        await stream.set_state(items)
        await stream.wait_in_sync(timeout=5)
        latest = emu.latest_state(stream.request.prompt_cache_key or "")
        assert latest is not None and latest.state == ["build 7 started", "Job is ready."], latest
        decision = await stream.decide(timeout=5)
        assert decision.answer("ready").decision is True  # about the new content, not the old


async def test_decide_after_an_on_change_dispatch_failed_for_good_answers_at_once(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    emu = await make_emulator()
    emu.faults.delay_decisions_ms = 200  # the first decide() waits when the failure arrives
    emu.faults.fail_decides(1, status=400, code="invalid_request", retryable=False)
    async with loopback_stream(
        emu, fast_backoff, "failed-for-good", state="Job is ready.\n", mode="on_change"
    ) as stream:
        with pytest.raises(DecisionFailed):
            await stream.decide(timeout=5)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with contextlib.suppress(DecisionFailed):
            await stream.decide(timeout=3)  # the same state: the stored failure, or a replay
        assert loop.time() - started < 1.0


async def test_an_older_states_final_failure_does_not_fail_the_wait_for_the_newer_one(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    """on_change: version 1's dispatch fails for good while version 2 waits behind it; the gateway
    dispatches version 2 on its own, and whoever waits for it gets its decision."""
    emu = await make_emulator()
    emu.faults.delay_decisions_ms = 600
    emu.faults.fail_decides(count=1, status=400, retryable=False)  # version 1's dispatch only
    async with loopback_stream(emu, fast_backoff, "older-failure", mode="on_change") as stream:
        await stream.append_text("Job is ready.\n")
        await stream.wait_in_sync(timeout=5)
        assert stream.state_version == 2
        decision = await stream.decide(timeout=10)
        assert decision.state_version == 2 and decision.answer("ready").decision is True
        assert emu.stats.decide_failures == {400: 1}


async def test_a_decided_stream_does_not_decide_its_state_again_after_a_restart(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    """on_change: with everything acknowledged and decided, a gateway restart opens no new
    connection (its start would dispatch the same state again: a second decision, and a second
    bill where the service cannot replay the first reply). The next change reconnects."""
    emu = await make_emulator()
    async with loopback_stream(emu, fast_backoff, "restart-decided", mode="on_change") as stream:
        seen = []
        decisions = stream.decisions()
        seen.append(await anext(decisions))
        assert not stream.has_work()
        await emu.restart(retry_after_ms=100)
        await emu.wait_for(lambda e: stream.dormant and not stream.connected, timeout=5)
        await stream.append_text("Job is ready.\n")
        seen.append(await asyncio.wait_for(anext(decisions), 10))
        await decisions.aclose()
    assert [d.state_version for d in seen] == [1, 1]  # a new stream: the replayed start is version 1
    assert [d.answer("ready").decision for d in seen] == [False, True]
    assert emu.stats.decisions_billed == 2 and emu.stats.decisions_replayed == 0
    [reconnect] = stream.reconnects
    assert (reconnect.reason, reconnect.close_code) == ("goodbye:shutdown", 1012)


async def test_waiting_to_be_in_sync_reconnects_a_stream_left_disconnected_with_nothing_to_do(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    """After a restart a decided stream stays disconnected (nothing to send or wait for); a caller
    of ``wait_in_sync`` needs the state at the gateway again, so the wait is work: the stream
    reconnects and replays it (one more decision: the replayed start is dispatched on_change)."""
    emu = await make_emulator()
    async with loopback_stream(emu, fast_backoff, "restart-sync", mode="on_change") as stream:
        decisions = stream.decisions()
        await anext(decisions)
        await emu.restart(retry_after_ms=100)
        await emu.wait_for(lambda e: stream.dormant and not stream.connected, timeout=5)
        await stream.wait_in_sync(timeout=10)
        assert stream.connected and stream.in_sync and not stream.dormant
        await decisions.aclose()
    assert emu.stats.streams_total == 2 and len(stream.reconnects) == 1


async def test_a_decide_goes_out_while_the_caller_keeps_appending_over_a_slow_link(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    """on_request over a 100 ms round trip, a line appended every 50 ms: a change is in flight at
    almost every moment, and the decide still goes out and is answered."""
    emu = await make_emulator()
    parts = urlsplit(emu.origin)
    proxy = await LatencyProxy(parts.hostname or "127.0.0.1", parts.port or 80, one_way_s=0.05).start()
    stop = asyncio.Event()

    async def busy_log(stream: DecisionStream) -> None:
        n = 0
        while not stop.is_set():
            await stream.append_text(f"line {n}\n")
            n += 1
            await asyncio.sleep(0.05)

    try:
        stream = DecisionStream(
            StreamSettings(proxy.origin, SECRET_KEY),
            {"model": "MODEL_ID", "questions": QUESTIONS},
            state="log\n",
            decision_mode="on_request",
            identity="busy-log",
            backoff=fast_backoff,
            open_deadline=10,
        )
        async with stream:
            writer = asyncio.ensure_future(busy_log(stream))
            try:
                await asyncio.sleep(1.0)  # past the pacing burst: the changes come as fast as paced
                acknowledged = stream.state_version
                decision = await stream.decide(timeout=10)
            finally:
                stop.set()
                await asyncio.wait_for(writer, 5)
            assert decision.state_version >= acknowledged >= 2
    finally:
        await proxy.stop()


async def test_a_final_failure_answers_who_waits_once_the_caller_returns_to_the_failed_state(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    """on_change: version 1's dispatch fails for good while a change is paced (not yet sent); the
    failure is about an older state then. The caller changes back to version 1's state, which the
    gateway holds and will not dispatch again: that failure is now the current state's, and
    whoever waits (``decide()``, ``decisions()``) hears it instead of waiting until a timeout."""
    # one event token: the start spends it, and the next change waits about a second for the next
    emu = await make_emulator(limits=TEST_LIMITS.replace(max_events_per_second=1, event_burst=1))
    emu.faults.delay_decisions_ms = 200
    emu.faults.fail_decides(count=1, status=400, retryable=False)
    async with loopback_stream(emu, fast_backoff, "back-to-failed", mode="on_change") as stream:
        decisions = stream.decisions()
        consumer = asyncio.ensure_future(anext(decisions))
        await stream.append_text("Job is ready.\n")  # paced: not written before the failure
        waiting = asyncio.ensure_future(stream.decide(timeout=5))
        await emu.wait_for(lambda e: e.stats.decide_failures == {400: 1}, timeout=5)
        await asyncio.sleep(0.05)  # the failure reached the client
        assert stream.state_version == 1
        await stream.replace("Initial log\n")  # back to what the gateway holds, and failed
        with pytest.raises(DecisionFailed):
            await waiting
        with pytest.raises(DecisionFailed):
            await asyncio.wait_for(consumer, 2)
        await decisions.aclose()
        assert emu.stats.decide_failures == {400: 1} and emu.stats.decisions_billed == 0
