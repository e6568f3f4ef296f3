"""The decisions of a :class:`~airflow_provider_systemzero.stream.DecisionStream`, as its caller gets them.

* ``decide()`` — a decision covering the desired state as it is now (on_request: the ``decide``
  intent, with the retry classification of the core; on_change: the decision that covers it);
* ``decisions()`` — the on_change decisions in order, built on the hand-over underneath;
* ``take_decision()`` / ``wake_on_decision()`` — that hand-over: the stream's reader queues a
  decision and resolves the one consumer's future itself, so the consumer is the next task to run.

:class:`DecisionDelivery` is one part of :class:`~airflow_provider_systemzero.stream.DecisionStream`;
it is not used on its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from airflow_provider_systemzero.protocol.reply import DecisionResult
from airflow_provider_systemzero.stream.exceptions import DeadlineExceeded, DecisionFailed, StreamClosed
from airflow_provider_systemzero.stream.untrusted import server_token

__all__ = ["DecisionDelivery"]

log = logging.getLogger(__name__)

#: 409 ``idempotency_conflict`` answers waited out by one ``decide()`` (the original call is still running).
_MAX_CONFLICT_RETRIES = 600


class DecisionDelivery:
    """The decisions of a :class:`~airflow_provider_systemzero.stream.DecisionStream`."""

    async def decide(self, *, timeout: float | None = None) -> DecisionResult:  # noqa: ASYNC109 - see DeadlineExceeded
        """A decision covering the desired state as it is now.

        on_request: sends ``decide`` for the version that holds every change made so far and
        waits for its decision; a retryable failure (429, 503 other than maintenance, 409
        ``idempotency_conflict``) is retried after the server's delay, up to ``decide_retries``
        times (409 ``idempotency_conflict`` — the same state's call still running after a
        reconnect — is waited out without spending that budget). on_change: returns the decision
        covering the current state, waiting for it if needed. A connection
        lost meanwhile is replayed and the decide re-sent; the caller sees one decision.

        :param timeout: seconds (``None``: no limit).
        :raises DecisionFailed: a non-retryable failure, or retries exhausted.
        :raises DeadlineExceeded: no decision in time.
        """
        self._check_usable()
        session = self.session
        if self._decision_mode == "on_change":
            if session.current_decision is not None:
                return session.current_decision  # already decided: on_change dispatches nothing new for it
            if session.current_failure is not None:
                # the gateway will not dispatch this state again: its final failure is the answer
                raise self._decision_error(session.current_failure)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        failures = conflicts = 0
        while True:
            intent = session.request_decision()
            future: asyncio.Future[DecisionResult] = loop.create_future()
            self._intent_futures[intent] = future
            self._kick()
            try:
                async with asyncio.timeout_at(deadline):
                    return await future
            except DecisionFailed as exc:
                if exc.http_status == 429 and self._starts is not None:
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
                delay = self.backoff.delay(0 if conflict else failures - 1, server)
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
                await self._sleep(delay)
                self._check_usable()
            except TimeoutError:
                if self._failure is not None:
                    raise self._failure from None
                raise DeadlineExceeded(
                    f"no decision within {round(timeout, 1):g} s",
                    last_error=self._last_error,
                    detail=self.last_error_text,
                ) from None
            finally:
                self._intent_futures.pop(intent, None)
                session.cancel_intent(intent)

    async def decisions(self) -> AsyncIterator[DecisionResult]:
        """Decisions as they arrive (on_change), in order; ends when the stream closes.

        One consumer at a time. A non-retryable on_change decision failure is raised here.

        :raises DecisionFailed: a dispatch failed and the gateway will not retry it.
        """
        self._check_usable()
        self._queue_decisions = True
        loop = asyncio.get_running_loop()
        while True:
            try:
                decision = self.take_decision()
            except StreamClosed:
                if self._failure is None:
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
        """The oldest on_change decision not taken yet, or ``None`` when there is none now.

        Together with :meth:`wake_on_decision` it is :meth:`decisions` without a task or an
        iterator in between: the consumer takes what is there, and waits on its own future.

        :raises DecisionFailed: a dispatch failed and the gateway will not retry it (in order).
        :raises StreamClosed: the stream closed (or the error that ended it).
        """
        if self._decisions:
            item = self._decisions.popleft()
            if isinstance(item, BaseException):
                raise item
            return item
        if self._failure is not None:
            raise self._failure
        if self._closed:
            raise StreamClosed(None, "closed", message="the stream closed: no further decision")
        return None

    def wake_on_decision(self, waiter: asyncio.Future[Any]) -> None:
        """Resolve ``waiter`` (with ``None``) the moment :meth:`take_decision` has something new:
        a decision, a failure, the end. The stream's reader resolves it itself, so the consumer
        awaiting it is the next task to run — no queue, task or event in between.

        One waiter at a time (a new one replaces the previous); a waiter already done (it timed
        out, was cancelled, or something else resolved it) is left alone.

        :param waiter: a future of the running loop.
        """
        self._decision_waiter = waiter
        if self._decisions or self._failure is not None or self._closed:
            self._decisions_ready()

    def _decisions_ready(self) -> None:
        """Wake the one consumer of decisions, if it waits."""
        waiter, self._decision_waiter = self._decision_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
