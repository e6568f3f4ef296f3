"""The websockets connection class of an emulator stream (:class:`EmulatorConnection`).

It hands each complete, valid UTF-8 text frame to its stream
(:class:`~airflow_provider_systemzero.emulator.connection.StreamLoop`) where websockets parses it,
so the frame is handled and answered in the callback that read it. Every other data frame — a
fragment, a binary frame, a frame that is not valid UTF-8, or any frame while an earlier message
still waits in websockets' reader — takes websockets' own path (reassembly, the close 1007 for
invalid UTF-8, flow control), and the stream's reader task delivers it, in order.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from websockets.asyncio.server import Server, ServerConnection
from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.server import ServerProtocol

from airflow_provider_systemzero.dependency_internals import close_frames
from airflow_provider_systemzero.protocol.ratelimit import TokenBucket
from airflow_provider_systemzero.protocol.reconnect import CloseCode

if TYPE_CHECKING:
    from airflow_provider_systemzero.emulator.host import EmulatorHost, FrameReceiver

__all__ = ["EmulatorConnection"]

_TEXT, _CONT, _BINARY = Opcode.TEXT, Opcode.CONT, Opcode.BINARY
_PING, _PONG = Opcode.PING, Opcode.PONG


class EmulatorConnection(ServerConnection):
    """The websockets connection of one stream: hands each complete text frame to its stream as
    it is parsed, counts the client's native pings and pongs against the advertised native
    control limits (close 1008 over them), plays a silent peer when the faults say so, and
    releases the account's stream reservation as soon as the stream ends.

    :param protocol: websockets' server protocol.
    :param server: websockets' server.
    :param emulator: the emulator it belongs to.
    """

    def __init__(
        self, protocol: ServerProtocol, server: Server, *, emulator: EmulatorHost, **kwargs: Any
    ) -> None:
        super().__init__(protocol, server, **kwargs)
        self.emulator = emulator
        self.account: str | None = None
        self.reservation_released = True
        #: The stream this connection feeds (``None`` before its handler runs and after it ends).
        self.stream: FrameReceiver | None = None
        #: Messages handed to websockets' own reader and not yet delivered to the stream: while
        #: any waits, every later frame takes the same path, so none overtakes it.
        self.queued_messages = 0
        #: The 101 response is held back, to leave in one write with the stream's hello: one
        #: segment and one wake-up of the client fewer per stream. The next write of the
        #: connection (the hello, or whatever comes first) carries it.
        self._hold_response = True
        self._held_response: bytes | None = None
        # the client's native pings and pongs, against the advertised native control limits
        lim, now = emulator.limits, time.monotonic()
        self._control_frames = TokenBucket(
            lim.max_native_control_frames_per_second, max(1, lim.native_control_frame_burst), now
        )
        self._control_bytes = TokenBucket(
            lim.max_native_control_bytes_per_second, max(1, lim.native_control_byte_burst), now
        )

    def send_data(self) -> None:
        # A silent peer: once open, every outgoing byte is dropped (pongs, pings, messages, the
        # close frame). The protocol state still advances, so a close times out and aborts.
        if not self.emulator.faults.answer_pings and self.protocol.state is not State.CONNECTING:
            self.protocol.data_to_send()
            return
        # Frames sent together leave in one write (one segment, one wake-up of the client); an
        # empty chunk is the end of the stream, as in the base class. The 101 response waits for
        # the stream's hello, which follows it in the same callback (see hold_response).
        pending: list[bytes] = []
        if self._held_response is not None:
            pending.append(self._held_response)
            self._held_response = None
        elif self._hold_response and self.protocol.state is State.OPEN:
            self._hold_response = False
            self._held_response = b"".join(self.protocol.data_to_send())
            return
        for chunk in self.protocol.data_to_send():
            if chunk:
                pending.append(chunk)
                continue
            if pending:
                self.transport.write(b"".join(pending))
                pending = []
            if self.transport.can_write_eof():
                with contextlib.suppress(Exception):
                    self.transport.write_eof()
            else:
                self.transport.close()
        if pending:
            self.transport.write(b"".join(pending))

    async def close(self, code: int = CloseCode.NORMAL_CLOSURE, reason: str = "") -> None:
        # Closed already (the usual end: the client closed, the TCP connection is gone): nothing
        # to do. websockets would still wait for the lost connection under a close timeout and
        # abort the transport again (its handler closes every connection it ran).
        if self.protocol.state is State.CLOSED:
            return
        await super().close(code, reason)

    async def ping(self, data: Any = None) -> Awaitable[float]:
        self.emulator._counters["native_pings_sent"] += 1
        return await super().ping(data)

    def process_event(self, event: Any) -> None:
        if type(event) is not Frame:  # the handshake request
            super().process_event(event)
            return
        opcode = event.opcode
        if opcode is _TEXT and event.fin and not self.queued_messages:
            stream = self.stream
            if stream is not None:
                data = event.data
                try:
                    text = data.decode()
                except UnicodeDecodeError:
                    pass  # websockets' reader closes 1007, as it does for any message
                else:
                    stream.receive_text(text, len(data))
                    return
        if opcode is _PING or opcode is _PONG:
            if opcode is _PONG:
                self.emulator._counters["native_pongs_received"] += 1
            now = time.monotonic()
            size = max(1, len(event.data))  # an empty ping still costs a byte of the budget
            if not (self._control_frames.try_take(now) and self._control_bytes.try_take(now, size)):
                # over max_native_control_frames_per_second / _bytes_per_second (and their bursts):
                # the public document names the limits, not the outcome; the emulator closes 1008
                if self.protocol.state is State.OPEN:
                    self.emulator._counters["native_control_floods"] += 1
                    self.protocol.fail(CloseCode.POLICY_VIOLATION, "native_control_rate_limited")
                    self.send_data()
                return
        elif opcode is _TEXT or opcode is _BINARY or opcode is _CONT:
            # websockets' own path: reassembly, UTF-8 check, flow control; the reader delivers it
            if event.fin:
                self.queued_messages += 1
            super().process_event(event)
            if self.stream is not None:
                self.stream.start_reader()
            return
        super().process_event(event)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        # A close frame from the client ends the stream for capacity at once: the client can only
        # see its connection closed (and open the next one) after this point.
        if close_frames(self.protocol)[1] is not None:
            self.release_reservation()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.release_reservation()
        if self.stream is not None:
            self.stream.transport_lost()

    def release_reservation(self) -> None:
        if not self.reservation_released and self.account is not None:
            self.reservation_released = True
            self.emulator._reserved[self.account] -= 1
