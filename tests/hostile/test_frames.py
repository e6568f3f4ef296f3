"""Frames the client hands to its session as they are parsed, and the frames it must not.

Every message is handed to the session in the transport's callback
(``stream/gateway_socket.py``, ``GatewaySocket``): a complete text frame read straight from the
bytes, everything else after websockets' own parser. These scripts send what a gateway may
legally send — a fragmented message, a fragmented message right before a complete one — and
what it may not (invalid UTF-8), and check the order of handling, the 1007 close, and that
messages are handled as they are parsed, with no task or queue in between.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

from airflow_provider_systemzero.protocol.limits import Limits
from airflow_provider_systemzero.stream.gateway_socket import GatewaySocket
from tests.helpers.hostile_gateway import REQUEST, HostileGateway, Peer, encode, reply


def _fragments(text: str, size: int = 7) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


async def _send_fragmented(peer: Peer, message: dict[str, Any]) -> None:
    """Send ``message`` as a fragmented text message (a websockets server sends an iterable so)."""
    seq = next(peer.seqs)
    await peer.ws.send(_fragments(encode({"stream_id": peer.stream_id, "seq": seq, **message})))


def _decision(version: int, event: str) -> dict[str, Any]:
    return {
        "type": "decision",
        "state_version": version,
        "covered_event_ids": [event],
        "reply": reply(),
        "request_id": "req_decision",
        "http_status": 200,
        "server_timing": None,
        "latency_ms": None,
        "rate_limit": None,
        "queue_ms": 0,
        "decide_ms": 5,
    }


async def _decide_and_reconnects(hook: Any) -> tuple[Any, list[Any]]:
    """One requested decision about ``log\n`` on a new stream, and the reconnects it took."""
    async with asyncio.timeout(20):
        async with hook.stream(REQUEST, decision_mode="on_request", state="log\n", open_deadline=20) as s:
            return await s.decide(timeout=20), list(s.reconnects)


async def _decide(hook: Any) -> Any:
    return (await _decide_and_reconnects(hook))[0]


async def test_a_fragmented_decision_is_reassembled_and_decided(
    gateway: Callable[..., HostileGateway], connect: Callable[..., Any]
) -> None:
    async def script(peer: Peer) -> None:
        await peer.open()
        message = await peer.recv()
        assert message["type"] == "decide"
        await peer.send({"type": "scheduled", "state_version": 1, "in_flight": False})
        await _send_fragmented(peer, _decision(1, "evt_1"))
        await peer.drain()

    decision = await _decide(connect(gateway(script)))
    assert decision.answers["ready"].decision is True and decision.state_version == 1


async def test_a_frame_after_a_fragmented_one_is_handled_after_it(
    gateway: Callable[..., HostileGateway], connect: Callable[..., Any]
) -> None:
    """The ``start``'s ack arrives fragmented and the decision covering it at once after it,
    unfragmented, in the same write: handled in the other order, the decision would come before
    its ack (``decision_before_ack``, a breach) and no decision would ever be returned."""

    async def script(peer: Peer) -> None:
        await peer.hello()
        start = await peer.recv()
        ack = {
            "stream_id": peer.stream_id,
            "seq": next(peer.seqs),
            "type": "ack",
            "event_id": start["event_id"],
        }
        ack.update(state_version=1, state_bytes=5, synthesized_body_bytes=100, scheduled=True)
        decision = {"stream_id": peer.stream_id, "seq": next(peer.seqs), **_decision(1, "evt_1")}
        protocol = peer.ws.protocol
        parts = _fragments(json.dumps(ack))
        protocol.send_text(parts[0].encode(), fin=False)
        for part in parts[1:-1]:
            protocol.send_continuation(part.encode(), fin=False)
        protocol.send_continuation(parts[-1].encode(), fin=True)
        protocol.send_text(json.dumps(decision).encode())
        peer.ws.transport.write(b"".join(protocol.data_to_send()))  # one write: read in one go
        await peer.drain()

    hook = connect(gateway(script))
    async with asyncio.timeout(20):
        async with hook.stream(REQUEST, decision_mode="on_change", state="log\n", open_deadline=20) as s:
            decision = await s.decide(timeout=20)
            reconnects = list(s.reconnects)
    assert decision.state_version == 1
    assert reconnects == []  # no breach, no second connection


async def test_invalid_utf8_is_closed_with_1007_and_never_handled(
    gateway: Callable[..., HostileGateway], connect: Callable[..., Any]
) -> None:
    closes: list[int | None] = []

    async def script(peer: Peer) -> None:
        if peer.number == 1:
            await peer.open()
            await peer.recv()  # the decide
            await peer.ws.send(b'{"type":"scheduled","x":"\xff\xfe"}', text=True)
            await peer.drain()
            closes.append(peer.ws.close_code)
            return
        await peer.open()
        message = await peer.recv()
        await peer.send({"type": "scheduled", "state_version": message["state_version"], "in_flight": False})
        await peer.decision(message["state_version"])
        await peer.drain()

    decision = await _decide(connect(gateway(script)))
    assert decision.state_version == 1
    assert closes == [1007]  # websockets' own reading refused it; the client reconnected and replayed


async def test_complete_frames_are_handled_as_they_are_parsed(
    gateway: Callable[..., HostileGateway], connect: Callable[..., Any]
) -> None:
    """The warm path itself: the stream's connection is a :class:`GatewaySocket`, and the decision
    reaches the session in the callback that read it: no task of the stream's serves the
    connection (the stream's run loop only waits for the connection's end)."""
    seen: list[Any] = []

    async def script(peer: Peer) -> None:
        await peer.open()
        await peer.decide_then()
        await peer.drain()

    hook = connect(gateway(script))
    async with asyncio.timeout(20):
        async with hook.stream(REQUEST, decision_mode="on_request", state="log\n", open_deadline=20) as s:
            await s.decide(timeout=20)
            connection = s.connection
            socket = connection.socket
            tasks = {getattr(t.get_coro(), "__qualname__", "") for t in asyncio.all_tasks()}
            seen += [
                type(socket),
                socket.handler is connection,
                sorted(n for n in tasks if "_serve" in n or "_read" in n),
            ]
    assert seen == [GatewaySocket, True, []]


def _frame(payload: bytes, *, opcode: int = 1, fin: bool = True) -> bytes:
    """A server frame (unmasked) with the shortest length encoding."""
    head = bytes([(0x80 if fin else 0) | opcode])
    n = len(payload)
    if n < 126:
        return head + bytes([n]) + payload
    if n < 65536:
        return head + bytes([126]) + n.to_bytes(2, "big") + payload
    return head + bytes([127]) + n.to_bytes(8, "big") + payload


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 64, 700, 100_000])
async def test_frames_split_anywhere_are_read_whole_and_in_order(
    chunk: int, gateway: Callable[..., HostileGateway], connect: Callable[..., Any]
) -> None:
    """A burst of frames — small and 16-bit-length text frames, a fragmented one, a native ping —
    cut into reads of every size: each is handled once and in order (the session checks ``seq``
    and would reconnect otherwise), and the last ping is answered. Some payloads hold "с" (UTF-8
    D1 81) before an ASCII letter: a read that starts inside such a frame starts with 0x81 and a
    plausible length byte, which only the check that websockets' parser is between frames tells
    apart from a frame of its own."""
    pongs: list[int] = []
    last = 40

    async def script(peer: Peer) -> None:
        await peer.hello()
        start = await peer.recv()
        seq = 1
        burst = b""

        def text(message: dict[str, Any]) -> bytes:
            nonlocal seq
            seq += 1
            return json.dumps(
                {"stream_id": peer.stream_id, "seq": seq, **message}, ensure_ascii=False
            ).encode()

        burst += _frame(
            text(
                {
                    "type": "ack",
                    "event_id": start["event_id"],
                    "state_version": 1,
                    "state_bytes": 5,
                    "synthesized_body_bytes": 100,
                    "scheduled": False,
                }
            )
        )
        for nonce in range(1, last + 1):
            body = text(
                {"type": "ping", "nonce": nonce, **({"padding": "\u0441a" * 150} if nonce % 7 == 0 else {})}
            )
            if nonce == 20:
                burst += _frame(body[:9], fin=False) + _frame(body[9:], opcode=0)  # fragmented
            else:
                burst += _frame(body)
            if nonce == 30:
                burst += _frame(b"native", opcode=9)  # a native ping: websockets answers it
        for offset in range(0, len(burst), chunk):
            peer.ws.transport.write(burst[offset : offset + chunk])
            await asyncio.sleep(0.001 if chunk >= 64 else 0)
        peer.seqs = iter(range(seq + 1, 10**6))
        decide = None
        while decide is None or not pongs or pongs[-1] != last:  # answered once the last ping was
            message = await peer.recv()
            if message["type"] == "pong":
                pongs.append(message["nonce"])
            elif message["type"] == "decide":
                decide = message
        await peer.send({"type": "scheduled", "state_version": 1, "in_flight": False})
        await peer.decision(1)
        await peer.drain()

    decision, reconnects = await _decide_and_reconnects(connect(gateway(script)))
    assert decision.state_version == 1
    assert reconnects == []
    assert pongs == sorted(pongs) and pongs[-1] == last


async def test_a_start_acknowledged_in_the_read_that_brought_hello_is_sent_first(
    gateway: Callable[..., HostileGateway], connect: Callable[..., Any]
) -> None:
    """A gateway may acknowledge ``start`` before reading it (it knows the client sends it next):
    ``hello`` and that ack arrive in one read. The client sends ``start`` before it handles the
    ack — handled at once, the ack would name an event not sent yet, a breach."""

    async def script(peer: Peer) -> None:
        hello = {"type": "hello", "protocol": "system-zero.stream.v1", "request_id": "req_hello"}
        hello.update(limits=Limits().advertised(), rate_limit=None)
        ack = {"type": "ack", "event_id": "evt_1", "state_version": 1, "state_bytes": 5}
        ack.update(synthesized_body_bytes=100, scheduled=False)
        frames = [encode({"stream_id": peer.stream_id, "seq": seq, **m}) for seq, m in ((1, hello), (2, ack))]
        protocol = peer.ws.protocol
        for frame in frames:
            protocol.send_text(frame.encode())
        peer.ws.transport.write(b"".join(protocol.data_to_send()))  # one write: one read
        peer.seqs = iter(range(3, 10**6))
        assert (await peer.recv())["type"] == "start"
        await peer.decide_then()
        await peer.drain()

    decision, reconnects = await _decide_and_reconnects(connect(gateway(script)))
    assert decision.state_version == 1
    assert reconnects == []
