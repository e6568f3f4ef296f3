"""A :class:`GatewaySocket` driven through its transport callbacks, as asyncio drives it, with a
transport that keeps what was written (no network)."""

from __future__ import annotations

import asyncio
from typing import Any

from websockets.client import ClientProtocol
from websockets.protocol import State
from websockets.uri import parse_uri
from websockets.utils import accept_key

from airflow_provider_systemzero.stream.gateway_socket import GatewaySocket

__all__ = ["FakeTransport", "Messages", "frames_written", "open_client"]


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.paused = False
        self.aborted = False
        self.eof = False
        #: what the transport reports as buffered (a test sets it: a peer that reads nothing)
        self.buffered = 0

    def write(self, data: Any) -> None:
        self.written += bytes(data)

    def abort(self) -> None:
        self.aborted = True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def is_reading(self) -> bool:
        return not self.paused


class Messages:
    """A socket's handler that keeps what it is handed."""

    def __init__(self) -> None:
        self.messages: list[str | bytes] = []
        self.opened = 0
        self.writable = 0

    def socket_opened(self, socket: GatewaySocket) -> None:
        self.opened += 1

    def socket_message(self, message: str | bytes) -> None:
        self.messages.append(message)

    def socket_writable(self) -> None:
        self.writable += 1


def open_client(**options: Any) -> tuple[GatewaySocket, FakeTransport, Messages]:
    """A socket whose upgrade was answered as a server would: open, its parser waiting.

    :param options: the socket's keyword arguments (``ping_interval`` …).
    """
    socket = GatewaySocket(ClientProtocol(parse_uri("ws://127.0.0.1/"), max_size=2**20), **options)
    transport = FakeTransport()
    socket.connection_made(transport)
    heard = Messages()
    socket.handler = heard
    socket.handshake()
    key_line = next(
        line for line in transport.written.split(b"\r\n") if line.lower().startswith(b"sec-websocket-key:")
    )
    key = accept_key(key_line.split(b":", 1)[1].strip().decode())
    socket.data_received(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        + f"Sec-WebSocket-Accept: {key}\r\n\r\n".encode()
    )
    assert socket.protocol.state is State.OPEN and socket.opened.done() and heard.opened == 1
    return socket, transport, heard


def frames_written(transport: FakeTransport) -> bytes:
    """What the client wrote after its upgrade request: its WebSocket frames."""
    return transport.written[transport.written.index(b"\r\n\r\n") + 4 :]
