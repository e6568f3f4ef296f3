"""One stream connection of the emulator: the websockets connection class
(:class:`EmulatorConnection`) and the I/O around the stream's
:class:`~airflow_provider_systemzero.protocol.gateway.GatewaySession` above it (:class:`StreamLoop`).

The :class:`~airflow_provider_systemzero.emulator.server.Emulator` makes both for each client and
owns them: each is given what it uses (the limits, the standing faults, the decide backend, the
emulator's :class:`~airflow_provider_systemzero.emulator.stats.Tally`) when it is made, and knows
nothing of the emulator.

The stream feeds the session every frame, decide outcome, shutdown request and timer, and
performs the actions it returns in order: a text frame per :class:`SendMessage` (written at once
when nothing waits before it, else through a FIFO writer, so the stream never blocks on a slow
reader and the send queue can be measured), a backend call per :class:`DispatchDecide`, a close
per :class:`CloseConnection`.

A complete text frame is handled where websockets hands it over
(:meth:`EmulatorConnection.process_event`): decoded, fed to the session and answered in the same
event-loop callback that read it. A frame that is not a complete, valid UTF-8 text frame — a
fragment, a binary frame, a frame that arrives while an earlier message still waits in websockets'
reader — takes websockets' own path (its reassembly, its close 1007 for invalid UTF-8, flow
control) and reaches the stream through a reader task, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
import time
import types
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterable
from typing import Any

from websockets.asyncio.server import Server, ServerConnection
from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.server import ServerProtocol

from airflow_provider_systemzero.dependency_internals import close_frames
from airflow_provider_systemzero.emulator.backend import DecideBackend
from airflow_provider_systemzero.emulator.faults import Faults
from airflow_provider_systemzero.emulator.stats import Tally
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
from airflow_provider_systemzero.protocol.limits import Limits
from airflow_provider_systemzero.protocol.messages import Hello, Ping, encode_message
from airflow_provider_systemzero.protocol.ratelimit import TokenBucket
from airflow_provider_systemzero.protocol.reconnect import CloseCode

__all__ = ["ActionTap", "EmulatorConnection", "StreamLoop"]

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# the websocket connection
# --------------------------------------------------------------------------------------------

_TEXT, _CONT, _BINARY = Opcode.TEXT, Opcode.CONT, Opcode.BINARY
_PING, _PONG = Opcode.PING, Opcode.PONG


class EmulatorConnection(ServerConnection):
    """The websockets connection of one stream: hands each complete text frame to its stream as
    it is parsed, counts the client's native pings and pongs against the advertised native
    control limits (close 1008 over them), plays a silent peer when the faults say so, and
    releases the account's stream reservation as soon as the stream ends.

    :param protocol: websockets' server protocol.
    :param server: websockets' server.
    :param limits: the advertised limits (the native control limits are enforced here).
    :param faults: the emulator's standing faults (a silent peer is played here).
    :param tally: the emulator's counts: native pings and pongs, control floods, reservations.
    :param kwargs: websockets' own connection arguments.
    """

    def __init__(
        self,
        protocol: ServerProtocol,
        server: Server,
        *,
        limits: Limits,
        faults: Faults,
        tally: Tally,
        **kwargs: Any,
    ) -> None:
        super().__init__(protocol, server, **kwargs)
        self.faults = faults
        self.tally = tally
        self.account: str | None = None
        self.reservation_released = True
        #: The stream this connection feeds (``None`` before its handler runs and after it ends).
        self.stream: StreamLoop | None = None
        #: Messages handed to websockets' own reader and not yet delivered to the stream: while
        #: any waits, every later frame takes the same path, so none overtakes it.
        self.queued_messages = 0
        #: The 101 response is held back, to leave in one write with the stream's hello: one
        #: segment and one wake-up of the client fewer per stream. The next write of the
        #: connection (the hello, or whatever comes first) carries it.
        self._hold_response = True
        self._held_response: bytes | None = None
        # the client's native pings and pongs, against the advertised native control limits
        lim, now = limits, time.monotonic()
        self._control_frames = TokenBucket(
            lim.max_native_control_frames_per_second, max(1, lim.native_control_frame_burst), now
        )
        self._control_bytes = TokenBucket(
            lim.max_native_control_bytes_per_second, max(1, lim.native_control_byte_burst), now
        )

    def send_data(self) -> None:
        # A silent peer: once open, every outgoing byte is dropped (pongs, pings, messages, the
        # close frame). The protocol state still advances, so a close times out and aborts.
        if not self.faults.answer_pings and self.protocol.state is not State.CONNECTING:
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
        self.tally.counters["native_pings_sent"] += 1
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
                self.tally.counters["native_pongs_received"] += 1
            now = time.monotonic()
            size = max(1, len(event.data))  # an empty ping still costs a byte of the budget
            if not (self._control_frames.try_take(now) and self._control_bytes.try_take(now, size)):
                # over max_native_control_frames_per_second / _bytes_per_second (and their bursts):
                # the public document names the limits, not the outcome; the emulator closes 1008
                if self.protocol.state is State.OPEN:
                    self.tally.counters["native_control_floods"] += 1
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

    def reserve(self, account: str) -> None:
        """Hold one of the account's stream places for this connection (its upgrade was accepted).
        It is released once: when the client's close frame arrives, when the TCP connection is
        lost (also before the stream started), or when the stream ends.

        :param account: the account.
        """
        self.account = account
        self.tally.reserved[account] += 1
        self.reservation_released = False

    def release_reservation(self) -> None:
        """Give the account's stream place back (once; nothing when none is held)."""
        if not self.reservation_released and self.account is not None:
            self.reservation_released = True
            self.tally.reserved[self.account] -= 1


