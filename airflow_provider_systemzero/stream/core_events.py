"""What the client core's events do to a :class:`~airflow_provider_systemzero.stream.DecisionStream`.

The sans-I/O :class:`~airflow_provider_systemzero.protocol.client.ClientSession` turns frames into
events (:mod:`~airflow_provider_systemzero.protocol.client_events`); here they reach the caller:

* acknowledgements and decisions resolve ``decide()`` waiters and feed ``decisions()``;
* a :class:`~airflow_provider_systemzero.decisions.budget.DecisionBudget` is asked before anything that can
  start a dispatch is written (on_change: every mutation; on_request: ``decide``), and counts
  every decision (billed, or replayed under a reply id it already holds);
* a :class:`~airflow_provider_systemzero.stream.observer.StreamObserver` hears connections, acks,
  decisions, reconnects, refusals and rate-limit waits (metrics and spans); the INFO log lines
  say the same for a person reading the task log — never the state's content or the key.

:class:`CoreEventHandling` is one part of :class:`~airflow_provider_systemzero.stream.DecisionStream`;
it is not used on its own.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from airflow_provider_systemzero.protocol.client_events import (
    Acknowledged,
    ClientEvent,
    DecisionFailedEvent,
    DecisionReceived,
    DecisionRepeated,
    GoodbyeReceived,
    HelloReceived,
    MutationRejected,
    ServerError,
    StreamFailed,
)
from airflow_provider_systemzero.protocol.client_input import DECIDE_REFUSALS
from airflow_provider_systemzero.protocol.messages import ClientMessage, Error, Hello
from airflow_provider_systemzero.protocol.reconnect import DecideRetry, classify_decide_failure
from airflow_provider_systemzero.protocol.reply import DecisionResult
from airflow_provider_systemzero.stream.exceptions import BudgetExceeded, DecisionFailed, StreamRejected
from airflow_provider_systemzero.stream.untrusted import server_text, server_token

__all__ = ["CoreEventHandling"]

log = logging.getLogger(__name__)


class CoreEventHandling:
    """The core-event handling of a :class:`~airflow_provider_systemzero.stream.DecisionStream`."""

    # ------------------------------------------------------------------ failure

    def _decision_error(self, error: Error) -> DecisionFailed:
        retryable = (
            error.http_status is not None
            and classify_decide_failure(error.http_status, error.envelope, error.retry)
            is not DecideRetry.NONE
        )
        return DecisionFailed(
            error.http_status,
            error.envelope,
            error.retry,
            retryable,
            state_version=error.state_version,
            request_id=error.request_id,
        )

    # ------------------------------------------------------------------ events

    def _dispatch(self, events: list[ClientEvent]) -> None:
        for event in events:
            if isinstance(event, HelloReceived):
                self.capacity.adopt_advertised(event.hello.limits.max_streams_per_process, self._origin())
                self._log_hello(event.hello)
                self._observe_later("hello", event.hello)  # after the start it makes due is written
            elif isinstance(event, Acknowledged):
                self._on_ack(event)
            elif isinstance(event, DecisionReceived):
                if not event.repeated:  # a repeated one was counted and queued when it arrived
                    self._on_decision(event.result)
                self._answer(event.intents, event.result)
                if self._queue_decisions and not event.repeated:
                    self._queue(event.result)
                self._settle_exceeded()
            elif isinstance(event, DecisionFailedEvent):
                if event.repeated:
                    self._on_failure_inherited(event)
                else:
                    self._on_decision_failed(event)
                self._settle_exceeded()
            elif isinstance(event, MutationRejected):
                self._accounting.refused(event.error)
                self._settle_exceeded()
                log.debug(
                    "change %s deferred by the gateway (%s); it is sent again",
                    server_token(event.error.event_id),
                    server_token(event.error.code),
                )
                if event.error.code == "event_rate_limited":
                    delay = event.error.retry.retry_after_ms
                    self._observe("rate_limited", "event", None if delay is None else delay / 1000)
            elif isinstance(event, StreamFailed):
                self._fail(StreamRejected(event.error.envelope, event.error.event_id))
            elif isinstance(event, ServerError):
                if event.error.fatal:
                    self._last_fatal = event.error
                elif event.error.event_id is None and event.error.code in DECIDE_REFUSALS:
                    self._accounting.refused(event.error)  # no dispatch follows the decide
                log.info(
                    "gateway error %s (fatal=%s): %s",
                    server_token(event.error.code),
                    event.error.fatal,
                    server_text(event.error.envelope.message),
                )
            elif isinstance(event, GoodbyeReceived):
                self._goodbye = event.goodbye
            elif isinstance(event, DecisionRepeated):
                log.warning(
                    "the System Zero gateway repeated the decision for state version %d: ignored",
                    event.state_version,
                )
        self._pulse()

    def _on_decision_failed(self, event: DecisionFailedEvent) -> None:
        error = self._decision_error(event.error)
        self._last_error = error
        self._accounting.failed(event.error, retryable=error.retryable)
        self._observe(
            "decision_failed",
            error.http_status,
            error.envelope.code,
            error.retryable,
            event.error.state_version,
        )
        if error.http_status == 429:
            delay = error.retry.retry_after_ms
            self._observe("rate_limited", "decide", None if delay is None else delay / 1000)
        if self._starts is not None:
            on_request = self._decision_mode == "on_request"
            self._starts.ended(self, event.error, self.session.generation, requeue=on_request)
        if event.error.fatal:
            self._last_fatal = event.error
        self._answer(event.intents, error)
        if self._decision_mode != "on_change":
            return
        if error.retryable:
            if classify_decide_failure(error.http_status, error.envelope, error.retry) is DecideRetry.CLIENT:
                log.info(
                    "decision failed with HTTP 503 (maintenance): the gateway is going away; the state is "
                    "decided again on the next connection"
                )
            else:
                log.info(
                    "decision failed with HTTP %s (%s); the gateway retries it",
                    error.http_status,
                    server_token(error.envelope.code),
                )
            return
        # the gateway will not retry: whoever waited for this state's decision heard it above
        if not event.current:
            log.info(
                "decision for state version %s failed with HTTP %s (%s), not retried; the state has "
                "changed since, and the newer one is decided on its own",
                event.error.state_version,
                error.http_status,
                server_token(error.envelope.code),
            )
            return
        if self._queue_decisions:
            self._queue(error)

    def _on_failure_inherited(self, event: DecisionFailedEvent) -> None:
        """The caller returned to a state whose dispatch failed for good (counted when it arrived):
        its waiters hear the failure, and ``decisions()`` does if it has not yet."""
        error = self._decision_error(event.error)
        self._answer(event.intents, error)
        if event.current and self._queue_decisions:
            self._queue(error)

    def _answer(self, intents: tuple[int, ...], outcome: DecisionResult | BaseException) -> None:
        """Settle the ``decide()`` calls waiting for ``intents`` with a decision or an error."""
        for intent in intents:
            future = self._intent_futures.get(intent)
            if future is None or future.done():
                continue
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

    def _queue(self, outcome: DecisionResult | BaseException) -> None:
        """Hand a decision, or the error that ends the state's wait, to ``decisions()``."""
        self._decisions.append(outcome)
        self._decisions_ready()

    # ------------------------------------------------------------------ budget and accounting

    def _admit(self, message: ClientMessage) -> bool:
        """Asked by the session before writing a message that can start a dispatch."""
        starts = self._starts
        if starts is not None and not starts.may_start(
            self, message, self.session.generation, self._ask_again
        ):
            if self._decided_this_connection and self.capacity.waiting and self._ws is not None:
                self._release_for = self._ws  # had its turn: its slot goes to a stream waiting for one
            return False  # its turn under the account's decision ceiling comes: _ask_again
        refused = self._accounting.admit(message, self.session.desired_body_bytes())
        if refused is not None:
            self._budget_exceeded(refused)
            return False
        return True

    def _ask_again(self) -> None:
        """Let the session ask for its decision start again: its turn came (it starts on its newest
        state), or a new connection asks anew."""
        if self._refused is None and self._session is not None:
            self._session.dispatch_held = False
            self._kick()

    def _budget_exceeded(self, exc: BudgetExceeded) -> None:
        first = self._refused is None
        self._refused = exc
        if first:
            log.warning("%s", exc)
            self._observe("budget_exceeded", exc)
        if self._decision_mode == "on_request":
            # nothing was sent: whoever waits for this decision hears why at once
            for intent, future in list(self._intent_futures.items()):
                if not future.done():
                    future.set_exception(exc)
                    self.session.cancel_intent(intent)
            return
        if first:
            log.info(
                "holding further changes locally; %d dispatch(es) already scheduled settle first",
                self._accounting.outstanding(),
            )
        self._settle_exceeded()

    def _settle_exceeded(self) -> None:
        """on_change: once nothing scheduled is outstanding, a refused stream fails (and closes)."""
        if (
            self._refused is not None
            and self._decision_mode == "on_change"
            and self._accounting.outstanding() == 0
        ):
            self._fail(self._refused)

    def _on_ack(self, event: Acknowledged) -> None:
        ack = event.ack
        self._state_version = ack.state_version
        self._accounting.acknowledged(ack)
        if event.message_type == "start":
            self._started_this_connection = True
            self._ready = True
        log.info(
            "state version %d acknowledged (%s%s): state %d bytes, decide body %d bytes%s",
            ack.state_version,
            event.message_type,
            ", replayed" if event.replayed else "",
            ack.state_bytes,
            ack.synthesized_body_bytes,
            ", decision scheduled" if ack.scheduled else "",
        )
        self._observe_later("acknowledged", ack, event.message_type, event.replayed)

    def _on_decision(self, result: DecisionResult) -> None:
        version = result.state_version
        self._decided_this_connection = True
        self._last_error = None  # overcome: a later timeout does not blame a failure of before
        if self._starts is not None:
            self._starts.ended(self, None, self.session.generation, requeue=False)
        billed = self._accounting.decided(result)
        self._observe_later("decided", result, billed=billed)
        if not log.isEnabledFor(logging.INFO):
            return  # the line below is built only for a log that shows it
        answers = "; ".join(
            f"{name}={answer.decision!r} (probability {_fmt(answer.probability)}, confidence "
            f"{_fmt(answer.confidence)})"
            for name, answer in result.answers.items()
        )
        usage = result.usage
        log.info(
            "decision for state version %d (covers %s): %s — reply %s, %s; %d input tokens; queue %s ms, "
            "decide %s ms",
            version,
            ", ".join(map(server_token, result.covered_event_ids)) or "nothing new",
            answers or "no answers",
            server_token(result.reply_id),
            "a new reply, counted as billed"
            if billed
            else "a reply already counted: replayed, not billed again",
            usage.get("input_tokens", 0),
            _fmt(result.queue_ms, 0),
            _fmt(result.decide_ms, 0),
        )

    def _connection_ended(self) -> None:
        """Account for dispatches the lost connection may leave behind (billed, reply never seen)."""
        if self._starts is not None:
            self._starts.withdraw(self)  # a start is granted to a connected stream only
            self._ask_again()
        if self._accounting.connection_ended():
            self._said_unconfirmed("the connection ended")

    @staticmethod
    def _said_unconfirmed(why: str) -> None:
        log.info(
            "%s with a dispatch possibly in flight: counted as one unconfirmed decision against the budget",
            why,
        )

    def settle_usage(self) -> None:
        """Count a dispatch the gateway may still make for this connection as one unconfirmed
        decision now, as the connection's end would count it: for a caller that reports what the
        stream spent before it closes the stream (a trigger's event goes out before its cleanup).
        Once the connection ends, nothing is counted twice, and a decision that still arrives
        takes the unconfirmed one's place."""
        if self._accounting.settle():
            self._said_unconfirmed("the stream's usage was reported")

    def _log_hello(self, hello: Hello) -> None:
        lim = hello.limits
        log.info(
            "System Zero stream %s open (%s): max_message_bytes=%d, max_decide_body_bytes=%d, "
            "max_events_per_second=%s (burst %d), max_pending_events=%d, heartbeat every %d ms, idle timeout "
            "%d ms, max duration %d ms, max_streams_per_process=%d",
            server_token(hello.stream_id),
            hello.protocol,
            lim.max_message_bytes,
            lim.max_decide_body_bytes,
            lim.max_events_per_second,
            lim.event_burst,
            lim.max_pending_events,
            lim.heartbeat_interval_ms,
            lim.idle_timeout_ms,
            lim.max_duration_ms,
            lim.max_streams_per_process,
        )

    def _observe(self, method: str, *args: Any, **kwargs: Any) -> None:
        """Tell the observer now (after what it was told to hear later, in order)."""
        if self._observations:
            self._observe_pending()
        self._observe_now(method, args, kwargs)

    def _observe_later(self, method: str, *args: Any, **kwargs: Any) -> None:
        """Tell the observer once whatever this frame woke has run: an ack or a decision is counted
        (metrics, spans) after the task waiting for the decision got it, not before — the caller's
        event does not wait for the metrics. The order of what the observer hears is kept."""
        pending = self._observations
        pending.append((method, args, kwargs))
        if len(pending) == 1:
            loop = asyncio.get_running_loop()
            loop.call_soon(loop.call_soon, self._observe_pending)  # behind the tasks woken this turn

    def _observe_pending(self) -> None:
        pending = self._observations
        while pending:
            method, args, kwargs = pending.popleft()
            self._observe_now(method, args, kwargs)

    def _observe_now(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            getattr(self.observer, method)(*args, **kwargs)
        except Exception as exc:  # an observer never breaks the stream
            log.debug("stream observer %s failed: %s", method, exc)


def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "n/a"
    return f"{value:.{digits}f}"
