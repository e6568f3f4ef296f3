"""Decide idempotency across connections (WIRE.md §3): bill once, 409 while in flight, 422 for a new body."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection

from airflow_provider_systemzero.emulator import Emulator
from tests.helpers.wire import FAST, recv, recv_type, send, start_message, stream

STATE = "Initial log\nJob is ready.\n"


async def decide_once(ws: ClientConnection, start: dict[str, Any]) -> dict[str, Any]:
    """Open with ``start`` (on_request), decide version 1, return the decision or error."""
    await recv(ws)
    await send(ws, start)
    await recv_type(ws, "ack")
    await send(ws, {"type": "decide", "state_version": 1})
    await recv_type(ws, "scheduled")
    async with asyncio.timeout(5):
        while True:
            message = await recv(ws)
            if message["type"] in ("decision", "error"):
                return message


async def test_replay_across_two_connections_is_billed_once(emu: Emulator) -> None:
    start = start_message(STATE, key="state-1")
    async with stream(emu) as first:
        original = await decide_once(first, start)
    async with stream(emu) as second:
        replayed = await decide_once(second, start)
    assert original["type"] == replayed["type"] == "decision"
    assert replayed["reply"] == original["reply"]  # the original reply, same id
    assert replayed["stream_id"] != original["stream_id"]
    stats = emu.stats
    assert (stats.decisions_dispatched, stats.decisions_billed, stats.decisions_replayed) == (2, 1, 1)
    body_sha = emu.ledger["demo"][0].body_sha256
    assert emu.billed_bodies() == [body_sha]
    assert [(e.idempotency_key, e.billed, e.reply_id) for e in emu.ledger["demo"]] == [
        ("state-1", True, original["reply"]["id"]),
        ("state-1", False, original["reply"]["id"]),
    ]
    body = (
        '{"model":"MODEL_ID","state":"Initial log\\nJob is ready.\\n","questions":{"ready":{"type":"boolean",'
        '"instructions":"Is the job ready?"}},"prompt_cache_key":"example-affinity"}'
    )
    assert body_sha == hashlib.sha256(body.encode()).hexdigest()


async def test_each_decision_is_one_log_line_saying_billed_or_replayed(
    emu: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    """``--log-level INFO`` (the default) promises one line per decision: its reply, and whether
    it was billed or replayed for nothing; never the key."""
    caplog.set_level(logging.INFO, logger="airflow_provider_systemzero.emulator")
    start = start_message(STATE, key="state-1")
    for _ in range(2):
        async with stream(emu) as ws:
            reply_id = (await decide_once(ws, start))["reply"]["id"]
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("decision szd_")]
    assert lines[0].startswith(f"decision {reply_id} billed (account sha256:")
    assert lines[1].startswith(f"decision {reply_id} replayed, not billed (account sha256:")
    assert len(lines) == 2 and "demo" not in " ".join(lines)


async def test_a_changed_body_under_the_same_key_is_422(emu: Emulator) -> None:
    async with stream(emu) as first:
        await decide_once(first, start_message(STATE, key="state-1"))
    async with stream(emu) as second:
        error = await decide_once(second, start_message(STATE + "more\n", key="state-1"))
    assert (error["type"], error["http_status"], error["fatal"]) == ("error", 422, False)
    assert error["error"]["envelope"]["error"]["code"] == "idempotency_key_reused"
    assert error["error"]["envelope"]["error"]["type"] == "idempotency_error"
    assert error["error"]["retry"]["retryable"] is False
    assert emu.stats.decisions_billed == 1


async def test_without_a_stable_cache_key_a_replay_is_not_byte_identical(emu: Emulator) -> None:
    # The body carries the stream_id as prompt_cache_key, so the same key names another body.
    async with stream(emu) as first:
        await decide_once(first, start_message(STATE, key="state-1", cache_key=None))
    async with stream(emu) as second:
        error = await decide_once(second, start_message(STATE, key="state-1", cache_key=None))
    assert error["http_status"] == 422


async def test_conflict_while_in_flight_then_replay() -> None:
    # Two connections replay the same keyed state at once (say, a reconnect racing the old
    # connection's decide): the second gets 409, retries after Retry-After-Ms, and is then
    # answered with the first call's reply, billed once.
    async with (
        Emulator(limits=FAST.replace(idle_timeout_ms=5000), decide_latency_ms=300) as emu,
        stream(emu) as a,
        stream(emu) as b,
    ):
        start = start_message(STATE, key="state-1", mode="on_change")
        await recv(a)
        await recv(b)
        await send(a, start)
        await recv_type(a, "ack")
        await emu.wait_for(lambda e: e.backend.calls == 1)
        await send(b, start)
        await recv_type(b, "ack")
        conflict = await recv(b)
        assert (conflict["type"], conflict["http_status"], conflict["fatal"]) == ("error", 409, False)
        assert conflict["error"]["envelope"]["error"]["code"] == "idempotency_conflict"
        assert conflict["error"]["retry"] == {"retryable": True, "retry_after_ms": 1000}
        first = await recv_type(a, "decision")
        second = await recv_type(b, "decision")
        assert second["reply"]["id"] == first["reply"]["id"]
        assert second["covered_event_ids"] == ["evt_1"]
    assert (emu.stats.decisions_billed, emu.stats.decisions_replayed) == (1, 1)
    assert len(emu.billed_bodies()) == 1


async def test_accounts_have_separate_ledgers() -> None:
    async with Emulator(api_keys={"demo": 8, "other": 8}, limits=FAST) as emu:
        start = start_message(STATE, key="state-1")
        async with stream(emu) as a:
            first = await decide_once(a, start)
        async with stream(emu, key="other") as b:
            second = await decide_once(b, start)
        assert first["reply"]["id"] != second["reply"]["id"]
        assert emu.stats.decisions_billed == 2
        assert set(emu.ledger) == {"demo", "other"}