# --------------------------------------------------------------------------------------------
# one stream
# --------------------------------------------------------------------------------------------

_CLOSE = object()

#: A stream's hello differs from another's with the same limits only in its stream ID (and the
#: request ID made from it): it is encoded once per limits, around a placeholder ID, and each
#: stream's frame is that encoding with its own ID put in.
_HELLO_ID = "f" * 32
_hello_frames: dict[tuple[Any, ...], list[bytes]] = {}


def _hello_frame(message: Hello) -> bytes:
    hex_id = message.stream_id.removeprefix("szws_")
    if message.rate_limit is not None or message.request_id != f"req_{hex_id}_1" or len(hex_id) != 32:
        return encode_message(message).encode("utf-8")
    key = (message.limits, message.seq, message.protocol)
    parts = _hello_frames.get(key)
    if parts is None:
        placeholder = dataclasses.replace(
            message, stream_id="szws_" + _HELLO_ID, request_id=f"req_{_HELLO_ID}_1"
        )
        parts = encode_message(placeholder).encode("utf-8").split(_HELLO_ID.encode())
        if len(parts) != 3:  # pragma: no cover - the placeholder turned up elsewhere: encode each time
            return encode_message(message).encode("utf-8")
        if len(_hello_frames) >= 64:  # a process making emulators with ever new limits
            _hello_frames.clear()
        _hello_frames[key] = parts
    return hex_id.encode().join(parts)


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


#: ``tap(stream, actions)``: sees what a stream's session decided, returns what the stream performs.
ActionTap = Callable[["StreamLoop", list[GatewayAction]], list[GatewayAction]]


