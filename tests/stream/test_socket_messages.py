"""Messages handed over by the client's :class:`GatewaySocket`, driven through its transport
callbacks as asyncio drives it: whatever the reads look like, every message comes out once, whole,
in order, a few per loop turn, and nothing after a text message that is not UTF-8."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.client import ClientProtocol
from websockets.frames import Opcode
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.uri import parse_uri

from airflow_provider_systemzero.stream.gateway_socket import FRAMES_PER_TURN
from tests.helpers.sockets import frames_written, open_client


def _frame(payload: bytes, opcode: int = 1, *, fin: bool = True, mask: bytes | None = None) -> bytes:
    head = bytes([(0x80 if fin else 0) | opcode])
    bit = 0x80 if mask is not None else 0
    n = len(payload)
    if n < 126:
        head += bytes([bit | n])
    elif n < 65536:
        head += bytes([bit | 126]) + n.to_bytes(2, "big")
    else:
        head += bytes([bit | 127]) + n.to_bytes(8, "big")
    if mask is None:
        return head + payload
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


#: A message: its text and how it is framed (whole, in two fragments, or followed by a native ping).
#: "\u0441" is D1 81 in UTF-8: a read that starts inside a frame may start with 0x81, as a text frame
#: does, so a reader that took such a read for a frame boundary would be caught.
messages = st.lists(
    st.tuples(
        st.text(alphabet='ab{}":\u0441\u20ac', min_size=0, max_size=300),
        st.sampled_from(["whole", "fragmented", "then_ping"]),
    ),
    min_size=1,
    max_size=12,
)


def _burst(items: list[tuple[str, str]], mask: bytes | None = None) -> bytes:
    data = b""
    for text, how in items:
        raw = text.encode()
        if how == "fragmented" and len(raw) > 1:
            data += _frame(raw[:1], fin=False, mask=mask) + _frame(raw[1:], 0, mask=mask)
        else:
            data += _frame(raw, mask=mask)
        if how == "then_ping":
            data += _frame(b"p", 9, mask=mask)
    return data


def _open_server() -> ServerProtocol:
    protocol = ServerProtocol()
    client = ClientProtocol(parse_uri("ws://127.0.0.1/"))
    request = client.connect()
    client.send_request(request)
    protocol.receive_data(b"".join(client.data_to_send()))
    (received,) = protocol.events_received()
    protocol.send_response(protocol.accept(received))
    protocol.data_to_send()
    assert protocol.state is State.OPEN
    return protocol


@settings(max_examples=200, deadline=None)
@given(messages, st.lists(st.integers(min_value=1, max_value=400), min_size=1, max_size=40))
async def test_the_client_reads_every_message_once_whole_and_in_order(
    items: list[tuple[str, str]], cuts: list[int]
) -> None:
    socket, transport, heard = open_client()
    data = _burst(items)
    position, index = 0, 0
    while position < len(data):
        size = cuts[index % len(cuts)]
        socket.data_received(data[position : position + size])
        position, index = position + size, index + 1
    for _ in range(len(items)):  # a long burst is handed over a few messages per loop turn
        if not heard.messages[len(items) - 1 :]:
            await asyncio.sleep(0)
    assert heard.messages == [text for text, _ in items]
    assert not transport.paused  # reading goes on once everything was handed over
    # websockets answered each native ping. What the client wrote is read back by websockets' own
    # server parser: a byte search would also find the pair inside the frames' random masks.
    gateway = _open_server()
    gateway.receive_data(frames_written(transport))
    pongs = [bytes(event.data) for event in gateway.events_received() if event.opcode is Opcode.PONG]
    assert pongs == [b"p"] * sum(how == "then_ping" for _, how in items)


async def test_a_flood_in_one_read_is_handed_over_a_few_messages_per_loop_turn() -> None:
    """Many small frames in one read: :data:`FRAMES_PER_TURN` are handed over at once, reading
    pauses, and the rest follow in later loop turns, in order."""
    socket, transport, heard = open_client()
    texts = [f'{{"n":{n}}}' for n in range(3 * FRAMES_PER_TURN + 1)]
    socket.data_received(b"".join(_frame(text.encode()) for text in texts))
    assert heard.messages == texts[:FRAMES_PER_TURN] and transport.paused
    await asyncio.sleep(0)
    assert heard.messages == texts[: 2 * FRAMES_PER_TURN]
    for _ in range(3):
        await asyncio.sleep(0)
    assert heard.messages == texts and not transport.paused


async def test_invalid_utf8_closes_1007_and_nothing_after_it_is_handed_over() -> None:
    """RFC 6455 §8.1: a text message that is not UTF-8 fails the connection; a valid message after
    it in the same read is not handed over."""
    socket, _, heard = open_client()
    socket.data_received(_frame(b'{"a"', fin=False) + _frame(b"\xff}", 0) + _frame(b"{}"))
    assert heard.messages == []
    assert socket.protocol.close_sent is not None and socket.protocol.close_sent.code == 1007
