"""The gateway side of one stream connection, as a pure state machine (WIRE.md §2–7).

:class:`GatewaySession` holds no socket and reads no clock: the I/O adapter feeds it frames
(:meth:`~GatewaySession.receive_text`), decide results (:meth:`~GatewaySession.dispatch_finished`)
and the passage of time (:meth:`~GatewaySession.tick`, with :meth:`~GatewaySession.next_deadline`
saying when to call it), and performs the actions it returns, in order:

* :class:`SendMessage` — write one server message (already numbered with ``seq``);
* :class:`DispatchDecide` — call the ordinary decide API with this body and key, then report the
  outcome with :meth:`~GatewaySession.dispatch_finished`;
* :class:`CloseConnection` — close the WebSocket with this code and reason (always last).

Times are seconds on any monotonic origin.
"""

from __future__ import annotations

import enum
import math
from typing import Any

from airflow_provider_systemzero.protocol import admission, gateway_actions
from airflow_provider_systemzero.protocol.dispatching import Dispatches, InFlightDecide
from airflow_provider_systemzero.protocol.errors import (
    ErrorEnvelope,
    LocalProtocolError,
    RemoteProtocolError,
    RetryHint,
)
from airflow_provider_systemzero.protocol.gateway_actions import (
    CloseConnection,
    DecideFailure,
    DecideOutcome,
    DecideSuccess,
    DispatchDecide,
    GatewayAction,
    SendMessage,
)
from airflow_provider_systemzero.protocol.limits import Limits
from airflow_provider_systemzero.protocol.messages import (
    PROTOCOL,
    Ack,
    Decide,
    Error,
    Goodbye,
    Hello,
    Mutation,
    Ping,
    Pong,
    Scheduled,
    ServerMessage,
    Start,
    StreamRequest,
    decode_client_message,
    event_id,
    sent_event_id,
)
from airflow_provider_systemzero.protocol.ratelimit import SlidingWindow, TokenBucket
from airflow_provider_systemzero.protocol.reconnect import (
    CloseCode,
    DecideRetry,
    GoodbyeReason,
    classify_decide_failure,
)
from airflow_provider_systemzero.protocol.state import StreamState

# the actions and outcomes stay importable from here, where the session that uses them lives
__all__ = ["GatewaySession", "Phase", *gateway_actions.__all__]


class Phase(enum.Enum):
    """Where a gateway connection is."""

    AWAITING_START = "awaiting_start"
    OPEN = "open"
    SHUTTING_DOWN = "shutting_down"
    CLOSED = "closed"


