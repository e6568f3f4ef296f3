"""The connection of a :class:`~airflow_provider_systemzero.stream.DecisionStream`: one at a time, opened, served, and opened again.

:class:`StreamConnection` is the I/O under the stream, as websockets' ``Connection`` is under its
protocol and httpcore's connection under its pool. It owns the socket, the writer and the task
that connects and reconnects, and drives the stream's sans-I/O
:class:`~airflow_provider_systemzero.protocol.client.ClientSession`; it decides nothing about the
caller's decisions: everything the session's events mean, and the answer to the session's
question before a dispatch, goes up to the stream through the one entry the stream gave it
(:meth:`StreamConnection.start`'s ``handle``), together with the connection's own
:class:`ConnectionLost`, :class:`ConnectionFailed` and :class:`ConnectionStopped`.

**Opening.** Each connection opens inside the stream's turn (:meth:`StreamStarts.turn
<airflow_provider_systemzero.stream.starts.StreamStarts.turn>`), holding a slot of the stream cap
until it ends; the upgrade is :func:`~airflow_provider_systemzero.stream.connection.open_socket`'s.

**Serving.** No task serves a connection: the
:class:`~airflow_provider_systemzero.stream.gateway_socket.GatewaySocket` hands each message to
the session in the transport's callback, and the *writer's turn* (:meth:`StreamConnection.flush`)
writes ``session.data_to_send(now)`` at once — after a message that made something due, after a
change (from the caller's task), and at ``session.next_wakeup(now)`` (one timer per connection);
a peer silent past ``session.receipt_deadline()`` is treated as dead (native pings run too). The
run loop's task only opens the connection and waits for its end. Nothing waits on the peer
without a bound: a peer that reads nothing for ``write_progress_timeout`` while frames wait drops
the connection, a close takes at most the close-handshake timeout, and pongs are coalesced and
rate-bounded. A key echoed back is scrubbed from every frame
(:mod:`~airflow_provider_systemzero.stream.untrusted`).

**Reconnecting.** When a connection ends, how it ended (an :class:`Ended`) goes to the core's
:class:`~airflow_provider_systemzero.protocol.reconnect.ReconnectPlanner`, and the loop does what
it says: reconnect after the planned delay, reconnect only once there is work, or stop with one of
:mod:`~airflow_provider_systemzero.stream.exceptions`; every reconnect replays the full desired
state byte-identically. What it says about failed attempts is
:class:`~airflow_provider_systemzero.stream.diagnosis.NetworkFailures`'.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TypeAlias

from websockets.exceptions import InvalidHandshake, InvalidStatus, InvalidURI
from websockets.frames import Close

from airflow_provider_systemzero.protocol.client import ClientSession
from airflow_provider_systemzero.protocol.client_events import (
    Acknowledged,
    ClientEvent,
    DecisionFailedEvent,
    DecisionReceived,
    GoodbyeReceived,
    ServerError,
)
from airflow_provider_systemzero.protocol.errors import RemoteProtocolError
from airflow_provider_systemzero.protocol.messages import Error, Goodbye
from airflow_provider_systemzero.protocol.reconnect import (
    Backoff,
    CloseCode,
    ConnectionOutcome,
    PlanKind,
    ReconnectPlan,
    ReconnectPlanner,
)
from airflow_provider_systemzero.stream.accounting import DispatchAccounting
from airflow_provider_systemzero.stream.connection import (
    open_socket,
    subprotocol_violation,
    upgrade_refusal_error,
)
from airflow_provider_systemzero.stream.diagnosis import NetworkFailures, is_network_error
from airflow_provider_systemzero.stream.exceptions import (
    ProtocolViolation,
    StreamClosed,
    SystemZeroValidationError,
    UpgradeRefused,
)
from airflow_provider_systemzero.stream.gateway_socket import CONTROL_REPLY_BUDGET, GatewaySocket
from airflow_provider_systemzero.stream.life import Pulse
from airflow_provider_systemzero.stream.observer import GOODBYE_REASONS, ObserverRelay
from airflow_provider_systemzero.stream.settings import StreamSettings
from airflow_provider_systemzero.stream.tls import TLSContexts
from airflow_provider_systemzero.stream.untrusted import scrub, server_text, server_token

__all__ = [
    "ConnectionFailed",
    "ConnectionLost",
    "ConnectionStopped",
    "Reconnect",
    "StreamConnection",
    "StreamEvent",
]

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


@dataclass(frozen=True, slots=True)
class ConnectionLost:
    """The connection the session was served on is gone (the session replays what was not
    acknowledged on the next one): what it may have left behind is the stream's to settle."""


