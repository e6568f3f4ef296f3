"""What the client core's events do to a :class:`~airflow_provider_systemzero.stream.DecisionStream`.

The sans-I/O :class:`~airflow_provider_systemzero.protocol.client.ClientSession` turns frames into
events (:mod:`~airflow_provider_systemzero.protocol.client_events`); here they reach the caller:

* acknowledgements and decisions resolve ``decide()`` waiters and feed ``decisions()``
  (through the stream's :class:`~airflow_provider_systemzero.stream.delivery.DecisionDelivery`);
* a :class:`~airflow_provider_systemzero.decisions.budget.DecisionBudget` is asked before anything that can
  start a dispatch is written (on_change: every mutation; on_request: ``decide``), and counts
  every decision (billed, or replayed under a reply id it already holds), through the stream's
  :class:`~airflow_provider_systemzero.stream.accounting.DispatchAccounting`;
* so are the account's decision starts of the process
  (:class:`~airflow_provider_systemzero.stream.starts.DecisionStarts`), and, on_change, before a
  connection whose ``start`` starts a decision opens; an on_change 429 gives the connection back
  rather than wait for the gateway's own retries;
* a :class:`~airflow_provider_systemzero.stream.observer.StreamObserver` hears connections, acks,
  decisions, reconnects, refusals and rate-limit waits (metrics and spans); the INFO log lines
  say the same for a person reading the task log — never the state's content or the key.

:class:`CoreEvents` is the part of a stream that does this; what one connection's events told
(its ``start`` acknowledged, a decision, a goodbye, a fatal error) is kept in its
:class:`ConnectionFacts`, from which the connection's end is described.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass

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
from airflow_provider_systemzero.protocol.messages import ClientMessage, Error, Goodbye, Hello, Start
from airflow_provider_systemzero.protocol.reconnect import DecideRetry, classify_decide_failure
from airflow_provider_systemzero.protocol.reply import DecisionResult
from airflow_provider_systemzero.stream.accounting import DispatchAccounting
from airflow_provider_systemzero.stream.capacity import SlotOffer, StreamCapacity
from airflow_provider_systemzero.stream.delivery import DecisionDelivery, decision_error
from airflow_provider_systemzero.stream.exceptions import BudgetExceeded, StreamRejected
from airflow_provider_systemzero.stream.life import StreamLife, StreamView
from airflow_provider_systemzero.stream.observer import ObserverRelay
from airflow_provider_systemzero.stream.starts import DecisionStarts
from airflow_provider_systemzero.stream.untrusted import server_text, server_token

__all__ = ["ConnectionFacts", "CoreEvents"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ConnectionFacts:
    """What one connection told about itself, for how it ended: a new one per connection attempt
    (made by :meth:`CoreEvents.new_connection`), so nothing is carried to the next connection."""

    #: The socket serves the session (set and cleared by the connection server).
    open: bool = False
    #: The gateway acknowledged ``start`` on it (set by :class:`CoreEvents`).
    started: bool = False
    #: A decision arrived on it (set by :class:`CoreEvents`).
    decided: bool = False
    #: The gateway's goodbye, if it said one (set by :class:`CoreEvents`).
    goodbye: Goodbye | None = None
    #: The last fatal error the gateway sent on it (set by :class:`CoreEvents`).
    last_fatal: Error | None = None
    #: This side gives the connection back once nothing is due (``DecisionStream.release``, or
    #: :class:`CoreEvents` when a stream that had its decision gives its slot to one waiting).
    release: bool = False


class CoreEvents:
    """The part of a stream that acts on the core's events, and asks the budget before a dispatch.

    :param stream: the stream (its session).
    :param holder: the stream itself, weakly: who asks the account's decision starts.
    :param life: the stream's life (ready, its last error, the pulse).
    :param delivery: where ``decide()`` and ``decisions()`` hear the outcomes.
    :param accounting: what the dispatches cost the budget.
    :param observations: what the observer hears.
    :param capacity: the stream cap (it adopts what the gateway advertises).
    :param fail: ends the stream with an error.
    :param kick: asks for a writer's turn.
    :param decision_mode: the stream's decision mode.
    """

    def __init__(
        self,
        stream: StreamView,
        holder: weakref.ref[object],
        life: StreamLife,
        delivery: DecisionDelivery,
        accounting: DispatchAccounting,
        observations: ObserverRelay,
        capacity: StreamCapacity,
        *,
        fail: Callable[[BaseException], None],
        kick: Callable[[], None],
        decision_mode: str,
    ) -> None:
        self._stream = stream
        self._holder = holder
        self._life = life
        self._delivery = delivery
        self._accounting = accounting
        self._observations = observations
        self._capacity = capacity
        self._fail = fail
        self._kick = kick
        self._decision_mode = decision_mode
        #: The account's decision starts shared in this process (set by the stream on entering).
        self.starts: DecisionStarts | None = None
        #: The gateway the stream talks to, as the stream cap counts it (set on entering).
        self.origin: str | None = None
        #: The latest state version the gateway acknowledged (numbering restarts per connection).
        self.state_version = 0
        #: What the budget refused, holding this stream (set once, by :meth:`admit`).
        self.refused: BudgetExceeded | None = None
        #: The current connection's facts (replaced by :meth:`new_connection`).
        self.facts = ConnectionFacts()
        #: on_change: the opening's turn counted the start its connection sends (set by
        #: :meth:`turn_to_open`, cleared when that ``start`` is admitted).
        self._opening_counted = False
        #: on_change: the opening's turn came (counted or granted) and is not used yet (set by
        #: :meth:`turn_to_open`, cleared by :meth:`turn_postponed`).
        self._turn_taken = False
        #: on_change: the turn the run loop waits for before it opens a connection (made by
        #: :meth:`turn_to_open` while it waits, resolved when the account's decision starts grant it).
        self.opening_turn: asyncio.Future[None] | None = None
        #: The offer of this connection's slot while its next start waits for its turn (made by
        #: :meth:`admit`; it ends when the turn comes and the capacity has not asked for the slot,
        #: else once the run loop gave the slot back: :meth:`slot_released`).
        self._slot_offer: SlotOffer | None = None

    def new_connection(self) -> ConnectionFacts:
        """A connection attempt begins: its facts start empty."""
        self.facts = ConnectionFacts()
        return self.facts

    # ------------------------------------------------------------------ events

    def dispatch(self, events: list[ClientEvent]) -> None:
        """Act on the core's events (from one frame, or a change of the caller's), then pulse.

        :param events: what the session returned.
        """
        facts = self.facts
        delivery = self._delivery
        for event in events:
            if isinstance(event, HelloReceived):
                self._capacity.adopt_advertised(event.hello.limits.max_streams_per_process, self.origin)
                if self.starts is not None:
                    self.starts.adopt(event.hello.limits)
                self._log_hello(event.hello)
                self._observations.later("hello", event.hello)  # after the start it makes due is written
            elif isinstance(event, Acknowledged):
                self._on_ack(event, facts)
            elif isinstance(event, DecisionReceived):
                if not event.repeated:  # a repeated one was counted and queued when it arrived
                    self._on_decision(event.result, facts)
                delivery.answer(event.intents, event.result)
                if delivery.queues and not event.repeated:
                    delivery.queue(event.result)
                self._settle_exceeded()
            elif isinstance(event, DecisionFailedEvent):
                if event.repeated:
                    self._on_failure_inherited(event)
                else:
                    self._on_decision_failed(event, facts)
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
                    self._observations.now("rate_limited", "event", None if delay is None else delay / 1000)
            elif isinstance(event, StreamFailed):
                self._fail(StreamRejected(event.error.envelope, event.error.event_id))
            elif isinstance(event, ServerError):
                if event.error.fatal:
                    facts.last_fatal = event.error
                elif event.error.event_id is None and event.error.code in DECIDE_REFUSALS:
                    self._accounting.refused(event.error)  # no dispatch follows the decide
                log.info(
                    "gateway error %s (fatal=%s): %s",
                    server_token(event.error.code),
                    event.error.fatal,
                    server_text(event.error.envelope.message),
                )
            elif isinstance(event, GoodbyeReceived):
                facts.goodbye = event.goodbye
            elif isinstance(event, DecisionRepeated):
                log.warning(
                    "the System Zero gateway repeated the decision for state version %d: ignored",
                    event.state_version,
                )
        self._life.pulse()

    def _on_decision_failed(self, event: DecisionFailedEvent, facts: ConnectionFacts) -> None:
        error = decision_error(event.error)
        self._life.last_error = error
        self._accounting.failed(event.error, retryable=error.retryable)
        self._observations.now(
            "decision_failed",
            error.http_status,
            error.envelope.code,
            error.retryable,
            event.error.state_version,
        )
        if error.http_status == 429:
            delay = error.retry.retry_after_ms
            self._observations.now("rate_limited", "decide", None if delay is None else delay / 1000)
        give_back = self._gives_back(event.error, facts)
        if self.starts is not None:
            on_request = self._decision_mode == "on_request"
            self.starts.ended(
                self._holder(),
                event.error,
                self._stream.session.generation,
                requeue=on_request or give_back,
            )
        if event.error.fatal:
            facts.last_fatal = event.error
        self._delivery.answer(event.intents, error)
        if self._decision_mode != "on_change":
            return
        if give_back:
            log.info(
                "decision refused with HTTP 429 (another process spends the account too): the "
                "connection is given back before the gateway retries it, and the state is decided "
                "again on a new one when this process's turn comes"
            )
            facts.release = True
            self._kick()
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
        if self._delivery.queues:
            self._delivery.queue(error)

    def _gives_back(self, error: Error, facts: ConnectionFacts) -> bool:
        """on_change: whether a decide failure makes the stream give its connection back — a 429
        the gateway would retry by itself, closing the stream with 1013 at its third refusal in a
        row for the version (WIRE.md §5). The stream does not wait for that: with the connection
        closed, its start waits for this process's turn under the account's ceiling instead."""
        return (
            self._decision_mode == "on_change"
            and self.starts is not None
            and error.http_status == 429
            and not error.fatal
            and facts.open
        )

    def _on_failure_inherited(self, event: DecisionFailedEvent) -> None:
        """The caller returned to a state whose dispatch failed for good (counted when it arrived):
        its waiters hear the failure, and ``decisions()`` does if it has not yet."""
        error = decision_error(event.error)
        self._delivery.answer(event.intents, error)
        if event.current and self._delivery.queues:
            self._delivery.queue(error)

    # ------------------------------------------------------------------ budget and accounting

    def admit(self, message: ClientMessage) -> bool:
        """Asked by the session before writing a message that can start a dispatch.

        :param message: the message about to be written.
        """
        starts = self.starts
        session = self._stream.session
        if starts is not None and self._starts_a_decision(message):
            if isinstance(message, Start):  # on_change: it cannot wait once the connection is open
                if not self._opening_counted:
                    starts.start_sent(self._holder(), session.generation)
                self._opening_counted = False
            elif not starts.may_start(self._holder(), session.generation, self.ask_again):
                self._slot_while_waiting()
                return False  # its turn under the account's decision ceiling comes: ask_again
        refused = self._accounting.admit(message, session.desired_body_bytes())
        if refused is not None:
            self._budget_exceeded(refused)
            return False
        return True

    def _slot_while_waiting(self) -> None:
        """This connection had its decision and its next start waits for its turn: its slot of
        ``max_streams_per_process`` goes to a stream waiting for one — now, or as soon as one
        waits (an offer). An on_change stream whose turn came and that waits for a socket is first
        in line, so a socket kept by a stream that waits for its own turn would leave every start
        of the process stalled until the queue's order reached it. The capacity asks one holder
        per waiter (at once if one waits now): several streams that wait for their turns do not
        all give their sockets back for one stream that waits for a socket."""
        facts = self.facts
        if facts.decided and facts.open and self._slot_offer is None:
            self._slot_offer = self._capacity.offer(self._slot_wanted)

    def _slot_wanted(self) -> None:
        """A stream waits for a slot while this one waits for its turn: the connection is given
        back (the next one opens when the turn comes)."""
        facts = self.facts
        if self._slot_offer is not None and facts.open and not facts.release:
            log.info(
                "another stream waits for a socket while this one waits for its turn under the "
                "account's decision ceiling: the connection is given back, and the newest state is "
                "decided on a new one"
            )
            facts.release = True
            self._kick()

    def _withdraw_slot_offer(self) -> None:
        offer, self._slot_offer = self._slot_offer, None
        self._capacity.withdraw(offer)

    def _starts_a_decision(self, message: ClientMessage) -> bool:
        """Whether ``message`` may make the gateway start a decision, so it spends a start of the
        account: not an on_change ``start`` replaying a state already decided (the gateway's
        idempotency ledger answers it with the original reply). An on_change mutation counts
        even when a decision is pending behind the one in flight: by the time it arrives, that
        one may have been dispatched, and the mutation makes the next."""
        if isinstance(message, Start):
            return self._start_decides()
        return True

    def _start_decides(self) -> bool:
        """on_change: whether the next ``start`` starts a decision (its state was not decided)."""
        return self._stream.session.current_decision is None

    async def turn_to_open(self) -> None:
        """on_change: wait for this stream's turn under the account's decision ceiling before a
        connection whose ``start`` starts a decision takes a slot of ``max_streams_per_process``
        (once open, the ``start`` cannot wait). Asked by the run loop before each connection."""
        self._opening_counted = False
        self._turn_taken = False
        starts = self.starts
        if starts is None or self._decision_mode != "on_change" or not self._start_decides():
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not turn.done():
                turn.set_result(None)

        if starts.may_start(self._holder(), self._stream.session.generation, wake):
            self._opening_counted = True  # counted now: its start is not counted again
        else:
            self.opening_turn = turn
            try:
                await turn  # granted: the start spends the grant
            finally:
                self.opening_turn = None
        self._turn_taken = True

    def turn_postponed(self) -> None:
        """on_change: the turn :meth:`turn_to_open` took cannot be used yet (no socket is free):
        its token goes back and the stream stays first in line for the next one."""
        if self.starts is not None and self._turn_taken:
            self.starts.postpone(
                self._holder(), self._stream.session.generation, counted=self._opening_counted
            )
        self._opening_counted = self._turn_taken = False

    def changed(self) -> None:
        """The caller changed the state: if the stream waits for its decision start, the start is
        for the newest state, and its newest change counts from now."""
        if self.starts is not None:
            self.starts.changed(self._holder(), self._stream.session.generation)

    def ask_again(self) -> None:
        """Let the session ask for its decision start again: its turn came (it starts on its newest
        state and keeps its socket: an offer of it ends, unless the capacity already asked for
        the socket: then the offer ends once the socket is given back)."""
        if not self.facts.release:
            self._withdraw_slot_offer()
        self._ask()

    def slot_released(self) -> None:
        """The connection's slot went back to the capacity: an offer of it ends. Not before: an
        offer the capacity asked counts as the hand-over to a waiting stream until the slot is
        free, so no second holder is asked for the same waiter meanwhile."""
        self._withdraw_slot_offer()

    def _ask(self) -> None:
        """Let the session ask for its decision start again (a new connection asks anew)."""
        if self.refused is None:
            self._stream.session.retry_admission()
            self._kick()

    def _budget_exceeded(self, exc: BudgetExceeded) -> None:
        first = self.refused is None
        self.refused = exc
        if first:
            log.warning("%s", exc)
            self._observations.now("budget_exceeded", exc)
        if self._decision_mode == "on_request":
            # nothing was sent: whoever waits for this decision hears why at once
            self._delivery.refuse_all(exc)
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
            self.refused is not None
            and self._decision_mode == "on_change"
            and self._accounting.outstanding() == 0
        ):
            self._fail(self.refused)

    def _on_ack(self, event: Acknowledged, facts: ConnectionFacts) -> None:
        ack = event.ack
        self.state_version = ack.state_version
        self._accounting.acknowledged(ack)
        if event.message_type == "start":
            facts.started = True
            self._life.ready = True
        log.info(
            "state version %d acknowledged (%s%s): state %d bytes, decide body %d bytes%s",
            ack.state_version,
            event.message_type,
            ", replayed" if event.replayed else "",
            ack.state_bytes,
            ack.synthesized_body_bytes,
            ", decision scheduled" if ack.scheduled else "",
        )
        self._observations.later("acknowledged", ack, event.message_type, event.replayed)

    def _on_decision(self, result: DecisionResult, facts: ConnectionFacts) -> None:
        version = result.state_version
        facts.decided = True
        self._life.last_error = None  # overcome: a later timeout does not blame a failure of before
        if self.starts is not None:
            self.starts.ended(self._holder(), None, self._stream.session.generation, requeue=False)
        billed = self._accounting.decided(result)
        self._observations.later("decided", result, billed=billed)
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

    def connection_ended(self) -> None:
        """Account for dispatches the lost connection may leave behind (billed, reply never seen)."""
        if self.starts is not None:
            if self._decision_mode == "on_request":
                self.starts.withdraw(self._holder())  # a decide is granted to a connected stream only
            # (on_change keeps its place: its next connection waits for its turn before it opens)
            self._ask()
        if self._accounting.connection_ended():
            _said_unconfirmed("the connection ended")

    def withdraw_start(self) -> None:
        """The stream closes: it wants no decision start any more (an offer of its slot ends when
        the run loop gives the slot back)."""
        if self.starts is not None:
            self.starts.withdraw(self._holder())

    def settle_usage(self) -> None:
        """``DecisionStream.settle_usage()`` (documented there)."""
        if self._accounting.settle():
            _said_unconfirmed("the stream's usage was reported")

    @staticmethod
    def _log_hello(hello: Hello) -> None:
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


def _said_unconfirmed(why: str) -> None:
    log.info(
        "%s with a dispatch possibly in flight: counted as one unconfirmed decision against the budget",
        why,
    )


def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "n/a"
    return f"{value:.{digits}f}"
