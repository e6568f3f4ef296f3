"""Found by the stream fuzzer: a frame that breaks the protocol, arriving while the client closes
the connection itself (the caller leaves the stream, or a trigger leases it back), must not
crash the stream's loop.

The gateway here answers the client's close frame with a binary frame before its own close frame
(a peer is allowed to send until it has seen the close), which makes the race deterministic.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.server import ServerProtocol

from airflow_provider_systemzero.protocol.messages import PROTOCOL
from airflow_provider_systemzero.stream import Backoff, DecisionStream, StreamSettings
from tests.helpers.mini_gateway import serve_session

KEY = "sz-close-race-0123456789"
QUESTIONS = {"ready": {"type": "boolean", "instructions": "Is the job ready?"}}
REPLY = {
    "id": "szd_" + "b" * 32,
    "model": "m",
    "answers": {"ready": {"type": "boolean", "probability": 0.9, "confidence": 0.9, "decision": True}},
}


class _BinaryBeforeClose(ServerConnection):
    """Sends one binary frame as soon as the client's close frame arrives, then closes normally."""

    def data_received(self, data: bytes) -> None:
        if data[:1] == b"\x88":  # FIN + close opcode: the client is closing
            self.protocol.send_binary(b"\x00\x01")
            self.send_data()
        super().data_received(data)


async def _handler(ws: ServerConnection) -> None:
    await serve_session(ws, "szws_" + "d" * 32, REPLY)


async def _gateway() -> Server:
    def factory(protocol: ServerProtocol, server: Server, **kwargs: Any) -> ServerConnection:
        return _BinaryBeforeClose(protocol, server, **kwargs)

    return await serve(
        _handler,
        "127.0.0.1",
        0,
        compression=None,
        create_connection=factory,  # type: ignore[arg-type]
        select_subprotocol=lambda _c, offered: PROTOCOL if PROTOCOL in offered else None,
    )


def _stream(server: Server) -> DecisionStream:
    origin = f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    return DecisionStream(
        StreamSettings(origin, KEY),
        {"model": "m", "questions": QUESTIONS},
        state="log\n",
        decision_mode="on_request",
        identity="close-race",
        backoff=Backoff(base=0.01, cap=0.05),
        open_deadline=5,
    )


async def test_leaving_the_stream_while_a_bad_frame_arrives_ends_cleanly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = await _gateway()
    try:
        stream = _stream(server)
        async with stream:
            await stream.decide(timeout=5)
    finally:
        server.close()
        await server.wait_closed()
    assert stream.failure is None, stream.failure
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


async def test_a_leased_stream_survives_a_bad_frame_during_its_release() -> None:
    server = await _gateway()
    try:
        async with _stream(server) as stream:
            await stream.decide(timeout=5)
            await stream.release()  # a trigger gives its stream back while nothing changes
            assert stream.failure is None and stream.dormant, stream.failure
            await stream.append_text("more\n")  # the next change brings it back
            assert (await stream.decide(timeout=5)).reply_id == REPLY["id"]
            assert stream.reconnects[-1].reason == "released"
    finally:
        server.close()
        await server.wait_closed()
