"""One stream connection of the emulator: the websockets connection class
(:class:`EmulatorConnection`) and the I/O loop around the stream's
:class:`~airflow_provider_systemzero.protocol.gateway.GatewaySession` (:class:`StreamLoop`).

The loop feeds the session every frame, decide outcome, shutdown request and timer, and performs
the actions it returns in order: a text frame per :class:`SendMessage` (through a FIFO writer, so
the loop never blocks on a slow reader and the send queue can be measured), a backend call per
:class:`DispatchDecide`, a close per :class:`CloseConnection`. Both classes are parts of
:class:`~airflow_provider_systemzero.emulator.server.Emulator` and keep its counters.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
import types
from collections.abc import Awaitable, Coroutine, Generator, Iterable
from typing import TYPE_CHECKING, Any

from websockets.asyncio.server import Server, ServerConnection
from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.server import ServerProtocol

from airflow_provider_systemzero.emulator.stats import AcceptedState
from airflow_provider_systemzero.protocol.errors import ErrorEnvelope, RetryHint
from airflow_provider_systemzero.protocol.gateway import (
    CloseConnection,
    DecideFailure,
    DecideOutcome,
    DispatchDecide,
    GatewayAction,
    GatewaySession,
    SendMessage,
)
from airflow_provider_systemzero.protocol.messages import Ping, encode_message
from airflow_provider_systemzero.protocol.ratelimit import TokenBucket
from airflow_provider_systemzero.protocol.reconnect import CloseCode

if TYPE_CHECKING:
    from airflow_provider_systemzero.emulator.server import Emulator

__all__ = ["EmulatorConnection", "StreamLoop"]

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# the connection class: counts native control frames, and can play a silent peer
# --------------------------------------------------------------------------------------------


class EmulatorConnection(ServerConnection):
    """The websockets connection of one stream: counts the client's native pings and pongs against
    the advertised native control limits (close 1008 over them), plays a silent peer when the
    faults say so, and releases the account's stream reservation as soon as the stream ends.

    :param protocol: websockets' server protocol.
    :param server: websockets' server.
    :param emulator: the emulator it belongs to.
    """

    def __init__(
        self, protocol: ServerProtocol, server: Server, *, emulator: Emulator, **kwargs: Any
    ) -> None:
        super().__init__(protocol, server, **kwargs)
        self.emulator = emulator
        self.account: str | None = None
        self.reservation_released = True
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
        # empty chunk is the end of the stream, as in the base class.
        pending: list[bytes] = []
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

    async def ping(self, data: Any = None) -> Awaitable[float]:
        self.emulator._counters["native_pings_sent"] += 1
        return await super().ping(data)

    def process_event(self, event: Any) -> None:
        if isinstance(event, Frame) and event.opcode in (Opcode.PING, Opcode.PONG):
            if event.opcode is Opcode.PONG:
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
        super().process_event(event)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        # A close frame from the client ends the stream for capacity at once: the client can only
        # see its connection closed (and open the next one) after this point.
        if self.protocol.close_rcvd is not None:
            self.release_reservation()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.release_reservation()

    def release_reservation(self) -> None:
        if not self.reservation_released and self.account is not None:
            self.reservation_released = True
            self.emulator._reserved[self.account] -= 1


# --------------------------------------------------------------------------------------------
# one stream
# --------------------------------------------------------------------------------------------

_TICK = ("tick",)
_LOST = ("lost",)
_CLOSE = object()


@types.coroutine
def _resume(coroutine: Coroutine[Any, Any, Any], pending: Any) -> Generator[Any, Any, Any]:
    """Carry on, inside a task, a coroutine that was stepped once outside one and is waiting on
    ``pending`` (what an eager task start does): the rest of it runs exactly as it would have."""
    while True:
        try:
            sent = yield pending
        except BaseException as exc:  # cancellation and errors go to the coroutine, as in a task
            try:
                pending = coroutine.throw(exc)
            except StopIteration as stop:
                return stop.value
        else:
            try:
                pending = coroutine.send(sent)
            except StopIteration as stop:
                return stop.value


class StreamLoop:
    """The I/O loop of one stream connection.

    Three tasks: a reader putting frames in the inbox, a writer taking frames from the outbox,
    and :meth:`run`, the only one that touches the session. Decide calls (emulator-owned tasks,
    so a decide outlives a dropped connection and settles in the ledger as it would on the real
    service), shutdown requests and completed ping writes arrive through the inbox too.
    """

    def __init__(self, emulator: Emulator, ws: EmulatorConnection, account: str) -> None:
        self.emulator = emulator
        self.ws = ws
        self.account = account
        self.stream_id = "szws_" + secrets.token_hex(16)
        self.limits = emulator.limits
        self.session = GatewaySession(stream_id=self.stream_id, now=time.monotonic(), limits=self.limits)
        self.inbox: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
        self.outbox: asyncio.Queue[Any] = asyncio.Queue()
        self.out_bytes = 0
        self.writing = False
        self.last_progress = time.monotonic()
        self.close_action: CloseConnection | None = None
        self.counted_close: int | None = None
        self.finished = asyncio.Event()
        self._state_seen: Any = None
        # frames of the event being handled, written together when it is done
        self._frames: list[tuple[bytes, int, int | None]] = []
        # decide outcomes that were ready at once, fed to the session after the current actions
        self._settled: list[tuple[int, DecideOutcome]] = []

    # ------------------------------------------------------------------ tasks

    async def _read(self) -> None:
        try:
            async for message in self.ws:
                if isinstance(message, str):
                    self.inbox.put_nowait(("text", message))
                else:
                    self.inbox.put_nowait(("binary",))
        except ConnectionClosed:
            pass
        finally:
            self.inbox.put_nowait(_LOST)

    async def _write(self) -> None:
        while True:
            batch = [await self.outbox.get()]
            while batch[-1] is not _CLOSE and not self.outbox.empty():
                batch.append(self.outbox.get_nowait())
            frames = [item for item in batch if item is not _CLOSE]
            if frames:
                self.writing = True
                try:
                    async with self.ws.send_context():
                        for data, _, _ in frames:
                            self.ws.protocol.send_text(data)
                except ConnectionClosed:
                    return
                finally:
                    self.writing = False
                now = time.monotonic()
                self.last_progress = now
                for _, size, nonce in frames:
                    self.out_bytes -= size
                    if nonce is not None:
                        self.inbox.put_nowait(("ping_written", nonce, now))
            if batch[-1] is _CLOSE:
                assert self.close_action is not None
                await self.ws.close(self.close_action.code, self.close_action.reason)
                return

    # ------------------------------------------------------------------ the loop

    async def run(self) -> None:
        reader = asyncio.create_task(self._read())
        writer = asyncio.create_task(self._write())
        try:
            self._handle(self.session.actions())
            if self.emulator._shutting_down:
                self._handle(
                    self.session.begin_shutdown(time.monotonic(), self.emulator._shutdown_retry_after_ms)
                )
            while not self.session.closed:
                event = await self._next_event()
                now = time.monotonic()
                kind = event[0]
                if kind == "text":
                    self._handle(self.session.receive_text(event[1], now))
                    self._observe_state()
                elif kind == "binary":
                    self._handle(self.session.receive_binary(now))
                elif kind == "decided":
                    self._handle(self.session.dispatch_finished(event[1], event[2], now))
                elif kind == "ping_written":
                    self.session.ping_written(event[1], event[2])
                elif kind == "shutdown":
                    self._handle(self.session.begin_shutdown(now, event[1]))
                elif kind == "lost":
                    self.session.connection_lost()
                    break
                else:
                    self._handle(self.session.tick(now))
                if not self.outbox.empty():
                    # Let the writer hand what is queued to the transport before the next event:
                    # a burst of client frames must not look like a slow reader. Only real
                    # backpressure (a paused transport) leaves frames queued.
                    await asyncio.sleep(0)
                self._report_send_queue(time.monotonic())
                self.emulator._notify()
            if self.close_action is not None:
                await self._finish_close(writer)
        finally:
            reader.cancel()
            if not writer.done():
                writer.cancel()
            self.session.connection_lost()

    async def _next_event(self) -> tuple[Any, ...]:
        deadlines = [d for d in (self.session.next_deadline(), self._send_queue_deadline()) if d is not None]
        timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
        try:
            async with asyncio.timeout(timeout):
                return await self.inbox.get()
        except TimeoutError:
            return _TICK

    def _handle(self, actions: Iterable[GatewayAction]) -> None:
        """Perform the session's actions, then feed it the decide outcomes that were ready at once
        (and perform what follows), then write the frames of it all together."""
        self._perform(actions)
        while self._settled:
            dispatch_id, outcome = self._settled.pop(0)
            self._perform(self.session.dispatch_finished(dispatch_id, outcome, time.monotonic()))
        self._flush()

    def _perform(self, actions: Iterable[GatewayAction]) -> None:
        for action in actions:
            if isinstance(action, SendMessage):
                message = action.message
                data = encode_message(message).encode("utf-8")
                self._frames.append((data, len(data), message.nonce if isinstance(message, Ping) else None))
                self.emulator._messages_sent[message.TYPE] += 1
                if message.TYPE == "decision" and log.isEnabledFor(logging.DEBUG):
                    log.debug(
                        "stream %s: decision for state version %s",
                        self.stream_id,
                        getattr(message, "state_version", "?"),
                    )
            elif isinstance(action, DispatchDecide):
                self._dispatch(action)
            elif isinstance(action, CloseConnection):
                self._flush()  # what the session sent before the close leaves first
                self.close_action = action
                self.outbox.put_nowait(_CLOSE)
                # Counted now, before the close frame is written, so a test that saw the close
                # sees it in the stats. websockets may have closed first (1009, a keepalive
                # timeout): then that is the code on the wire.
                sent = self.ws.protocol.close_sent
                self.counted_close = sent.code if sent is not None else action.code
                self.emulator._closes[self.counted_close] += 1

    def _flush(self) -> None:
        """Write the frames of the event just handled: in one write, from here, when nothing is
        queued before them and the transport takes data; else through the writer, in order."""
        frames, self._frames = self._frames, []
        if not frames:
            return
        ws = self.ws
        if self.outbox.empty() and not self.writing and not ws.paused and ws.protocol.state is State.OPEN:
            for data, _, _ in frames:
                ws.protocol.send_text(data)
            ws.send_data()
            now = time.monotonic()
            self.last_progress = now
            for _, _, nonce in frames:
                if nonce is not None:
                    self.session.ping_written(nonce, now)
            return
        if self.outbox.empty() and not self.writing:
            self.last_progress = time.monotonic()
        for frame in frames:
            self.out_bytes += frame[1]
            self.outbox.put_nowait(frame)

    def _dispatch(self, action: DispatchDecide) -> None:
        # The decide call starts at once (as an eager task would): with nothing to wait for (no
        # simulated latency, a plain decider) its outcome is fed to the session right after the
        # current actions, so the decision leaves in the same write as the ack. Otherwise the
        # rest runs as an emulator-owned task, which outlives a dropped connection.
        coroutine = self._decide(action)
        if not self.emulator.backend.decides_at_once():
            self.emulator._spawn(self._decided_later(coroutine, None, action.dispatch_id))
            return
        try:
            pending = coroutine.send(None)
        except StopIteration as stop:
            self._settled.append((action.dispatch_id, stop.value))
            return
        self.emulator._spawn(self._decided_later(coroutine, pending, action.dispatch_id))

    async def _decided_later(
        self, coroutine: Coroutine[Any, Any, DecideOutcome], pending: Any, dispatch_id: int
    ) -> None:
        outcome = await (coroutine if pending is None else _resume(coroutine, pending))
        self.inbox.put_nowait(("decided", dispatch_id, outcome))

    async def _decide(self, action: DispatchDecide) -> DecideOutcome:
        try:
            return await self.emulator.backend.decide(self.account, action.body, action.idempotency_key)
        except Exception as exc:  # keep the stream alive whatever the backend does
            log.exception("decide backend failed")
            return DecideFailure(
                500,
                ErrorEnvelope("api_error", "internal_error", f"backend failure: {exc}"),
                RetryHint(False),
                "req_" + secrets.token_hex(12),
            )

    def _observe_state(self) -> None:
        current = self.session.stream_state
        if current is None or current is self._state_seen:
            return
        if self._state_seen is None and self.session.request is not None:
            key = self.session.request.prompt_cache_key
            self.emulator._latest_by_cache_key[key if key is not None else self.stream_id] = self.stream_id
        self._state_seen = current
        self.emulator.final_states[self.stream_id] = AcceptedState(
            current.state, [a.to_dict() for a in current.attachments]
        )

    # ------------------------------------------------------------------ send queue

    def _queued_frames(self) -> int:
        return self.outbox.qsize() - (1 if self.close_action is not None and not self.outbox.empty() else 0)

    def _send_queue_pending(self) -> bool:
        return self.writing or self._queued_frames() > 0

    def _send_queue_deadline(self) -> float | None:
        if self.session.closed or not self._send_queue_pending():
            return None
        return self.last_progress + self.limits.write_progress_timeout_ms / 1000

    def _report_send_queue(self, now: float) -> None:
        if self.session.closed:
            return
        transport_bytes = 0
        with contextlib.suppress(Exception):
            transport_bytes = self.ws.transport.get_write_buffer_size()
        stalled = now - self.last_progress if self._send_queue_pending() else 0.0
        self._handle(
            self.session.send_queue_report(
                queued_bytes=self.out_bytes + transport_bytes,
                queued_frames=self._queued_frames(),
                write_stalled_for=stalled,
                now=now,
            )
        )

    async def _finish_close(self, writer: asyncio.Task[None]) -> None:
        # The writer flushes what is queued, then closes. A reader too slow to take the backlog
        # gets write_progress_timeout, then the close frame is queued directly; if even that
        # cannot be written within the close handshake timeout, the TCP connection is aborted.
        assert self.close_action is not None
        with contextlib.suppress(TimeoutError, ConnectionClosed):
            await asyncio.wait_for(asyncio.shield(writer), self.limits.write_progress_timeout_ms / 1000)
        if writer.done():
            return
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
            await writer
        try:
            async with asyncio.timeout(self.limits.close_handshake_timeout_ms / 1000):
                await self.ws.close(self.close_action.code, self.close_action.reason)
        except TimeoutError:
            self.ws.transport.abort()

    def close_code(self) -> int:
        """The close code of a stream the gateway session did not close itself."""
        protocol = self.ws.protocol
        if protocol.close_sent is not None:
            return protocol.close_sent.code
        if protocol.close_rcvd is not None:
            return protocol.close_rcvd.code
        return CloseCode.ABNORMAL_CLOSURE