class GatewaySession:
    """The gateway's state machine for one stream connection.

    :param stream_id: ``szws_`` + 32 lowercase hex.
    :param now: the time the connection opened (seconds).
    :param limits: the limits to advertise and enforce.
    :param request_id: the ``request_id`` of ``hello``.
    :param rate_limit: the ``rate_limit`` object of ``hello`` (``None``).
    """

    def __init__(
        self,
        *,
        stream_id: str,
        now: float,
        limits: Limits | None = None,
        request_id: str | None = None,
        rate_limit: dict[str, Any] | None = None,
    ) -> None:
        self.stream_id = stream_id
        self.limits = limits or Limits()
        self.phase = Phase.AWAITING_START
        self.opened_at = now
        self.request: StreamRequest | None = None
        self.decision_mode: str | None = None
        self.min_interval_ms = 0
        self.stream_state: StreamState | None = None
        self.state_version = 0
        self.idempotency_key: str | None = None
        # the accepted state's decide body, as its frame and its state's JSON (see body)
        self._frame: admission.BodyFrame | None = None
        self._state_json = ""
        self.success_watermark = 0
        #: The last version frozen into a dispatch (the later ones are pending events).
        self.frozen_version = 0
        self.close_code: int | None = None
        self.close_reason: str | None = None
        # counters for stats
        self.accepted_events = 0
        self.rejections = 0
        self.refusal_count = 0
        lim = self.limits
        # the limits the timers use, in seconds
        self._idle_s = lim.idle_timeout_ms / 1000
        self._heartbeat_s = lim.heartbeat_interval_ms / 1000
        self._pong_s = lim.pong_timeout_ms / 1000
        self._seq = 0
        self._actions: list[GatewayAction] = []
        self._start_deadline = now + lim.start_timeout_ms / 1000
        self._end_at = now + lim.max_duration_ms / 1000
        self._last_activity = now
        self._refusals = SlidingWindow(lim.protocol_refusal_window_ms / 1000)
        self._event_bucket = TokenBucket(lim.max_events_per_second, max(1, lim.event_burst), now)
        self._message_bucket = TokenBucket(lim.max_messages_per_second, max(1, lim.message_burst), now)
        self._dispatches = Dispatches(now)
        self._nonce = 0
        self._next_ping = now + self._heartbeat_s
        self._pongs_due: dict[int, float] = {}
        self._settle_deadline: float | None = None
        self._shutdown_retry_after_ms: int | None = None
        self._emit(
            Hello(
                stream_id,
                self._next_seq(),
                PROTOCOL,
                request_id or self._request_id(1),
                self.limits,
                rate_limit,
            )
        )

    # ------------------------------------------------------------------ outputs

    def actions(self) -> list[GatewayAction]:
        """Take the actions produced so far, in the order they must be performed."""
        actions, self._actions = self._actions, []
        return actions

    @property
    def closed(self) -> bool:
        """Whether the session has asked for (or seen) the end of the connection."""
        return self.phase is Phase.CLOSED

    @property
    def decide_in_flight(self) -> bool:
        """Whether a decide call is running."""
        return self._dispatches.in_flight is not None

    @property
    def dispatches(self) -> int:
        """Decide calls started on this connection."""
        return self._dispatches.started

    @property
    def body_frame(self) -> admission.BodyFrame | None:
        """The decide body around the accepted state (``None`` before ``start``): built once per
        attachment list and kept, the same object, while only the state changes."""
        return self._frame

    @property
    def body(self) -> str | None:
        """The synthesized decide body of the accepted state (``None`` before ``start``)."""
        return None if self._frame is None else self._frame.body(self._state_json)

    @property
    def pending_events(self) -> int:
        """Accepted events not yet frozen into a dispatch."""
        return self.state_version - self.frozen_version

    def next_deadline(self) -> float | None:
        """The next time :meth:`tick` has something to do, or ``None``."""
        phase = self.phase
        if phase is Phase.CLOSED:
            return None
        at = min(self._end_at, self._next_ping)
        if phase is Phase.AWAITING_START:
            at = min(at, self._start_deadline)
        if self._pongs_due:
            at = min(at, *self._pongs_due.values())
        dispatches = self._dispatches
        if phase is Phase.OPEN and dispatches.in_flight is None:
            if dispatches.pending:
                at = min(at, dispatches.eligible_at(self.min_interval_ms))
            else:
                at = min(at, self._last_activity + self._idle_s)
        if self._settle_deadline is not None:
            at = min(at, self._settle_deadline)
        return at

    # ------------------------------------------------------------------ inputs

    def receive_text(self, text: str, now: float, size: int | None = None) -> list[GatewayAction]:
        """Handle one text frame from the client.

        :param text: the frame.
        :param now: the current time.
        :param size: the frame's UTF-8 length, when the adapter has it (else it is measured).
        """
        self._run_timers(now)
        if self.closed:
            return self.actions()
        if (len(text.encode("utf-8")) if size is None else size) > self.limits.max_message_bytes:
            self._close(CloseCode.MESSAGE_TOO_BIG, "message too big")
            return self.actions()
        if not self._message_bucket.try_take(now):
            # unread, but a mutation's event_id is echoed and the delay named: what to resend, when
            self._refuse(
                "message_rate_limited",
                f"more than {self.limits.max_messages_per_second} messages per second "
                f"(burst {self.limits.message_burst}): slow down",
                now,
                kind="rate_limit_error",
                event_id_=sent_event_id(text),
                retry=RetryHint(True, math.ceil(self._message_bucket.delay(now) * 1000)),
            )
            return self.actions()
        try:
            message = decode_client_message(text)
        except RemoteProtocolError as exc:
            # an error about a mutation echoes the event_id the client sent, refusal or not
            eid = sent_event_id(text)
            if exc.protocol_refusal:
                self._refuse(exc.code, exc.message, now, event_id_=eid)
            else:
                self._reject(LocalProtocolError(exc.message, code=exc.code, field=exc.field), eid)
            return self.actions()
        if not isinstance(message, Pong):
            self._last_activity = now
        if isinstance(message, Pong):
            self._on_pong(message)
        elif isinstance(message, Decide):
            self._on_decide(message, now)
        else:
            self._on_mutation(message, now)
        self._maybe_dispatch(now)
        return self.actions()

    def receive_binary(self, now: float) -> list[GatewayAction]:
        """Handle a binary frame (always a protocol refusal)."""
        self._run_timers(now)
        if not self.closed:
            self._refuse("invalid_message", "binary frames are not allowed: send text JSON messages", now)
        return self.actions()

    def ping_written(self, nonce: int, now: float) -> None:
        """The write of JSON ping ``nonce`` completed: the pong is due ``pong_timeout_ms`` from now."""
        if nonce in self._pongs_due:
            self._pongs_due[nonce] = now + self._pong_s

    def dispatch_finished(self, dispatch_id: int, outcome: DecideOutcome, now: float) -> list[GatewayAction]:
        """Report the outcome of a :class:`DispatchDecide`."""
        flight = None if self.closed else self._dispatches.finish(dispatch_id)
        if flight is None:
            return self.actions()
        self._last_activity = now
        if isinstance(outcome, DecideSuccess):
            covered = tuple(event_id(n) for n in range(self.success_watermark + 1, flight.state_version + 1))
            self.success_watermark = flight.state_version
            self._dispatches.succeeded()
            self._emit(
                outcome.decision(
                    self.stream_id, self._next_seq(), flight.state_version, covered, flight.queue_ms
                )
            )
        else:
            self._on_failure(flight, outcome, now)
        if self.phase is Phase.SHUTTING_DOWN:
            self._finish_shutdown()
        else:
            self._run_timers(now)
        return self.actions()

    def tick(self, now: float) -> list[GatewayAction]:
        """Handle every timer due at ``now``."""
        self._run_timers(now)
        return self.actions()

    def _run_timers(self, now: float) -> None:
        phase = self.phase
        if phase is Phase.CLOSED:
            return
        lim = self.limits
        if phase is Phase.AWAITING_START and now >= self._start_deadline:
            self._error(
                "start_timeout", f"no start within start_timeout_ms ({lim.start_timeout_ms} ms)", fatal=True
            )
            self._close(CloseCode.POLICY_VIOLATION, "start_timeout")
            return
        if now >= self._end_at:
            self._goodbye(GoodbyeReason.MAX_DURATION, 0)
            self._close(CloseCode.NORMAL_CLOSURE, "max_duration")
            return
        if self._pongs_due and min(self._pongs_due.values()) <= now:
            self._close(CloseCode.TRY_AGAIN_LATER, "slow_reader")
            return
        if self._settle_deadline is not None and now >= self._settle_deadline:
            self._dispatches.in_flight = None
            self._finish_shutdown()
            return
        dispatches = self._dispatches
        if (
            phase is Phase.OPEN
            and dispatches.in_flight is None
            and not dispatches.pending
            and now >= self._last_activity + self._idle_s
        ):
            self._goodbye(GoodbyeReason.IDLE_TIMEOUT, 0)
            self._close(CloseCode.NORMAL_CLOSURE, "idle_timeout")
            return
        if now >= self._next_ping:
            self._next_ping = now + self._heartbeat_s
            if len(self._pongs_due) < max(1, lim.max_pending_probes):
                self._nonce += 1
                self._pongs_due[self._nonce] = now + self._pong_s
                self._emit(Ping(self.stream_id, self._next_seq(), self._nonce))
        self._maybe_dispatch(now)

    def begin_shutdown(self, now: float, retry_after_ms: int) -> list[GatewayAction]:
        """Start the shutdown sequence: mutations are still acknowledged with ``scheduled: false``,
        an in-flight decide gets up to ``decision_settlement_timeout`` to settle, then ``goodbye``
        ``shutdown`` and close 1012.

        :param retry_after_ms: the delay advertised in ``goodbye.resume.retry_after_ms``.
        """
        if self.closed or self.phase is Phase.SHUTTING_DOWN:
            return self.actions()
        self._shutdown_retry_after_ms = retry_after_ms
        self.phase = Phase.SHUTTING_DOWN
        self._dispatches.stop()
        if self._dispatches.in_flight is None:
            self._finish_shutdown()
        else:
            self._settle_deadline = now + self.limits.decision_settlement_timeout_ms / 1000
        return self.actions()

    def send_queue_report(
        self, *, queued_bytes: int, queued_frames: int, write_stalled_for: float, now: float
    ) -> list[GatewayAction]:
        """Enforce the send-queue limits (``max_send_queue_bytes``/``_frames``,
        ``write_progress_timeout``): close 1013 ``slow_reader`` when one is exceeded.

        :param queued_bytes: bytes written but not yet taken by the transport.
        :param queued_frames: frames waiting to be written.
        :param write_stalled_for: seconds since the transport last made write progress while data waited.
        """
        lim = self.limits
        if not self.closed and (
            queued_bytes > lim.max_send_queue_bytes
            or queued_frames > lim.max_send_queue_frames
            or write_stalled_for >= lim.write_progress_timeout_ms / 1000
        ):
            self._close(CloseCode.TRY_AGAIN_LATER, "slow_reader")
        return self.actions()

    def connection_lost(self) -> None:
        """The transport is gone; nothing more will be sent."""
        if not self.closed:
            self.phase = Phase.CLOSED
            self._dispatches.in_flight = None

    # ------------------------------------------------------------------ handlers

    def _on_pong(self, message: Pong) -> None:
        if self._pongs_due.pop(message.nonce, None) is None:
            self._reject(
                LocalProtocolError(
                    f"pong.nonce {message.nonce} answers no outstanding ping",
                    code="unexpected_pong",
                    field="nonce",
                ),
                None,
            )

    def _on_decide(self, message: Decide, now: float) -> None:
        rejection = admission.decide_rejection(
            started=self.phase is not Phase.AWAITING_START,
            decision_mode=self.decision_mode,
            shutting_down=self.phase is Phase.SHUTTING_DOWN,
            requested=message.state_version,
            current=self.state_version,
        )
        if rejection is not None:
            retry = (
                RetryHint(True, self._shutdown_retry_after_ms) if rejection.code == "shutting_down" else None
            )
            self._reject(rejection, None, retry=retry)
            return
        self._emit(Scheduled(self.stream_id, self._next_seq(), message.state_version, self.decide_in_flight))
        self._dispatches.intend(now)

    def _on_mutation(self, message: Mutation, now: float) -> None:
        eid = message.event_id
        rejection = admission.order_rejection(
            message, started=self.phase is not Phase.AWAITING_START, state_version=self.state_version
        )
        if rejection is not None:
            self._reject(rejection, eid)
            return
        if self.state_version >= self.limits.max_events:
            self._error(
                "event_limit",
                f"the stream reached max_events ({self.limits.max_events}); reconnect and "
                "replay the full state",
                fatal=True,
                event_id_=eid,
            )
            self._goodbye(GoodbyeReason.EVENT_LIMIT, 0)
            self._close(CloseCode.POLICY_VIOLATION, "event_limit")
            return
        try:
            admitted = admission.admit_mutation(
                message,
                current=self.stream_state,
                request=self.request,
                decision_mode=self.decision_mode,
                min_interval_ms=self.min_interval_ms,
                stream_id=self.stream_id,
                limits=self.limits,
                pending_events=self.pending_events,
                frame=self._frame,
            )
        except LocalProtocolError as exc:
            self._reject(exc, eid)
            return
        if not self._event_bucket.try_take(now):
            delay_ms = math.ceil(self._event_bucket.delay(now) * 1000)
            self._reject(
                LocalProtocolError(
                    f"more than {self.limits.max_events_per_second} accepted mutations per second "
                    f"(burst {self.limits.event_burst}): retry after {delay_ms} ms",
                    code="event_rate_limited",
                    field="event_id",
                ),
                eid,
                retry=RetryHint(True, delay_ms),
                kind="rate_limit_error",
            )
            return
        # accept
        if isinstance(message, Start):
            self.request, self.decision_mode = admitted.request, admitted.decision_mode
            self.min_interval_ms = admitted.min_interval_ms
            self.phase = Phase.OPEN if self.phase is Phase.AWAITING_START else self.phase
        self.stream_state = admitted.state
        self.state_version += 1
        self.idempotency_key = admitted.key
        self._frame, self._state_json = admitted.frame, admitted.state_json
        self.accepted_events += 1
        scheduled = self.decision_mode == "on_change" and self.phase is Phase.OPEN
        self._emit(
            Ack(
                self.stream_id,
                self._next_seq(),
                eid,
                self.state_version,
                admitted.state_bytes,
                admitted.body_bytes,
                scheduled,
            )
        )
        if scheduled:
            self._dispatches.intend(now)

    def _on_failure(self, flight: InFlightDecide, failure: DecideFailure, now: float) -> None:
        fatal = False
        delay_ms = failure.retry.retry_after_ms
        retry = (
            self.decision_mode == "on_change"
            and self.phase is Phase.OPEN
            and classify_decide_failure(failure.http_status, failure.envelope, failure.retry)
            is DecideRetry.GATEWAY
        )
        if retry:
            fatal, retry_in_ms = self._dispatches.retry_ends_connection(
                flight,
                delay_ms,
                limit=self.limits.consecutive_retryable_failures,
                remaining_ms=(self._end_at - now) * 1000,
            )
        self._emit(failure.error(self.stream_id, self._next_seq(), flight.state_version, fatal=fatal))
        if fatal:
            # the goodbye names the server's delay only when the failure named one
            self._goodbye(GoodbyeReason.OVERLOAD, delay_ms)
            self._close(CloseCode.TRY_AGAIN_LATER, "overload")
        elif retry:
            self._dispatches.retry_in(retry_in_ms, now)

    # ------------------------------------------------------------------ scheduling

    def _maybe_dispatch(self, now: float) -> None:
        dispatches = self._dispatches
        if (
            not dispatches.pending
            or self.phase is not Phase.OPEN
            or not dispatches.due(now, self.min_interval_ms)
        ):
            return
        body = self.body
        assert body is not None
        flight = self._dispatches.start(self.state_version, now)
        self.frozen_version = self.state_version
        self._actions.append(
            DispatchDecide(flight.dispatch_id, self.state_version, body, self.idempotency_key)
        )

    # ------------------------------------------------------------------ emitting

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def next_seq(self) -> int:
        """Take the stream's next ``seq`` for a server message the session does not build itself
        (a peer that misbehaves on purpose, in a test or a fault): the session's own next message
        follows it."""
        return self._next_seq()

    def _request_id(self, seq: int) -> str:
        return f"req_{self.stream_id.removeprefix('szws_')}_{seq}"

    def _emit(self, message: ServerMessage) -> None:
        self._actions.append(SendMessage(message))

    def _error(
        self,
        code: str,
        message: str,
        *,
        fatal: bool,
        event_id_: str | None = None,
        retry: RetryHint | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        seq = self._next_seq()
        self._emit(
            Error(
                self.stream_id,
                seq,
                event_id_,
                self.state_version or None,
                None,
                self._request_id(seq),
                fatal,
                ErrorEnvelope(kind, code, message),
                retry or RetryHint(False),
            )
        )

    def _reject(
        self,
        exc: LocalProtocolError,
        event_id_: str | None,
        *,
        retry: RetryHint | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        self.rejections += 1
        self._error(exc.code, exc.message, fatal=False, event_id_=event_id_, retry=retry, kind=kind)

    def _refuse(self, code: str, message: str, now: float, **error: Any) -> None:
        """A protocol refusal (``error``: :meth:`_error`'s keywords); too many in the window close 1008."""
        self.refusal_count += 1
        fatal = self._refusals.add(now) >= self.limits.protocol_refusal_limit
        self._error(code, message, fatal=fatal, **error)
        if fatal:
            self._close(CloseCode.POLICY_VIOLATION, "protocol_refusal_limit")

    def _goodbye(self, reason: str, retry_after_ms: int | None) -> None:
        self._emit(
            Goodbye(
                self.stream_id,
                self._next_seq(),
                reason,
                self.state_version or None,
                self.success_watermark or None,
                retry_after_ms,
            )
        )

    def _finish_shutdown(self) -> None:
        self._settle_deadline = None
        self._goodbye(GoodbyeReason.SHUTDOWN, self._shutdown_retry_after_ms)
        self._close(CloseCode.SERVICE_RESTART, "shutdown")

    def _close(self, code: int, reason: str) -> None:
        self.phase = Phase.CLOSED
        self.close_code, self.close_reason = code, reason
        self._pongs_due.clear()
        self._actions.append(CloseConnection(code, reason))
