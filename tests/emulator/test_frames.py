"""How client frames reach the gateway session: a complete text frame is handled (and answered)
in the callback that read it; anything else — a fragmented message, a frame that is not valid
UTF-8, a frame behind one still waiting in websockets' reader — takes websockets' own path, in
order."""

from __future__ import annotations

import asyncio
import json
import secrets
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection

from airflow_provider_systemzero.emulator import Emulator
from airflow_provider_systemzero.emulator.connection import EmulatorConnection, StreamLoop, _hello_frame
from airflow_provider_systemzero.protocol import GatewaySession, Limits
from airflow_provider_systemzero.protocol.gateway import SendMessage
from airflow_provider_systemzero.protocol.messages import Hello, encode_message
from tests.helpers import live_timers
from tests.helpers.wire import FAST, close_of, recv, recv_type, start_message, stream, until_closed


def append(n: int) -> dict[str, Any]:
    return {"type": "append_text", "event_id": f"evt_{n}", "text": f"line {n}\n"}


def _write_together(ws: ClientConnection) -> None:
    """Write every frame the client's protocol holds in one ``write`` (one segment on loopback),
    so the gateway parses them in one ``data_received``."""
    ws.transport.write(b"".join(ws.protocol.data_to_send()))


async def _acks(ws: ClientConnection, count: int) -> list[dict[str, Any]]:
    messages = []
    async with asyncio.timeout(5):
        while len(messages) < count:
            message = await recv(ws)
            if message["type"] in ("ack", "error"):
                messages.append(message)
    return messages


