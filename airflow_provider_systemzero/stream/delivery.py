"""The decisions of a :class:`~airflow_provider_systemzero.stream.DecisionStream`, as its caller gets them.

* ``decide()`` — a decision covering the desired state as it is now (on_request: the ``decide``
  intent, with the retry classification of the core; on_change: the decision that covers it);
* ``decisions()`` — the on_change decisions in order, built on the hand-over underneath;
* ``take_decision()`` / ``wake_on_decision()`` — that hand-over: the stream's reader queues a
  decision and resolves the one consumer's future itself, so the consumer is the next task to run.

:class:`DecisionDelivery` is the part of a stream that keeps what its callers wait for: the
``decide()`` futures by intent, the queue of ``decisions()`` and its one waiter. The core's events
(:mod:`~airflow_provider_systemzero.stream.core_events`) settle them through :meth:`~DecisionDelivery.answer`
and :meth:`~DecisionDelivery.queue`; the stream's end through :meth:`~DecisionDelivery.fail_all`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

from airflow_provider_systemzero.protocol.messages import Error
from airflow_provider_systemzero.protocol.reconnect import Backoff, DecideRetry, classify_decide_failure
from airflow_provider_systemzero.protocol.reply import DecisionResult
from airflow_provider_systemzero.stream.exceptions import DeadlineExceeded, DecisionFailed, StreamClosed
from airflow_provider_systemzero.stream.life import StreamLife, StreamView
from airflow_provider_systemzero.stream.untrusted import server_token

__all__ = ["DecisionDelivery", "decision_error"]

log = logging.getLogger(__name__)

#: 409 ``idempotency_conflict`` answers waited out by one ``decide()`` (the original call is still running).
_MAX_CONFLICT_RETRIES = 600
#: Undelivered on_change decisions kept for ``decisions()`` (the oldest are dropped).
MAX_QUEUED_DECISIONS = 10_000


def decision_error(error: Error) -> DecisionFailed:
    """The :class:`~airflow_provider_systemzero.stream.exceptions.DecisionFailed` a caller hears for a
    failed dispatch, retryable as the core classifies it.

    :param error: the gateway's error for the dispatch.
    """
    retryable = (
        error.http_status is not None
        and classify_decide_failure(error.http_status, error.envelope, error.retry) is not DecideRetry.NONE
    )
    return DecisionFailed(
        error.http_status,
        error.envelope,
        error.retry,
        retryable,
        state_version=error.state_version,
        request_id=error.request_id,
    )


class DecisionDelivery:
    """What the callers of a :class:`~airflow_provider_systemzero.stream.DecisionStream` wait for.

    :param stream: the stream (its session, and what its last failure was).
    :param life: the stream's life.
    :param kick: asks for a writer's turn (a ``decide`` to send).
    :param decision_mode: the stream's decision mode.
    :param decide_retries: retries of a retryable on_request decision failure.
    :param backoff: the delays between those retries.
    """

    def __init__(
        self,
        stream: StreamView,
        life: StreamLife,
        kick: Callable[[], None],
        *,
        decision_mode: str,
        decide_retries: int,
        backoff: Backoff,
    ) -> None:
        self._stream = stream
        self._life = life
        self._kick = kick
        self._decision_mode = decision_mode
        self._decide_retries = decide_retries
        self._backoff = backoff
        #: The account's shared decision starts (set by the stream on entering): with them a 429
        #: is waited out by the process's start queue, not by a retry here.
        self.shares_starts = False
        #: The ``decide()`` calls waiting, by intent (added and removed by :meth:`decide`; settled
        #: by :meth:`answer`, :meth:`refuse_all` and :meth:`fail_all`).
        self.intents: dict[int, asyncio.Future[DecisionResult]] = {}
        #: Decisions (and the errors that end a state's wait) not taken yet by ``decisions()``
        #: (added by :meth:`queue`, taken by :meth:`take_decision`).
        self._queued: deque[DecisionResult | BaseException] = deque(maxlen=MAX_QUEUED_DECISIONS)
        #: Whether decisions are queued for ``decisions()``: always on_change, and from the first
        #: ``decisions()`` call on_request.
        self.queues = decision_mode == "on_change"
        #: The one consumer's future, resolved the moment there is something to take (set by
        #: :meth:`wake_on_decision`, resolved and cleared by :meth:`ready`).
        self.waiter: asyncio.Future[Any] | None = None

    async def decide(self, timeout: float | None) -> DecisionResult:  # noqa: ASYNC109 - see DeadlineExceeded
        """``DecisionStream.decide()`` (documented there).

        :param timeout: seconds (``None``: no limit).
        """
        life = self._life
        life.check_usable()
        session = self._stream.session
        if self._decision_mode == "on_change":
            if session.current_decision is not None:
                return session.current_decision  # already decided: on_change dispatches nothing new for it
            if session.current_failure is not None:
                # the gateway will not dispatch this state again: its final failure is the answer
                raise decision_error(session.current_failure)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        failures = conflicts = 0
        while True:
            intent = session.request_decision()
            future: asyncio.Future[DecisionResult] = loop.create_future()
            self.intents[intent] = future
            self._kick()
            try:
                async with asyncio.timeout_at(deadline):
                    return await future
            except DecisionFailed as exc:
                if exc.http_status == 429 and self.shares_starts:
                    continue  # asked again: the process's start queue waits out the Retry-After, once
                conflict = exc.http_status == 409 and exc.envelope.code == "idempotency_conflict"
                if conflict:
                    # the same state's call still runs (a decide re-sent after a reconnect): it will
                    # finish, so wait for it without spending the retry budget
                    conflicts += 1
                else:
                    failures += 1
                if not exc.retryable or failures > self._decide_retries or conflicts > _MAX_CONFLICT_RETRIES:
                    raise
                server = exc.retry.retry_after_ms / 1000 if exc.retry.retry_after_ms is not None else None
                delay = self._backoff.delay(0 if conflict else failures - 1, server)
                if deadline is not None and loop.time() + delay >= deadline:
                    raise DeadlineExceeded(
                        f"no decision within {round(timeout, 1):g} s (the server asked to wait "
                        f"{delay:.3f} s before retrying)",
                        last_error=exc,
                    ) from exc
                log.info(
                    "decision failed with HTTP %s (%s); retrying in %.3f s",
                    exc.http_status,
                    server_token(exc.envelope.code),
                    delay,
                )
                await life.sleep(delay)
                life.check_usable()
            except TimeoutError:
                if life.failure is not None:
                    raise life.failure from None
                raise DeadlineExceeded(
                    f"no decision within {round(timeout, 1):g} s",
                    last_error=life.last_error,
                    detail=self._stream.last_error_text,
                ) from None
            finally:
                self.intents.pop(intent, None)
                session.cancel_intent(intent)

    async def decisions(self) -> AsyncIterator[DecisionResult]:
        """``DecisionStream.decisions()`` (documented there)."""
        self._life.check_usable()
        self.queues = True
        loop = asyncio.get_running_loop()
        while True:
            try:
                decision = self.take_decision()
            except StreamClosed:
                if self._life.failure is None:
                    return
                raise
            if decision is not None:
                yield decision
                continue
            # woken by a queued decision, a failure or the end, not by every frame
            waiter = loop.create_future()
            self.wake_on_decision(waiter)
            await waiter

    def take_decision(self) -> DecisionResult | None:
        """``DecisionStream.take_decision()`` (documented there)."""
        if self._queued:
            item = self._queued.popleft()
            if isinstance(item, BaseException):
                raise item
            return item
        life = self._life
        if life.failure is not None:
            raise life.failure
        if life.closed:
            raise StreamClosed(None, "closed", message="the stream closed: no further decision")
        return None

    def wake_on_decision(self, waiter: asyncio.Future[Any]) -> None:
        """``DecisionStream.wake_on_decision()`` (documented there).

        :param waiter: a future of the running loop.
        """
        self.waiter = waiter
        if self._queued or self._life.failure is not None or self._life.closed:
            self.ready()

    def ready(self) -> None:
        """Wake the one consumer of decisions, if it waits."""
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # ------------------------------------------------------------------ settled by the stream's events

    def answer(self, intents: tuple[int, ...], outcome: DecisionResult | BaseException) -> None:
        """Settle the ``decide()`` calls waiting for ``intents`` with a decision or an error.

        :param intents: the decide intents the decision or failure covers.
        :param outcome: the decision, or the error to raise.
        """
        for intent in intents:
            future = self.intents.get(intent)
            if future is None or future.done():
                continue
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

    def queue(self, outcome: DecisionResult | BaseException) -> None:
        """Hand a decision, or the error that ends the state's wait, to ``decisions()``.

        :param outcome: the decision or the error.
        """
        self._queued.append(outcome)
        self.ready()

    def refuse_all(self, exc: BaseException) -> None:
        """Nothing was sent for the ``decide()`` calls waiting (the budget refused): each hears
        ``exc`` at once, and its intent is withdrawn from the session.

        :param exc: the refusal.
        """
        session = self._stream.session
        for intent, future in list(self.intents.items()):
            if not future.done():
                future.set_exception(exc)
                session.cancel_intent(intent)

    def fail_all(self, exc: BaseException) -> None:
        """The stream failed or closed: every ``decide()`` waiting hears ``exc``.

        :param exc: the error that ended the stream.
        """
        for future in self.intents.values():
            if not future.done():
                future.set_exception(exc)
