"""One connection of a :class:`~airflow_provider_systemzero.stream.DecisionStream`: open it, serve it, close it.

* the upgrade follows WIRE.md §1: the exact URL from the origin, ``Authorization: Bearer``, only
  the ``system-zero.stream.v1`` subprotocol (checked after connecting), no compression, no
  ``Origin``, no cookies, no proxy from the environment, ``max_size`` from the limits;
* no task serves a connection: the :class:`~airflow_provider_systemzero.stream.gateway_socket.GatewaySocket`
  hands each message to the session in the transport's callback, and the *writer's turn*
  (:meth:`ConnectionServer.flush`) writes ``session.data_to_send(now)`` at once — after a
  message that made something due, after a change, and at ``session.next_wakeup(now)`` (one
  timer per connection); a peer silent past ``session.receipt_deadline()`` is treated as dead
  (native pings run too); the run loop's task only opens the connection and waits for its end;
* nothing waits on the peer without a bound: a peer that reads nothing for
  ``write_progress_timeout`` while frames wait drops the connection, a close takes at most the
  close-handshake timeout, a redirect of the upgrade is refused, and pongs are coalesced and
  rate-bounded;
* the gateway's words are untrusted: a key echoed back is scrubbed from every frame, and server
  text is escaped and bounded before it is logged or raised (:mod:`~airflow_provider_systemzero.stream.untrusted`);
* how the connection ended is described in an :class:`Ended` for the run loop
  (:mod:`~airflow_provider_systemzero.stream.run_loop`) to plan from.

:class:`ConnectionServer` is the part of a :class:`~airflow_provider_systemzero.stream.DecisionStream`
that holds its connection: the socket, the writer's timers (see the table of
:mod:`~airflow_provider_systemzero.stream.life`) and why the connection ends. It hands the core's
events to the stream's :class:`~airflow_provider_systemzero.stream.core_events.CoreEvents`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass

from websockets.exceptions import InvalidHandshake, InvalidStatus, InvalidURI

from airflow_provider_systemzero.protocol.errors import RemoteProtocolError
from airflow_provider_systemzero.protocol.reconnect import CloseCode, ConnectionOutcome
from airflow_provider_systemzero.stream.accounting import DispatchAccounting
from airflow_provider_systemzero.stream.connection import (
    open_socket,
    subprotocol_violation,
    upgrade_refusal_error,
)
from airflow_provider_systemzero.stream.core_events import ConnectionFacts, CoreEvents
from airflow_provider_systemzero.stream.diagnosis import is_network_error
from airflow_provider_systemzero.stream.exceptions import (
    ProtocolViolation,
    StreamClosed,
    SystemZeroValidationError,
)
from airflow_provider_systemzero.stream.gateway_socket import CONTROL_REPLY_BUDGET, GatewaySocket
from airflow_provider_systemzero.stream.life import StreamLife, StreamView
from airflow_provider_systemzero.stream.observer import GOODBYE_REASONS, ObserverRelay
from airflow_provider_systemzero.stream.tls import TLSContexts
from airflow_provider_systemzero.stream.untrusted import scrub, server_text, server_token

__all__ = ["ConnectionServer", "Ended"]

log = logging.getLogger(__name__)

#: Codes this client closes with when a frame of the gateway broke RFC 6455 (or its size limit): each
#: is a contract breach, counted toward the breach rule.
_BREACH_CLOSE_CODES = frozenset({CloseCode.PROTOCOL_ERROR, CloseCode.INVALID_DATA, CloseCode.MESSAGE_TOO_BIG})
#: Pongs are flushed at most this often (seconds): the document's application message rate, 40 a second.
_PONG_FLUSH_INTERVAL = 1 / 40
#: A decision the gateway still owes is said in the log after this long (seconds), then again
#: after twice as long each time, up to the cap: a slow gateway is a visible wait, not a silent one.
DECISION_WAIT_REPORT_S = 10.0
DECISION_WAIT_REPORT_CAP_S = 300.0


@dataclass(slots=True)
class Ended:
    """How a connection attempt ended: what the core plans from, and the error to raise or keep.

    ``final`` means the stream ends whatever the plan (the caller closed it or it failed, or the
    peer is not a System Zero gateway at all).
    """

    outcome: ConnectionOutcome
    error: BaseException | None = None
    final: bool = False


class ConnectionServer:
    """The part of a :class:`~airflow_provider_systemzero.stream.DecisionStream` that serves its
    connections, one at a time: the
    :class:`~airflow_provider_systemzero.stream.gateway_socket.SocketHandler` of its sockets, and
    the writer.

    :param stream: the stream (its settings and session).
    :param life: the stream's life (closing, failed; the pulse).
    :param events: what acts on the core's events (and keeps the connection's facts).
    :param accounting: what the dispatches cost (how long a decision has been owed).
    :param observations: what the observer hears.
    """

    def __init__(
        self,
        stream: StreamView,
        life: StreamLife,
        events: CoreEvents,
        accounting: DispatchAccounting,
        observations: ObserverRelay,
    ) -> None:
        self._stream = stream
        self._life = life
        self._events = events
        self._accounting = accounting
        self._observations = observations
        #: The connection's TLS files (set by the stream on entering, before the first connection).
        self.tls: TLSContexts | None = None
        #: The open connection, serving the session (set in :meth:`socket_opened`, cleared when it
        #: is gone); ``None`` between connections.
        self.socket: GatewaySocket | None = None
        #: What the current connection's events told (a new one per attempt, from the events).
        self.facts = ConnectionFacts()
        # Why the current connection ends, set by whoever ends it and read by _ended:
        #: a message broke the protocol, or handling it failed (a bug)
        self._frame_error: BaseException | None = None
        #: the gateway did not select the subprotocol
        self._violation: BaseException | None = None
        #: the receipt deadline passed: the peer is silent
        self._silent = False
        #: a failed dispatch the gateway does not retry on this connection: it is replayed on a new one
        self._recycle = False
        #: this side began the close (the stream closes, fails, is released or replays)
        self._closed_by_us = False
        #: monotonic time the current connection opened
        self._opened_at = 0.0
        #: the key, as removed from every frame of the connection
        self._scrub_secret: str | None = None
        # The writer's signals (see the table of stream.life):
        #: a writer's turn asked for in the next loop iteration (:meth:`kick`)
        self.turn_soon: asyncio.Handle | None = None
        #: the writer's one timer: a turn when something falls due (:meth:`_set_alarm`)
        self.alarm: asyncio.TimerHandle | None = None
        #: a writer's turn for pongs owed, rate-bounded (:meth:`_pongs_owed`)
        self.pong_turn: asyncio.TimerHandle | None = None
        #: loop time of the last pongs' turn
        self._last_pong_turn = -math.inf
        #: the decision wait last said in the log: (since, next report, gap); see _report_decision_wait
        self._decision_wait_report: tuple[float | None, float, float] = (None, 0.0, 0.0)

    # ------------------------------------------------------------------ opening and the end

    async def connect_and_serve(self) -> Ended:
        """Open a connection, serve it until it is gone, and say how it ended."""
        settings = self._stream.settings
        assert settings is not None
        url = settings.url
        self.facts = self._events.new_connection()
        self._frame_error = None
        self._violation = None
        self._silent = self._recycle = self._closed_by_us = False
        self._opened_at = time.monotonic()
        try:
            socket = await open_socket(settings, self._stream.session.limits, self, self.tls)
        except BaseException as exc:
            adopted = self.socket
            if adopted is not None:  # the upgrade was answered as the opening ended (a timeout, a cancel)
                self._connection_closed(adopted)
            return self._opening_failed(exc, url)
        try:
            # served in the socket's callbacks (socket_opened, socket_message, the writer's turns)
            # until the TCP connection is gone
            await asyncio.shield(socket.lost)
            return self._ended(socket)
        except asyncio.CancelledError:
            socket.abort()  # cancelled: the socket is released all the same
            raise
        finally:
            self._connection_closed(socket)

    def _opening_failed(self, exc: BaseException, url: str) -> Ended:
        """How an opening that raised ``exc`` ended (anything else is raised again)."""
        if isinstance(exc, InvalidStatus):
            return self._upgrade_refused(exc, url)
        if is_network_error(exc):
            delay_ms = self._stream.session.next_connection_delay_ms(time.monotonic())
            return Ended(ConnectionOutcome(server_delay_ms=delay_ms, kind="network"), exc)
        if isinstance(exc, InvalidURI):
            return Ended(
                ConnectionOutcome(kind="network"),
                SystemZeroValidationError(
                    f"the stream URL {url} is invalid: {exc}", code="invalid_origin", field="host"
                ),
                final=True,
            )
        if isinstance(exc, InvalidHandshake):
            return Ended(
                ConnectionOutcome(kind="violation"),
                ProtocolViolation(
                    f"the opening handshake with {url} failed: {server_text(str(exc), self.secret())}: check that the "
                    "connection's host is a System Zero API origin",
                    code="invalid_handshake",
                ),
                final=True,
            )
        raise exc

    def _connection_closed(self, socket: GatewaySocket) -> None:
        """The connection is gone (or the serving task was cancelled): the session replays what
        was not acknowledged on the next one; nothing of this connection is kept."""
        socket.handler = None  # the socket keeps no reference to this stream
        self._set_alarm(None)
        if self.socket is not socket:
            return  # never opened for the session (refused subprotocol)
        self._stream.session.connection_lost()
        self._events.connection_ended()
        self.facts.open = False
        self.socket = None
        self._observations.now(
            "closed",
            socket.close_code if socket.close_code is not None else CloseCode.ABNORMAL_CLOSURE,
            server_text(socket.close_reason or "", self.secret()),
        )
        self._life.pulse()

    def _ended(self, socket: GatewaySocket) -> Ended:
        """How the connection ended, for the run loop to plan from."""
        if self._violation is not None:
            return Ended(
                ConnectionOutcome(CloseCode.PROTOCOL_ERROR, kind="violation"), self._violation, final=True
            )
        if socket.flooded:
            log.warning(
                "the System Zero gateway sent native pings faster than it read their pongs (over %d "
                "bytes owed): dropped the connection as a breach of the protocol",
                CONTROL_REPLY_BUDGET,
            )
            return Ended(
                self._outcome(socket, CloseCode.ABNORMAL_CLOSURE, "violation"),
                ProtocolViolation(
                    "the System Zero gateway flooded the connection with native pings while reading nothing "
                    f"this client sent (pongs owed past {CONTROL_REPLY_BUDGET} bytes): this client dropped "
                    "the connection without a close handshake",
                    code="native_ping_flood",
                ),
            )
        if socket.stalled:
            log.warning(
                "the System Zero gateway read nothing for %.1f s while this client had a frame to "
                "send: treating the connection as dead",
                self.write_timeout(),
            )
            return Ended(self._outcome(socket, CloseCode.ABNORMAL_CLOSURE, "stalled"))
        if self._silent:
            return Ended(self._outcome(socket, CloseCode.ABNORMAL_CLOSURE, "silent"))
        error = self._frame_error
        if isinstance(error, RemoteProtocolError):
            # the message quotes the gateway's values: bounded, escaped, without the key
            problem = server_text(error.message, self.secret(), limit=400, quote=False)
            return Ended(
                self._outcome(socket, CloseCode.PROTOCOL_ERROR, "violation"),
                ProtocolViolation(
                    f"the System Zero gateway broke the stream protocol: {problem}", code=error.code
                ),
            )
        if error is not None:
            raise error  # handling a message failed: a bug, which ends the stream
        final = self._life.ending
        if self._closed_by_us:
            if final:
                return Ended(self._outcome(socket, CloseCode.NORMAL_CLOSURE), final=True)
            if self._recycle:
                return Ended(self._outcome(socket, CloseCode.NORMAL_CLOSURE, "recycled"))
            if self.facts.release:
                return Ended(self._outcome(socket, CloseCode.NORMAL_CLOSURE, "released"))
            return Ended(self._outcome(socket, CloseCode.NORMAL_CLOSURE), final=True)
        breach = None if final else self._frame_breach(socket)
        if breach is not None:
            return breach
        goodbye = self.facts.goodbye
        if goodbye is not None and goodbye.reason not in GOODBYE_REASONS:
            log.info(
                "the System Zero gateway said goodbye for an unknown reason %s",
                server_text(goodbye.reason, self.secret()),
            )
        code = socket.close_code if socket.close_code is not None else CloseCode.ABNORMAL_CLOSURE
        reason = server_text(socket.close_reason or "", self.secret())
        closed = socket.closed
        sent = closed.sent if closed is not None and closed.rcvd_then_sent is not True else None
        if sent is not None:
            # this side closed first (a keepalive ping unanswered): the code it sent is the cause
            ours = server_text(sent.reason or "no reason", self.secret())
            message = f"this client closed the connection with code {sent.code} ({ours}); the gateway's code: {code}"
        else:
            message = f"connection closed with code {code} ({reason})"
        return Ended(self._outcome(socket, code), StreamClosed(code, reason, message=message), final=final)

    def _frame_breach(self, socket: GatewaySocket) -> Ended | None:
        """The breach of the WebSocket protocol for which this client failed the connection (a frame
        with a reserved bit set, invalid UTF-8, an illegal close code: 1002 or 1007; a frame over
        ``max_message_bytes``: 1009), as a contract breach named by the code this client sent;
        ``None`` when this client did not close so first."""
        closed = socket.closed
        # not when the gateway closed first (its own close, echoed)
        sent = closed.sent if closed is not None and closed.rcvd_then_sent is not True else None
        if sent is None or sent.code not in _BREACH_CLOSE_CODES:
            return None
        code = CloseCode(sent.code)
        if code == CloseCode.MESSAGE_TOO_BIG:
            limit = self._stream.session.limits.max_message_bytes
            log.warning(
                "the System Zero gateway sent a frame over max_message_bytes (%d bytes): closed with 1009",
                limit,
            )
            return Ended(
                self._outcome(socket, code, "violation"),
                ProtocolViolation(
                    f"the System Zero gateway sent a frame over max_message_bytes ({limit} bytes): this "
                    "client closed the connection with code 1009",
                    code="message_too_big",
                ),
            )
        why = server_text(sent.reason or "no reason", self.secret())
        log.warning(
            "the System Zero gateway broke the WebSocket protocol (%s): this client closed the connection "
            "with code %d",
            why,
            code,
        )
        return Ended(
            self._outcome(socket, code, "violation"),
            ProtocolViolation(
                f"the System Zero gateway broke the WebSocket protocol ({why}): this client closed the "
                f"connection with code {int(code)}",
                code="invalid_utf8" if code == CloseCode.INVALID_DATA else "websocket_protocol_error",
            ),
        )

    def _outcome(self, socket: GatewaySocket, code: int | None, kind: str = "closed") -> ConnectionOutcome:
        facts = self.facts
        goodbye, fatal = facts.goodbye, facts.last_fatal
        session = self._stream.session
        return ConnectionOutcome(
            code,
            server_text(socket.close_reason or "", self.secret()),
            goodbye.reason if goodbye else None,
            session.next_connection_delay_ms(time.monotonic()),
            fatal.code if fatal else None,
            facts.started,
            facts.decided,
            time.monotonic() - self._opened_at,
            kind,
            released=facts.release,
            work_left=session.has_work(),
        )

    def _upgrade_refused(self, exc: InvalidStatus, url: str) -> Ended:
        error = upgrade_refusal_error(exc, url, self.secret())
        if 300 <= error.status < 400:
            log.warning(
                "the System Zero gateway redirected the upgrade to %s: redirects are refused",
                server_text(exc.response.headers.get("Location", ""), self.secret()),
            )
        if error.retryable:  # a final refusal is raised to the caller, who reports it once
            log.info(
                "the System Zero gateway refused the upgrade with HTTP %s (%s)",
                error.status,
                server_token(error.envelope.code) if error.envelope else "no error body",
            )
            if error.status == 429:
                self._observations.now(
                    "rate_limited",
                    "upgrade",
                    None if error.retry_after_ms is None else error.retry_after_ms / 1000,
                )
        named = self._stream.session.next_connection_delay_ms(time.monotonic())
        delays = [delay for delay in (error.retry_after_ms, named) if delay is not None]
        return Ended(
            ConnectionOutcome(
                server_delay_ms=max(delays) if delays else None,
                kind="refused",
                retryable=error.retryable,
                status=error.status,
            ),
            error,
        )

    # ------------------------------------------------------------------ the socket's handler

    def socket_opened(self, socket: GatewaySocket) -> None:
        """The upgrade succeeded (in the transport's callback; ``hello`` may follow at once)."""
        url = self._url()
        violation = subprotocol_violation(socket, url)
        if violation is not None:
            self._violation = violation
            socket.close(CloseCode.PROTOCOL_ERROR, "subprotocol not selected")
            return
        session = self._stream.session
        self._opened_at = now = time.monotonic()
        try:
            session.connection_opened(now)
        except Exception as exc:
            self._broke(socket, exc)
            return
        self.socket = socket
        self.facts.open = True
        socket.write_timeout = self.write_timeout()
        self._scrub_secret = self.secret()
        replay = session.connections > 1
        log.info("connected to %s (%s)", url, "replaying the stream's state" if replay else "a new stream")
        # heard once the frames of this read were handled: the start goes out before the metrics
        self._observations.later("connected", url, replay)
        self._turn()

    def socket_message(self, message: str | bytes) -> None:
        """One message from the gateway: to the session, and its events to the caller; what it
        made due is written before the next message is handled."""
        socket = self.socket
        if socket is None or self._frame_error is not None:
            return  # not served (yet), or after a broken rule: a message changes nothing
        try:
            due = self._handle(message)
        except Exception as exc:
            if self._closed_by_us and isinstance(exc, RemoteProtocolError):
                # a peer may send until it sees our close: a bad message then changes nothing
                # (and nothing after it is read)
                log.debug("after this side's close, a message broke the protocol: %s", exc.code)
                socket.handler = None
                return
            if not isinstance(exc, RemoteProtocolError):
                self._broke(socket, exc)
                return
            self._frame_error = exc
            problem = server_text(exc.message, self.secret(), limit=400, quote=False)
            log.warning("the System Zero gateway broke the protocol: %s", problem)
            socket.close(CloseCode.PROTOCOL_ERROR, "protocol error")
            return
        if due:
            self._turn()

    def socket_writable(self) -> None:
        """The transport drained: the frames held back go now."""
        self._turn()

    def _broke(self, socket: GatewaySocket, exc: BaseException) -> None:
        """Serving the connection failed here (a bug): the connection ends, and the run loop
        raises ``exc`` — the stream fails with it — instead of the event loop logging it as an
        error of a callback and going on."""
        if self._frame_error is None:
            self._frame_error = exc
        socket.close(CloseCode.NORMAL_CLOSURE)

    def _turn(self) -> None:
        """:meth:`flush` from a transport callback or a timer (a failure: :meth:`_broke`)."""
        try:
            self.flush()
        except Exception as exc:
            socket = self.socket
            if socket is None:
                raise
            self._broke(socket, exc)

    def _handle(self, frame: str | bytes) -> bool:
        """Feed one frame to the session and act on its events; whether the session has
        something to write now (this frame gave the writer something to do)."""
        if isinstance(frame, str):
            frame = scrub(
                frame, self._scrub_secret
            )  # a key echoed back never reaches a message, log or error
        now = time.monotonic()
        events = self._stream.session.receive_text(frame, now)
        self._events.dispatch(events)
        if not events:  # a ping (or scheduled): pongs go out at a bounded rate, coalesced
            self._pongs_owed()
            return False
        return self._due(now)

    # ------------------------------------------------------------------ the writer

    def flush(self) -> None:
        """The writer's turn: write what the session has to send now (in one write), then end
        the connection if it should end, else set the one timer for the next thing due.

        Frames are held back while the transport is paused (the peer is slow to read): the
        session coalesces what changes meanwhile, and the socket aborts a peer that reads
        nothing for ``write_progress_timeout``.
        """
        socket = self.socket
        if socket is None or not socket.open:
            return
        session = self._stream.session
        now = time.monotonic()
        if not socket.paused:
            frames = session.data_to_send(now)
            if (asked := session.admission_wanted) is not None:  # one dispatch a turn, one question
                session.admit(self._events.admit(asked.message))
                frames += session.data_to_send(now)
            if frames:
                socket.send_texts(frames)
        if self._life.ending or self.facts.release:
            self._close_connection(socket)
            return
        if session.recycle_due(now):
            log.info("%s", session.recycle_reason)
            self._recycle = True
            self._close_connection(socket)
            return
        deadline = session.receipt_deadline()
        if deadline is not None and now >= deadline:
            log.warning(
                "the System Zero gateway sent nothing for %.1f s: treating the connection as dead",
                (session.limits.heartbeat_interval_ms + session.limits.pong_timeout_ms) / 1000,
            )
            self._silent = True
            socket.abort()
            return
        times = [
            t
            for t in (deadline, session.next_wakeup(now), self._report_decision_wait(now))
            if t is not None and math.isfinite(t)
        ]
        self._set_alarm(min(times) if times else None)

    def _report_decision_wait(self, now: float) -> float | None:
        """Say in the log that the gateway has owed this connection a decision for a while, when
        it is time to; returns when to say it next (``None``: no decision is owed)."""
        since = self._accounting.waiting_since
        if since is None:
            return None
        reported_since, at, gap = self._decision_wait_report
        if reported_since != since:
            at, gap = since + DECISION_WAIT_REPORT_S, DECISION_WAIT_REPORT_S
        if now >= at:
            log.info(
                "waiting for the System Zero gateway's decision for %.0f s (state version %d acknowledged%s)",
                now - since,
                self._events.state_version,
                "" if self._stream.session.in_sync else "; a newer change waits to be sent",
            )
            gap = min(gap * 2, DECISION_WAIT_REPORT_CAP_S)
            at = now + gap
        self._decision_wait_report = (since, at, gap)
        return at

    def _close_connection(self, socket: GatewaySocket) -> None:
        """This side ends the connection (1000): the stream closes, fails, is released or replays."""
        self._closed_by_us = True
        self._set_alarm(None)
        socket.close(CloseCode.NORMAL_CLOSURE)

    def _due(self, now: float) -> bool:
        """Whether the session has something to write now; if it will later, sooner than the
        writer's timer rings, the timer is moved (a frame that leaves nothing to send, such as
        most acks and decisions, costs no writer's turn)."""
        due = self._stream.session.next_wakeup(now)
        if due is None:
            return False
        if due <= now:
            return True
        self._set_alarm(due)  # kept when the timer already rings sooner
        return False

    def turn_now(self) -> None:
        """From the caller's task: a writer's turn now on an open connection (its errors are the
        caller's), else whoever waits for work is woken to look."""
        if self.socket is not None:
            self.flush()
        else:
            self.kick()

    def kick(self) -> None:
        """Something to send or to look at: the stream pulses (the run loop wakes if it waits for
        work) and, on an open connection, a writer's turn runs in the next loop iteration (once,
        however often it is asked): for what does not run from the caller's own task or a socket
        callback."""
        self._life.pulse()
        self._turn_soon()

    def _turn_soon(self) -> None:
        """A writer's turn in the next loop iteration, on an open connection (once, however often
        it is asked)."""
        if self.socket is not None and self.turn_soon is None:
            self.turn_soon = asyncio.get_running_loop().call_soon(self._turn_soon_fired)

    def _turn_soon_fired(self) -> None:
        self.turn_soon = None
        self._turn()

    def _pongs_owed(self) -> None:
        """A writer's turn for pongs, at most every :data:`_PONG_FLUSH_INTERVAL`: a ping flood costs
        a bounded number of writes (the session keeps only the newest pongs owed)."""
        if self.pong_turn is not None:
            return
        loop = asyncio.get_running_loop()
        delay = self._last_pong_turn + _PONG_FLUSH_INTERVAL - loop.time()
        if delay <= 0:
            self._last_pong_turn = loop.time()
            self._turn_soon()
            return

        def fire() -> None:
            self.pong_turn = None
            self._last_pong_turn = loop.time()
            self._turn()

        self.pong_turn = loop.call_later(delay, fire)

    def _set_alarm(self, at: float | None) -> None:
        """The writer's one timer for the connection: a turn at ``at`` (monotonic time; ``None``:
        none). A timer that rings sooner is kept (the turn then sets the next one); only a
        later one, or none, is replaced."""
        alarm = self.alarm
        if at is None:
            if alarm is not None:
                alarm.cancel()
                self.alarm = None
            return
        if alarm is not None:
            if alarm.when() <= at:
                return
            alarm.cancel()
        self.alarm = asyncio.get_running_loop().call_at(at, self._ring)

    def _ring(self) -> None:
        self.alarm = None
        self._turn()

    # ------------------------------------------------------------------ the connection's settings

    def write_timeout(self) -> float:
        """Seconds a peer may read nothing while frames wait (``write_progress_timeout``)."""
        return self._stream.session.limits.write_progress_timeout_ms / 1000

    def close_timeout(self) -> float:
        """Seconds the close handshake may take (5 before the limits are known)."""
        try:
            limits = self._stream.session.limits
        except RuntimeError:  # the settings are not resolved yet
            return 5.0
        return limits.close_handshake_timeout_ms / 1000

    def _url(self) -> str:
        settings = self._stream.settings
        return settings.url if settings else "the gateway"

    def secret(self) -> str | None:
        """The API key as it is removed from the gateway's text (``None`` before the settings)."""
        settings = self._stream.settings
        return settings.api_key.strip() if settings else None
