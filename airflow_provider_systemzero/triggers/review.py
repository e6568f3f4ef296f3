"""A sensor's wait while a person is asked: the watch goes on, and the review follows the state.

A review is about one state: the one its request shows. While a person decides, the sensor's
trigger (:class:`~airflow_provider_systemzero.triggers.decision.SystemZeroDecisionTrigger`) keeps
watching the same source under the same rules, and :class:`ReviewWatch` says how the wait ends:

* a person answers while the source still holds the reviewed state: a ``review`` event with the
  answer, ``counted`` (the sensor takes it: "Yes" fires, "No" waits again);
* a person answers after the source moved on: a ``review`` event with the answer, not counted
  (the sensor records it; it decides nothing about the newer state);
* a newer state is decided and ends the wait (act, default, fail, skip, or a newer review): the
  open request is answered on Airflow's side first, so it leaves Required Actions, and the
  verdict's event carries ``review`` saying it was superseded and by which state version;
* ``review_timeout`` passes: the policy's default is written as the answer (as Airflow's
  ``HITLTrigger`` does) and counts for the reviewed state when the source still holds it; with no
  default the sensor does what the policy's ``below`` says. The scheduler's own review-timeout
  sweep covers only ``awaiting_input`` tasks, and a watching sensor is deferred.

The request is read every :data:`POKE_INTERVAL` seconds (every second under ``dag.test()``),
through the triggerer's channel, the calls ``HITLTrigger`` makes
(:class:`~airflow_provider_systemzero.tasks.review_wait.OpenReview`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from airflow_provider_systemzero.identity import state_hash
from airflow_provider_systemzero.tasks.review_wait import (
    IN_PROCESS_POKE_INTERVAL,
    SYSTEMZERO_ANSWER,
    OpenReview,
    closed_by_the_sensor,
    in_process_review_comms,
)

if TYPE_CHECKING:
    from airflow_provider_systemzero.decisions.watch import VerdictRules
    from airflow_provider_systemzero.sources.base import StateSource
    from airflow_provider_systemzero.triggers.driver import WatchDriver

__all__ = ["POKE_INTERVAL", "ReviewWatch", "spent_review"]

log = logging.getLogger(__name__)

#: Seconds between two reads of the open request in a triggerer (``HITLTrigger``'s default).
POKE_INTERVAL = 5.0


class ReviewWatch:
    """The open review of one sensor's wait (see the module docstring).

    :param review: the trigger's ``review`` kwarg.
    :param rules: the wait's rules (their history records what happened to the review).
    :param source: the wait's source (read to judge an answer against the state it holds now).
    :param request: the channel to the request (:class:`OpenReview` of the review's task
        instance when not given; a test passes its own).
    :param clock: the wall clock ``review_timeout`` is measured on (epoch seconds).
    :param interval: seconds between two reads of the request (``None``: :data:`POKE_INTERVAL`,
        every second under ``dag.test()``).
    """

    def __init__(
        self,
        review: Mapping[str, Any],
        rules: VerdictRules,
        source: StateSource,
        *,
        request: OpenReview | None = None,
        clock: Callable[[], float] = time.time,
        interval: float | None = None,
    ) -> None:
        self.review = dict(review)
        self.gate: dict[str, Any] = dict(review["gate"])
        self.rules = rules
        self.source = source
        self.request = request if request is not None else OpenReview(str(review["ti_id"]))
        self._clock = clock
        self._interval = interval

    @staticmethod
    def reviewed_state(review: Mapping[str, Any] | None) -> str | None:
        """The hash of the state an open review is about (``None``: no review open)."""
        if not review or not (review.get("open") or review.get("answer")):
            return None
        return (review.get("gate") or {}).get("state_hash")

    @classmethod
    def of(
        cls, review: Mapping[str, Any] | None, rules: VerdictRules, source: StateSource
    ) -> ReviewWatch | None:
        """The open review of a trigger's kwargs, ``None`` when none is open or to be judged."""
        if ReviewWatch.reviewed_state(review) is None:
            return None
        assert review is not None
        return cls(review, rules, source)

    # ------------------------------------------------------------------ the wait

    async def next_event(
        self, driver: WatchDriver, extra: Mapping[str, Any], *, deadline: float | None
    ) -> dict[str, Any]:
        """Watch while the person decides; the event that ends the wait (see the module docstring).

        :param driver: the wait's driver (its watch goes on after a verdict).
        :param extra: the fields every event of the trigger carries.
        :param deadline: the sensor's deadline (epoch seconds), for a verdict's event.
        """
        interval = self._interval
        if interval is None:
            with in_process_review_comms() as in_process:
                interval = IN_PROCESS_POKE_INTERVAL if in_process else POKE_INTERVAL
        answer = self.review.get("answer")
        reading = answer is None
        log.info(
            "a person is asked about state version %s; the sensor goes on watching meanwhile",
            self.gate.get("state_version"),
        )
        verdicts: asyncio.Future[Any] | None = None
        try:
            while True:
                if reading:
                    answer = await self.request.read()
                    if answer is not None and closed_by_the_sensor(answer):
                        # closed by an earlier run of this trigger, whose event never reached the task
                        answer, reading = None, False
                if answer is None and reading and self._timed_out():
                    return await self._timeout_event(extra)
                if answer is not None:
                    return await self._answer_event(answer, extra)
                if verdicts is None:
                    verdicts = asyncio.ensure_future(driver.next_verdict())
                await asyncio.wait({verdicts}, timeout=self._next_read(interval) if reading else None)
                if verdicts.done():
                    return await self._verdict_event(verdicts.result(), extra, deadline)
        finally:
            if verdicts is not None and not verdicts.done():
                verdicts.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await verdicts

    def _timed_out(self) -> bool:
        timeout_at = self.review.get("timeout_at")
        return timeout_at is not None and self._clock() >= float(timeout_at)

    def _next_read(self, interval: float) -> float:
        """Seconds until the request is read again: the interval, or the review's timeout if sooner."""
        timeout_at = self.review.get("timeout_at")
        if timeout_at is None:
            return interval
        return max(0.0, min(interval, float(timeout_at) - self._clock()))

    # ------------------------------------------------------------------ how it ends

    def _closed(self, how: str, **fields: Any) -> dict[str, Any]:
        """The try's review after the wait (:func:`spent_review`), with what ended it."""
        return {**spent_review(self.review), "ended": how, **fields}

    def _mark(self, kind: str, **fields: Any) -> None:
        self.rules.timeline.mark(kind, self._clock(), state_version=self.gate.get("state_version"), **fields)

    async def _holds_the_reviewed_state(self) -> bool:
        """Whether the source holds the state the request shows, now."""
        return state_hash(await self.source.read()) == self.gate.get("state_hash")

    async def _answer_event(self, answer: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
        """A person's answer, judged against the state the source holds now."""
        counted = await self._holds_the_reviewed_state()
        self._mark("review_answered" if counted else "review_outdated")
        if counted:
            log.info("a person answered the review: %s", list(answer.get("chosen_options") or []))
        else:
            log.info(
                "a person answered the review about state version %s after the source moved on: "
                "the answer is recorded and decides nothing about the newer state",
                self.gate.get("state_version"),
            )
        return self._event(extra, self._closed("answered", answer=dict(answer), counted=counted))

    async def _timeout_event(self, extra: Mapping[str, Any]) -> dict[str, Any]:
        """``review_timeout`` passed: the policy's default is written as the answer (if any)."""
        defaults = self.review.get("defaults")
        self._mark("review_timed_out")
        if not defaults:
            answer: dict[str, Any] = {
                "error": "nobody answered the review in time and the policy has no default",
                "timedout": True,
            }
        else:
            # written as Airflow's HITLTrigger writes it (nobody answered, no params): a run of this
            # trigger that reads it back takes it as the timeout's default
            person = await self.request.close(list(defaults), {})
            if person is not None:  # answered just before the timeout
                return await self._answer_event(person, extra)
            answer = {
                "chosen_options": list(defaults),
                "params_input": {},
                "responded_at": None,
                "responded_by_user": None,
                "timedout": True,
            }
        counted = await self._holds_the_reviewed_state()
        return self._event(extra, self._closed("timed_out", answer=answer, counted=counted))

    async def _verdict_event(
        self, verdict: Any, extra: Mapping[str, Any], deadline: float | None
    ) -> dict[str, Any]:
        """A newer state's verdict ends the wait: the request is closed first (superseded), unless
        a person answered it just before (their answer is then about a replaced state)."""
        decision = verdict.decision
        by = decision.state_version
        chosen = self._closing_options(verdict)
        person = await self.request.close(
            chosen,
            {SYSTEMZERO_ANSWER: f"superseded: state version {by} was decided while a person was asked"},
        )
        if person is None:
            self._mark("review_superseded", by_state_version=by)
            review = self._closed("superseded", by_state_version=by)
            log.info(
                "state version %s was decided while a person was asked about version %s: the review "
                "request is closed",
                by,
                self.gate.get("state_version"),
            )
        else:
            self._mark("review_outdated")
            review = self._closed("answered", answer=dict(person), counted=False, by_state_version=by)
        event = self.rules.sensor_event(
            verdict, key_namespace=str(extra.get("key_namespace")), deadline=deadline
        )
        return {**event.to_payload(), "review": review}

    def _closing_options(self, verdict: Any) -> list[str]:
        """The options written when the sensor closes the request: the newer decision's answer
        where it is one of the request's options, else the policy's default, else the first."""
        from airflow_provider_systemzero.tasks.review import Gate

        gate = Gate.from_dict(self.gate)
        labels = gate.labels()
        answer = verdict.decision.answers.get(gate.question)
        if answer is not None and not gate.multiple:
            with contextlib.suppress(KeyError, TypeError):
                chosen = gate.to_labels(answer.decision)
                if all(label in labels for label in chosen):
                    return chosen
        defaults = self.review.get("defaults")
        return list(defaults) if defaults else labels[:1]

    def _event(self, extra: Mapping[str, Any], review: dict[str, Any]) -> dict[str, Any]:
        """A ``review`` event: the try's review with its answer, what the task resumes the review
        with (the gate and the policy's verdict), and the wait's history."""
        decisions = self.rules.timeline.to_list()
        self.rules.timeline.restart()
        resume = {"gate": self.gate, "outcome": self.review.get("outcome")}
        return {"status": "review", **extra, "review": review, "resume": resume, "decisions": decisions}


def spent_review(review: Mapping[str, Any]) -> dict[str, Any]:
    """What the rest of the try keeps of its review request once it is no longer open: which task
    instance's request, and the state it showed (Airflow keeps one request per task try and never
    changes its text, so no later state of the try can be shown in one).

    :param review: the trigger's ``review`` kwarg.
    """
    gate = review.get("gate") or {}
    return {
        "ti_id": review.get("ti_id"),
        "state_version": gate.get("state_version", review.get("state_version")),
        "state_hash": gate.get("state_hash", review.get("state_hash")),
        "open": False,
    }
