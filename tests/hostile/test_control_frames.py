"""Frames below the stream protocol: a native ping flood and frames that break RFC 6455.

A gateway that floods native pings while it reads nothing made the client's write buffer grow by
a pong for every ping (79–123 MiB a connection before the write timeout), since websockets
answers each ping at once and reading went on while writing was paused. Now reading pauses while
writing is, the pongs the peer forces may take at most ``CONTROL_REPLY_BUDGET`` past the
high-water mark, and a flood ends the connection as a contract breach, not as a buffer.

A frame with a reserved bit set, invalid UTF-8 or an illegal close code makes the client close
with 1002 or 1007. Such a breach counts toward the rule of three breaches in a row like any
other, and the error names the code this client sent, not the 1006 of the TCP connection the
gateway then dropped.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from airflow_provider_systemzero.stream.exceptions import DeadlineExceeded, ProtocolViolation
from tests.helpers.hostile_gateway import REQUEST, HostileGateway, Peer

#: The gateways' receive buffer: a peer that stops reading stops the client's writes within a few KiB.
BUFFER = 4096
#: The most the client's write buffer may hold here: its high-water mark (32 KiB) and the control
#: replies' budget (16 KiB), with room to spare; before, a flood took it to ~100 MiB.
BUFFER_BOUND = 2**17


async def _flood_native_pings(peer: Peer) -> None:
    """Acknowledge ``start``, stop reading, and write empty native pings (2 bytes each, a 6-byte
    pong owed for each) as fast as the client takes them, until the client goes away."""
    await peer.open()
    transport = peer.ws.transport
    transport.pause_reading()
    chunk = b"\x89\x00" * 32_768
    while not transport.is_closing():
        if transport.get_write_buffer_size() < 2**18:
            transport.write(chunk)
        await asyncio.sleep(0.001)


async def test_a_native_ping_flood_while_reading_nothing_ends_as_a_breach_not_a_buffer(
    gateway: Callable[..., HostileGateway], connect: Callable[..., Any]
) -> None:
    gw = gateway(_flood_native_pings, receive_buffer=BUFFER)
    largest = 0
    stream_ref: list[Any] = []

    async def watch_the_write_buffer() -> None:
        nonlocal largest
        while True:
            connection = stream_ref[0].connection if stream_ref else None
            socket = connection.socket if connection is not None else None
            transport = getattr(socket, "transport", None)
            if transport is not None and not transport.is_closing():
                largest = max(largest, transport.get_write_buffer_size())
            await asyncio.sleep(0.002)

    watcher = asyncio.create_task(watch_the_write_buffer())
    started = time.monotonic()
    try:
        with pytest.raises(ProtocolViolation) as caught:
            async with asyncio.timeout(40):
                async with connect(gw).stream(
                    REQUEST, decision_mode="on_request", state="log\n", open_deadline=30
                ) as stream:
                    stream_ref.append(stream)
                    await stream.decide(timeout=30)
    finally:
        watcher.cancel()
    took = time.monotonic() - started
    assert caught.value.code == "native_ping_flood", caught.value
    assert "native pings" in str(caught.value)
    assert gw.connections == 3  # three breaches in a row, then the caller hears it
    assert [r.reason for r in stream.reconnects] == ["protocol_violation"] * 2
    # each flood ended as soon as the pongs owed passed the budget, not at the 5 s write timeout
    assert took < 3 * 5, f"{took:.1f} s"
    assert largest <= BUFFER_BOUND, f"{largest} bytes buffered"


async def test_an_ordinary_native_ping_is_answered_and_counts_for_nothing(
    gateway: Callable[..., HostileGateway], connect: Callable[..., Any]
) -> None:
    """The control: a gateway's native pings at a gateway's pace are answered with pongs, and the
    connection goes on."""
    pongs: list[bytes] = []

    async def ping_then_decide(peer: Peer) -> None:
        await peer.open()
        for nonce in range(5):
            waiter = await peer.ws.ping(bytes([nonce]) * 4)
            await asyncio.wait_for(waiter, 10)
            pongs.append(bytes([nonce]) * 4)
        await peer.decide_then()
        await peer.drain()

    async with asyncio.timeout(30):
        async with connect(gateway(ping_then_decide)).stream(
            REQUEST, decision_mode="on_request", state="log\n", open_deadline=20
        ) as stream:
            decision = await stream.decide(timeout=20)
            reconnects = list(stream.reconnects)
    assert decision.state_version == 1 and reconnects == [] and len(pongs) == 5


#: Frames no gateway may send (RFC 6455 §5.2, §7.4), and the code the client closes with.
BREACHES = {
    "rsv1_without_an_extension": (b"\xc1\x02{}", 1002),
    "invalid_utf8": (b"\x81\x04\xff\xfe\xfd\xfc", 1007),
    "close_code_999": (b"\x88\x02\x03\xe7", 1002),
    "close_code_1005": (b"\x88\x02\x03\xed", 1002),
    "close_code_5000": (b"\x88\x02\x13\x88", 1002),
}


@pytest.mark.parametrize("name", sorted(BREACHES))
async def test_a_frame_that_breaks_rfc_6455_counts_toward_the_breach_rule(
    name: str, gateway: Callable[..., HostileGateway], connect: Callable[..., Any]
) -> None:
    frame, code = BREACHES[name]

    async def break_the_protocol_then_drop(peer: Peer) -> None:
        await peer.open()
        transport = peer.ws.transport
        transport.pause_reading()  # the client's close frame is never read, never echoed
        transport.write(frame)
        await asyncio.sleep(0.2)
        transport.abort()  # the TCP connection dropped: 1006 as the client sees it

    gw = gateway(break_the_protocol_then_drop)
    with pytest.raises(ProtocolViolation) as caught:
        async with asyncio.timeout(40):
            async with connect(gw).stream(
                REQUEST, decision_mode="on_request", state="log\n", open_deadline=30
            ) as stream:
                await stream.decide(timeout=30)
    assert gw.connections == 3
    assert [(r.reason, r.close_code) for r in stream.reconnects] == [("protocol_violation", code)] * 2
    message = str(caught.value)
    assert f"this client closed the connection with code {code}" in message, message
    assert "1006" not in message


async def test_the_last_error_names_the_close_code_this_client_sent(
    gateway: Callable[..., HostileGateway], connect: Callable[..., Any]
) -> None:
    """A gateway that stops reading answers no native ping: the client closes with 1011 and, the
    close never answered, drops the connection. The caller's deadline error names the 1011 this
    client sent, not only the 1006 of the dropped connection."""

    async def answer_no_native_ping(peer: Peer) -> None:
        await peer.open({"native_heartbeat_interval_ms": 100, "pong_timeout_ms": 100})
        if peer.number == 1:  # the advertised timers hold from the next connection on
            await peer.goodbye("shutdown")
            await peer.ws.close(1012)
            return
        peer.ws.transport.pause_reading()  # no ping read, no pong sent, no close answered
        await asyncio.sleep(30)

    with pytest.raises(DeadlineExceeded) as caught:
        async with asyncio.timeout(40):
            async with connect(gateway(answer_no_native_ping)).stream(
                REQUEST, decision_mode="on_request", state="log\n", open_deadline=10
            ) as stream:
                await stream.decide(timeout=9)
    message = str(caught.value)
    assert "this client closed the connection with code 1011 ('keepalive ping timeout')" in message, message
