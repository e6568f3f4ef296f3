"""What a client session does with each server message (WIRE.md §2–8).

:class:`SessionInput` is the input half of
:class:`~airflow_provider_systemzero.protocol.client.ClientSession`: one object, two modules, so
that each holds one job. Here: the first message is a ``hello`` that sets the limits and the
pacing; a ``ping`` queues a ``pong``; an ``ack`` makes the mutation in flight what the gateway
holds; a ``decision`` settles the intents it covers; an ``error`` is a failed dispatch, a
rejection of the mutation in flight (sent again later, or the end of the stream), a refused
``decide``, or only reported; a ``goodbye`` names the delay before the next connection.

Every delay the gateway names is honoured (the public document: "Honor
goodbye.resume.retry_after_ms and any longer server retry delay"): the longest delay a
``goodbye`` or a fatal ``error`` names counts from the end of the connection
(:attr:`~.client.ClientSession.server_delay_ms`); the retry delay of any other error counts from
its arrival (:attr:`~.client.ClientSession.retry_not_before`), so a decide the gateway asked to
retry in 20 s is not replayed on a new connection sooner. And whatever the gateway said it will
do and then does not, the client does itself (WIRE.md §8; :class:`Recycle`): a ``goodbye`` or a
fatal error with no close after it, a refused message nobody will answer, a decide refused as
stale although it named the acknowledged version.
"""

from __future__ import annotations

import math

from airflow_provider_systemzero.protocol import client_events as events
from airflow_provider_systemzero.protocol.client_events import ClientEvent
from airflow_provider_systemzero.protocol.connection_state import ConnectionState, Phase, Recycle, check_hello
from airflow_provider_systemzero.protocol.desired import DesiredState
from airflow_provider_systemzero.protocol.errors import RemoteProtocolError
from airflow_provider_systemzero.protocol.limits import Limits
from airflow_provider_systemzero.protocol.messages import (
    Ack,
    Decision,
    Error,
    Goodbye,
    Hello,
    Ping,
    Pong,
    Scheduled,
    Start,
    StreamRequest,
    decode_server_message,
)
from airflow_provider_systemzero.protocol.outcomes import Outcomes
from airflow_provider_systemzero.protocol.reconnect import (
    DEFAULT_REJECTION_RETRY_MS,
    MAX_SERVER_DELAY_S,
    DecideRetry,
    classify_decide_failure,
)
from airflow_provider_systemzero.protocol.reply import DecisionResult

__all__ = ["DECIDE_REFUSALS", "SessionInput"]

#: Rejections after which the same mutation may be sent again later.
_RETRYABLE_REJECTIONS = frozenset(
    {"event_rate_limited", "too_many_pending_events", "shutting_down", "message_rate_limited"}
)

#: Error codes (with no ``event_id``) by which the gateway refuses a ``decide``: nothing is
#: dispatched for it.
DECIDE_REFUSALS = frozenset({"stale_state_version", "shutting_down"})


def _server_delay_s(error: Error) -> float:
    """The delay an error asks for (a default when it names none), capped, in seconds."""
    delay = error.retry.retry_after_ms
    return min((DEFAULT_REJECTION_RETRY_MS if delay is None else delay) / 1000, MAX_SERVER_DELAY_S)