@dataclass(frozen=True, slots=True)
class ConnectionFailed:
    """A connection, or an attempt at one, ended with a retryable failure and the next is planned:
    the stream's last error until a decision overcomes it.

    :param error: the failure.
    """

    error: BaseException


@dataclass(frozen=True, slots=True)
class ConnectionStopped:
    """No connection follows: the stream closed (``error`` ``None``), or cannot go on.

    :param error: why the stream cannot go on (a final refusal, a violation, a bug), or ``None``.
    """

    error: BaseException | None


#: What a stream's connection tells the stream: the session's events (a frame's, and its question
#: before a dispatch) and the connection's own.
StreamEvent: TypeAlias = ClientEvent | ConnectionLost | ConnectionFailed | ConnectionStopped


@dataclass(frozen=True, slots=True)
class Reconnect:
    """One reconnect, as the tests and operators see it.

    :param reason: why the previous connection ended (``goodbye:shutdown`` — ``goodbye:other`` for a
        reason the document does not name —, ``close``, ``network``, ``upgrade_refused``,
        ``receipt_timeout``, ``write_timeout``, ``protocol_violation``, ``released`` …).
    :param close_code: the close code seen (1006 for an abrupt loss; ``None`` if there was no connection).
    :param server_delay: the server's minimum delay in seconds, if it named one.
    :param planned_delay: the delay chosen (backoff, never below ``server_delay``).
    :param waited: seconds actually waited between the end of the previous attempt and this one.
    :param attempt: the backoff attempt (0 after a connection that got its ``start`` acknowledged).
    """

    reason: str
    close_code: int | None
    server_delay: float | None
    planned_delay: float
    waited: float
    attempt: int


@dataclass(slots=True)
class Ended:
    """How a connection attempt ended: what the core plans from, and the error to raise or keep.

    ``final`` means the stream ends whatever the plan (the caller closed it or it failed, or the
    peer is not a System Zero gateway at all).
    """

    outcome: ConnectionOutcome
    error: BaseException | None = None
    final: bool = False


@dataclass(slots=True)
class _Pending:
    """A connection that ended, and the plan for the next."""

    plan: ReconnectPlan
    close_code: int | None
    failed_at: float


def _ignore(events: Sequence[StreamEvent]) -> None:
    """Where the connection's events go while no stream runs it."""


def _sent_first(socket: GatewaySocket) -> Close | None:
    """The close frame this client sent, when it closed first (not its echo of the gateway's)."""
    closed = socket.closed
    return closed.sent if closed is not None and closed.rcvd_then_sent is not True else None


