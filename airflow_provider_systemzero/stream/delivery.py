"""What the callers of a :class:`~airflow_provider_systemzero.stream.DecisionStream` wait for, until its events settle it.

``decide()`` waits on a future per decide intent of the session; ``decisions()``,
``take_decision()`` and ``wake_on_decision()`` read the on_change decisions in order from one
queue, whose one consumer's future the stream's reader resolves itself, so the consumer is the
next task to run. What each answer means is the stream's
(:mod:`~airflow_provider_systemzero.stream.decision_stream`), and so is ``decide()``'s retry.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from airflow_provider_systemzero.protocol.messages import Error
from airflow_provider_systemzero.protocol.reconnect import DecideRetry, classify_decide_failure
from airflow_provider_systemzero.protocol.reply import DecisionResult
from airflow_provider_systemzero.stream.exceptions import DecisionFailed

__all__ = ["DecisionDelivery", "decision_error"]

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

    :param decision_mode: the stream's decision mode.
    """

    def __init__(self, decision_mode: str) -> None:
        #: The ``decide()`` calls waiting, by intent (added by :meth:`expect`, removed by
        #: :meth:`forget`; settled by :meth:`answer` and :meth:`fail_all`).
        self.intents: dict[int, asyncio.Future[DecisionResult]] = {}
        #: Decisions (and the errors that end a state's wait) not taken yet by ``decisions()``
        #: (added by :meth:`queue`, taken by :meth:`take`).
        self._queued: deque[DecisionResult | BaseException] = deque(maxlen=MAX_QUEUED_DECISIONS)
        #: Whether decisions are queued for ``decisions()``: always on_change, and from the first
        #: ``decisions()`` call on_request (:meth:`read_from_now`).
        self._queues = decision_mode == "on_change"
        #: The one consumer's future, resolved the moment there is something to take (set by
        #: :meth:`wait`, resolved and cleared by :meth:`ready`).
        self.waiter: asyncio.Future[Any] | None = None

    # ------------------------------------------------------------------ decide()

    def expect(self, intent: int) -> asyncio.Future[DecisionResult]:
        """The future a ``decide()`` call waits on for ``intent``.

        :param intent: the session's decide intent.
        """
        future: asyncio.Future[DecisionResult] = asyncio.get_running_loop().create_future()
        self.intents[intent] = future
        return future

    def forget(self, intent: int) -> None:
        """The ``decide()`` call of ``intent`` stopped waiting.

        :param intent: the session's decide intent.
        """
        self.intents.pop(intent, None)

    # ------------------------------------------------------------------ decisions()

    def read_from_now(self) -> None:
        """``decisions()`` is read from now on: what arrives is queued for it (on_request; on_change
        it always is)."""
        self._queues = True

    def take(self) -> DecisionResult | BaseException | None:
        """The oldest decision (or error ending a state's wait) not taken yet, or ``None``."""
        return self._queued.popleft() if self._queued else None

    def wait(self, waiter: asyncio.Future[Any], *, ended: bool) -> None:
        """Resolve ``waiter`` the moment there is something to take (one waiter at a time).

        :param waiter: a future of the running loop.
        :param ended: the stream failed or closed: there is its end to take now.
        """
        self.waiter = waiter
        if self._queued or ended:
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
        """Hand a decision, or the error that ends the state's wait, to ``decisions()`` (when it is
        read: see :meth:`read_from_now`).

        :param outcome: the decision or the error.
        """
        if self._queues:
            self._queued.append(outcome)
            self.ready()

    def fail_all(self, exc: BaseException) -> list[int]:
        """Every ``decide()`` call waiting hears ``exc`` at once (the stream failed or closed, or the
        budget refused and nothing was sent); returns their intents.

        :param exc: the error.
        """
        failed = []
        for intent, future in list(self.intents.items()):
            if not future.done():
                future.set_exception(exc)
                failed.append(intent)
        return failed
