"""The stream client against the real emulator over loopback: the example exchange, both
decision modes, every reconnect path, pacing, the process-wide cap and cancellation."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from airflow_provider_systemzero.emulator import Emulator
from airflow_provider_systemzero.protocol import Limits
from airflow_provider_systemzero.protocol.body import body_hash
from airflow_provider_systemzero.protocol.messages import Pong
from airflow_provider_systemzero.stream import (
    Backoff,
    DecisionFailed,
    DecisionStream,
    StreamCapacity,
    StreamRejected,
    SystemZeroValidationError,
    default_capacity,
)
from tests.helpers.stream import (
    SECRET_KEY,
    SHORT_PONG,
    TEST_LIMITS,
    EmulatorFactory,
    make_stream,
)


def billed_for(emu: Emulator) -> list[Any]:
    return [entry for entry in emu.ledger.get(SECRET_KEY, []) if entry.billed]


def assert_each_state_billed_once(emu: Emulator) -> None:
    """No body billed twice, and every key always named the same body (a replay is byte-identical)."""
    entries = emu.ledger.get(SECRET_KEY, [])
    billed = [e.body_sha256 for e in entries if e.billed]
    assert billed and len(billed) == len(set(billed)), entries
    bodies_by_key: dict[str | None, set[str]] = {}
    for entry in entries:
        bodies_by_key.setdefault(entry.idempotency_key, set()).add(entry.body_sha256)
    assert None not in bodies_by_key and all(len(b) == 1 for b in bodies_by_key.values()), entries


async def assert_replay_is_answered_from_the_ledger(emu: Emulator, stream: DecisionStream) -> None:
    """Deciding the replayed state again costs nothing: same key, byte-identical body, not billed."""
    before = emu.ledger[SECRET_KEY][-1]
    await stream.decide(timeout=10)
    after = emu.ledger[SECRET_KEY][-1]
    assert after is not before and not after.billed
    assert (after.idempotency_key, after.body_sha256) == (before.idempotency_key, before.body_sha256)


async def assert_no_reconnect_without_work(emu: Emulator, stream: DecisionStream) -> None:
    """A stream with everything acknowledged and decided stays disconnected after its connection
    is lost: a new one now would only decide the same state again. Its next change or decision
    asked for reconnects."""
    await emu.wait_for(lambda e: stream.dormant and not stream.connected, timeout=10)
    assert not stream.reconnects and not stream.has_work()


# ------------------------------------------------------------------ the example exchange and both modes


async def test_the_example_exchange(make_emulator: EmulatorFactory, fast_backoff: Backoff) -> None:
    emu = await make_emulator()
    async with make_stream(emu, fast_backoff, idempotency_key="example-state-1") as stream:
        assert stream.state_version == 1 and stream.stream_id is not None
        await stream.append_text("Job is ready.\n", idempotency_key="example-state-2")
        decision = await stream.decide(timeout=10)
        assert decision.answer("ready").decision is True
        assert decision.state_version == 2 and decision.covered_event_ids == ("evt_1", "evt_2")
        assert decision.reply["answers"]["ready"]["decision"] is True  # the raw reply is kept
        assert stream.last_decision is decision and stream.state == "Initial log\nJob is ready.\n"
        assert stream.state_version == 2
        first_stream_id = stream.stream_id

        # the server restarts: goodbye shutdown (500 ms), close 1012. Everything is decided, so
        # the client reconnects with the next decision asked for, and replays (not before 500 ms)
        await emu.restart(retry_after_ms=500)
        await assert_no_reconnect_without_work(emu, stream)
        assert emu.stats.streams_total == 1
        decided_again = asyncio.ensure_future(stream.decide(timeout=10))
        await emu.wait_for(
            lambda e: bool(stream.reconnects) and stream.connected and stream.in_sync, timeout=10
        )
        [reconnect] = stream.reconnects
        assert (reconnect.reason, reconnect.close_code, reconnect.server_delay) == (
            "goodbye:shutdown",
            1012,
            0.5,
        )
        assert reconnect.waited >= 0.5
        assert stream.stream_id != first_stream_id and stream.state_version == 1  # a new stream, one start
        latest = emu.latest_state(stream.request.prompt_cache_key or "")
        assert latest is not None and latest.state == "Initial log\nJob is ready.\n"

        again = await decided_again
    assert again.decisions() == {"ready": True} and again.covered_event_ids == ("evt_1",)
    # the replayed start carried the same key and a byte-identical body: answered from the ledger
    entries = emu.ledger[SECRET_KEY]
    assert [e.billed for e in entries] == [True, False]
    assert entries[0].idempotency_key == entries[1].idempotency_key == "example-state-2"
    assert entries[0].body_sha256 == entries[1].body_sha256
    assert emu.stats.decisions_billed == 1 and emu.stats.decisions_replayed == 1
    await emu.wait_for(lambda e: e.stats.streams_open == 0, timeout=5)
    assert emu.stats.closes_by_code.get(1000) == 1 and emu.stats.closes_by_code.get(1012) == 1
    assert_each_state_billed_once(emu)


async def test_on_change_decisions_arrive_as_the_state_changes(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    emu = await make_emulator()
    async with make_stream(emu, fast_backoff, mode="on_change", state="Initial log\n") as stream:
        seen = []
        async for decision in stream.decisions():
            seen.append(decision)
            if decision.state_version == 1:
                assert decision.decisions() == {"ready": False}
                await stream.append_text("Job is ready.\n")
            elif decision.decisions() == {"ready": True}:
                break
        assert seen[-1].covered_event_ids[-1] == "evt_2" and stream.last_decision is seen[-1]
        waited = await stream.decide(timeout=10)  # on_change: the first decision covering the state now
        assert waited.state_version == 2
    assert emu.stats.decisions_billed == 2


async def test_validation_errors_change_nothing_and_send_nothing(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    emu = await make_emulator()
    async with make_stream(emu, fast_backoff) as stream:
        with pytest.raises(SystemZeroValidationError, match="append_items needs an array state"):
            await stream.append_items([1])
        with pytest.raises(SystemZeroValidationError, match="idempotency_key"):
            await stream.append_text("x", idempotency_key="\x00")
        assert stream.state == "Initial log\n" and stream.in_sync
    assert emu.stats.events_accepted == 1 and emu.stats.rejections == 0


async def test_a_state_the_gateway_refuses_for_good_raises_stream_rejected(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    emu = await make_emulator(limits=TEST_LIMITS.replace(max_decide_body_bytes=300))
    with pytest.raises(StreamRejected, match="decide_body_too_large"):
        async with make_stream(emu, fast_backoff, state="x" * 400):
            pass
    assert emu.stats.rejections == 1 and emu.stats.streams_total == 1  # raised at once, no retry loop


# ------------------------------------------------------------------ reconnect paths


async def test_abrupt_loss_mid_decide_is_replayed_and_the_caller_sees_one_decision(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    emu = await make_emulator(decide_latency_ms=300)
    async with make_stream(emu, fast_backoff) as stream:
        await stream.append_text("Job is ready.\n")
        pending = asyncio.create_task(stream.decide(timeout=20))
        await emu.wait_for(lambda e: e.stats.decisions_dispatched == 1, timeout=5)
        body_before = stream.session.desired_body()
        await emu.drop_all()  # no close frame: the client sees 1006
        decision = await pending
        assert decision.decisions() == {"ready": True}
        [reconnect] = stream.reconnects
        assert reconnect.reason == "close" and reconnect.close_code == 1006 and reconnect.server_delay is None
        assert stream.session.desired_body() == body_before
    # the interrupted call finished on the gateway and billed once; the re-sent decide replayed it
    assert len(billed_for(emu)) == 1 and emu.billed_bodies() == [body_hash(body_before)]
    assert [e.body_sha256 for e in emu.ledger[SECRET_KEY]] == [body_hash(body_before)] * len(
        emu.ledger[SECRET_KEY]
    )
    assert_each_state_billed_once(emu)


async def test_a_decide_resent_while_the_original_call_runs_waits_it_out(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    emu = await make_emulator(decide_latency_ms=1_200)
    async with make_stream(emu, fast_backoff, state="Job is ready.\n", decide_retries=0) as stream:
        pending = asyncio.create_task(stream.decide(timeout=20))
        await emu.wait_for(lambda e: e.stats.decisions_dispatched == 1, timeout=5)
        await emu.drop_all()
        decision = await pending  # 409 idempotency_conflict until the original call finishes
    assert decision.decisions() == {"ready": True}
    assert emu.stats.decide_failures.get(409, 0) >= 1 and len(billed_for(emu)) == 1


async def test_a_write_that_fails_on_a_lost_connection_leads_to_a_replay(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    emu = await make_emulator()
    async with make_stream(emu, fast_backoff) as stream:
        assert stream.connection is not None
        ws = stream.connection.socket
        assert ws is not None

        write = ws.transport.write

        def write_into_a_dead_socket(data: Any) -> None:
            ws.transport.abort()  # the connection dies under the write, before the reader notices
            write(data)  # what a lost connection is given is dropped

        ws.transport.write = write_into_a_dead_socket  # type: ignore[method-assign]
        await stream.append_text("Job is ready.\n")
        await emu.wait_for(
            lambda e: bool(stream.reconnects) and stream.connected and stream.in_sync, timeout=10
        )
        assert stream.reconnects[0].close_code == 1006
        assert (await stream.decide(timeout=10)).decisions() == {"ready": True}
    latest = emu.latest_state(stream.request.prompt_cache_key or "")
    assert latest is not None and latest.state == "Initial log\nJob is ready.\n"


async def test_unanswered_pings_close_1013_slow_reader_and_the_client_recovers(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    emu = await make_emulator(limits=SHORT_PONG)
    async with make_stream(emu, fast_backoff) as stream:
        await stream.decide(timeout=10)
        session = stream.session
        original = session.outgoing
        muted = True

        def without_pongs(now: float) -> list[Any]:
            messages = original(now)
            return [m for m in messages if not (muted and isinstance(m, Pong))]

        session.outgoing = without_pongs  # type: ignore[method-assign]
        await emu.wait_for(lambda e: e.stats.closes_by_code.get(1013, 0) >= 1, timeout=10)
        muted = False
        await assert_no_reconnect_without_work(emu, stream)
        await assert_replay_is_answered_from_the_ledger(emu, stream)  # the decide reconnects
        assert stream.reconnects[0].close_code == 1013 and stream.reconnects[0].reason == "close"
        await stream.append_text("Job is ready.\n")
        assert (await stream.decide(timeout=10)).decisions() == {"ready": True}
    assert_each_state_billed_once(emu)


async def test_answered_pings_keep_a_quiet_stream_alive(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    emu = await make_emulator(limits=SHORT_PONG)
    async with make_stream(emu, fast_backoff) as stream:
        # several heartbeat intervals (400 ms) and pong timeouts (300 ms) pass with no application traffic
        await emu.wait_for(lambda e: e.stats.messages_sent.get("ping", 0) >= 4, timeout=10)
        assert stream.connected and not stream.reconnects
    assert emu.stats.closes_by_code == {1000: 1}


async def test_three_failed_dispatches_close_1013_and_the_state_is_replayed_after_the_delay(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    emu = await make_emulator()
    emu.faults.fail_decides(3, status=503, retry_after_ms=200)
    async with make_stream(emu, fast_backoff, mode="on_change", state="Job is ready.\n") as stream:
        decision = await stream.decide(timeout=15)
        assert decision.decisions() == {"ready": True}
        [reconnect] = stream.reconnects
        assert reconnect.reason == "goodbye:overload" and reconnect.close_code == 1013
        assert reconnect.server_delay == 0.2 and reconnect.waited >= 0.2
        # overcome by the decision: a later timeout would not blame it
        assert stream.last_error_text is None
    assert emu.stats.decide_failures == {503: 3} and len(billed_for(emu)) == 1
    assert_each_state_billed_once(emu)


async def test_a_silent_peer_is_treated_as_dead(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    emu = await make_emulator(limits=SHORT_PONG)  # silent for 0.7 s: dead
    async with make_stream(emu, fast_backoff) as stream:
        await stream.decide(timeout=10)
        emu.faults.answer_pings = False  # the gateway stops sending anything at all
        await emu.wait_for(lambda e: not stream.connected, timeout=5)
        emu.faults.answer_pings = True
        await assert_no_reconnect_without_work(emu, stream)
        await assert_replay_is_answered_from_the_ledger(emu, stream)  # the decide reconnects
        assert stream.reconnects[0].reason in ("receipt_timeout", "close")
        assert stream.reconnects[0].close_code in (1006, 1011)
    assert_each_state_billed_once(emu)


async def test_an_idle_goodbye_reconnects_only_when_there_is_work(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    emu = await make_emulator(limits=TEST_LIMITS.replace(idle_timeout_ms=300))
    async with make_stream(emu, fast_backoff) as stream:
        first = await stream.decide(timeout=10)
        await emu.wait_for(lambda e: stream.dormant, timeout=5)  # goodbye idle_timeout, close 1000
        assert emu.stats.closes_by_code == {1000: 1} and emu.stats.streams_open == 0
        assert not stream.has_work() and not stream.reconnects
        await stream.append_text("Job is ready.\n")  # work: reconnect, replay, append nothing more
        second = await stream.decide(timeout=10)
        [reconnect] = stream.reconnects
        assert reconnect.reason == "goodbye:idle_timeout" and reconnect.close_code == 1000
    assert first.decisions() == {"ready": False} and second.decisions() == {"ready": True}
    assert second.covered_event_ids == ("evt_1",)  # the replay carried the new text
    assert emu.stats.streams_total == 2 and len(billed_for(emu)) == 2
    assert_each_state_billed_once(emu)


async def test_a_lifetime_goodbye_reconnects_only_when_there_is_work(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    emu = await make_emulator(limits=TEST_LIMITS.replace(max_duration_ms=700))
    async with make_stream(emu, fast_backoff, mode="on_change") as stream:
        await stream.decide(timeout=10)
        await emu.wait_for(lambda e: stream.dormant, timeout=5)
        assert emu.stats.messages_sent.get("goodbye") == 1 and not stream.reconnects
        await stream.append_text("Job is ready.\n")
        decision = await stream.decide(timeout=10)
        assert decision.decisions() == {"ready": True}
        assert stream.reconnects[0].reason == "goodbye:max_duration"
    assert_each_state_billed_once(emu)


async def test_a_429_upgrade_is_retried_after_retry_after(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    emu = await make_emulator()
    async with make_stream(emu, fast_backoff) as stream:
        await stream.append_text("Job is ready.\n")
        await stream.decide(timeout=10)
        emu.faults.refuse_upgrades(1, status=429, code="stream_capacity", retry_after_s=1)
        await emu.restart(retry_after_ms=0)
        await assert_no_reconnect_without_work(emu, stream)
        # the next decide reconnects, meets a full account, and is answered after Retry-After
        await assert_replay_is_answered_from_the_ledger(emu, stream)
        first, second = stream.reconnects
        assert (first.reason, first.close_code) == ("goodbye:shutdown", 1012)
        assert second.reason == "upgrade_refused:429" and second.server_delay == 1.0 and second.waited >= 1.0
    assert emu.stats.upgrade_refusals == {429: 1}
    assert_each_state_billed_once(emu)


async def test_a_release_closes_1000_and_the_next_change_reconnects(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    emu = await make_emulator()
    async with make_stream(emu, fast_backoff) as stream:
        await stream.release()
        assert not stream.connected and stream.dormant
        await emu.wait_for(lambda e: e.stats.streams_open == 0, timeout=5)
        await stream.append_text("Job is ready.\n")
        assert (await stream.decide(timeout=10)).decisions() == {"ready": True}
        assert stream.reconnects[0].reason == "released"
    assert emu.stats.closes_by_code == {1000: 2}


# ------------------------------------------------------------------ decide failures


async def test_retryable_decide_failures_are_retried_after_the_server_delay(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    emu = await make_emulator()
    emu.faults.fail_decides(2, status=503, retry_after_ms=150)
    async with make_stream(emu, fast_backoff, state="Job is ready.\n") as stream:
        loop = asyncio.get_running_loop()
        started = loop.time()
        decision = await stream.decide(timeout=10)
        assert loop.time() - started >= 0.3  # two waits of at least 150 ms
    assert decision.decisions() == {"ready": True} and emu.stats.decide_failures == {503: 2}


async def test_non_retryable_decide_failures_raise_at_once(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    emu = await make_emulator()
    emu.faults.fail_decides(1, status=422, code="invalid_questions", retryable=False)
    async with make_stream(emu, fast_backoff) as stream:
        with pytest.raises(DecisionFailed, match="HTTP 422") as info:
            await stream.decide(timeout=10)
        assert info.value.http_status == 422 and not info.value.retryable
        assert info.value.envelope.code == "invalid_questions"
        assert (await stream.decide(timeout=10)).decisions() == {"ready": False}  # the stream goes on


# ------------------------------------------------------------------ pacing


async def test_a_burst_of_1000_appends_is_paced_without_rejections(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    emu = await make_emulator()
    lines = [f"line {n}\n" for n in range(1000)]
    async with make_stream(emu, fast_backoff, state="") as stream:
        for n, line in enumerate(lines):
            await stream.append_text(line, idempotency_key=f"burst-{n}")
        await stream.wait_in_sync(timeout=20)
        decision = await stream.decide(timeout=10)
        latest = emu.latest_state(stream.request.prompt_cache_key or "")
    expected = "".join(lines)
    assert stream.state == expected and latest is not None and latest.state == expected
    assert emu.stats.rejections == 0 and emu.stats.protocol_refusals == 0
    assert 2 <= emu.stats.events_accepted <= 30  # coalesced, not 1000 mutations
    assert decision.covered_event_ids[-1] == f"evt_{emu.stats.events_accepted}"
    assert emu.ledger[SECRET_KEY][-1].idempotency_key == "burst-999"  # the newest key names the state


# ------------------------------------------------------------------ capacity and cancellation


async def test_ten_concurrent_streams_never_exceed_the_process_cap(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    emu = await make_emulator(decide_latency_ms=100)
    capacity = default_capacity()

    async def one(n: int) -> bool:
        async with make_stream(emu, fast_backoff, identity=f"cap-{n}", state=f"stream {n}\n") as stream:
            assert capacity.in_use <= 4
            await stream.append_text("Job is ready.\n")
            return (await stream.decide(timeout=30)).decisions()["ready"]

    results = await asyncio.gather(*(one(n) for n in range(10)))
    assert results == [True] * 10
    assert emu.stats.max_streams_open == 4 and capacity.max_in_use == 4  # the cap was reached, never passed
    assert emu.stats.upgrade_refusals == {} and emu.stats.streams_total == 10
    assert capacity.in_use == 0 and capacity.waiting == 0


async def test_cancelling_a_waiting_decide_closes_the_socket(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    emu = await make_emulator(decide_latency_ms=30_000)

    async def waits_forever() -> None:
        async with make_stream(emu, fast_backoff) as stream:
            await stream.decide()

    task = asyncio.create_task(waits_forever())
    await emu.wait_for(lambda e: e.stats.decisions_dispatched == 1 and e.stats.streams_open == 1, timeout=5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await emu.wait_for(lambda e: e.stats.streams_open == 0, timeout=5)
    assert emu.stats.closes_by_code == {1000: 1}  # a clean close, not an abandoned socket
    assert default_capacity().in_use == 0


async def test_cancelling_a_stream_waiting_for_a_slot_leaves_the_queue(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    emu = await make_emulator()
    capacity = StreamCapacity(1)
    async with make_stream(emu, fast_backoff, capacity=capacity, identity="holder"):
        waiting = asyncio.create_task(
            make_stream(emu, fast_backoff, capacity=capacity, identity="waiter").__aenter__()
        )
        await emu.wait_for(lambda e: capacity.waiting == 1, timeout=5)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert capacity.waiting == 0 and capacity.in_use == 1
    assert capacity.in_use == 0 and emu.stats.streams_total == 1


async def test_the_stream_cap_follows_a_lower_advertised_limit(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    emu = await make_emulator(limits=TEST_LIMITS.replace(max_streams_per_process=2))
    async with make_stream(emu, fast_backoff) as stream:
        assert stream.settings is not None and default_capacity().limit_for(stream.settings.url) == 2
        assert default_capacity().limit == 4  # streams to other gateways keep the process's limit
    assert Limits().max_streams_per_process == 4  # the document's default is unchanged
