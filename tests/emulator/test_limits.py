"""Every limit and close path of WIRE.md §7, over real sockets with shrunken limits."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from airflow_provider_systemzero.emulator import Emulator
from airflow_provider_systemzero.protocol import PROTOCOL, Limits
from tests.helpers.wire import FAST, close_of, recv, recv_type, send, start_message, stream, until_closed


def append(n: int, text: str = "x", **extra: Any) -> dict[str, Any]:
    return {"type": "append_text", "event_id": f"evt_{n}", "text": text, **extra}


async def test_start_timeout_is_fatal_and_closes_1008(emu: Emulator) -> None:
    async with stream(emu) as ws:
        await recv(ws)
        messages = await until_closed(ws)
    assert [(m["type"], m["error"]["envelope"]["error"]["code"], m["fatal"]) for m in messages] == [
        ("error", "start_timeout", True)
    ]
    assert close_of(ws) == (1008, "start_timeout")
    assert emu.stats.closes_by_code == {1008: 1}


async def test_a_rejected_start_waits_for_a_corrected_one(emu: Emulator) -> None:
    async with stream(emu) as ws:
        await recv(ws)
        await send(ws, start_message(questions={"9bad": {"type": "boolean", "instructions": "x"}}))
        error = await recv(ws)
        assert (error["type"], error["event_id"], error["fatal"]) == ("error", "evt_1", False)
        assert error["error"]["envelope"]["error"]["code"] == "invalid_question_name"
        await send(ws, start_message())
        assert (await recv(ws))["type"] == "ack"


async def test_message_over_max_message_bytes_closes_1009() -> None:
    async with Emulator(limits=FAST.replace(max_message_bytes=1024)) as emu, stream(emu) as ws:
        await recv(ws)
        await send(ws, start_message())
        await recv(ws)
        await ws.send("x" * 1025)
        assert await until_closed(ws) == []
        assert close_of(ws)[0] == 1009
    assert emu.stats.closes_by_code == {1009: 1}


async def test_event_rate_rejects_without_spending_the_next_id() -> None:
    limits = FAST.replace(max_events_per_second=2, event_burst=2, idle_timeout_ms=5000)
    async with Emulator(limits=limits) as emu, stream(emu) as ws:
        await recv(ws)
        await send(ws, start_message())
        await send(ws, append(2))
        await send(ws, append(3))
        assert [(await recv(ws))["type"] for _ in range(2)] == ["ack", "ack"]
        error = await recv(ws)
        assert (error["type"], error["event_id"], error["fatal"], error["state_version"]) == (
            "error",
            "evt_3",
            False,
            2,
        )
        assert error["error"]["envelope"]["error"] == {
            **error["error"]["envelope"]["error"],
            "type": "rate_limit_error",
            "code": "event_rate_limited",
        }
        retry = error["error"]["retry"]
        assert retry["retryable"] is True and 0 < retry["retry_after_ms"] <= 500
        await asyncio.sleep(retry["retry_after_ms"] / 1000)  # the delay the gateway asked for
        await send(ws, append(3))
        ack = await recv(ws)
        assert (ack["type"], ack["event_id"], ack["state_version"]) == ("ack", "evt_3", 3)
    assert emu.stats.rejections == 1 and emu.stats.protocol_refusals == 0


async def test_message_rate_is_a_refusal() -> None:
    limits = FAST.replace(max_messages_per_second=1, message_burst=3)
    async with Emulator(limits=limits) as emu, stream(emu) as ws:
        await recv(ws)
        await send(ws, start_message(mode="on_change"))
        for n in (2, 3, 4):
            await send(ws, append(n))
        # the acks and decisions of the three admitted messages interleave with the refusal as
        # the decides finish: read up to the refusal, then check nothing else was refused
        error = await recv_type(ws, "error")
        assert error["error"]["envelope"]["error"]["code"] == "message_rate_limited"
        # the refused mutation is named, and when to send it again
        assert error["event_id"] == "evt_4" and error["fatal"] is False
        assert error["error"]["retry"]["retryable"] is True and error["error"]["retry"]["retry_after_ms"] > 0
    assert emu.stats.protocol_refusals == 1


async def test_refusal_limit_closes_1008(emu: Emulator) -> None:
    async with stream(emu) as ws:
        await recv(ws)
        await ws.send("not json")
        await ws.send(b"\x00binary")
        await send(ws, {"type": "no_such_type"})
        messages = await until_closed(ws)
    assert [(m["error"]["envelope"]["error"]["code"], m["fatal"]) for m in messages] == [
        ("invalid_message", False),
        ("invalid_message", False),
        ("unknown_message_type", True),
    ]
    assert close_of(ws) == (1008, "protocol_refusal_limit")
    assert emu.stats.protocol_refusals == 3


async def test_too_many_pending_events_is_a_rejection() -> None:
    async with Emulator(limits=FAST.replace(max_pending_events=2)) as emu, stream(emu) as ws:
        await recv(ws)
        await send(ws, start_message())
        await send(ws, append(2))
        await send(ws, append(3))
        kinds = [await recv(ws) for _ in range(3)]
        assert [m["type"] for m in kinds] == ["ack", "ack", "error"]
        assert kinds[2]["error"]["envelope"]["error"]["code"] == "too_many_pending_events"
        # A decide freezes the pending events; then evt_3 fits.
        await send(ws, {"type": "decide", "state_version": 2})
        await recv_type(ws, "decision")
        await send(ws, append(3))
        assert (await recv(ws))["event_id"] == "evt_3"


async def test_max_events_says_goodbye_and_closes_1008() -> None:
    async with Emulator(limits=FAST.replace(max_events=2)) as emu, stream(emu) as ws:
        await recv(ws)
        await send(ws, start_message())
        await send(ws, append(2))
        await send(ws, append(3))
        messages = await until_closed(ws)
    assert [m["type"] for m in messages] == ["ack", "ack", "error", "goodbye"]
    assert messages[2]["fatal"] is True and messages[2]["error"]["envelope"]["error"]["code"] == "event_limit"
    assert messages[3]["reason"] == "event_limit"
    assert close_of(ws) == (1008, "event_limit")


async def test_missed_pong_closes_1013_slow_reader() -> None:
    limits = FAST.replace(heartbeat_interval_ms=100, pong_timeout_ms=200, start_timeout_ms=5000)
    async with Emulator(limits=limits) as emu, stream(emu) as ws:
        await recv(ws)
        messages = await until_closed(ws, pong=False)
    assert messages and all(m["type"] == "ping" for m in messages)
    assert [m["nonce"] for m in messages] == list(range(1, len(messages) + 1))
    assert close_of(ws) == (1013, "slow_reader")


async def test_answered_pings_keep_the_stream_but_do_not_extend_idle() -> None:
    limits = FAST.replace(heartbeat_interval_ms=100, pong_timeout_ms=200, idle_timeout_ms=600)
    async with Emulator(limits=limits) as emu, stream(emu) as ws:
        await recv(ws)
        await send(ws, start_message())
        messages = await until_closed(ws)  # answers every ping
    kinds = [m["type"] for m in messages]
    assert kinds.count("ping") >= 3
    assert kinds[-1] == "goodbye" and messages[-1]["reason"] == "idle_timeout"
    assert messages[-1]["state_version"] == 1 and messages[-1]["last_decision_state_version"] is None
    assert close_of(ws) == (1000, "idle_timeout")


async def test_idle_goodbye_closes_1000(emu: Emulator) -> None:
    async with stream(emu) as ws:
        await recv(ws)
        await send(ws, start_message())
        await recv(ws)
        messages = await until_closed(ws)
    assert [(m["type"], m["reason"]) for m in messages] == [("goodbye", "idle_timeout")]
    assert messages[0]["resume"] == {
        "supported": False,
        "action": "reconnect_and_replay",
        "retry_after_ms": 0,
    }
    assert close_of(ws) == (1000, "idle_timeout")


async def test_max_duration_goodbye_closes_1000() -> None:
    limits = FAST.replace(max_duration_ms=500, idle_timeout_ms=10_000)
    async with Emulator(limits=limits) as emu, stream(emu) as ws:
        await recv(ws)
        await send(ws, start_message())
        messages = await until_closed(ws)
    assert [m["type"] for m in messages][-1] == "goodbye"
    assert messages[-1]["reason"] == "max_duration"
    assert close_of(ws) == (1000, "max_duration")


async def test_native_pings_are_sent_and_answered() -> None:
    async with (
        Emulator(limits=FAST.replace(native_heartbeat_interval_ms=50, idle_timeout_ms=5000)) as emu,
        stream(emu) as ws,
    ):
        await recv(ws)
        await emu.wait_for(lambda e: e.stats.native_pongs_received >= 2)
        assert emu.stats.native_pings_sent >= 2
        assert emu.stats.messages_sent == {"hello": 1}  # native controls are not JSON messages


@pytest.mark.parametrize("limit", ["max_send_queue_frames", "write_progress_timeout_ms"])
async def test_a_reader_that_stops_reading_is_closed_as_slow_reader(limit: str) -> None:
    # Many acks to a client that reads nothing. Both socket buffers are made tiny so the backlog
    # builds up in the gateway's send queue after a few kilobytes, not megabytes.
    limits = FAST.replace(
        max_events_per_second=100_000,
        event_burst=100_000,
        max_messages_per_second=100_000,
        message_burst=100_000,
        idle_timeout_ms=10_000,
        write_progress_timeout_ms=300,
        max_send_queue_frames=16 if limit == "max_send_queue_frames" else 100_000,
    )
    async with Emulator(limits=limits) as emu:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", emu.port))
        ws = await connect(
            emu.url,
            sock=sock,
            subprotocols=[PROTOCOL],
            compression=None,
            max_queue=1,
            additional_headers={"Authorization": "Bearer demo"},
        )
        await emu.wait_for(lambda e: e.stats.streams_open == 1)
        (server_side,) = emu.open_streams
        server_side.ws.transport.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_SNDBUF, 4096
        )
        server_side.ws.transport.set_write_buffer_limits(high=4096)
        await send(ws, start_message())
        try:
            async with asyncio.timeout(10):
                n = 2
                while not emu.stats.closes_by_code:
                    await send(ws, append(n))
                    n += 1
                    if limit == "write_progress_timeout_ms" and n > 400:
                        await emu.wait_for(lambda e: e.stats.closes_by_code)  # stop writing, stay unread
                    elif n % 20 == 0:
                        await asyncio.sleep(0)
        except ConnectionClosed:
            pass
        await emu.wait_for(lambda e: e.stats.closes_by_code)
        assert emu.stats.closes_by_code == {1013: 1}
        # The close frame sits behind the backlog the client never read: it may arrive, or the
        # connection is aborted after the close handshake timeout.
        with pytest.raises(ConnectionClosed):
            async with asyncio.timeout(10):
                while True:
                    await ws.recv()
        assert close_of(ws) in ((1013, "slow_reader"), (None, None))
        await ws.close()


async def test_on_change_coalesces_into_the_latest_state() -> None:
    gate = asyncio.Event()
    calls: list[str] = []

    class Gated:
        def decide(self, request: Any, *, now: float) -> Any:
            calls.append(request["state"])

            async def answer() -> dict[str, bool]:
                if len(calls) == 1:
                    await gate.wait()
                return {"ready": True}

            return answer()

    async with Emulator(limits=FAST, decider=Gated()) as emu, stream(emu) as ws:
        await recv(ws)
        await send(ws, start_message("a", mode="on_change"))
        assert (await recv(ws))["scheduled"] is True
        await emu.wait_for(lambda e: e.stats.decisions_dispatched == 1)
        for n, text in ((2, "b"), (3, "c"), (4, "d")):
            await send(ws, append(n, text))
            ack = await recv(ws)
            assert (ack["event_id"], ack["scheduled"]) == (f"evt_{n}", True)
        gate.set()
        first = await recv_type(ws, "decision")
        second = await recv_type(ws, "decision")
    assert (first["state_version"], first["covered_event_ids"]) == (1, ["evt_1"])
    assert (second["state_version"], second["covered_event_ids"]) == (4, ["evt_2", "evt_3", "evt_4"])
    assert calls == ["a", "abcd"]  # one dispatch for the three coalesced changes, on the latest state
    assert emu.stats.decisions_dispatched == 2


async def test_min_interval_spaces_dispatch_starts() -> None:
    async with Emulator(limits=FAST.replace(idle_timeout_ms=5000)) as emu, stream(emu) as ws:
        await recv(ws)
        await send(ws, start_message(mode="on_change", min_interval_ms=400))
        await recv(ws)
        first = await recv_type(ws, "decision")
        await send(ws, append(2))
        await recv_type(ws, "ack")
        second = await recv_type(ws, "decision")
    assert first["queue_ms"] == 0
    # The second dispatch waited for min_interval_ms after the first began.
    assert 200 <= second["queue_ms"] <= 1000
    assert second["covered_event_ids"] == ["evt_2"]


async def test_on_request_decide_rules(emu: Emulator) -> None:
    async with stream(emu) as ws:
        await recv(ws)
        await send(ws, start_message())
        await recv(ws)
        await send(ws, {"type": "decide", "state_version": 2})
        stale = await recv(ws)
        assert (stale["type"], stale["fatal"]) == ("error", False)
        assert stale["error"]["envelope"]["error"]["code"] == "stale_state_version"
        await send(ws, append(5))
        wrong = await recv(ws)
        assert (wrong["event_id"], wrong["error"]["envelope"]["error"]["code"]) == (
            "evt_5",
            "event_id_out_of_sequence",
        )
        await send(ws, {"type": "decide", "state_version": 1})
        assert (await recv(ws))["type"] == "scheduled"
        decision = await recv(ws)
        assert decision["covered_event_ids"] == ["evt_1"]
        # Nothing new since: the next decision covers no new event, same watermark.
        await send(ws, {"type": "decide", "state_version": 1})
        await recv_type(ws, "scheduled")
        again = await recv(ws)
        assert (again["state_version"], again["covered_event_ids"]) == (1, [])
    assert emu.stats.rejections == 2


async def test_the_client_closing_normally_is_counted(emu: Emulator) -> None:
    async with stream(emu) as ws:
        await recv(ws)
    await emu.wait_for(lambda e: e.stats.streams_open == 0)
    assert emu.stats.closes_by_code == {1000: 1}
    assert json.dumps(emu.stats.to_dict())  # JSON-ready
    assert Limits().advertised() == json.loads(json.dumps(Limits().advertised()))


async def test_a_client_flooding_native_pings_is_closed_1008(emu: Emulator) -> None:
    """max_native_control_frames_per_second / native_control_frame_burst hold for the client's
    native pings; the public document names no outcome, the emulator closes 1008."""
    async with stream(emu) as ws:
        await recv(ws)  # hello
        burst = emu.limits.native_control_frame_burst
        for n in range(burst + 4):
            await ws.ping(str(n).encode())
        await until_closed(ws)
        assert close_of(ws) == (1008, "native_control_rate_limited")
    assert emu.stats.native_control_floods == 1


async def test_native_pings_within_the_limits_are_answered(emu: Emulator) -> None:
    async with stream(emu) as ws:
        await recv(ws)
        for n in range(emu.limits.native_control_frame_burst // 2):
            latency = await asyncio.wait_for(await ws.ping(str(n).encode()), 2)
            assert latency >= 0
        assert emu.stats.native_control_floods == 0
