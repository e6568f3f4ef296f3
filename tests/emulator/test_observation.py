"""What tests and benchmarks read back: final_states, latest_state, stats, wait_for."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_systemzero.emulator import AcceptedState, Emulator
from airflow_provider_systemzero.protocol.gateway import GatewayAction, SendMessage
from tests.helpers.wire import recv, send, start_message, stream

PNG = "data:image/png;base64,iVBORw0KGgo="


async def test_final_and_latest_states(emu: Emulator) -> None:
    async with stream(emu) as ws:
        hello = await recv(ws)
        await send(ws, start_message(["a"], cache_key="shared"))
        await send(ws, {"type": "append_items", "event_id": "evt_2", "items": [{"b": 1}]})
        await send(
            ws,
            {
                "type": "append_attachments",
                "event_id": "evt_3",
                "attachments": [{"name": "shot", "data": PNG}],
            },
        )
        for _ in range(3):
            assert (await recv(ws))["type"] == "ack"
        first_id = hello["stream_id"]
        assert emu.final_states[first_id] == AcceptedState(["a", {"b": 1}], [{"name": "shot", "data": PNG}])
        assert emu.latest_state("shared") == (["a", {"b": 1}], [{"name": "shot", "data": PNG}])
    async with stream(emu) as ws:
        second_id = (await recv(ws))["stream_id"]
        await send(ws, start_message("fresh", cache_key="shared"))
        await recv(ws)
    assert emu.latest_state("shared") == ("fresh", [])
    assert set(emu.final_states) == {first_id, second_id}
    assert emu.final_states[first_id].state == ["a", {"b": 1}]  # kept after the stream closed
    assert emu.latest_state("unknown") is None


async def test_a_stream_without_a_cache_key_is_found_by_its_stream_id(emu: Emulator) -> None:
    async with stream(emu) as ws:
        stream_id = (await recv(ws))["stream_id"]
        await send(ws, start_message("s", cache_key=None))
        await recv(ws)
    state = emu.latest_state(stream_id)
    assert state is not None and state.state == "s"


async def test_a_stream_that_never_started_has_no_state(emu: Emulator) -> None:
    async with stream(emu) as ws:
        await recv(ws)
    await emu.wait_for(lambda e: e.stats.streams_total == 1 and e.stats.streams_open == 0)
    assert emu.final_states == {}


async def test_wait_for_times_out_with_the_stats(emu: Emulator) -> None:
    with pytest.raises(TimeoutError, match="streams_open=0"):
        await emu.wait_for(lambda e: e.stats.streams_open == 1, timeout=0.2)


async def test_addresses() -> None:
    emu = Emulator(port=0)
    with pytest.raises(RuntimeError, match="not started"):
        _ = emu.url
    async with emu:
        assert emu.url == f"ws://127.0.0.1:{emu.port}/v1/system-zero/stream"
        assert emu.origin == f"ws://127.0.0.1:{emu.port}"
        assert len(emu.admin_token) >= 32
    with pytest.raises(ValueError, match="non-empty"):
        Emulator(api_keys=["bad key"])
    assert Emulator(api_keys=["a:3", "b"]).accounts == {"a": 3, "b": 8}


async def test_an_action_tap_set_while_a_stream_is_open_sees_its_actions_from_then_on(emu: Emulator) -> None:
    seen: list[tuple[str, str]] = []

    def tap(stream: Any, actions: list[GatewayAction]) -> list[GatewayAction]:
        seen.extend((stream.stream_id, a.message.TYPE) for a in actions if isinstance(a, SendMessage))
        return actions

    async with stream(emu) as ws:
        stream_id = (await recv(ws))["stream_id"]
        await send(ws, start_message(["a"]))
        assert (await recv(ws))["type"] == "ack"
        emu.action_tap = tap
        await send(ws, {"type": "append_items", "event_id": "evt_2", "items": ["b"]})
        assert (await recv(ws))["type"] == "ack"
        emu.action_tap = None
        await send(ws, {"type": "append_items", "event_id": "evt_3", "items": ["c"]})
        assert (await recv(ws))["type"] == "ack"
    assert seen == [(stream_id, "ack")]