class SessionInput:
    """The input half of :class:`~airflow_provider_systemzero.protocol.client.ClientSession`
    (see the module's description); the session provides the attributes and methods below."""

    _conn: ConnectionState | None
    _stream_failure: Error | None
    request: StreamRequest
    decision_mode: str
    limits: Limits
    desired: DesiredState
    outcomes: Outcomes
    stream_id: str | None
    server_delay_ms: int | None
    retry_not_before: float

    def _move(self, phase: Phase) -> None:  # pragma: no cover - the session's
        raise NotImplementedError

    def _adopt(self) -> list[ClientEvent]:  # pragma: no cover - the session's
        raise NotImplementedError

    def receive_text(self, text: str | bytes, now: float) -> list[ClientEvent]:
        """Handle one server frame.

        :raises RemoteProtocolError: the gateway broke the contract; close the connection and
            reconnect.
        """
        conn = self._conn
        if conn is None:
            raise RuntimeError("receive_text without an open connection")
        conn.last_receipt = now
        message = decode_server_message(text)
        conn.check_sequence(message)
        if conn.hello is None:
            message = check_hello(message)
            conn.greeted(message, now)
            self.limits = message.limits
            self.stream_id = message.stream_id
            self._move(Phase.STARTING)
            return [events.HelloReceived(message)]
        if isinstance(message, Hello):
            raise RemoteProtocolError(
                "a second hello on one connection", code="unexpected_hello", field="type"
            )
        if isinstance(message, Ping):
            conn.pongs.append(Pong(message.nonce))
            # a gateway keeps at most max_pending_probes pings unanswered: older ones are moot (a flood stays bounded)
            del conn.pongs[: -max(1, self.limits.max_pending_probes)]
            return []
        if isinstance(message, Ack):
            return self._on_ack(conn, message)
        if isinstance(message, Scheduled):
            conn.scheduled(message.state_version)
            return []
        if isinstance(message, Decision):
            return self._on_decision(conn, message)
        if isinstance(message, Error):
            return self._on_error(conn, message, now)
        assert isinstance(message, Goodbye)
        self._named_delay(message.retry_after_ms)  # a second goodbye never shortens the first's
        self._expect_close(conn, now)
        return [events.GoodbyeReceived(message)]

    def _named_delay(self, delay_ms: int | None) -> None:
        """A ``goodbye`` or a fatal error named ``delay_ms`` before the next connection: the longest counts."""
        if delay_ms is not None:
            self.server_delay_ms = max(self.server_delay_ms or 0, delay_ms)

    def _expect_close(self, conn: ConnectionState, now: float) -> None:
        """The gateway closes the connection now (after a ``goodbye`` or a fatal error); if it does
        not within the close handshake timeout, the client closes it and replays."""
        conn.plan_recycle(now + self.limits.close_handshake_timeout_ms / 1000, Recycle.CLOSE_EXPECTED)

    def _note_retry_delay(self, conn: ConnectionState, error: Error, now: float) -> None:
        """The delays ``error`` names: a fatal one's counts from the end of the connection (which
        must follow), any other's from now (no new connection replays the state sooner)."""
        delay = error.retry.retry_after_ms
        if error.fatal:
            self._named_delay(delay)
            self._expect_close(conn, now)
        elif delay is not None:
            self.retry_not_before = max(self.retry_not_before, now + _server_delay_s(error))

    def _on_ack(self, conn: ConnectionState, ack: Ack) -> list[ClientEvent]:
        flight = conn.acknowledge(ack)
        self.outcomes.acknowledged(flight.generation)
        is_start = isinstance(flight.message, Start)
        if is_start:
            self._move(Phase.STREAMING)
        return [
            events.Acknowledged(ack, flight.message.TYPE, replayed=is_start and conn.replay),
            *self._adopt(),
        ]

    def _on_decision(self, conn: ConnectionState, message: Decision) -> list[ClientEvent]:
        if message.state_version > conn.acked_version:
            raise RemoteProtocolError(
                f"decision covers version {message.state_version} but only "
                f"{conn.acked_version} was acknowledged: an ack precedes any decision "
                "covering it",
                code="decision_before_ack",
                field="state_version",
            )
        result = DecisionResult.from_message(message, self.request.questions)
        if self.decision_mode == "on_change" and 0 < message.state_version <= conn.decided_version:
            return [events.DecisionRepeated(message.state_version)]
        generation = conn.decided(message.state_version)
        intents = self.outcomes.decision(result, generation)
        return [
            events.DecisionReceived(result, current=generation == self.desired.generation, intents=intents)
        ]

    def _on_error(self, conn: ConnectionState, error: Error, now: float) -> list[ClientEvent]:
        self._note_retry_delay(conn, error, now)
        flight = conn.in_flight
        if error.http_status is not None and error.event_id is None:
            return self._on_decide_failure(conn, error, now)
        if flight is not None and error.event_id == flight.message.event_id and not error.fatal:
            if error.code in _RETRYABLE_REJECTIONS:
                drain = error.code == "too_many_pending_events" and self.decision_mode == "on_request"
                conn.rejected_for_now(error, _server_delay_s(error), now, drain=drain)
                # the caller may have returned to the acknowledged state meanwhile
                return [events.MutationRejected(error), *self._adopt()]
            conn.in_flight = None
            self._stream_failure = error
            self._move(Phase.FAILED)
            return [events.StreamFailed(error)]
        if error.event_id is None and error.code in DECIDE_REFUSALS:
            if error.code == "stale_state_version" and conn.decide_outstanding is not None:
                # the decide named the acknowledged version with nothing in flight: the gateway
                # counts otherwise, and the same decide would be refused again at once; it stays
                # outstanding (nothing is sent again here) until the replay on a new connection
                conn.plan_recycle(now + _server_delay_s(error), Recycle.VERSION_DISAGREES)
                return [events.ServerError(error)]
            conn.decide_outstanding = None
            if error.code == "shutting_down":
                conn.blocked_until = math.inf
            return [events.ServerError(error)]
        if (
            error.event_id is None
            and error.code == "message_rate_limited"
            and not error.fatal
            and conn.unanswered()
        ):
            # one of the messages sent was dropped, and the gateway did not say which: if it was
            # the change or the decide still unanswered, nothing will answer it (an answer that
            # does come first cancels this: ConnectionState.cancel_recycle)
            conn.plan_recycle(now + _server_delay_s(error), Recycle.MESSAGE_REFUSED)
            return [events.ServerError(error)]
        if (
            error.event_id is None
            and not error.fatal
            and error.code in ("decide_not_allowed", "start_required")
        ):
            self._stream_failure = error
            self._move(Phase.FAILED)
            return [events.StreamFailed(error)]
        return [events.ServerError(error)]

    def _on_decide_failure(self, conn: ConnectionState, error: Error, now: float) -> list[ClientEvent]:
        assert error.http_status is not None
        conn.drain = False
        if self.decision_mode == "on_request":
            # the decide named one version: it answers whoever asked about that state or an
            # older one; a caller who asked after a newer change gets a decide of its own
            named = conn.decide_outstanding if conn.decide_outstanding is not None else error.state_version
            conn.decide_outstanding = None
            generation = conn.version_generation.get(named or 0, -1)
            return [events.DecisionFailedEvent(error, self.outcomes.fail_through(generation))]
        retry = classify_decide_failure(error.http_status, error.envelope, error.retry)
        if error.fatal:
            # goodbye and close follow; the next connection replays
            return [events.DecisionFailedEvent(error, ())]
        if retry is DecideRetry.CLIENT:
            # nobody retries it on this connection: replay on a new one after the server's delay
            conn.plan_recycle(now + _server_delay_s(error), Recycle.DECIDE_NOT_RETRIED)
        elif retry is DecideRetry.NONE:
            # the gateway will not dispatch this state again: it is settled, with this failure,
            # for whoever waits for it or an older state; a newer state is dispatched on its own
            generation = conn.version_generation.get(error.state_version or 0, -1)
            current = generation < 0 or generation == self.desired.generation
            self.outcomes.failed_for_good(error, generation, reported=current)
            intents = self.outcomes.fail_through(generation)
            return [events.DecisionFailedEvent(error, intents, current=current)]
        return [events.DecisionFailedEvent(error, ())]