class StreamConnection:
    """The connection of a :class:`~airflow_provider_systemzero.stream.DecisionStream` (see the
    module), and the :class:`~airflow_provider_systemzero.stream.gateway_socket.SocketHandler` of its sockets.

    :param session: the stream's session, whose I/O side this connection drives.
    :param settings: where and how to connect.
    :param tls: the connection's TLS files (read and checked before the first connection).
    :param take_turn: the stream's turn, which each connection opens and is served in
        (:meth:`StreamStarts.turn <airflow_provider_systemzero.stream.starts.StreamStarts.turn>`).
    :param accounting: what the stream's dispatches cost (how long a decision has been owed, for
        the log).
    :param observations: what the stream's observer hears.
    :param backoff: the reconnect backoff.
    :param reached: an earlier stream of the same caller reached this gateway (see
        :class:`~airflow_provider_systemzero.stream.diagnosis.NetworkFailures`).
    """

    def __init__(
        self,
        session: ClientSession,
        settings: StreamSettings,
        tls: TLSContexts,
        take_turn: Callable[[StreamConnection], AbstractAsyncContextManager[None]],
        accounting: DispatchAccounting,
        observations: ObserverRelay,
        *,
        backoff: Backoff,
        reached: bool,
    ) -> None:
        self._session = session
        self._settings = settings
        #: the API key as it is removed from every frame and from the gateway's text
        self._secret = settings.api_key.strip()
        self._tls = tls
        self._take_turn = take_turn
        self._accounting = accounting
        self._observations = observations
        self._backoff = backoff
        #: The stream's one entry for what this connection tells it (given by :meth:`start`,
        #: dropped when the loop ends, so that a closed stream and its connection hold no cycle).
        self._handle: Callable[[Sequence[StreamEvent]], None] = _ignore
        #: The run loop's task (made by :meth:`start`).
        self._task: asyncio.Task[None] | None = None
        #: Every reconnect made, in order (appended by the run loop).
        self.reconnects: list[Reconnect] = []
        #: What the stream says about failed attempts.
        self.network = NetworkFailures(
            settings.url, open_timeout=settings.open_timeout, proxy=settings.proxy, reached=reached
        )
        #: Disconnected on purpose, waiting for work (set while the run loop waits for it).
        self.dormant = False
        #: Callers that need a connection whatever the session's work (:meth:`needed`).
        self._needed = 0
        #: The stream closes or failed: the open connection closes at the writer's next turn and
        #: no other opens (set by :meth:`close` and :meth:`stop`).
        self._closing = False
        #: The run loop's wake-up while it waits for work or out its backoff (fired by
        #: :meth:`kick` and :meth:`close`).
        self.wakeup = Pulse()
        #: The open connection, serving the session (set in :meth:`socket_opened`, cleared when it
        #: is gone); ``None`` between connections.
        self.socket: GatewaySocket | None = None
        # What the current connection told about itself (reset when an attempt begins):
        #: the gateway acknowledged ``start`` on it
        self._started = False
        #: a decision arrived on it
        self.decided = False
        #: the gateway's goodbye, if it said one
        self._goodbye: Goodbye | None = None
        #: the last fatal error the gateway sent on it
        self._last_fatal: Error | None = None
        #: this side gives the connection back once nothing is due (:meth:`give_back`)
        self.giving_back = False
        # Why the current connection ends, set by whoever ends it and read by _ended:
        #: a message broke the protocol, or handling it failed (a bug)
        self._frame_error: BaseException | None = None
        #: the gateway did not select the subprotocol
        self._violation: BaseException | None = None
        #: the receipt deadline passed: the peer is silent
        self._silent = False
        #: a failed dispatch the gateway does not retry on this connection: it is replayed on a new one
        self._recycle = False
        #: this side began the close (the stream closes, fails, gives the connection back or replays)
        self._closed_by_us = False
        #: monotonic time the current connection opened
        self._opened_at = 0.0
        # The writer's turns:
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

    # ------------------------------------------------------------------ what the stream reads

    @property
    def open(self) -> bool:
        """Whether a connection is open and serves the session."""
        return self.socket is not None

    @property
    def finished(self) -> bool:
        """Whether the run loop ran and ended."""
        return self._task is not None and self._task.done()

    # ------------------------------------------------------------------ what the stream asks

    def start(self, handle: Callable[[Sequence[StreamEvent]], None], name: str) -> None:
        """Start the run loop.

        :param handle: the stream's one entry for what the connection tells it (held while the
            loop runs: the stream is kept by its running loop).
        :param name: the task's name.
        """
        self._handle = handle
        self._task = asyncio.create_task(self._run(), name=name)

    async def stop(self, grace: float | None) -> None:
        """End the loop's task: the close handshake in its time (at most ``grace``), then an
        abort; a cancellation of the caller meanwhile propagates once the task has ended.

        :param grace: seconds the close handshake may take at most (``None``: its own timeout).
        """
        self._closing = True
        self.wakeup.fire()
        runner = self._task
        if runner is None or runner.done():
            return
        socket = self.socket
        if socket is not None and socket.paused:
            # the peer is not reading: a close frame would queue behind the held-up write
            log.warning(
                "the System Zero gateway is not reading: closing the connection without a close handshake"
            )
            socket.abort()
        elif socket is not None:
            # serving: the writer's turn closes with 1000 and the run loop releases everything
            self.flush()
        if socket is not None:
            try:
                # asyncio.wait, not wait_for(shield(...)): on Python 3.11 wait_for swallows a
                # cancellation that arrives as the runner ends, and the caller would never see it
                limit = self.close_timeout() + 1
                await asyncio.wait((runner,), timeout=limit if grace is None else min(limit, grace))
            except asyncio.CancelledError:
                runner.cancel()
                raise
        if runner.done():
            return
        if self.socket is not None:
            self.socket.abort()  # the graceful close had its time
        runner.cancel()
        try:
            await runner
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the caller's own cancellation, not only the runner's
        except Exception:
            pass  # the runner's own failure: the stream is closing anyway

    def close(self) -> None:
        """The stream closes or failed: the open connection closes (1000) at the writer's next turn,
        and no other opens."""
        self._closing = True
        self.kick()

    def give_back(self) -> None:
        """Give the current connection back (1000) once nothing is due; the next one opens when
        the stream has work (a lease given back, a socket for a stream that waits for one, a 429
        the gateway would retry). About this connection only: one that ends first for another
        reason takes it with it."""
        self.giving_back = True
        self.kick()

    @contextlib.contextmanager
    def needed(self) -> Iterator[None]:
        """``with connection.needed():`` a connection is work for the block, whatever the
        session's (a caller waiting to be in sync reconnects a stream left disconnected)."""
        self._needed += 1
        self.kick()
        try:
            yield
        finally:
            self._needed -= 1

    # ------------------------------------------------------------------ the run loop

    async def _run(self) -> None:
        settings, network = self._settings, self.network
        planner = ReconnectPlanner(self._backoff)
        pending: _Pending | None = None
        error: BaseException | None = None
        try:
            while not self._closing:
                attempt_number = planner.attempt
                if pending is not None:
                    plan = pending.plan
                    if plan.kind is PlanKind.WHEN_NEEDED:
                        await self._wait_for_work()
                        if self._closing:
                            return
                    remaining = plan.delay - (time.monotonic() - pending.failed_at)
                    if remaining > 0:
                        await self.wakeup.sleep(remaining, until=lambda: self._closing)
                        if self._closing:
                            return
                    waited = time.monotonic() - pending.failed_at
                    self.reconnects.append(
                        Reconnect(
                            plan.reason,
                            pending.close_code,
                            plan.server_delay,
                            plan.delay,
                            waited,
                            plan.attempt,
                        )
                    )
                    log.info(
                        "reconnecting the System Zero stream after %s (close %s, waited %.3f s)",
                        plan.reason,
                        pending.close_code,
                        waited,
                    )
                    self._observations.now("reconnecting", plan.reason, pending.close_code, plan.delay)
                    attempt_number = plan.attempt
                    pending = None
                async with self._take_turn(self):  # the stream's turn, and a slot for the connection
                    self._observations.now("connecting", settings.url, attempt_number)
                    ended = await self._serve()
                outcome = ended.outcome
                if ended.final:
                    if ended.error is not None:
                        error = ended.error
                    elif not self._closing:  # never leave waiters hanging
                        error = StreamClosed(outcome.close_code, outcome.label)
                    return
                plan = planner.plan(outcome)
                if plan.kind is PlanKind.STOP:
                    error = self._stop_error(ended, plan)
                    return
                if ended.error is not None:
                    self._handle([ConnectionFailed(ended.error)])
                if outcome.kind == "network" and ended.error is not None:
                    network.record(ended.error)
                    if (unreachable := network.give_up()) is not None:
                        error = unreachable
                        return
                else:
                    network.answered()
                if plan.kind is PlanKind.RECONNECT:
                    plan = dataclasses.replace(plan, delay=network.bound_delay(plan.delay))
                pending = _Pending(plan, outcome.close_code, time.monotonic())
                log.info(
                    "System Zero stream connection ended (%s, close %s); reconnecting %s %.3f s",
                    plan.reason,
                    outcome.close_code,
                    "when there is something to send or to wait for, not before"
                    if plan.kind is PlanKind.WHEN_NEEDED
                    else "in",
                    plan.delay,
                )
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a bug: never leave waiters hanging
            log.exception("System Zero stream loop crashed")
            error = exc
        finally:
            handle, self._handle = self._handle, _ignore
            handle([ConnectionStopped(error)])

    async def _wait_for_work(self) -> None:
        """Wait until the session needs a connection, or a caller does (or the stream closes)."""
        session = self._session
        self.dormant = True
        try:
            while not self._closing and not (session.has_work() or self._needed):
                await self.wakeup.wait(None)
        finally:
            self.dormant = False

    # ------------------------------------------------------------------ one connection

    async def _serve(self) -> Ended:
        """Open a connection, serve it until it is gone, and say how it ended."""
        self._started = self.decided = self.giving_back = False
        self._goodbye = self._last_fatal = None
        self._frame_error = None
        self._violation = None
        self._silent = self._recycle = self._closed_by_us = False
        self._opened_at = time.monotonic()
        try:
            socket = await open_socket(self._settings, self._session.limits, self, self._tls)
        except BaseException as exc:
            adopted = self.socket
            if adopted is not None:  # the upgrade was answered as the opening ended (a timeout, a cancel)
                self._connection_closed(adopted)
            return self._opening_failed(exc)
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

    def _opening_failed(self, exc: BaseException) -> Ended:
        """How an opening that raised ``exc`` ended (anything else is raised again)."""
        url = self._settings.url
        if isinstance(exc, InvalidStatus):
            return self._upgrade_refused(exc)
        if is_network_error(exc):
            delay_ms = self._session.next_connection_delay_ms(time.monotonic())
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
                    f"the opening handshake with {url} failed: {server_text(str(exc), self._secret)}: check that the "
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
        self._session.connection_lost()
        self.socket = None
        self._handle([ConnectionLost()])
        self._observations.now(
            "closed",
            socket.close_code if socket.close_code is not None else CloseCode.ABNORMAL_CLOSURE,
            server_text(socket.close_reason or "", self._secret),
        )

    def _ended(self, socket: GatewaySocket) -> Ended:
        """How the connection ended, for the run loop to plan from."""
        if self._violation is not None:
            return Ended(
                ConnectionOutcome(CloseCode.PROTOCOL_ERROR, kind="violation"), self._violation, final=True
            )
        if socket.flooded:
            flood = ProtocolViolation(
                "the System Zero gateway flooded the connection with native pings while reading nothing "
                f"this client sent (pongs owed past {CONTROL_REPLY_BUDGET} bytes): this client dropped "
                "the connection without a close handshake",
                code="native_ping_flood",
            )
            log.warning("%s", flood)
            return Ended(self._outcome(socket, CloseCode.ABNORMAL_CLOSURE, "violation"), flood)
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
        if isinstance(error, ProtocolViolation):
            return Ended(self._outcome(socket, CloseCode.PROTOCOL_ERROR, "violation"), error)
        if error is not None:
            raise error  # handling a message failed: a bug, which ends the stream
        final = self._closing
        if self._closed_by_us:
            if final:
                return Ended(self._outcome(socket, CloseCode.NORMAL_CLOSURE), final=True)
            if self._recycle:
                return Ended(self._outcome(socket, CloseCode.NORMAL_CLOSURE, "recycled"))
            if self.giving_back:
                return Ended(self._outcome(socket, CloseCode.NORMAL_CLOSURE, "released"))
            return Ended(self._outcome(socket, CloseCode.NORMAL_CLOSURE), final=True)
        breach = None if final else self._frame_breach(socket)
        if breach is not None:
            return breach
        goodbye = self._goodbye
        if goodbye is not None and goodbye.reason not in GOODBYE_REASONS:
            log.info(
                "the System Zero gateway said goodbye for an unknown reason %s",
                server_text(goodbye.reason, self._secret),
            )
        code = socket.close_code if socket.close_code is not None else CloseCode.ABNORMAL_CLOSURE
        reason = server_text(socket.close_reason or "", self._secret)
        sent = _sent_first(socket)
        if sent is not None:
            # this side closed first (a keepalive ping unanswered): the code it sent is the cause
            ours = server_text(sent.reason or "no reason", self._secret)
            message = f"this client closed the connection with code {sent.code} ({ours}); the gateway's code: {code}"
        else:
            message = f"connection closed with code {code} ({reason})"
        return Ended(self._outcome(socket, code), StreamClosed(code, reason, message=message), final=final)

    def _frame_breach(self, socket: GatewaySocket) -> Ended | None:
        """The breach of the WebSocket protocol for which this client failed the connection (a frame
        with a reserved bit set, invalid UTF-8, an illegal close code: 1002 or 1007; a frame over
        ``max_message_bytes``: 1009), as a contract breach named by the code this client sent;
        ``None`` when this client did not close so first."""
        sent = _sent_first(socket)
        if sent is None or sent.code not in _BREACH_CLOSE_CODES:
            return None
        code = CloseCode(sent.code)
        if code == CloseCode.MESSAGE_TOO_BIG:
            breach = ProtocolViolation(
                "the System Zero gateway sent a frame over max_message_bytes "
                f"({self._session.limits.max_message_bytes} bytes): this client closed the connection "
                "with code 1009",
                code="message_too_big",
            )
        else:
            why = server_text(sent.reason or "no reason", self._secret)
            breach = ProtocolViolation(
                f"the System Zero gateway broke the WebSocket protocol ({why}): this client closed the "
                f"connection with code {int(code)}",
                code="invalid_utf8" if code == CloseCode.INVALID_DATA else "websocket_protocol_error",
            )
        log.warning("%s", breach)
        return Ended(self._outcome(socket, code, "violation"), breach)

    def _outcome(self, socket: GatewaySocket, code: int | None, kind: str = "closed") -> ConnectionOutcome:
        goodbye, fatal = self._goodbye, self._last_fatal
        session = self._session
        return ConnectionOutcome(
            code,
            server_text(socket.close_reason or "", self._secret),
            goodbye.reason if goodbye else None,
            session.next_connection_delay_ms(time.monotonic()),
            fatal.code if fatal else None,
            self._started,
            self.decided,
            time.monotonic() - self._opened_at,
            kind,
            released=self.giving_back,
            work_left=session.has_work(),
        )

    def _upgrade_refused(self, exc: InvalidStatus) -> Ended:
        error = upgrade_refusal_error(exc, self._settings.url, self._secret)
        if 300 <= error.status < 400:
            log.warning(
                "the System Zero gateway redirected the upgrade to %s: redirects are refused",
                server_text(exc.response.headers.get("Location", ""), self._secret),
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
        named = self._session.next_connection_delay_ms(time.monotonic())
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
        url = self._settings.url
        violation = subprotocol_violation(socket, url)
        if violation is not None:
            self._violation = violation
            socket.close(CloseCode.PROTOCOL_ERROR, "subprotocol not selected")
            return
        session = self._session
        self._opened_at = now = time.monotonic()
        try:
            session.connection_opened(now)
        except Exception as exc:
            self._broke(socket, exc)
            return
        self.socket = socket
        socket.write_timeout = self.write_timeout()
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
            due = self._handle_frame(message)
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
            # the message quotes the gateway's values: bounded, escaped, without the key
            problem = server_text(exc.message, self._secret, limit=400, quote=False)
            self._frame_error = violation = ProtocolViolation(
                f"the System Zero gateway broke the stream protocol: {problem}", code=exc.code
            )
            log.warning("%s", violation)
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

    def _handle_frame(self, frame: str | bytes) -> bool:
        """Feed one frame to the session and its events to the stream; whether the session has
        something to write now (this frame gave the writer something to do)."""
        if isinstance(frame, str):  # a key echoed back never reaches a message, log or error
            frame = scrub(frame, self._secret)
        now = time.monotonic()
        events = self._session.receive_text(frame, now)
        for event in events:  # what the connection's end is described from
            if isinstance(event, Acknowledged):
                if event.message_type == "start":
                    self._started = True
            elif isinstance(event, DecisionReceived):
                if not event.repeated:
                    self.decided = True
            elif isinstance(event, ServerError):
                if event.error.fatal:
                    self._last_fatal = event.error
            elif isinstance(event, DecisionFailedEvent):
                if event.error.fatal and not event.repeated:
                    self._last_fatal = event.error
            elif isinstance(event, GoodbyeReceived):
                self._goodbye = event.goodbye
        self._handle(events)
        if not events:  # a ping (or scheduled): pongs go out at a bounded rate, coalesced
            self._pongs_owed()
            return False
        return self._due(now)

    # ------------------------------------------------------------------ the writer

    def flush(self) -> None:
        """The writer's turn (see the module): write what the session has to send now (in one
        write; nothing while the transport is paused: the session coalesces meanwhile), then end
        the connection if it should end, else set the one timer for the next thing due."""
        socket = self.socket
        if socket is None or not socket.open:
            return
        session = self._session
        now = time.monotonic()
        if not socket.paused:
            frames = session.data_to_send(now)
            if (asked := session.admission_wanted) is not None:  # one dispatch a turn, one question
                self._handle([asked])  # the stream answers it: session.admit(...)
                frames += session.data_to_send(now)
            if frames:
                socket.send_texts(frames)
        if self._closing or self.giving_back:
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
                self._session.state_version,
                "" if self._session.in_sync else "; a newer change waits to be sent",
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
        due = self._session.next_wakeup(now)
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
        """Something to send or to look at: the run loop wakes if it waits (for work, or out its
        backoff), and :meth:`_turn_soon` — for what does not run from the caller's own task or a
        socket callback."""
        self.wakeup.fire()
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
        return self._session.limits.write_progress_timeout_ms / 1000

    def close_timeout(self) -> float:
        """Seconds the close handshake may take."""
        return self._session.limits.close_handshake_timeout_ms / 1000

    @staticmethod
    def _stop_error(ended: Ended, plan: ReconnectPlan) -> BaseException:
        """The error a stopped stream raises: the connection's own, or why its close is final."""
        error = ended.error
        if isinstance(error, ProtocolViolation | UpgradeRefused):
            return error
        outcome = ended.outcome
        detail = f" after error {server_token(outcome.fatal_code)}" if outcome.fatal_code else ""
        return StreamClosed(
            outcome.close_code,
            outcome.close_reason,
            message=(
                f"the System Zero gateway closed the stream with code {outcome.close_code} "
                f"({outcome.close_reason or 'no reason'}){detail}: {plan.final}; check the request and the "
                "gateway's limits"
            ),
        )
