"""One connection of a :class:`~airflow_provider_systemzero.stream.DecisionStream`: open it, serve it, close it.

* the upgrade follows WIRE.md §1: the exact URL from the origin, ``Authorization: Bearer``, only
  the ``system-zero.stream.v1`` subprotocol (checked after connecting), no compression, no
  ``Origin``, no cookies, no proxy from the environment, ``max_size`` from the limits;
* one reader task feeds frames to the session; the writer flushes ``session.data_to_send(now)``
  after every input and at ``session.next_wakeup(now)``; a watchdog treats a peer silent past
  ``session.receipt_deadline()`` as dead (native pings run too);
* nothing waits on the peer without a bound: a write that makes no progress within
  ``write_progress_timeout`` drops the connection, a close takes at most the close-handshake
  timeout, a redirect of the upgrade is refused, and pongs are coalesced and rate-bounded;
* the gateway's words are untrusted: a key echoed back is scrubbed from every frame, and server
  text is escaped and bounded before it is logged or raised (:mod:`~airflow_provider_systemzero.stream.untrusted`);
* how the connection ended is described in an :class:`Ended` for the run loop
  (:mod:`~airflow_provider_systemzero.stream.run_loop`) to plan from.

:class:`ConnectionServing` is one part of :class:`~airflow_provider_systemzero.stream.DecisionStream`
(it uses the stream's session, signals and event handling); it is not used on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import (
    ConnectionClosed,
    InvalidHandshake,
    InvalidMessage,
    InvalidProxy,
    InvalidStatus,
    InvalidURI,
)
from websockets.protocol import State

from airflow_provider_systemzero.observability import GOODBYE_REASONS
from airflow_provider_systemzero.protocol.errors import RemoteProtocolError
from airflow_provider_systemzero.protocol.reconnect import CloseCode, ConnectionOutcome
from airflow_provider_systemzero.stream.connection import (
    FRAMES_PER_READ,
    NoRedirectsConnect,
    StreamConnection,
    connect_options,
    subprotocol_violation,
    upgrade_refusal_error,
)
from airflow_provider_systemzero.stream.exceptions import (
    ProtocolViolation,
    StreamClosed,
    SystemZeroValidationError,
)
from airflow_provider_systemzero.stream.untrusted import scrub, server_text, server_token

__all__ = ["ConnectionServing", "Ended"]

log = logging.getLogger("airflow_provider_systemzero.stream.decision_stream")  # the stream's own log

#: Frames of a change up to this many characters are written at once (far below the transport's
#: high-water mark, so the write never waits for the peer); larger ones by the writer, bounded.
_DIRECT_WRITE_BYTES = 16 * 1024
#: Pongs are flushed at most this often (seconds): the document's application message rate, 40 a second.
_PONG_FLUSH_INTERVAL = 1 / 40


@dataclass(slots=True)
class Ended:
    """How a connection attempt ended: what the core plans from, and the error to raise or keep.

    ``final`` means the stream ends whatever the plan (the caller closed it or it failed, or the
    peer is not a System Zero gateway at all).
    """

    outcome: ConnectionOutcome
    error: BaseException | None = None
    final: bool = False


class ConnectionServing:
    """The connection-serving part of a :class:`~airflow_provider_systemzero.stream.DecisionStream`."""

    def _kick_soon(self) -> None:
        """Wake the writer for pongs, at most every :data:`_PONG_FLUSH_INTERVAL`: a ping flood costs
        a bounded number of writes (the session keeps only the newest pongs owed)."""
        if self._pong_flush is not None:
            return
        loop = asyncio.get_running_loop()
        delay = self._last_pong_flush + _PONG_FLUSH_INTERVAL - loop.time()
        if delay <= 0:
            self._last_pong_flush = loop.time()
            self._kick()
            return

        def fire() -> None:
            self._pong_flush = None
            self._last_pong_flush = loop.time()
            self._kick()

        self._pong_flush = loop.call_later(delay, fire)

    def _connect_kwargs(self) -> dict[str, Any]:
        assert self._settings is not None
        return connect_options(self._settings, self.session.limits, self._ssl)

    async def _connect_and_serve(self) -> Ended:
        settings = self._settings
        assert settings is not None
        url = settings.url
        self._started_this_connection = False
        self._decided_this_connection = False
        self._goodbye = None
        self._last_fatal = None
        try:
            ws = await NoRedirectsConnect(url, **self._connect_kwargs())
            try:
                violation = subprotocol_violation(ws, url)
                if violation is not None:
                    await self._close(ws, CloseCode.PROTOCOL_ERROR, "subprotocol not selected")
                    return Ended(
                        ConnectionOutcome(CloseCode.PROTOCOL_ERROR, kind="violation"), violation, final=True
                    )
                return await self._serve(ws)
            finally:
                await self._close(ws, CloseCode.NORMAL_CLOSURE)
        except InvalidStatus as exc:
            return self._upgrade_refused(exc, url)
        except (InvalidMessage, InvalidProxy, OSError, TimeoutError, ConnectionClosed) as exc:
            return Ended(ConnectionOutcome(kind="network"), exc)
        except InvalidURI as exc:
            return Ended(
                ConnectionOutcome(kind="network"),
                SystemZeroValidationError(
                    f"the stream URL {url} is invalid: {exc}", code="invalid_origin", field="host"
                ),
                final=True,
            )
        except InvalidHandshake as exc:
            return Ended(
                ConnectionOutcome(kind="violation"),
                ProtocolViolation(
                    f"the opening handshake with {url} failed: {server_text(str(exc), self._secret())}: check that the "
                    "connection's host is a System Zero API origin",
                    code="invalid_handshake",
                ),
                final=True,
            )

    def _upgrade_refused(self, exc: InvalidStatus, url: str) -> Ended:
        error = upgrade_refusal_error(exc, url, self._secret())
        if 300 <= error.status < 400:
            log.warning(
                "the System Zero gateway redirected the upgrade to %s: redirects are refused",
                server_text(exc.response.headers.get("Location", ""), self._secret()),
            )
        if error.retryable:  # a final refusal is raised to the caller, who reports it once
            log.info(
                "the System Zero gateway refused the upgrade with HTTP %s (%s)",
                error.status,
                server_token(error.envelope.code) if error.envelope else "no error body",
            )
            if error.status == 429:
                self._observe(
                    "rate_limited",
                    "upgrade",
                    None if error.retry_after_ms is None else error.retry_after_ms / 1000,
                )
        return Ended(
            ConnectionOutcome(
                server_delay_ms=error.retry_after_ms,
                kind="refused",
                retryable=error.retryable,
                status=error.status,
            ),
            error,
        )

    def _handle(self, frame: str | bytes) -> bool:
        """Feed one frame to the session and act on its events; whether the writer should run
        before the next frame is handled (this one gave it something to do)."""
        if isinstance(frame, str):
            frame = scrub(
                frame, self._scrub_secret
            )  # a key echoed back never reaches a message, log or error
        now = time.monotonic()
        events = self.session.receive_text(frame, now)
        self._dispatch(events)
        if not events:  # a ping (or scheduled): pongs go out at a bounded rate, coalesced
            self._kick_soon()
            return False
        return self._kick_if_due(now)

    def _handle_at_once(self, frame: str) -> bool:
        """:meth:`_handle` for a frame handed over in the transport's callback
        (:class:`~airflow_provider_systemzero.stream.connection.StreamConnection`); whether the next
        frames of the same read may follow at once. A frame that breaks the protocol ends the
        connection as it would in the reader: the serving loop picks up :attr:`_frame_error`."""
        try:
            return not self._handle(frame)
        except Exception as exc:
            self._frame_error = exc
            ws = self._ws
            if ws is not None:
                ws.on_text = None  # the reader task reads whatever still comes
            self._kick()
            return False

    async def _read(self, ws: ClientConnection) -> None:
        streak = 0  # frames handled since the reader last let other tasks run
        with contextlib.suppress(ConnectionClosed):
            async for frame in ws:
                # the writer acts on a frame that gave it something to do before the next is read
                turn = self._handle(frame)
                streak += 1
                if turn or streak == FRAMES_PER_READ:  # nor does a flood of frames hold the loop
                    streak = 0
                    await asyncio.sleep(0)

    async def _serve(self, ws: ClientConnection) -> Ended:
        assert self._wake is not None
        session = self.session
        opened_at = time.monotonic()
        session.connection_opened(opened_at)
        self._ws = ws
        replay = session.connections > 1
        log.info(
            "connected to %s (%s)",
            self._settings.url if self._settings else "the gateway",
            "replaying the stream's state" if replay else "first connection",
        )
        self._observe("connected", self._settings.url if self._settings else "", replay)
        self._frame_error = None
        self._scrub_secret = self._secret()
        reader = asyncio.create_task(self._read(ws), name="systemzero-stream-reader")
        reader.add_done_callback(lambda _: self._kick())
        if isinstance(ws, StreamConnection):
            ws.on_text = self._handle_at_once  # frames from now on are handled as they are parsed
            ws.take_queued(self._handle_at_once)  # and those that came with the upgrade's answer
        silent = recycle = lost = stalled = False

        def outcome(code: int | None, kind: str = "closed") -> ConnectionOutcome:
            goodbye, fatal = self._goodbye, self._last_fatal
            delay_ms = goodbye.retry_after_ms if goodbye is not None else None
            if fatal is not None and fatal.retry.retry_after_ms is not None:
                delay_ms = max(delay_ms or 0, fatal.retry.retry_after_ms)
            return ConnectionOutcome(
                code,
                server_text(ws.close_reason or "", self._secret()),
                goodbye.reason if goodbye else None,
                delay_ms,
                fatal.code if fatal else None,
                self._started_this_connection,
                self._decided_this_connection,
                time.monotonic() - opened_at,
                kind,
                released=self._release_for is ws,
            )

        try:
            try:
                while not reader.done() and self._frame_error is None:
                    self._wake.clear()
                    now = time.monotonic()
                    frames = session.data_to_send(now)
                    if self._outbox:  # what a change left to the writer goes first
                        frames[:0] = self._outbox
                        self._outbox.clear()
                    if frames and self._may_write_at_once(ws, frames) and self._write_at_once(ws, frames):
                        frames = []  # nothing could wait: written in one go
                    for frame in frames:
                        if not await self._write(ws, frame):
                            stalled = True
                            break
                    if stalled:
                        break
                    if self._closing or self._failure is not None or self._release_for is ws:
                        break
                    now = time.monotonic()
                    if session.recycle_due(now):
                        recycle = True
                        break
                    deadline = session.receipt_deadline()
                    if deadline is not None and now >= deadline:
                        silent = True
                        break
                    times = [
                        t for t in (deadline, session.next_wakeup(now)) if t is not None and math.isfinite(t)
                    ]
                    # what the reader compares with before waking the writer (see _kick_if_due)
                    self._writer_wakes_at = self._set_alarm(min(times) if times else None)
                    try:
                        await self._wake.wait()
                    finally:
                        self._writer_wakes_at = -math.inf  # awake: every kick counts
            except ConnectionClosed:
                lost = True  # a write failed: the connection is gone, and the reader ends with it
            if stalled:
                log.warning(
                    "the System Zero gateway read nothing for %.1f s while this client had a frame to "
                    "send: treating the connection as dead",
                    self._write_timeout(),
                )
                return Ended(outcome(CloseCode.ABNORMAL_CLOSURE, "stalled"))
            if silent:
                log.warning(
                    "the System Zero gateway sent nothing for %.1f s: treating the connection as dead",
                    (session.limits.heartbeat_interval_ms + session.limits.pong_timeout_ms) / 1000,
                )
                ws.transport.abort()
                return Ended(outcome(CloseCode.ABNORMAL_CLOSURE, "silent"))
            if lost:
                # the reader's own outcome (a protocol error included) is examined below
                with contextlib.suppress(TimeoutError, RemoteProtocolError):
                    await asyncio.wait_for(asyncio.shield(reader), self._close_timeout())
                if not reader.done():
                    ws.transport.abort()
                    return Ended(outcome(CloseCode.ABNORMAL_CLOSURE))
            if not reader.done() and self._frame_error is None:
                # we close: the stream ends, fails, is released, or replays on a new connection
                if recycle:
                    log.info(
                        "the gateway does not retry the failed decision on this connection and said no "
                        "goodbye: reconnecting to replay the state"
                    )
                await self._close(ws, CloseCode.NORMAL_CLOSURE)
                # a peer may send until it sees our close: a bad frame then changes nothing
                with contextlib.suppress(TimeoutError, RemoteProtocolError):
                    await asyncio.wait_for(asyncio.shield(reader), self._close_timeout())
                if self._closing or self._failure is not None:
                    return Ended(outcome(CloseCode.NORMAL_CLOSURE), final=True)
                if recycle:
                    return Ended(outcome(CloseCode.NORMAL_CLOSURE, "recycled"))
                if self._release_for is ws:
                    return Ended(outcome(CloseCode.NORMAL_CLOSURE, "released"))
                return Ended(outcome(CloseCode.NORMAL_CLOSURE), final=True)
            error = self._frame_error if self._frame_error is not None else reader.exception()
            if isinstance(error, RemoteProtocolError):
                # the message quotes the gateway's values: bounded, escaped, without the key
                problem = server_text(error.message, self._secret(), limit=400, quote=False)
                log.warning("the System Zero gateway broke the protocol: %s", problem)
                await self._close(ws, CloseCode.PROTOCOL_ERROR, "protocol error")
                return Ended(
                    outcome(CloseCode.PROTOCOL_ERROR, "violation"),
                    ProtocolViolation(
                        f"the System Zero gateway broke the stream protocol: {problem}", code=error.code
                    ),
                )
            if error is not None:
                raise error
            final = self._failure is not None or self._closing
            sent = ws.protocol.close_sent
            if sent is not None and sent.code == CloseCode.MESSAGE_TOO_BIG and not final:
                # websockets refused a frame over max_size: the gateway broke max_message_bytes
                limit = session.limits.max_message_bytes
                log.warning(
                    "the System Zero gateway sent a frame over max_message_bytes (%d bytes): closed with "
                    "1009",
                    limit,
                )
                return Ended(
                    outcome(CloseCode.MESSAGE_TOO_BIG, "violation"),
                    ProtocolViolation(
                        f"the System Zero gateway sent a frame over max_message_bytes ({limit} bytes)",
                        code="message_too_big",
                    ),
                )
            goodbye = self._goodbye
            if goodbye is not None and goodbye.reason not in GOODBYE_REASONS:
                log.info(
                    "the System Zero gateway said goodbye for an unknown reason %s",
                    server_text(goodbye.reason, self._secret()),
                )
            code = ws.close_code if ws.close_code is not None else CloseCode.ABNORMAL_CLOSURE
            reason = server_text(ws.close_reason or "", self._secret())
            return Ended(
                outcome(code),
                StreamClosed(code, reason, message=f"connection closed with code {code} ({reason})"),
                final=final,
            )
        finally:
            self._set_alarm(None)
            if isinstance(ws, StreamConnection):
                ws.on_text = None  # the connection keeps no reference to this stream
            if not reader.done():
                reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            session.connection_lost()
            self._outbox.clear()  # written for this connection: the session replays what was not acknowledged
            self._connection_ended()
            self._release_for = None
            self._ws = None
            self._observe(
                "closed",
                ws.close_code if ws.close_code is not None else CloseCode.ABNORMAL_CLOSURE,
                server_text(ws.close_reason or "", self._secret()),
            )
            self._pulse()

    def _write_timeout(self) -> float:
        return self.session.limits.write_progress_timeout_ms / 1000

    def _set_alarm(self, at: float | None) -> float:
        """Make sure the waiting writer is woken by ``at`` (monotonic time; ``None``: nothing to
        wake it for) with one timer for the connection, not a timeout per wait: a timer that rings
        sooner is kept (the writer then looks again and sleeps the rest); only a later one, or
        none, is replaced. Returns when the writer will wake on its own."""
        alarm = self._alarm
        if at is None:
            if alarm is not None:
                alarm.cancel()
                self._alarm = None
            return math.inf
        if alarm is not None:
            if alarm.when() <= at:
                return alarm.when()
            alarm.cancel()
        self._alarm = asyncio.get_running_loop().call_at(at, self._ring)
        return at

    def _ring(self) -> None:
        self._alarm = None
        self._kick()

    @staticmethod
    def _may_write_at_once(ws: ClientConnection, frames: list[str]) -> bool:
        """Whether writing ``frames`` now cannot wait for the peer: the socket's buffer is empty
        and they are small (far below the transport's high-water mark)."""
        return not ws.transport.get_write_buffer_size() and sum(map(len, frames)) <= _DIRECT_WRITE_BYTES

    @staticmethod
    def _write_at_once(ws: ClientConnection, frames: list[str]) -> bool:
        """Hand ``frames`` to the transport now, in one write, when nothing can make it wait: the
        connection is open, no fragmented message is being sent, and the caller checked that the
        socket's buffer is empty and the frames are small (so websockets' flow control would not
        wait either). Whether it did; otherwise the writer sends them (:meth:`_write`)."""
        protocol = ws.protocol
        if protocol.state is not State.OPEN or ws.send_in_progress is not None:
            return False
        for frame in frames:
            protocol.send_text(frame.encode())
        chunks = protocol.data_to_send()
        ws.transport.write(chunks[0] if len(chunks) == 1 else b"".join(chunks))
        return True

    async def _write(self, ws: ClientConnection, frame: str) -> bool:
        """Send one frame within ``write_progress_timeout``; ``False`` (the connection aborted) when
        the peer read nothing meanwhile. No write waits longer, whatever the peer does."""
        self._writing = True
        try:
            async with asyncio.timeout(self._write_timeout()):
                await ws.send(frame)
            return True
        except TimeoutError:
            ws.transport.abort()
            return False
        finally:
            self._writing = False

    async def _close(self, ws: ClientConnection, code: int, reason: str = "") -> None:
        """Close within the close-handshake timeout, else abort (a peer that stopped reading never
        takes the close frame)."""
        if ws.state is State.CLOSED:
            return
        try:
            async with asyncio.timeout(self._close_timeout()):
                await ws.close(code, reason)
        except TimeoutError:
            ws.transport.abort()
        except asyncio.CancelledError:
            ws.transport.abort()  # cancelled while closing: the socket is released all the same
            raise

    def _close_timeout(self) -> float:
        limits = self._session.limits if self._session else None
        return (limits.close_handshake_timeout_ms / 1000) if limits else 5.0

    def _origin(self) -> str | None:
        """The gateway this stream talks to, as the stream cap counts it."""
        return self._settings.url if self._settings else None

    def _secret(self) -> str | None:
        return self._settings.api_key.strip() if self._settings else None