class StreamLoop:
    """The I/O of one stream connection.

    Everything that happens to the stream is an *event* handled at once, in the callback that
    brought it: a text frame (from :meth:`EmulatorConnection.process_event`, or from the reader
    task for a message websockets assembled), a decide outcome (decide calls are emulator-owned
    tasks, so a decide outlives a dropped connection and settles in the ledger as it would on the
    real service), a shutdown request, a completed ping write, the stream's one timer, the loss
    of the transport. One event is handled at a time (one that arrives during another waits for
    it). After each, the send queue is reported and the timer is set to the session's next
    deadline. :meth:`run` waits for the end and performs the close.

    :param ws: its websocket connection.
    :param account: the account whose key opened it.
    :param limits: the limits its session enforces.
    :param backend: the decide backend its decide calls go to.
    :param tally: the emulator's counts: messages sent, closes, accepted states.
    :param spawn: runs a coroutine as a task of the emulator's (awaited or cancelled when the
        emulator stops): a decide call outlives the connection that made it, as on the real service.
    :param action_tap: what the session decides to do passes through this first (``None``:
        nothing does), so a test or a fault scenario can watch it, or drop some; it runs on the
        event loop. The attribute of the same name may be set at any time.
    """

    def __init__(
        self,
        ws: EmulatorConnection,
        account: str,
        *,
        limits: Limits,
        backend: DecideBackend,
        tally: Tally,
        spawn: Callable[[Awaitable[Any]], None],
        action_tap: ActionTap | None = None,
    ) -> None:
        self.ws = ws
        self.account = account
        self.stream_id = "szws_" + secrets.token_hex(16)
        self.limits = limits
        self.backend = backend
        self.tally = tally
        self.spawn = spawn
        self.action_tap = action_tap
        self.session = GatewaySession(stream_id=self.stream_id, now=time.monotonic(), limits=self.limits)
        #: Frames waiting for the writer task (made when the first frame has to wait).
        self.outbox: asyncio.Queue[Any] | None = None
        self.out_bytes = 0
        self.writing = False
        self.last_progress = time.monotonic()
        self.close_action: CloseConnection | None = None
        self.counted_close: int | None = None
        self.finished = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        #: Resolved when the session closed or the transport was lost: no event is handled after.
        self._ended: asyncio.Future[None] = self._loop.create_future()
        self._done = False
        # an event that comes before run() (a shutdown) waits for the opening, as for any event
        self._busy = True
        self._later: deque[tuple[Callable[..., None], tuple[Any, ...]]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._reader: asyncio.Task[None] | None = None
        self._writer: asyncio.Task[None] | None = None
        # the send queue limits can only be exceeded by something queued (see _report_send_queue)
        lim = self.limits
        self._idle_queue_is_fine = (
            lim.write_progress_timeout_ms > 0
            and lim.max_send_queue_bytes >= 0
            and lim.max_send_queue_frames >= 0
        )
        self._state_seen: Any = None
        # frames of the event being handled, written together when it is done
        self._frames: list[tuple[bytes, int, int | None]] = []
        # decide outcomes that were ready at once, fed to the session after the current actions
        self._settled: list[tuple[int, DecideOutcome]] = []

    # ------------------------------------------------------------------ the stream's life

    async def run(self) -> None:
        """Send ``hello``, handle the stream's events until it ends, then perform the close."""
        try:
            self._busy = False
            self._event(self._on_open)
            self.ws.stream = self
            if self.ws.queued_messages:
                self.start_reader()  # frames that came before the stream was attached
            await self._ended
            if self.close_action is not None:
                assert self._writer is not None  # the close is queued behind the frames
                await self._finish_close(self._writer)
        finally:
            self.ws.stream = None
            self._done = True
            if self._timer is not None:
                self._timer.cancel()
            if self._reader is not None:
                self._reader.cancel()
            if self._writer is not None and not self._writer.done():
                self._writer.cancel()
            self.session.connection_lost()

    def receive_text(self, text: str, size: int | None = None) -> None:
        """A complete text frame from the client.

        :param text: the frame.
        :param size: its UTF-8 length when known.
        """
        self._event(self._on_text, text, size)

    def shutdown(self, retry_after_ms: int) -> None:
        """Start the shutdown sequence (goodbye ``shutdown`` and close 1012 once a decide in flight
        settled). Asked before :meth:`run`, it follows the ``hello``.

        :param retry_after_ms: ``goodbye.resume.retry_after_ms``.
        """
        self._event(self._on_shutdown, retry_after_ms)

    def transport_lost(self) -> None:
        """The TCP connection is gone. The reader delivers the loss itself when it still holds
        messages that came before it."""
        if self._reader is None or not self.ws.queued_messages:
            self._event(self._on_lost)

    def start_reader(self) -> None:
        """Start the reader task (once) that takes the messages websockets assembled."""
        if self._reader is None and not self._done:
            self._reader = self._loop.create_task(self._read())

    # ------------------------------------------------------------------ events

    def _event(self, handler: Callable[..., None], *args: Any) -> None:
        if self._done:
            return
        if self._busy:  # one event at a time: this one follows the one being handled
            self._later.append((handler, args))
            return
        self._busy = True
        try:
            handler(*args)
            while self._later and not self._done:
                handler, args = self._later.popleft()
                handler(*args)
            if not self._done:
                self._after_event()
        except Exception as exc:
            self._end(exc)
        finally:
            self._busy = False

    def _after_event(self) -> None:
        session = self.session
        if not session.closed:
            self._report_send_queue(time.monotonic())
        self.tally.on_change()
        if session.closed:
            self._end()
            return
        deadline = session.next_deadline()
        if self._send_queue_pending():  # a write may not stall past write_progress_timeout
            queue_deadline = self.last_progress + self.limits.write_progress_timeout_ms / 1000
            if deadline is None or queue_deadline < deadline:
                deadline = queue_deadline
        self._arm(deadline)

    def _on_open(self) -> None:
        self._handle(self.session.actions())

    def _on_text(self, text: str, size: int | None) -> None:
        self._handle(self.session.receive_text(text, time.monotonic(), size))
        self._observe_state()

    def _on_binary(self) -> None:
        self._handle(self.session.receive_binary(time.monotonic()))

    def _on_decided(self, dispatch_id: int, outcome: DecideOutcome) -> None:
        self._handle(self.session.dispatch_finished(dispatch_id, outcome, time.monotonic()))

    def _on_ping_written(self, nonce: int, now: float) -> None:
        self.session.ping_written(nonce, now)

    def _on_shutdown(self, retry_after_ms: int) -> None:
        self._handle(self.session.begin_shutdown(time.monotonic(), retry_after_ms))

    def _on_tick(self) -> None:
        self._handle(self.session.tick(time.monotonic()))

    def _on_lost(self) -> None:
        self.session.connection_lost()
        self._end()

    def _end(self, exc: BaseException | None = None) -> None:
        self._done = True
        self._later.clear()
        if not self._ended.done():
            if exc is None:
                self._ended.set_result(None)
            else:
                self._ended.set_exception(exc)

    # ------------------------------------------------------------------ the timer

    def _arm(self, deadline: float | None) -> None:
        """Set the stream's one timer to the next deadline. A timer set earlier than needed
        stays: it finds nothing due and is set again."""
        timer = self._timer
        if deadline is None:
            if timer is not None:
                timer.cancel()
                self._timer = None
            return
        if timer is not None:
            if self._timer_at <= deadline:
                return
            timer.cancel()
        self._timer_at = deadline
        self._timer = self._loop.call_later(max(0.0, deadline - time.monotonic()), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._event(self._on_tick)

    # ------------------------------------------------------------------ tasks

    async def _read(self) -> None:
        ws = self.ws
        try:
            while True:
                message = await ws.recv()
                ws.queued_messages -= 1
                if isinstance(message, str):
                    self._event(self._on_text, message, None)
                else:
                    self._event(self._on_binary)
        except ConnectionClosed:
            pass
        finally:
            self._event(self._on_lost)

    async def _write(self) -> None:
        outbox = self.outbox
        assert outbox is not None
        while True:
            batch = [await outbox.get()]
            while batch[-1] is not _CLOSE and not outbox.empty():
                batch.append(outbox.get_nowait())
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
                        self._event(self._on_ping_written, nonce, now)
            if batch[-1] is _CLOSE:
                assert self.close_action is not None
                await self.ws.close(self.close_action.code, self.close_action.reason)
                return

    def _enqueue(self, item: Any) -> None:
        if self.outbox is None:
            self.outbox = asyncio.Queue()
        self.outbox.put_nowait(item)
        if self._writer is None:
            self._writer = self._loop.create_task(self._write())

    # ------------------------------------------------------------------ actions

    def _handle(self, actions: Iterable[GatewayAction]) -> None:
        """Perform the session's actions, then feed it the decide outcomes that were ready at once
        (and perform what follows), then write the frames of it all together."""
        self._perform(actions)
        while self._settled:
            dispatch_id, outcome = self._settled.pop(0)
            self._perform(self.session.dispatch_finished(dispatch_id, outcome, time.monotonic()))
        self._flush()

    def _perform(self, actions: Iterable[GatewayAction]) -> None:
        tap = self.action_tap
        if tap is not None:
            actions = tap(self, list(actions))
        for action in actions:
            if isinstance(action, SendMessage):
                message = action.message
                if type(message) is Hello:
                    data = _hello_frame(message)
                else:
                    data = encode_message(message).encode("utf-8")
                self._frames.append((data, len(data), message.nonce if isinstance(message, Ping) else None))
                self.tally.messages_sent[message.TYPE] += 1
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
                self._enqueue(_CLOSE)
                # Counted now, before the close frame is written, so a test that saw the close
                # sees it in the stats. websockets may have closed first (1009, a keepalive
                # timeout): then that is the code on the wire.
                sent, _ = close_frames(self.ws.protocol)
                self.counted_close = sent.code if sent is not None else action.code
                self.tally.closes[self.counted_close] += 1

    def _flush(self) -> None:
        """Write the frames of the event just handled: in one write, from here, when nothing is
        queued before them and the transport takes data; else through the writer, in order."""
        frames, self._frames = self._frames, []
        if not frames:
            return
        ws = self.ws
        idle = not self.writing and (self.outbox is None or self.outbox.empty())
        if idle and not ws.paused and ws.protocol.state is State.OPEN:
            for data, _, _ in frames:
                ws.protocol.send_text(data)
            ws.send_data()
            now = time.monotonic()
            self.last_progress = now
            for _, _, nonce in frames:
                if nonce is not None:
                    self.session.ping_written(nonce, now)
            return
        if idle:
            self.last_progress = time.monotonic()
        for frame in frames:
            self.out_bytes += frame[1]
            self._enqueue(frame)

    def _dispatch(self, action: DispatchDecide) -> None:
        # The decide call starts at once (as an eager task would): with nothing to wait for (no
        # simulated latency, a plain decider) its outcome is fed to the session right after the
        # current actions, so the decision leaves in the same write as the ack. Otherwise the
        # rest runs as an emulator-owned task, which outlives a dropped connection.
        coroutine = self._decide(action)
        if not self.backend.decides_at_once():
            self.spawn(self._decided_later(coroutine, None, action.dispatch_id))
            return
        try:
            pending = coroutine.send(None)
        except StopIteration as stop:
            self._settled.append((action.dispatch_id, stop.value))
            return
        self.spawn(self._decided_later(coroutine, pending, action.dispatch_id))

    async def _decided_later(
        self, coroutine: Coroutine[Any, Any, DecideOutcome], pending: Any, dispatch_id: int
    ) -> None:
        outcome = await (coroutine if pending is None else _resume(coroutine, pending))
        self._event(self._on_decided, dispatch_id, outcome)

    async def _decide(self, action: DispatchDecide) -> DecideOutcome:
        try:
            return await self.backend.decide(self.account, action.body, action.idempotency_key)
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
            self.tally.latest_by_cache_key[key if key is not None else self.stream_id] = self.stream_id
        self._state_seen = current
        self.tally.states[self.stream_id] = current

    # ------------------------------------------------------------------ send queue

    def _queued_frames(self) -> int:
        outbox = self.outbox
        if outbox is None:
            return 0
        return outbox.qsize() - (1 if self.close_action is not None and not outbox.empty() else 0)

    def _send_queue_pending(self) -> bool:
        return self.writing or (self.outbox is not None and self._queued_frames() > 0)

    def _report_send_queue(self, now: float) -> None:
        if self.session.closed:
            return
        try:
            transport_bytes = self.ws.transport.get_write_buffer_size()
        except Exception:  # a transport being torn down
            transport_bytes = 0
        pending = self._send_queue_pending()
        if not (pending or transport_bytes or self.out_bytes) and self._idle_queue_is_fine:
            return  # nothing queued: no limit can be exceeded
        stalled = now - self.last_progress if pending else 0.0
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
        sent, received = close_frames(self.ws.protocol)
        if sent is not None:
            return sent.code
        if received is not None:
            return received.code
        return CloseCode.ABNORMAL_CLOSURE