async def test_a_complete_frame_is_answered_in_the_callback_that_read_it(
    emu: Emulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    written_while_reading: list[bool] = []
    reading = False
    data_received, send_data = EmulatorConnection.data_received, EmulatorConnection.send_data

    def spied_data_received(self: EmulatorConnection, data: bytes) -> None:
        nonlocal reading
        reading = True
        try:
            data_received(self, data)
        finally:
            reading = False

    def spied_send_data(self: EmulatorConnection) -> None:
        write = self.transport.write

        def spied_write(data: Any) -> None:
            written_while_reading.append(reading)
            write(data)

        self.transport.write = spied_write  # type: ignore[method-assign]
        try:
            send_data(self)
        finally:
            del self.transport.write

    readers: list[StreamLoop] = []
    start_reader = StreamLoop.start_reader

    def spied_start_reader(self: StreamLoop) -> None:
        readers.append(self)
        start_reader(self)

    monkeypatch.setattr(EmulatorConnection, "data_received", spied_data_received)
    monkeypatch.setattr(EmulatorConnection, "send_data", spied_send_data)
    monkeypatch.setattr(StreamLoop, "start_reader", spied_start_reader)
    async with stream(emu) as ws:
        assert (await recv(ws))["type"] == "hello"
        written_while_reading.clear()
        await ws.send(json.dumps(start_message(mode="on_change")))
        ack = await recv_type(ws, "ack")
        decision = await recv_type(ws, "decision")
        assert (ack["seq"], decision["seq"]) == (2, 3)
        # the ack and the decision left in one write, made inside the data_received of the start
        assert written_while_reading == [True]
    assert readers == []  # no frame needed websockets' reader


async def test_a_fragmented_message_is_reassembled_and_a_frame_behind_it_waits_for_it(emu: Emulator) -> None:
    async with stream(emu) as ws:
        await recv(ws)  # hello
        start = json.dumps(start_message(mode="on_request")).encode()
        third = len(start) // 3
        protocol = ws.protocol
        protocol.send_text(start[:third], fin=False)
        protocol.send_continuation(start[third : 2 * third], fin=False)
        protocol.send_continuation(start[2 * third :], fin=True)
        protocol.send_text(json.dumps(append(2)).encode())  # complete, but behind the fragments
        _write_together(ws)
        first, second = await _acks(ws, 2)
        assert (first["type"], first["event_id"], first["state_version"]) == ("ack", "evt_1", 1)
        assert (second["type"], second["event_id"], second["state_version"]) == ("ack", "evt_2", 2)
        # and once the reader delivered them, complete frames are answered directly again
        await ws.send(json.dumps(append(3)))
        (third_ack,) = await _acks(ws, 1)
        assert (third_ack["type"], third_ack["event_id"]) == ("ack", "evt_3")
    assert emu.stats.events_accepted == 3


async def test_frames_sent_before_the_stream_is_attached_follow_hello_in_order(
    emu: Emulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = StreamLoop.run
    attached = asyncio.Event()

    async def late_run(self: StreamLoop) -> None:
        await asyncio.sleep(0.2)  # the client's frames arrive before the stream handles any
        attached.set()
        await run(self)

    monkeypatch.setattr(StreamLoop, "run", late_run)
    async with stream(emu) as ws:
        await ws.send(json.dumps(start_message(mode="on_request")))
        await ws.send(json.dumps(append(2)))
        await attached.wait()
        hello = await recv(ws)
        assert (hello["type"], hello["seq"]) == ("hello", 1)
        first, second = await _acks(ws, 2)
        assert [(m["event_id"], m["seq"]) for m in (first, second)] == [("evt_1", 2), ("evt_2", 3)]


async def test_a_text_frame_that_is_not_utf8_closes_1007(emu: Emulator) -> None:
    async with stream(emu) as ws:
        await recv(ws)  # hello
        ws.protocol.send_text(b'{"type": "pong", "nonce": "\xff\xfe"}')
        _write_together(ws)
        assert await until_closed(ws) == []
        assert close_of(ws)[0] == 1007
    await emu.wait_for(lambda e: e.stats.streams_open == 0)
    assert emu.stats.closes_by_code == {1007: 1}
    assert emu.stats.protocol_refusals == 0  # websockets closed it: no JSON error was sent


def _timers_of(stream: StreamLoop) -> list[asyncio.TimerHandle]:
    """The live timers whose callback is a method of ``stream``."""
    return [handle for handle, callback in live_timers() if getattr(callback, "__self__", None) is stream]


async def test_the_stream_keeps_one_timer_while_changes_come(emu: Emulator) -> None:
    async with stream(emu) as ws:
        await recv(ws)  # hello
        await ws.send(json.dumps(start_message(mode="on_request")))
        await _acks(ws, 1)
        (loop,) = emu.open_streams
        (timer,) = _timers_of(loop)
        for n in range(2, 7):
            await ws.send(json.dumps(append(n)))
            await _acks(ws, 1)
        # each change moved the idle deadline later; the timer set for the first one stays
        assert _timers_of(loop) == [timer]


@pytest.mark.parametrize("limits", [Limits(), FAST])
def test_a_hello_frame_is_the_encoding_of_its_message(limits: Limits) -> None:
    for _ in range(3):  # the first builds the stream-independent frame, the others reuse it
        stream_id = "szws_" + secrets.token_hex(16)
        session = GatewaySession(stream_id=stream_id, now=0.0, limits=limits)
        (action,) = session.actions()
        assert isinstance(action, SendMessage) and isinstance(action.message, Hello)
        assert _hello_frame(action.message) == encode_message(action.message).encode()
    other = Hello("szws_" + "a" * 32, 1, "system-zero.stream.v1", "req_elsewhere", limits, {"limit": 5})
    assert _hello_frame(other) == encode_message(other).encode()


async def test_the_upgrade_response_and_hello_leave_in_one_write(
    emu: Emulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes: list[bytes] = []
    connection_made = EmulatorConnection.connection_made

    def spied_connection_made(self: EmulatorConnection, transport: Any) -> None:
        connection_made(self, transport)
        write = transport.write

        def spied_write(data: Any) -> None:
            writes.append(bytes(data))
            write(data)

        transport.write = spied_write

    monkeypatch.setattr(EmulatorConnection, "connection_made", spied_connection_made)
    async with stream(emu) as ws:
        hello = await recv(ws)
    assert hello["type"] == "hello"
    first = writes[0]
    assert first.startswith(b"HTTP/1.1 101 ") and b'"type":"hello"' in first
