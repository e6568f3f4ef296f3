"""Every upgrade refusal of WIRE.md §1 over real sockets: status, JSON envelope, Retry-After."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from airflow_provider_systemzero.emulator import Emulator, UpgradeRecord
from airflow_provider_systemzero.protocol import PROTOCOL
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

AUTH = {"Authorization": "Bearer demo"}


async def refused(url: str, **kwargs: Any) -> tuple[int, dict[str, str], dict[str, Any]]:
    options: dict[str, Any] = {
        "subprotocols": [PROTOCOL],
        "additional_headers": AUTH,
        "compression": None,
        "open_timeout": 5,
    }
    options.update(kwargs)
    with pytest.raises(InvalidStatus) as info:
        async with connect(url, **options):
            pass
    response = info.value.response
    return response.status_code, dict(response.headers.raw_items()), json.loads(response.body)


@pytest.mark.parametrize(
    ("suffix", "kwargs", "status", "code"),
    [
        ("/", {}, 404, "not_found"),
        ("?debug=1", {}, 400, "query_not_allowed"),
        ("", {"origin": "https://example.com"}, 403, "browser_context_forbidden"),
        ("", {"additional_headers": {**AUTH, "Cookie": "session=1"}}, 403, "browser_context_forbidden"),
        ("", {"compression": "deflate"}, 400, "compression_not_supported"),
        ("", {"subprotocols": None}, 400, "unsupported_protocol"),
        ("", {"subprotocols": [PROTOCOL, "other.v1"]}, 400, "unsupported_protocol"),
        ("", {"additional_headers": {}}, 401, "missing_credentials"),
        ("", {"additional_headers": {"Authorization": "Basic ZGVtbzo="}}, 401, "missing_credentials"),
        ("", {"additional_headers": {"Authorization": "Bearer wrong"}}, 401, "invalid_api_key"),
    ],
)
async def test_static_refusals(
    emu: Emulator, suffix: str, kwargs: dict[str, Any], status: int, code: str
) -> None:
    got_status, headers, body = await refused(emu.url + suffix, **kwargs)
    assert (got_status, body["error"]["code"]) == (status, code)
    assert set(body["error"]) == {"type", "code", "message"}
    assert headers["Content-Type"] == "application/json"
    assert "Retry-After" not in headers
    assert emu.stats.upgrade_refusals == {status: 1}
    assert emu.stats.streams_total == 0


async def test_other_path_is_404(emu: Emulator) -> None:
    status, _, body = await refused(emu.origin + "/v1/system-zero/streams")
    assert (status, body["error"]["code"]) == (404, "not_found")


async def test_account_capacity_is_half_of_max_concurrent() -> None:
    # The streams here never send a start: FAST's 300 ms start timeout would close them under a
    # loaded machine before the counts are read, so this test waits for starts longer.
    patient = dataclasses.replace(FAST, start_timeout_ms=30_000, idle_timeout_ms=30_000)
    async with Emulator(api_keys={"demo": 8, "small": 3}, limits=patient) as emu:
        small = {"additional_headers": {"Authorization": "Bearer small"}}
        async with stream(emu, key="small"):
            status, headers, body = await refused(emu.url, **small)
            assert (status, body["error"]["code"], body["error"]["type"]) == (
                429,
                "stream_capacity",
                "rate_limit_error",
            )
            assert headers["Retry-After"] == "1"
            # Another account is unaffected: demo holds max(1, floor(8 / 2)) = 4 streams.
            others = [
                await connect(emu.url, subprotocols=[PROTOCOL], additional_headers=AUTH, compression=None)
                for _ in range(4)
            ]
            status, headers, body = await refused(emu.url)
            assert (status, body["error"]["code"]) == (429, "stream_capacity")
            assert emu.stats.connections_by_account == {"small": 1, "demo": 4}
            for ws in others:
                await ws.close()
        # A closed stream frees its slot once the gateway saw the close.
        await emu.wait_for(lambda e: e.stats.streams_open == 0)
        async with stream(emu, key="small") as ws:
            assert (await recv(ws))["type"] == "hello"
        assert emu.stats.peak_connections_by_account == {"small": 1, "demo": 4}
        assert emu.stats.upgrade_refusals == {429: 2}


async def test_a_closed_stream_frees_its_slot_before_the_client_sees_the_close() -> None:
    # A client that closes and reconnects at once never meets its own old stream's slot.
    async with Emulator(api_keys=["solo:1"], limits=FAST) as emu:
        for _ in range(20):
            async with stream(emu, key="solo") as ws:
                await recv(ws)
        assert emu.stats.upgrade_refusals == {}
        assert emu.stats.streams_total == 20


async def test_max_concurrent_one_still_allows_one_stream() -> None:
    async with Emulator(api_keys=["solo:1"], limits=FAST) as emu, stream(emu, key="solo") as ws:
        assert (await recv(ws))["type"] == "hello"
        status, _, _ = await refused(emu.url, additional_headers={"Authorization": "Bearer solo"})
        assert status == 429


async def test_shutting_down_refuses_with_503_maintenance() -> None:
    gate = asyncio.Event()

    async def slow(request: Any, now: float) -> dict[str, bool]:
        await gate.wait()
        return {"ready": True}

    class Slow:
        def decide(self, request: Any, *, now: float) -> Any:
            return slow(request, now)

    limits = FAST.replace(decision_settlement_timeout_ms=5000)
    emu = Emulator(limits=limits, decider=Slow())
    await emu.start()
    async with stream(emu) as ws:
        await recv(ws)
        await send(ws, start_message())
        await recv(ws)
        await send(ws, {"type": "decide", "state_version": 1})
        await recv_type(ws, "scheduled")
        # The decide is in flight, so the shutdown waits for it to settle; meanwhile: 503.
        stopping = asyncio.create_task(emu.stop(retry_after_ms=1500))
        await emu.wait_for(lambda e: e.shutting_down)
        status, headers, body = await refused(emu.url)
        assert (status, body["error"]["code"], headers["Retry-After"]) == (503, "maintenance", "2")
        # A mutation during shutdown is still acknowledged, with scheduled: false.
        await send(ws, {"type": "append_text", "event_id": "evt_2", "text": "more\n"})
        ack = await recv_type(ws, "ack")
        assert ack["scheduled"] is False
        gate.set()
        messages = await until_closed(ws)
        assert [m["type"] for m in messages] == ["decision", "goodbye"]
        assert messages[1]["reason"] == "shutdown"
        assert messages[1]["resume"]["retry_after_ms"] == 1500
        assert close_of(ws)[0] == 1012
        await stopping


async def test_scripted_upgrade_refusals(emu: Emulator) -> None:
    emu.faults.refuse_upgrades(2, status=429, retry_after_s=3)
    for _ in range(2):
        status, headers, body = await refused(emu.url)
        assert (status, body["error"]["code"], headers["Retry-After"]) == (429, "rate_limited", "3")
    # An invalid request does not use up a scripted refusal; the next valid one succeeds.
    emu.faults.refuse_upgrades(1, status=503, code="overloaded", retry_after_s=None)
    assert (await refused(emu.url, additional_headers={}))[0] == 401
    status, headers, _ = await refused(emu.url)
    assert status == 503 and "Retry-After" not in headers
    async with stream(emu) as ws:
        assert (await recv(ws))["type"] == "hello"


async def test_handshakes_are_recorded_with_secrets_masked(emu: Emulator) -> None:
    async with stream(emu) as ws:
        await recv(ws)
    (headers,) = emu.handshakes
    assert headers["Authorization"] == "Bearer ***"
    assert headers["Sec-WebSocket-Protocol"] == PROTOCOL
    lowered = {k.lower() for k in headers}
    assert not lowered & {"origin", "cookie", "sec-websocket-extensions"}
    assert "demo" not in json.dumps(emu.handshakes)


async def test_each_upgrade_is_recorded_with_when_it_came_and_how_it_was_answered() -> None:
    solo = {"additional_headers": {"Authorization": "Bearer solo"}}
    async with Emulator(api_keys=["solo:1"], limits=FAST) as emu:
        before = time.monotonic()
        async with stream(emu, key="solo") as ws:
            assert (await recv(ws))["type"] == "hello"
            await refused(emu.url, **solo)  # the account's one stream is taken
        await refused(emu.url, additional_headers={"Authorization": "Bearer wrong"})
        emu.faults.refuse_upgrades(1, status=503, retry_after_s=3)
        await refused(emu.url, **solo)
        after = time.monotonic()
        status, _, _ = await asyncio.to_thread(http, emu, "GET", "/_emulator/stats", token=emu.admin_token)
        assert status == 200  # the control surface is not the stream path: not recorded
    assert [(u.status, u.code, u.retry_after_s, u.accepted) for u in emu.upgrades] == [
        (101, None, None, True),
        (429, "stream_capacity", 1, False),
        (401, "invalid_api_key", None, False),
        (503, "overloaded", 3, False),
    ]
    arrivals = [u.at for u in emu.upgrades]
    assert before <= arrivals[0] and arrivals == sorted(arrivals) and arrivals[-1] <= after
    assert all(isinstance(u, UpgradeRecord) for u in emu.upgrades)
