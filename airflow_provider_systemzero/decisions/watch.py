"""What "this decision ends the wait" means, in one place, with no Airflow and no I/O.

A :class:`VerdictRules` is fed the current decisions about a changing state, one at a time, and
says when the wait ends. It owns the rules the deferrable trigger and the sensor's poke path share:

* the condition and its policy bands
  (:class:`~airflow_provider_systemzero.decisions.conditions.DecisionCondition`): a decision
  *qualifies* when it is met or — when a person can review it — when the policy sends it to review;
* **skip states**: a decision about a state a person already said "no" about does not qualify;
* a ``fail``/``skip`` verdict of the policy ends the wait at once;
* a static state (``end_when_unmet``): a decision that does not qualify ends the wait, since no
  later decision could differ;
* **hysteresis** (:class:`~airflow_provider_systemzero.decisions.conditions.Streak`): the wait ends
  once a run of qualifying decisions about successive states is ``consecutive`` long and
  ``min_true_for`` old, once per run; :meth:`VerdictRules.wait_time` says when only time is missing;
* **once per run**: after the verdict of a run (``fired``), the next one needs a decision that does
  not qualify first; an asset watcher restores ``fired`` after a restart and hears each change of
  it (``on_fired``), so a restart does not fire again for the run it already fired for.

What it produces is one event type, :class:`WatchEvent`, whose :meth:`~WatchEvent.to_payload` is
the plain JSON a trigger fires and :meth:`~WatchEvent.from_payload` reads it back on the worker.
Every decision it judges is recorded in its
:class:`~airflow_provider_systemzero.decisions.timeline.DecisionTimeline` with what it did with it
(waiting, hysteresis, held, fired …); its events carry that history as ``decisions``.
Every decision payload of the package is built here: :meth:`VerdictRules.sensor_event` (a
sensor's wait) and :func:`answers_payload` (an operator's one decision with every answer); the
worker reads either one, and a trigger's error or timeout payload, through
:meth:`WatchEvent.from_payload`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_systemzero.decisions.conditions import ConditionResult, DecisionCondition, Streak
from airflow_provider_systemzero.decisions.policy import state_info
from airflow_provider_systemzero.decisions.timeline import DecisionTimeline
from airflow_provider_systemzero.deprecations import Renamed
from airflow_provider_systemzero.durations import readable
from airflow_provider_systemzero.protocol.body import json_size
from airflow_provider_systemzero.protocol.reply import DecisionResult
from airflow_provider_systemzero.protocol.untrusted import safe_text
from airflow_provider_systemzero.timestamps import now_iso, utc_iso

__all__ = ["ENDING_STATUSES", "VerdictRules", "WatchEvent", "answers_payload", "decided_at"]

log = logging.getLogger(__name__)

#: The statuses of a watch event: ``success`` (fire, or ask a person), ``policy`` (the policy said
#: fail or skip) and ``unmet`` (a static state that did not meet the condition).
ENDING_STATUSES = ("success", "policy", "unmet")

#: The payload keys every watch event carries, in the order they are written.
_DECISION_KEYS = (
    "question",
    "decision",
    "probability",
    "confidence",
    "reply_id",
    "request_id",
    "state_version",
    "covered_event_ids",
    "model",
    "usage",
    "reason",
    "decided_at",
)
#: The keys a policy or hysteresis adds (the verdict, the alternatives, the state's hash, the run).
_VERDICT_KEYS = ("action", "outcome", "state_hash", "streak", "alternatives")


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """A decision that ended a wait (or wants a person): the one event a watch produces.

    :param status: one of :data:`ENDING_STATUSES`.
    :param question: the watched question.
    :param decision: the watched answer's decision (``None`` when the reply has no such answer).
    :param probability: the answer's probability.
    :param confidence: the answer's confidence.
    :param reply_id: the reply's id.
    :param request_id: the request's id.
    :param state_version: the state version the decision covers.
    :param covered_event_ids: the events the decision covers.
    :param model: the model that decided.
    :param usage: the reply's usage.
    :param reason: why the decision ends the wait, in plain words.
    :param decided_at: when System Zero decided (:func:`decided_at`; ``None`` in an event that
        carries no decision).
    :param verdict: ``{"action", "outcome", "state_hash", "streak", "alternatives"}`` when a policy or
        hysteresis applies (empty otherwise).
    :param extra: what the caller adds (``key_namespace`` or ``watch_id``, and for a review
        ``state_info``, ``deadline`` and ``skip_states``), and ``decisions``, the watch's history.
    """

    status: str
    question: str
    decision: Any
    probability: float | None
    confidence: float | None
    reply_id: str | None
    request_id: str | None
    state_version: int | None
    covered_event_ids: list[Any]
    model: str | None
    usage: Any
    reason: str
    verdict: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    decided_at: str | None = None

    @property
    def action(self) -> str:
        """The policy's action (``act`` without a policy)."""
        return str(self.verdict.get("action") or "act")

    @property
    def key_namespace(self) -> str | None:
        """The key namespace of the request the event answers (a sensor's or an operator's)."""
        return self.extra.get("key_namespace")

    @property
    def state_info(self) -> dict[str, Any]:
        """``{"state_hash", "state_bytes", "preview"}`` of the decided state (empty when not sent)."""
        info = self.extra.get("state_info")
        return dict(info) if isinstance(info, Mapping) else {}

    @property
    def state_hash(self) -> str | None:
        """The decided state's hash (from the verdict, else from :attr:`state_info`)."""
        return self.verdict.get("state_hash") or self.state_info.get("state_hash")

    @property
    def answers(self) -> dict[str, dict[str, Any]]:
        """Every answer of an operator's decision (:func:`answers_payload`), by question."""
        answers = self.extra.get("answers")
        return {name: dict(a) for name, a in answers.items()} if isinstance(answers, Mapping) else {}

    @property
    def reply(self) -> dict[str, Any] | None:
        """The whole reply of an operator's decision (:func:`answers_payload`)."""
        reply = self.extra.get("reply")
        return dict(reply) if isinstance(reply, Mapping) else None

    @property
    def decisions(self) -> list[dict[str, Any]] | None:
        """The history of the wait (:meth:`DecisionTimeline.to_list
        <airflow_provider_systemzero.decisions.timeline.DecisionTimeline.to_list>` rows), ``None``
        when the event carries none."""
        rows = self.extra.get("decisions")
        return [dict(row) for row in rows if isinstance(row, Mapping)] if isinstance(rows, list) else None

    @property
    def message(self) -> str | None:
        """An ``error``/``timeout`` event's message."""
        message = self.extra.get("message")
        return None if message is None else str(message)

    @property
    def error_type(self) -> str | None:
        """An ``error`` event's kind (``authentication``, ``validation``, ``decision_failed`` …)."""
        return self.extra.get("error_type")

    @property
    def error_code(self) -> str | None:
        """An ``error`` event's wire or validation code."""
        return self.extra.get("code")

    @property
    def http_status(self) -> int | None:
        """A failed decision's HTTP status, when the gateway gave one."""
        status = self.extra.get("http_status")
        return status if isinstance(status, int) and not isinstance(status, bool) else None

    @property
    def retryable(self) -> bool:
        """Whether the gateway said a failed decision may be retried."""
        return bool(self.extra.get("retryable"))

    def summary(self) -> dict[str, Any]:
        """The decision alone (what a sensor returns to XCom): question, answer, ids, usage, reason
        and when System Zero decided."""
        return {key: getattr(self, key) for key in _DECISION_KEYS}

    def to_payload(self) -> dict[str, Any]:
        """The plain-JSON event: ``status``, the caller's keys, the decision's, then the verdict's."""
        extra = {key: value for key, value in self.extra.items() if key in ("key_namespace", "watch_id")}
        later = {key: value for key, value in self.extra.items() if key not in extra}
        return {"status": self.status, **extra, **self.summary(), **self.verdict, **later}

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> WatchEvent:
        """Read an event back (a missing key reads as ``None``; unknown keys are kept in ``extra``).

        :param payload: what :meth:`to_payload` wrote (e.g. a trigger's event, on the worker).
        """
        known = {"status", *_DECISION_KEYS, *_VERDICT_KEYS}
        return cls(
            status=str(payload.get("status")),
            **{key: payload.get(key) for key in _DECISION_KEYS},
            verdict={key: payload[key] for key in _VERDICT_KEYS if key in payload},
            extra={key: value for key, value in payload.items() if key not in known},
        )

    @classmethod
    def from_decision(
        cls,
        status: str,
        decision: DecisionResult,
        question: str,
        result: ConditionResult,
        *,
        verdict: Mapping[str, Any] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> WatchEvent:
        """The event for ``decision`` about the watched ``question``, checked as ``result``."""
        answer = result.answer
        return cls(
            status=status,
            question=question,
            decision=answer.decision if answer else None,
            probability=answer.probability if answer else None,
            confidence=answer.confidence if answer else None,
            reply_id=decision.reply_id,
            request_id=decision.request_id,
            state_version=decision.state_version,
            covered_event_ids=list(decision.covered_event_ids),
            model=decision.model,
            usage=decision.usage,
            reason=result.reason,
            decided_at=decided_at(decision),
            verdict=dict(verdict or {}),
            extra=dict(extra or {}),
        )


@dataclass(frozen=True, slots=True)
class _Verdict:
    """A decision that ends the wait, with what the event needs."""

    status: str
    decision: DecisionResult
    result: ConditionResult
    state_key: str
    state: Any
    streak: dict[str, Any]


#: The skip states of a watch that has none: one empty set for all of them.
_NO_STATES: frozenset[str] = frozenset()


class VerdictRules:
    """Says, decision by decision, when a wait for a condition ends.

    :param condition: the condition (with its policy and hysteresis).
    :param reviews: a person can review a decision (the sensor): a ``review`` verdict qualifies and
        a ``fail``/``skip`` verdict ends the wait; without (an asset watcher) only a met decision counts.
    :param skip_states: hashes of states a person already said "no" about.
    :param reviewing: the hash of the state a person is being asked about: a decision about it
        that qualifies does not end the wait again (the person's answer decides it).
    :param end_when_unmet: a static state: a decision that does not qualify ends the wait too.
    :param fired: the current run of qualifying decisions already had its verdict (an asset
        watcher's memory of an event it produced before a restart): the next verdict needs a
        decision that does not qualify first.
    :param on_fired: called with the new value and the decision each time ``fired`` changes: with
        ``True`` as a verdict ends a run, with ``False`` when a decision that does not qualify
        ends a run that had its verdict.
    :param timeline: where each decision judged is recorded, with what the watch did with it (a new
        one, without state content, when not given); a caller that keeps one history across
        several watches passes its own.
    :param clock: the wall clock of the history's times (epoch seconds); the wait's own rules run
        on the ``now`` each call is given.
    """

    # one per waiting trigger, and a triggerer holds thousands: no per-instance __dict__
    __slots__ = (
        "_clock",
        "_last",
        "_on_fired",
        "condition",
        "end_when_unmet",
        "fired",
        "last_reason",
        "reviewing",
        "reviews",
        "skip_states",
        "streak",
        "timeline",
    )

    def __init__(
        self,
        condition: DecisionCondition,
        *,
        reviews: bool = True,
        skip_states: Collection[str] = (),
        reviewing: str | None = None,
        end_when_unmet: bool = False,
        fired: bool = False,
        on_fired: Callable[[bool, DecisionResult], None] | None = None,
        timeline: DecisionTimeline | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.condition = condition
        self.reviews = reviews
        self.skip_states = frozenset(skip_states) if skip_states else _NO_STATES
        self.reviewing = reviewing
        self.end_when_unmet = end_when_unmet
        self.streak = Streak(condition.consecutive, condition.min_true_for)
        self._last: tuple[DecisionResult, ConditionResult, str, Any] | None = None
        #: the current run of qualifying decisions had its verdict; a decision that does not qualify
        #: clears it
        self.fired = fired
        self._on_fired = on_fired
        #: why the newest decision checked did (not) meet the condition, for a timeout's message
        self.last_reason: str | None = None
        #: every decision judged, with what the watch did with it (the events' ``decisions``)
        self.timeline = timeline if timeline is not None else DecisionTimeline()
        self.timeline.watching(condition.to_dict())
        self._clock = clock

    def check(self, decision: DecisionResult, state_key: str) -> ConditionResult:
        """The condition's verdict on ``decision``, demoted to ``wait`` for a skipped state."""
        return self._checked(decision, state_key)[0]

    def _checked(self, decision: DecisionResult, state_key: str) -> tuple[ConditionResult, bool]:
        """:meth:`check`, and whether the state's skip demoted a decision that qualified."""
        result = self.condition.evaluate(decision)
        declined = result.candidate and (state_key in self.skip_states or state_key == self.reviewing)
        if declined:
            why = (
                "a person is being asked about this state"
                if state_key == self.reviewing
                else "a person already said no about this state"
            )
            result = ConditionResult(False, result.answer, f"{result.reason}; {why}", "wait", result.outcome)
        log.info("decision at version %s: %s", decision.state_version, result.reason)
        self.last_reason = f"the last decision (state version {decision.state_version}): {result.reason}"
        return result, declined

    def _record(
        self,
        decision: DecisionResult,
        state_key: str,
        state: Any,
        disposition: str,
        reason: str,
        generation: int | None,
    ) -> None:
        """Note a current decision in the history, with what the watch did with it and why."""
        self.timeline.decision(
            decision,
            question=self.condition.question,
            at=self._clock(),
            disposition=disposition,
            state_key=state_key,
            state_bytes=None if state is None else json_size(state),
            state=state,
            generation=generation,
            reason=reason,
        )

    def observe(
        self,
        decision: DecisionResult,
        state_key: str,
        state: Any,
        now: float,
        *,
        generation: int | None = None,
    ) -> _Verdict | None:
        """Take a current decision about the state ``state`` (hash ``state_key``) at time ``now``.

        :param generation: the state's generation in the watch of its source (for the history).
        :return: the verdict when the wait ends (or a person is asked), else ``None``.
        """
        result, declined = self._checked(decision, state_key)

        def record(disposition: str) -> None:
            self._record(decision, state_key, state, disposition, result.reason, generation)

        if self.reviews and result.action in ("fail", "skip"):
            record("failed" if result.action == "fail" else "skipped")
            return _Verdict("policy", decision, result, state_key, state, self.streak.to_dict(now))
        qualifies = result.candidate if self.reviews else result.met
        if self.end_when_unmet and not qualifies:
            record("unmet")
            return _Verdict("unmet", decision, result, state_key, state, self.streak.to_dict(now))
        if qualifies:  # fired below when the run is long and old enough
            record("held" if self.fired else "hysteresis")
        else:
            record("declined" if declined else "waiting")
        self.streak.observe(qualifies, now, state_key)
        if qualifies:
            self._last = (decision, result, state_key, state)
        else:
            self._last = None
            if self.fired:
                self.fired = False
                if self._on_fired is not None:
                    self._on_fired(False, decision)
        if qualifies and self.condition.has_hysteresis and not self.streak.ready(now):
            # the run can outgrow ``consecutive`` while only time is missing: say what is still needed
            log.info(
                "hysteresis: %d qualifying decision(s) in a row (%d needed), true for %s (%s needed)",
                self.streak.count,
                self.condition.consecutive,
                readable(self.streak.to_dict(now)["true_for"]),
                readable(self.condition.min_true_for),
            )
        return self._due(now, by_time=False)

    def due(self, now: float) -> _Verdict | None:
        """The verdict when the current run of qualifying decisions has just become long and old enough."""
        return self._due(now, by_time=True)

    def _due(self, now: float, *, by_time: bool) -> _Verdict | None:
        """:meth:`due`; ``by_time``: no decision came, only time passed (the history marks it)."""
        if self.fired or self._last is None or not self.streak.ready(now):
            return None
        self.fired = True
        decision, result, key, state = self._last
        self.timeline.settle(decision, "review" if result.action == "review" else "fired")
        if by_time:
            self.timeline.mark("hold_met", self._clock(), state_version=decision.state_version)
        if self._on_fired is not None:
            self._on_fired(True, decision)
        return _Verdict("success", decision, result, key, state, self.streak.to_dict(now))

    def held_back(self, now: float, *, more_time: str) -> str | None:
        """Why the newest decision, which qualified, has not ended the wait: the hold rule
        (``consecutive``, ``min_true_for``) still unmet and the fix (:meth:`Streak.short_of
        <airflow_provider_systemzero.decisions.conditions.Streak.short_of>`); ``None`` when no
        qualifying run is waiting on one.

        :param now: the current time (the clock of :meth:`observe`).
        :param more_time: the fix that gives the wait more time (which argument to raise).
        """
        if self.fired or self._last is None:
            return None
        return self.streak.short_of(now, more_time=more_time)

    def wait_time(self, now: float) -> float | None:
        """Seconds until only time can end the wait (``None``: no decision is waiting on time)."""
        return None if self.fired else self.streak.wait_time(now)

    def event(
        self, verdict: _Verdict, *, policy_fields: bool = True, extra: Mapping[str, Any] | None = None
    ) -> WatchEvent:
        """The :class:`WatchEvent` of ``verdict``, carrying the history so far as ``decisions``; the
        history then starts again, so an asset watcher's next event tells the story since this one.

        :param policy_fields: add the verdict's action, outcome, state hash, run and alternatives.
        :param extra: the caller's keys (``key_namespace`` or ``watch_id``, review details).
        """
        fields_: dict[str, Any] = {}
        if policy_fields:
            answer = verdict.decision.answers.get(self.condition.question)
            fields_ = {
                "action": verdict.result.action,
                "outcome": verdict.result.outcome,
                "state_hash": verdict.state_key,
                "streak": dict(verdict.streak),
                "alternatives": [dict(a) for a in answer.alternatives] if answer is not None else [],
            }
        status = "unmet" if verdict.status == "unmet" and not verdict.result.candidate else verdict.status
        extra = {**(extra or {}), "decisions": self.timeline.to_list()}
        self.timeline.restart()
        return WatchEvent.from_decision(
            status, verdict.decision, self.condition.question, verdict.result, verdict=fields_, extra=extra
        )

    def sensor_event(self, verdict: _Verdict, *, key_namespace: str, deadline: float | None) -> WatchEvent:
        """The event a sensor's wait ends with (from its trigger or its poke).

        A ``review`` verdict also carries what the sensor needs to ask a person and, when they say
        no, to wait again: the state's hash, size and preview, the deadline and the skip states.

        :param key_namespace: the sensor's key namespace (the worker checks the event is its own).
        :param deadline: the wait's absolute deadline (epoch seconds), ``None`` for none.
        """
        extra: dict[str, Any] = {"key_namespace": key_namespace}
        if verdict.result.action == "review":
            extra.update(
                state_info=state_info(verdict.state), deadline=deadline, skip_states=sorted(self.skip_states)
            )
        return self.event(verdict, extra=extra)


def decided_at(decision: DecisionResult) -> str:
    """When System Zero decided, as UTC ISO 8601 text: the reply's ``created`` (so a replayed
    reply, on a retry, gives the same time), or — when the reply has no valid one — now, as the
    decision arrives.

    :param decision: the decision.
    """
    return utc_iso(decision.reply.get("created")) or now_iso()


def answers_payload(
    decision: DecisionResult,
    state: Any,
    *,
    key_namespace: str,
    at: float | None = None,
    capture_content: bool = False,
) -> dict[str, Any]:
    """An operator's event: one decision about a fixed state with every answer, as plain JSON.

    It carries the state's hash, size and preview (for the ``decision`` record), never the rest of
    its content, and its history (``decisions``): the decision, one row per question, with the
    newest end of the state only when ``capture_content`` is on.

    :param decision: the decision.
    :param state: the decided state.
    :param key_namespace: the operator's key namespace.
    :param at: when it arrived (epoch seconds; ``None``: now).
    :param capture_content: the history keeps the newest end of the state.
    """
    info = state_info(state)
    timeline = DecisionTimeline(capture_content=capture_content)
    arrived = time.time() if at is None else at
    for question in decision.answers:
        timeline.decision(
            decision,
            question=question,
            at=arrived,
            disposition="decided",
            state_key=info["state_hash"],
            state_bytes=info["state_bytes"],
            state=state,
            generation=1,  # an operator decides one state
        )
    return {
        "status": "success",
        "key_namespace": key_namespace,
        "reply_id": decision.reply_id,
        "state_version": decision.state_version,
        "covered_event_ids": list(decision.covered_event_ids),
        "request_id": decision.request_id,
        "stream_id": safe_text(decision.stream_id),  # as sent (the client matches it): made safe here
        "model": decision.model,
        "answers": {name: answer.to_dict() for name, answer in decision.answers.items()},
        "reply": decision.reply,
        "state_info": info,
        "decisions": timeline.to_list(),
        "decided_at": decided_at(decision),
    }


#: The names of this module before 0.2.
__getattr__ = Renamed(__name__, {"DecisionWatch": ("VerdictRules", lambda: VerdictRules)})
