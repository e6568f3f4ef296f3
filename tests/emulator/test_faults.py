"""Fault injection and the admin-only HTTP control surface."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed, ConnectionClosedError

from airflow_provider_systemzero.emulator import Emulator, mask_secret
from tests.helpers.wire import (
    FAST,
    close_of,
    http,
    recv,
    recv_type,
    send,
    start_message,
    stream,
    until_closed,
)


async def test_restart_says_goodbye_to_every_stream_and_keeps_serving(emu: Emulator) -> None:
    async with stream(emu) as a, stream(emu) as b:
        await recv(a)
        await recv(b)
        await send(a, start_message())
        await recv(a)
        await emu.restart(retry_after_ms=300)
        for ws in (a, b):
            (goodbye,) = await until_closed(ws)
            assert (goodbye["reason"], goodbye["resume"]["retry_after_ms"]) == ("shutdown", 300)
            assert close_of(ws) == (1012, "shutdown")
        async with stream(emu) as c:
            assert (await recv(c))["type"] == "hello"
    assert emu.stats.closes_by_code[1012] == 2


async def test_restart_waits_for_an_in_flight_decide_only_up_to_the_settlement_timeout(emu: Emulator) -> None:
    never = asyncio.Event()

    class Stuck:
        def decide(self, request: Any, *, now: float) -> Any:
            async def answer() -> dict[str, bool]:
                await never.wait()
                return {"ready": True}

            return answer()

    emu.backend.decider = Stuck()
    async with stream(emu) as ws:
        await recv(ws)
        await send(ws, start_message(mode="on_change"))
        await recv_type(ws, "ack")
        await emu.wait_for(lambda e: e.backend.calls == 1)
        await emu.restart(retry_after_ms=100)
        messages = await until_closed(ws)
    assert [(m["type"], m["reason"]) for m in messages] == [("goodbye", "shutdown")]
    assert messages[0]["last_decision_state_version"] is None
    assert close_of(ws)[0] == 1012


async def test_drop_all_aborts_without_a_close_frame(emu: Emulator) -> None:
    async with stream(emu) as ws:
        await recv(ws)
        await emu.drop_all()
        with pytest.raises(ConnectionClosedError):
            async with asyncio.timeout(5):
                await ws.recv()
        assert ws.close_code == 1006 and close_of(ws) == (None, None)
    assert emu.stats.closes_by_code == {1006: 1}
    assert emu.stats.streams_open == 0


async def test_a_silent_peer_answers_nothing() -> None:
    # A start deadline far beyond the test, so nothing the gateway writes before the fault (a
    # start_timeout close on a loaded machine) can be mistaken for a breach of silence.
    async with Emulator(limits=FAST.replace(start_timeout_ms=60_000)) as emu:
        async with stream(emu, ping_interval=0.1, ping_timeout=0.3, close_timeout=0.3) as ws:
            await recv(ws)
            emu.faults.answer_pings = False
            await send(ws, start_message())
            # No ack, no native pong: the client's own keepalive gives up on the peer.
            with pytest.raises(ConnectionClosed):
                async with asyncio.timeout(5):
                    await ws.recv()
        emu.faults.answer_pings = True
        await emu.wait_for(lambda e: e.stats.streams_open == 0)
        assert emu.stats.events_accepted == 1  # the server still read and applied the start
        async with stream(emu) as ws:
            assert (await recv(ws))["type"] == "hello"


async def test_delayed_decisions(emu: Emulator) -> None:
    emu.faults.delay_decisions_ms = 250
    async with stream(emu) as ws:
        await recv(ws)
        await send(ws, start_message(mode="on_change"))
        decision = await recv_type(ws, "decision")
    assert decision["decide_ms"] >= 240  # asyncio timers may fire a hair early


# --------------------------------------------------------------------------------------------
# the control surface
# --------------------------------------------------------------------------------------------


async def call(emu: Emulator, method: str, path: str, **kwargs: Any) -> tuple[int, dict[str, str], Any]:
    return await asyncio.to_thread(http, emu, method, path, **kwargs)


async def test_control_surface_requires_the_admin_token(emu: Emulator) -> None:
    for kwargs in ({}, {"token": "wrong"}, {"token": "demo"}, {"headers": {"X-Emulator-Token": ""}}):
        status, headers, body = await call(emu, "GET", "/_emulator/stats", **kwargs)
        assert status == 401, kwargs
        assert body["error"]["code"] == "admin_token_required"
        assert headers["Content-Type"] == "application/json"
    for path in ("/_emulator/faults?fail=1", "/_emulator/restart", "/_emulator/drop", "/_emulator/nothing"):
        assert (await call(emu, "POST", path))[0] == 401
    assert emu.faults.pending_decide_failures == 0
    assert emu.stats.upgrade_refusals == {} and emu.handshakes == [] and emu.upgrades == []


async def test_control_surface_stats_and_faults(emu: Emulator) -> None:
    async with stream(emu) as ws:
        await recv(ws)
        status, _, stats = await call(emu, "GET", "/_emulator/stats", token=emu.admin_token)
        assert status == 200
        assert stats["streams_open"] == 1
        assert stats["connections_by_account"] == {mask_secret("demo"): 1}
        status, _, stats = await call(
            emu, "GET", "/_emulator/stats", headers={"X-Emulator-Token": emu.admin_token}
        )
        assert status == 200

        status, _, faults = await call(
            emu,
            "POST",
            "/_emulator/faults?fail=2&status=429&retry_after_ms=100&delay_ms=5&refuse=1&refuse_status=503",
            token=emu.admin_token,
        )
        assert status == 200
        assert [f["status"] for f in faults["decide_failures"]] == [429, 429]
        assert faults["decide_failures"][0]["retry_after_ms"] == 100
        assert faults["delay_decisions_ms"] == 5
        assert [r["status"] for r in faults["upgrade_refusals"]] == [503]
        assert (await call(emu, "GET", "/_emulator/faults", token=emu.admin_token))[2] == faults
        status, _, faults = await call(
            emu, "POST", "/_emulator/faults?clear=true&answer_pings=true", token=emu.admin_token
        )
        assert faults == {
            "delay_decisions_ms": 0,
            "answer_pings": True,
            "decide_failures": [],
            "upgrade_refusals": [],
        }

        for method, path, expected in (
            ("POST", "/_emulator/faults?bogus=1", 400),
            ("POST", "/_emulator/faults?fail=x", 400),
            ("GET", "/_emulator/restart", 405),
            ("POST", "/_emulator/stats", 405),
            ("GET", "/_emulator/nothing", 404),
        ):
            status, _, body = await call(emu, method, path, token=emu.admin_token)
            assert status == expected, (method, path, body)
            assert set(body["error"]) == {"type", "code", "message"}


async def test_control_surface_restart_and_drop(emu: Emulator) -> None:
    async with stream(emu) as ws:
        await recv(ws)
        status, _, body = await call(
            emu, "POST", "/_emulator/restart?retry_after_ms=700", token=emu.admin_token
        )
        assert (status, body) == (202, {"restarting_streams": 1, "retry_after_ms": 700})
        (goodbye,) = await until_closed(ws)
        assert goodbye["resume"]["retry_after_ms"] == 700
        assert close_of(ws)[0] == 1012
    async with stream(emu) as ws:
        await recv(ws)
        status, _, body = await call(emu, "POST", "/_emulator/drop", token=emu.admin_token)
        assert (status, body) == (202, {"dropping_streams": 1})
        with pytest.raises(ConnectionClosedError):
            async with asyncio.timeout(5):
                await ws.recv()
        assert ws.close_code == 1006


async def test_scripted_failures_through_the_control_surface() -> None:
    async with Emulator(limits=FAST) as emu, stream(emu) as ws:
        await call(
            emu,
            "POST",
            "/_emulator/faults?fail=1&status=503&code=overloaded&retry_after_ms=20",
            token=emu.admin_token,
        )
        await recv(ws)
        await send(ws, start_message(mode="on_change"))
        error = await recv_type(ws, "error")
        assert (error["http_status"], error["error"]["retry"]["retry_after_ms"]) == (503, 20)
        await recv_type(ws, "decision")
