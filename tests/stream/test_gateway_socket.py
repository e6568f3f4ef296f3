"""What :class:`GatewaySocket` adds to websockets' sans-I/O protocol, each a timer: the native
keepalive (RFC 6455 §5.5.2; websockets' own rule: no pong within ``ping_timeout`` closes 1011),
a peer that reads nothing while frames wait (the transport is aborted), and a close that does not
complete (aborted after ``close_timeout``). Driven through the transport's callbacks with a
transport that keeps what was written; every wait is bounded."""

from __future__ import annotations

import asyncio

from tests.helpers import until as _until
from tests.helpers.sockets import frames_written, open_client


def _pings(written: bytes) -> list[bytes]:
    """The payloads of the native pings in ``written`` (client frames: masked, short)."""
    found, position = [], 0
    while position + 2 <= len(written):
        opcode, length = written[position] & 0x0F, written[position + 1] & 0x7F
        start = position + 2 + 4
        if written[position + 1] & 0x80 == 0 or length >= 126:
            break  # not a short masked client frame: the request's bytes come first
        payload = bytes(
            b ^ written[position + 2 + i % 4] for i, b in enumerate(written[start : start + length])
        )
        if opcode == 0x9:
            found.append(payload)
        position = start + length
    return found


def _pong(payload: bytes) -> bytes:
    return bytes([0x8A, len(payload)]) + payload


async def test_a_ping_answered_keeps_the_connection_and_the_next_follows() -> None:
    socket, transport, _ = open_client(ping_interval=0.02, ping_timeout=0.5)
    await _until(lambda: len(_pings(frames_written(transport))) == 1)
    socket.data_received(_pong(_pings(frames_written(transport))[0]))
    await _until(lambda: len(_pings(frames_written(transport))) == 2)
    assert socket.open and socket.protocol.close_sent is None


async def test_a_ping_without_its_pong_closes_1011() -> None:
    socket, transport, _ = open_client(ping_interval=0.02, ping_timeout=0.05)
    await _until(lambda: socket.protocol.close_sent is not None)
    assert len(_pings(frames_written(transport))) == 1
    assert socket.protocol.close_sent.code == 1011  # type: ignore[union-attr]
    assert socket.protocol.close_sent.reason == "keepalive ping timeout"  # type: ignore[union-attr]


async def test_a_pong_for_another_ping_is_ignored() -> None:
    socket, transport, _ = open_client(ping_interval=0.02, ping_timeout=0.1)
    await _until(lambda: len(_pings(frames_written(transport))) == 1)
    socket.data_received(_pong(b"nope"))  # unsolicited (RFC 6455 §5.5.3)
    await _until(lambda: socket.protocol.close_sent is not None)
    assert socket.protocol.close_sent.code == 1011  # type: ignore[union-attr]


async def test_a_peer_that_reads_nothing_is_aborted_after_the_write_timeout() -> None:
    socket, transport, _ = open_client()
    socket.write_timeout = 0.05
    socket.pause_writing()
    assert socket.paused
    await _until(lambda: transport.aborted)
    assert socket.stalled


async def test_a_peer_that_drains_in_time_is_kept() -> None:
    socket, transport, heard = open_client()
    socket.write_timeout = 0.05
    socket.pause_writing()
    socket.resume_writing()
    await asyncio.sleep(0.1)  # past the write timeout: nothing may fire now
    assert not transport.aborted and not socket.stalled and not socket.paused
    assert heard.writable == 1  # the handler heard it may write again


async def test_reading_pauses_while_writing_is_paused() -> None:
    """A peer that does not read what it is sent is not read either: each frame read may owe it a
    reply (a pong) that could only be buffered."""
    socket, transport, _ = open_client()
    socket.pause_writing()
    assert transport.paused
    socket.resume_writing()
    assert not transport.paused


async def test_pongs_a_peer_forces_past_the_budget_drop_the_connection_as_a_flood() -> None:
    from airflow_provider_systemzero.stream.gateway_socket import CONTROL_REPLY_BUDGET

    socket, transport, _ = open_client()
    transport.buffered = 2**15 + CONTROL_REPLY_BUDGET - 12  # the high-water mark, the budget almost spent
    written = len(transport.written)
    socket.data_received(b"\x89\x00")  # one ping: its 6-byte pong still fits
    assert len(transport.written) == written + 6 and not transport.aborted
    transport.buffered += 6
    socket.data_received(b"\x89\x00" * 2)  # two more: 12 bytes of pongs do not
    assert transport.aborted and socket.flooded
    assert len(transport.written) == written + 6  # nothing more was buffered


async def test_a_close_the_peer_never_completes_is_aborted_after_close_timeout() -> None:
    socket, transport, _ = open_client(close_timeout=0.05)
    socket.close()
    assert frames_written(transport)[:1] == b"\x88"  # the close frame went out at once
    assert not socket.open
    await _until(lambda: transport.aborted)


async def test_a_completed_close_resolves_lost() -> None:
    socket, transport, _ = open_client(close_timeout=5)
    socket.close()
    socket.data_received(b"\x88\x02\x03\xe8")  # the server's close frame (1000)
    socket.eof_received()  # then the server closes the TCP connection
    socket.connection_lost(None)
    assert socket.lost.done() and socket.close_code == 1000
    assert not transport.aborted
    assert not transport.eof  # the peer ended the stream: closing sends this side's end, no half-close first
