"""Decide failures: error frames, the on_change retry policy and the overload fatal path (WIRE.md §5)."""

from __future__ import annotations

from typing import Any

from airflow_provider_systemzero.emulator import Emulator
from tests.helpers.wire import FAST, close_of, recv, recv_type, send, start_message, stream, until_closed


def envelope(message: dict[str, Any]) -> dict[str, Any]:
    return message["error"]["envelope"]["error"]


async def test_retryable_failure_is_retried_after_its_delay(emu: Emulator) -> None:
    emu.faults.fail_decides(1, status=503, retry_after_ms=100)
    async with stream(emu) as ws:
        await recv(ws)
        await send(ws, start_message(mode="on_change"))
        assert (await recv(ws))["type"] == "ack"
        error = await recv(ws)
        assert (
            error["type"],
            error["event_id"],
            error["state_version"],
            error["http_status"],
            error["fatal"],
        ) == ("error", None, 1, 503, False)
        assert envelope(error) == {**envelope(error), "type": "overloaded_error", "code": "overloaded"}
        assert error["error"]["retry"] == {"retryable": True, "retry_after_ms": 100}
        assert error["request_id"].startswith("req_")
        decision = await recv(ws)
        # A failed dispatch loses nothing: the retry covers the same events.
        assert (decision["type"], decision["covered_event_ids"]) == ("decision", ["evt_1"])
        assert decision["queue_ms"] >= 90
    assert emu.stats.decide_failures == {503: 1}
    assert emu.stats.decisions_dispatched == 2 and emu.stats.decisions_billed == 1


async def test_retry_after_seconds_and_ms_precedence(emu: Emulator) -> None:
    emu.faults.fail_decides(1, status=429, retry_after_s=5, retry_after_ms=50)
    async with stream(emu) as ws:
        await recv(ws)
        await send(ws, start_message(mode="on_change"))
        error = await recv_type(ws, "error")
        assert error["error"]["retry"] == {"retryable": True, "retry_after_ms": 50}
        assert envelope(error)["type"] == "rate_limit_error"
        await recv_type(ws, "decision")


async def test_conflict_409_is_retried_but_other_failures_are_not(emu: Emulator) -> None:
    emu.faults.fail_decides(1, status=409, code="idempotency_conflict", retry_after_ms=50)
    emu.faults.fail_decides(1, status=503, code="maintenance", retry_after_ms=50)
    async with stream(emu) as ws:
        await recv(ws)
        await send(ws, start_message(mode="on_change"))
        await recv_type(ws, "ack")
        first, second = await recv(ws), await recv(ws)
        assert (first["http_status"], second["http_status"]) == (409, 503)
        assert envelope(second)["code"] == "maintenance" and second["fatal"] is False
        # 503 maintenance is not retried automatically: the next change schedules again.
        await send(ws, {"type": "append_text", "event_id": "evt_2", "text": "more"})
        await recv_type(ws, "ack")
        decision = await recv(ws)
        assert decision["covered_event_ids"] == ["evt_1", "evt_2"]
    assert emu.stats.decisions_dispatched == 3


async def test_non_retryable_failure_is_reported_once(emu: Emulator) -> None:
    emu.faults.fail_decides(1, status=503, retryable=False)
    async with stream(emu) as ws:
        await recv(ws)
        await send(ws, start_message(mode="on_change"))
        await recv_type(ws, "ack")
        error = await recv(ws)
        assert error["error"]["retry"]["retryable"] is False
        messages = await until_closed(ws)  # nothing more until the idle goodbye
    assert [m["type"] for m in messages] == ["goodbye"]
    assert emu.stats.decisions_dispatched == 1


async def test_three_retryable_failures_are_fatal_overload() -> None:
    async with Emulator(limits=FAST.replace(idle_timeout_ms=5000)) as emu, stream(emu) as ws:
        emu.faults.fail_decides(3, status=503, retry_after_ms=60)
        await recv(ws)
        await send(ws, start_message(mode="on_change"))
        messages = await until_closed(ws)
    assert [m["type"] for m in messages] == ["ack", "error", "error", "error", "goodbye"]
    assert [m["fatal"] for m in messages[1:4]] == [False, False, True]
    assert messages[3]["error"]["retry"] == {"retryable": True, "retry_after_ms": 60}  # keeps the HTTP retry
    goodbye = messages[4]
    assert (goodbye["reason"], goodbye["resume"]["retry_after_ms"], goodbye["state_version"]) == (
        "overload",
        60,
        1,
    )
    assert close_of(ws) == (1013, "overload")
    assert emu.stats.closes_by_code == {1013: 1}


async def test_a_retry_beyond_the_lifetime_is_fatal_at_once() -> None:
    async with Emulator(limits=FAST.replace(max_duration_ms=2000)) as emu, stream(emu) as ws:
        emu.faults.fail_decides(1, status=503, retry_after_s=5)
        await recv(ws)
        await send(ws, start_message(mode="on_change"))
        messages = await until_closed(ws)
    assert [m["type"] for m in messages] == ["ack", "error", "goodbye"]
    assert messages[1]["fatal"] is True
    assert (messages[2]["reason"], messages[2]["resume"]["retry_after_ms"]) == ("overload", 5000)
    assert close_of(ws) == (1013, "overload")


async def test_on_request_never_retries(emu: Emulator) -> None:
    emu.faults.fail_decides(1, status=503, retry_after_ms=10)
    async with stream(emu) as ws:
        await recv(ws)
        await send(ws, start_message())
        await recv(ws)
        await send(ws, {"type": "decide", "state_version": 1})
        assert (await recv(ws))["type"] == "scheduled"
        error = await recv(ws)
        assert (error["type"], error["fatal"]) == ("error", False)
        await send(ws, {"type": "decide", "state_version": 1})
        await recv_type(ws, "scheduled")
        assert (await recv(ws))["covered_event_ids"] == ["evt_1"]
    assert emu.stats.decisions_dispatched == 2


async def test_account_decision_bucket_answers_429_and_on_change_retries() -> None:
    limits = FAST.replace(
        account_decision_burst=1, account_decision_ceiling_per_minute=600, idle_timeout_ms=5000
    )
    async with Emulator(limits=limits) as emu, stream(emu) as ws:
        await recv(ws)
        await send(ws, start_message(mode="on_change", key=None))
        await recv_type(ws, "decision")
        await send(ws, {"type": "append_text", "event_id": "evt_2", "text": "x"})
        await recv_type(ws, "ack")
        error = await recv(ws)
        assert (error["http_status"], envelope(error)["code"]) == (429, "rate_limited")
        assert 0 < error["error"]["retry"]["retry_after_ms"] <= 100
        decision = await recv(ws)
        assert decision["covered_event_ids"] == ["evt_2"]
    assert emu.stats.decisions_billed == 2
