"""The WebSocket under a stream: websockets' sans-I/O client protocol on an asyncio transport.

Theory of operation
-------------------

websockets keeps every rule of RFC 6455 in its sans-I/O ``ClientProtocol``: the opening handshake,
frame parsing, masking, the size limit (1009), pings answered with pongs, the close handshake
and its states. Its asyncio ``ClientConnection`` puts a message queue, a reader task, a keepalive
task and a coroutine per send around that protocol, for callers who ``await ws.recv()``. A stream
does not read that way: every message goes to its sans-I/O session as soon as it is parsed, and
what the session then has to send is written at once. :class:`GatewaySocket` is therefore the
protocol driven straight from the transport's callbacks (``data_received``, ``eof_received``,
``connection_lost``, ``pause_writing``/``resume_writing``), with the few things websockets'
asyncio layer adds that a stream needs, each a timer or a flag rather than a task:

* **messages** — a complete text frame is handed over as websockets' parser returns it;
  fragments are reassembled (at most :data:`MAX_FRAGMENTS`, else 1009) and text is decoded as
  UTF-8 (else 1007, RFC 6455 §8.1). A binary message is handed over as bytes, for the stream to
  refuse. At most :data:`FRAMES_PER_TURN` messages are handed over per loop turn: the rest of a
  flood waits, with reading paused, so other tasks run in between;
* **keepalive** — a native ping every ``ping_interval`` seconds; no pong within ``ping_timeout``
  fails the connection (1011), as websockets' keepalive does;
* **flow control** — writes go to the transport at once (frames written together in one write);
  while the transport is above its high-water mark the socket is :attr:`~GatewaySocket.paused`,
  the stream holds its frames back and the socket reads nothing (a peer that does not read what
  it is sent is not read either). Paused longer than :attr:`~GatewaySocket.write_timeout` means
  the peer reads nothing: the transport is aborted (:attr:`~GatewaySocket.stalled`);
* **control replies** — websockets answers every native ping with a pong, and echoes a close:
  replies the peer's frames force. They may take the transport's buffer at most
  :data:`CONTROL_REPLY_BUDGET` bytes past its high-water mark, paused or not; a peer that forces
  more (a ping flood while it reads nothing) has its connection dropped as a breach of the
  protocol (:attr:`~GatewaySocket.flooded`), so its pongs never become a buffer;
* **closing** — once a close frame is sent or received (the protocol then expects the TCP close),
  the transport is aborted if the close has not completed within ``close_timeout`` (RFC 6455
  §7.1.1: the client waits for the server to close the TCP connection first).

The socket knows nothing of System Zero: its :class:`SocketHandler` (the stream) hears when the
upgrade succeeded, each message, and when writing may go on; :attr:`~GatewaySocket.lost`
completes when the TCP connection is gone.

It is created by websockets' own connection opener (``connect(...,
create_connection=GatewaySocket)``), which keeps the TCP connection, TLS, proxies and the
``ClientProtocol``'s options; :func:`~airflow_provider_systemzero.stream.connection.open_socket`
then runs the upgrade through :meth:`GatewaySocket.handshake`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
from collections import deque
from typing import Any, Protocol

from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.protocol import State

from airflow_provider_systemzero.dependency_internals import release_transport
from airflow_provider_systemzero.protocol.reconnect import CloseCode

__all__ = ["CONTROL_REPLY_BUDGET", "FRAMES_PER_TURN", "MAX_FRAGMENTS", "GatewaySocket", "SocketHandler"]

#: Messages handed to the handler per loop turn, at most; the rest of a read waits for the next
#: turn (with reading paused), so a flood of small frames does not hold the loop.
FRAMES_PER_TURN = 16
#: Fragments of one message, at most (websockets' own bound); more closes with 1009.
MAX_FRAGMENTS = 4096
#: Bytes of control replies (pongs, a close echoed) the transport's buffer may hold past its
#: high-water mark. A gateway pings every ``native_heartbeat_interval_ms``: its pongs take a few
#: bytes. More means the peer floods pings and does not read the answers: a breach, not a buffer.
CONTROL_REPLY_BUDGET = 16 * 1024

_TEXT, _BINARY, _CONT, _PONG = Opcode.TEXT, Opcode.BINARY, Opcode.CONT, Opcode.PONG
_OPEN, _CONNECTING = State.OPEN, State.CONNECTING


class SocketHandler(Protocol):
    """What a :class:`GatewaySocket` tells the stream it serves (each call in a transport callback;
    none may block)."""

    def socket_opened(self, socket: GatewaySocket) -> None:
        """The upgrade succeeded; the messages that came with the response follow this call."""

    def socket_message(self, message: str | bytes) -> None:
        """One complete message: text, or bytes for a binary one."""

    def socket_writable(self) -> None:
        """The transport drained below its low-water mark: held frames may be written."""


class GatewaySocket(asyncio.Protocol):
    """One WebSocket connection to a gateway, driven from the transport's callbacks.

    The keyword arguments are those websockets' opener passes to its ``create_connection``
    factory (``max_queue`` has no use here: messages are handed over, not queued).

    :param protocol: websockets' sans-I/O client protocol (state ``CONNECTING``).
    :param ping_interval: seconds between native pings (``None``: none).
    :param ping_timeout: seconds a native ping waits for its pong (``None``: forever).
    :param close_timeout: seconds a started close may take before the transport is aborted.
    :param write_limit: the transport's high-water mark (and low-water mark, as a pair).
    """

    def __init__(
        self,
        protocol: ClientProtocol,
        *,
        ping_interval: float | None = None,
        ping_timeout: float | None = None,
        close_timeout: float | None = None,
        max_queue: Any = None,
        write_limit: int | tuple[int, int | None] = 2**15,
    ) -> None:
        self.protocol = protocol
        self.loop = asyncio.get_running_loop()
        #: the transport (set when the TCP connection is made)
        self.transport: asyncio.Transport | None = None
        #: the stream this socket serves (``None``: messages are dropped)
        self.handler: SocketHandler | None = None
        #: completes when the upgrade answered: with ``None`` (101), or the handshake's error
        self.opened: asyncio.Future[None] = self.loop.create_future()
        #: completes (with ``None``) when the TCP connection is gone
        self.lost: asyncio.Future[None] = self.loop.create_future()
        #: the transport is above its high-water mark: hold frames back until it drains
        self.paused = False
        #: aborted because the peer read nothing for :attr:`write_timeout` seconds
        self.stalled = False
        #: aborted because the peer's frames forced more control replies (pongs) than the
        #: transport may buffer (:data:`CONTROL_REPLY_BUDGET`): the peer floods and does not read
        self.flooded = False
        #: seconds the transport may stay paused before the peer counts as not reading
        self.write_timeout: float | None = None
        self.ping_interval = ping_interval
        self.ping_timeout = ping_timeout
        self.close_timeout = close_timeout
        high, low = write_limit if isinstance(write_limit, tuple) else (write_limit, None)
        self._write_limits = (high, low)
        self._inbox: deque[str | bytes] = deque()  # parsed messages not handed over yet
        self._handing = False  # a turn of the inbox is under way (no re-entry)
        self._turn: asyncio.Handle | None = None  # the next turn, while reading is paused
        self._fragments: list[bytes] | None = None  # the message being reassembled
        self._fragmented: Opcode = _TEXT
        self._refused = False  # a message broke a rule (1007, 1009): nothing after it is handed over
        self._ping: bytes | None = None  # the keepalive ping waiting for its pong
        self._pinged_at = 0.0
        self._keepalive: asyncio.TimerHandle | None = None  # next ping, or its pong's deadline
        self._close_timer: asyncio.TimerHandle | None = None
        self._stall_timer: asyncio.TimerHandle | None = None
        self._subprotocol: str | None = None

    # ------------------------------------------------------------------ the read-only view

    @property
    def open(self) -> bool:
        """Whether messages may be sent (the upgrade succeeded and no close began)."""
        return self.protocol.state is _OPEN

    @property
    def subprotocol(self) -> str | None:
        """The subprotocol the server selected (``None`` before the upgrade, or if it selected none)."""
        return self._subprotocol

    @property
    def close_code(self) -> int | None:
        """The close code received (1006 once closed without one; ``None`` while open)."""
        return self.protocol.close_code

    @property
    def close_reason(self) -> str | None:
        """The close reason received (``None`` while open)."""
        return self.protocol.close_reason

    @property
    def closed(self) -> ConnectionClosed | None:
        """Once the connection is closed, how: the close frames sent and received and which came
        first (websockets' ``ConnectionClosed``: ``sent``, ``rcvd``, ``rcvd_then_sent``); ``None``
        before."""
        protocol = self.protocol
        return protocol.close_exc if protocol.state is State.CLOSED else None

    # ------------------------------------------------------------------ actions

    def handshake(self, headers: Any = None, user_agent: str | None = None) -> asyncio.Future[None]:
        """Send the upgrade request; :attr:`opened` completes with its answer.

        :param headers: headers added to the request (websockets' ``additional_headers``).
        :param user_agent: the ``User-Agent`` header, unless ``headers`` set one.
        """
        request = self.protocol.connect()
        if headers is not None:
            request.headers.update(headers)
        if user_agent is not None:
            request.headers.setdefault("User-Agent", user_agent)
        self.protocol.send_request(request)
        self._write_out()
        return self.opened

    def send_texts(self, texts: list[str]) -> None:
        """Send text messages, in order, in one write (the socket must be :attr:`open`)."""
        protocol = self.protocol
        for text in texts:
            protocol.send_text(text.encode())
        self._write_out()

    def close(self, code: int = CloseCode.NORMAL_CLOSURE, reason: str = "") -> None:
        """Start the close handshake (nothing if one began already); the transport is aborted
        if it has not completed within ``close_timeout``."""
        protocol = self.protocol
        if protocol.state is _OPEN:
            protocol.send_close(code, reason)
            self._write_out()
        elif protocol.state is _CONNECTING:
            self.abort()

    def fail(self, code: int, reason: str = "") -> None:
        """Close at once with ``code`` after a broken rule (websockets' ``fail``)."""
        if self.protocol.state is _OPEN or self.protocol.state is _CONNECTING:
            self.protocol.fail(code, reason)
            self._write_out()

    def abort(self) -> None:
        """Drop the TCP connection now, without a close handshake."""
        if self.transport is not None:
            self.transport.abort()

    def _write_out(self, *, peer_ended: bool = False, replies: bool = False) -> None:
        """Write what the protocol has to send, in one write; the end of the stream half-closes
        the TCP connection (or closes it where that cannot be done, as over TLS).

        :param peer_ended: the peer's end of the stream was just received: the transport closes
            the connection next, so this side's end needs no write of its own.
        :param replies: what there is to send was forced by the peer's frames (pongs, a close
            echoed): it may take the buffer at most :data:`CONTROL_REPLY_BUDGET` bytes past the
            high-water mark, else the connection is dropped (:attr:`flooded`).
        """
        transport = self.transport
        protocol = self.protocol
        chunks = protocol.data_to_send()
        if transport is None or transport.is_closing():
            return
        data = [chunk for chunk in chunks if chunk]
        if data:
            out = data[0] if len(data) == 1 else b"".join(data)
            if (
                replies
                and transport.get_write_buffer_size() + len(out)
                > self._write_limits[0] + CONTROL_REPLY_BUDGET
            ):
                self.flooded = True
                transport.abort()  # the peer reads nothing: a close frame would only queue behind
                return
            transport.write(out)
        if len(data) != len(chunks) and not peer_ended:  # an empty chunk: the end of the stream
            if transport.can_write_eof():
                with contextlib.suppress(Exception):  # the transport may already be going away
                    transport.write_eof()
            else:
                transport.close()
        if self._close_timer is None and protocol.close_expected():
            self._close_timer = self.loop.call_later(self.close_timeout or 0, self.abort)

    # ------------------------------------------------------------------ keepalive

    def _send_ping(self) -> None:
        self._keepalive = None
        if self.protocol.state is not _OPEN:
            return
        self._ping = data = os.urandom(4)
        self._pinged_at = self.loop.time()
        self.protocol.send_ping(data)
        self._write_out()
        if self.ping_timeout is not None:
            self._keepalive = self.loop.call_later(self.ping_timeout, self._pong_missing)

    def _pong_missing(self) -> None:
        self._keepalive = None
        self.fail(CloseCode.INTERNAL_ERROR, "keepalive ping timeout")

    def _pong(self, data: bytes) -> None:
        if self._ping is None or data != self._ping:
            return  # unsolicited (RFC 6455 §5.5.3): nothing to do
        self._ping = None
        if self._keepalive is not None:
            self._keepalive.cancel()
        assert self.ping_interval is not None
        latency = self.loop.time() - self._pinged_at
        self._keepalive = self.loop.call_later(max(0.0, self.ping_interval - latency), self._send_ping)

    # ------------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        high, low = self._write_limits
        transport.set_write_buffer_limits(high, low)

    def data_received(self, data: bytes) -> None:
        protocol = self.protocol
        if protocol.state is _CONNECTING:
            self._receive_response(data)
            return
        protocol.receive_data(data)
        events = protocol.events_received()
        self._write_out(replies=True)  # pongs, the close frame echoed
        self._frames(events)
        self._hand_over()

    def _receive_response(self, data: bytes) -> None:
        protocol = self.protocol
        protocol.receive_data(data)
        events = protocol.events_received()
        self._write_out()
        if not events:
            return  # the response is not complete yet
        response = events[0]
        assert isinstance(response, Response)
        error = protocol.handshake_exc
        if error is not None:
            if not self.opened.done():
                self.opened.set_exception(error)
            return
        # websockets checked it is one of those offered
        self._subprotocol = response.headers.get("Sec-WebSocket-Protocol")
        if not self.opened.done():
            self.opened.set_result(None)
        if self.ping_interval is not None:
            self._keepalive = self.loop.call_later(self.ping_interval, self._send_ping)
        if self.handler is not None:
            self.handler.socket_opened(self)
        self._frames(events[1:])  # what came with the response (a gateway's hello)
        self._hand_over()

    def _frames(self, events: list[Any]) -> None:
        """Turn parsed frames into messages in the inbox (control frames need nothing more: the
        protocol answered pings and the close already)."""
        for frame in events:
            if type(frame) is not Frame or self._refused:
                continue
            opcode = frame.opcode
            if opcode is _PONG:
                self._pong(bytes(frame.data))
                continue
            if opcode is _TEXT or opcode is _BINARY:
                if frame.fin:
                    self._message(opcode, bytes(frame.data))
                else:
                    self._fragments, self._fragmented = [bytes(frame.data)], opcode
            elif opcode is _CONT and self._fragments is not None:  # the protocol checked the order
                self._fragments.append(bytes(frame.data))
                if frame.fin:
                    fragments, self._fragments = self._fragments, None
                    self._message(self._fragmented, b"".join(fragments))
                elif len(self._fragments) >= MAX_FRAGMENTS:
                    self._fragments = None
                    self._refuse(CloseCode.MESSAGE_TOO_BIG, "too many fragments")

    def _message(self, opcode: Opcode, data: bytes) -> None:
        if opcode is _BINARY:
            self._inbox.append(data)
            return
        try:
            self._inbox.append(data.decode())
        except UnicodeDecodeError as exc:
            # RFC 6455 §8.1: a text message that is not UTF-8 fails the connection (1007)
            self._refuse(CloseCode.INVALID_DATA, f"{exc.reason} at position {exc.start}")

    def _refuse(self, code: int, reason: str) -> None:
        """A message broke a rule: fail the connection, and hand nothing after it over."""
        self._refused = True
        self.fail(code, reason)

    def _hand_over(self) -> None:
        """Hand the inbox's messages to the handler, :data:`FRAMES_PER_TURN` per loop turn; with
        more waiting, reading pauses until the inbox is empty."""
        if self._handing or not self._inbox:
            return
        self._handing = True
        try:
            inbox = self._inbox
            for _ in range(FRAMES_PER_TURN):
                if not inbox:
                    break
                message = inbox.popleft()
                handler = self.handler
                if handler is not None:
                    handler.socket_message(message)
        finally:
            self._handing = False
        if self._inbox:
            if self._turn is None:
                self._turn = self.loop.call_soon(self._next_turn)
                self._reading()
        elif self._turn is not None:
            self._turn.cancel()
            self._turn = None
            self._reading()

    def _next_turn(self) -> None:
        self._turn = None
        self._hand_over()
        self._reading()

    def _reading(self) -> None:
        """Read while the inbox is handed over and writing is not paused; else pause reading (a
        peer that does not read what it is sent is not read either: every frame read may owe it
        a reply)."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        wanted = self._turn is None and not self.paused
        if wanted != transport.is_reading():
            if wanted:
                transport.resume_reading()
            else:
                transport.pause_reading()

    def eof_received(self) -> None:
        self.protocol.receive_eof()
        self._frames(self.protocol.events_received())
        self._write_out(peer_ended=True, replies=True)
        self._hand_over()
        # the WebSocket close handshake comes first: nothing is written after the peer's EOF, so
        # the transport closes (returning a true value would keep it half-open); closing sends
        # this side's end, so the protocol's half-close would only be one more system call

    def connection_lost(self, exc: Exception | None) -> None:
        release_transport(self.transport)  # no reference cycle left for the collector
        protocol = self.protocol
        protocol.receive_eof()  # idempotent: the state becomes CLOSED
        for timer in (self._keepalive, self._close_timer, self._stall_timer, self._turn):
            if timer is not None:
                timer.cancel()
        self._keepalive = self._close_timer = self._stall_timer = self._turn = None
        if self._inbox:  # what was read before the end is still the peer's word, in order
            handler = self.handler
            while self._inbox:
                message = self._inbox.popleft()
                if handler is not None:
                    handler.socket_message(message)
        if not self.opened.done():
            # a TLS alert the gateway sent says more than the end of the stream websockets saw
            alert = exc if isinstance(exc, ssl.SSLError) else None
            error = (
                alert
                or protocol.handshake_exc
                or exc
                or ConnectionError("the connection closed during the upgrade")
            )
            self.opened.set_exception(error)
            self.opened.exception()  # retrieved here: the opener may be gone
        if not self.lost.done():
            self.lost.set_result(None)

    def pause_writing(self) -> None:
        self.paused = True
        self._reading()
        if self.write_timeout is not None and self._stall_timer is None:
            self._stall_timer = self.loop.call_later(self.write_timeout, self._stall)

    def resume_writing(self) -> None:
        self.paused = False
        self._reading()
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        handler = self.handler
        if handler is not None:
            handler.socket_writable()

    def _stall(self) -> None:
        self._stall_timer = None
        if self.paused:
            self.stalled = True
            self.abort()
