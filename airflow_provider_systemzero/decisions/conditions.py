"""When a decision counts as "yes": the watched question, the expected answer and the bars.

A :class:`DecisionCondition` is plain data (it travels in trigger kwargs as a dict). A missing
confidence or probability never passes a bar: a model that reports no number counts as uncertain.

Optionally a :class:`~airflow_provider_systemzero.decisions.policy.DecisionPolicy` says what to do with an
expected answer (act, ask a person, fail, skip, keep waiting, or take the default), and
hysteresis (``consecutive``, ``min_true_for``) keeps a flapping answer from firing: see
:class:`Streak`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow_provider_systemzero.decisions.policy import check_bar
from airflow_provider_systemzero.durations import readable
from airflow_provider_systemzero.exceptions import SystemZeroArgumentError
from airflow_provider_systemzero.protocol.errors import did_you_mean
from airflow_provider_systemzero.protocol.reply import Answer, DecisionResult, share
from airflow_provider_systemzero.protocol.validation import validate_question_name

__all__ = ["ConditionResult", "DecisionCondition", "Streak"]


@dataclass(frozen=True, slots=True)
class ConditionResult:
    """The outcome of checking one decision.

    :param met: the decision is the expected answer and passes every bar.
    :param answer: the watched answer (``None`` if the reply has none).
    :param reason: why it is (not) met, in plain words, for logs.
    :param action: what to do: ``act`` (met), ``wait`` (not met: keep waiting), or — under a
        policy — ``review`` (a person decides), ``fail``, ``skip`` or ``default`` (the policy's
        default answer is the expected one, so the condition is met).
    :param outcome: the policy's verdict in dict form (``None`` without a policy).
    """

    met: bool
    answer: Answer | None
    reason: str
    action: str = "act"
    outcome: dict[str, Any] | None = None

    @property
    def candidate(self) -> bool:
        """The decision counts towards firing (met, or waiting for a person)."""
        return self.met or self.action == "review"


@dataclass(frozen=True, slots=True)
class DecisionCondition:
    """What a sensor waits for.

    :param question: the question to watch.
    :param expect: the answer that satisfies the sensor (``True``/``False`` for a boolean question,
        an option or a list of options for a choice question).
    :param min_confidence: the answer's confidence must be at least this (``None``: no bar).
    :param min_probability: the answer's probability must be at least this (``None``: no bar).
    :param policy: a :class:`~airflow_provider_systemzero.decisions.policy.DecisionPolicy` dict: what to do
        with an expected answer that passes the bars above (``None``: act on it).
    :param consecutive: fire only after this many successive qualifying decisions, each about a
        different state.
    :param min_true_for: fire only after the decisions have qualified for this many seconds.
    """

    question: str
    expect: Any = True
    min_confidence: float | None = None
    min_probability: float | None = None
    policy: dict[str, Any] | None = None
    consecutive: int = 1
    min_true_for: float = 0.0

    def __post_init__(self) -> None:
        validate_question_name(self.question, field="question")
        check_bar(self.min_confidence, "min_confidence")
        check_bar(self.min_probability, "min_probability")
        if (
            isinstance(self.consecutive, bool)
            or not isinstance(self.consecutive, int)
            or self.consecutive < 1
        ):
            raise SystemZeroArgumentError(
                f"consecutive {self.consecutive!r} must be a whole number of at least 1",
                code="invalid_hysteresis",
                field="consecutive",
            )
        if (
            isinstance(self.min_true_for, bool)
            or not isinstance(self.min_true_for, int | float)
            or not 0 <= self.min_true_for < float("inf")
        ):
            raise SystemZeroArgumentError(
                f"min_true_for {self.min_true_for!r} must be a number of seconds (0 or more)",
                code="invalid_hysteresis",
                field="min_true_for",
            )
        if self.policy is not None:
            from airflow_provider_systemzero.decisions.policy import DecisionPolicy

            try:
                policy = DecisionPolicy.coerce(self.policy)
            except ValueError as exc:
                raise SystemZeroArgumentError(str(exc), code="invalid_policy", field="policy") from None
            object.__setattr__(self, "policy", policy.to_dict() if policy is not None else None)
        expect = self.expect
        if isinstance(expect, list):
            if not expect or not all(isinstance(option, str) for option in expect):
                raise SystemZeroArgumentError(
                    "expect must be a boolean, an option, or a non-empty list of options",
                    code="invalid_expect",
                    field="expect",
                )
        elif not isinstance(expect, bool | str):
            raise SystemZeroArgumentError(
                f"expect {expect!r} must be a boolean, an option, or a list of options",
                code="invalid_expect",
                field="expect",
            )

    def expects(self, decision: Any) -> bool:
        """Whether ``decision`` is the answer the condition waits for: ``expect``, or one of its
        options (a boolean is not a number: ``True`` is not ``1``).

        :param decision: an answer's decision, a policy's default or a person's answer.
        """
        wanted = self.expect if isinstance(self.expect, list) else [self.expect]
        return decision in wanted and isinstance(decision, bool) == isinstance(wanted[0], bool)

    def check_questions(self, questions: Mapping[str, Any], *, reviews: bool = True) -> None:
        """Check that the watched question is asked and ``expect`` fits its type, and the policy fits.

        :param questions: the request's questions in wire form.
        :param reviews: a person can review a decision (the sensor); without (an asset watch) a
            policy's review band is refused, and so is ``below="wait"``: a decision in either would
            never fire.
        :raises SystemZeroArgumentError: naming the field.
        """
        if self.question not in questions:
            raise SystemZeroArgumentError(
                f"question {self.question!r} is not among the questions asked ({sorted(questions)})"
                f"{did_you_mean(self.question, questions)}: name one of them in the condition, or ask it",
                code="unknown_question",
                field="question",
            )
        spec = questions[self.question]
        kind = spec.get("type") if isinstance(spec, Mapping) else getattr(spec, "type", None)
        options = spec.get("options") if isinstance(spec, Mapping) else getattr(spec, "options", None)
        if kind == "boolean" and not isinstance(self.expect, bool):
            raise SystemZeroArgumentError(
                f"expect {self.expect!r} must be true or false for boolean question {self.question!r}",
                code="invalid_expect",
                field="expect",
            )
        if kind == "choice":
            wanted = self.expect if isinstance(self.expect, list) else [self.expect]
            missing = [w for w in wanted if w not in (options or ())]
            if missing:
                raise SystemZeroArgumentError(
                    f"expect {missing[0]!r} is not an option of choice question "
                    f"{self.question!r} (options: {list(options or ())}){did_you_mean(missing[0], options or ())}",
                    code="invalid_expect",
                    field="expect",
                )
        if self.policy is not None:
            from airflow_provider_systemzero.decisions.policy import DecisionPolicy

            try:
                policy = DecisionPolicy.from_dict(self.policy)
                policy.check(kind=kind or "boolean", options=options, allow_wait=True)
            except ValueError as exc:
                raise SystemZeroArgumentError(str(exc), code="invalid_policy", field="policy") from None
            if not reviews and policy.has_review:
                _refuse_review_band(policy)
            if not reviews and policy.below == "wait":
                raise SystemZeroArgumentError(
                    "policy: below='wait' keeps a sensor waiting for more state, but an asset watch "
                    "always keeps watching: a decision below the bar produces no event, so below='wait' "
                    "would never fire and says nothing the watch does not do anyway; drop below, or pass "
                    "below='default' with default=<the expected answer> to produce an event for such a "
                    "decision",
                    code="invalid_policy",
                    field="policy",
                )

    def evaluate(self, result: DecisionResult) -> ConditionResult:
        """Check a decision against the condition."""
        answer = result.answers.get(self.question)
        if answer is None:
            return ConditionResult(False, None, f"the reply has no answer for {self.question!r}", "wait")
        if not self.expects(answer.decision):
            return ConditionResult(
                False, answer, f"{self.question} = {answer.decision!r}, waiting for {self.expect!r}", "wait"
            )
        # a bar is met only by a number from 0 to 1 at or above it: NaN, infinities and values out
        # of range count as no number at all
        confidence, probability = share(answer.confidence), share(answer.probability)
        if self.min_confidence is not None and (confidence is None or not confidence >= self.min_confidence):
            return ConditionResult(
                False,
                answer,
                f"{self.question} = {answer.decision!r} but confidence "
                f"{answer.confidence} is below {self.min_confidence}",
                "wait",
            )
        if self.min_probability is not None and (
            probability is None or not probability >= self.min_probability
        ):
            return ConditionResult(
                False,
                answer,
                f"{self.question} = {answer.decision!r} but probability "
                f"{answer.probability} is below {self.min_probability}",
                "wait",
            )
        described = (
            f"{self.question} = {answer.decision!r} (probability {answer.probability}, "
            f"confidence {answer.confidence})"
        )
        if self.policy is None:
            return ConditionResult(True, answer, described)
        return self._apply_policy(answer, described)

    def _apply_policy(self, answer: Answer, described: str) -> ConditionResult:
        from airflow_provider_systemzero.decisions.policy import DecisionPolicy

        policy = DecisionPolicy.from_dict(self.policy or {})
        outcome = policy.evaluate(answer)
        reason = f"{described}: {outcome.reason}"
        if outcome.action == "act":
            return ConditionResult(True, answer, reason, "act", outcome.to_dict())
        if outcome.action == "default":
            met = self.expects(policy.default)
            return ConditionResult(
                met,
                answer,
                f"{reason}; the policy's default {policy.default!r} "
                + ("is the expected answer" if met else "is not the expected answer"),
                "default" if met else "wait",
                outcome.to_dict(),
            )
        return ConditionResult(False, answer, reason, outcome.action, outcome.to_dict())

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON form (the policy and hysteresis only when set, so older readers still read it)."""
        data: dict[str, Any] = {
            "question": self.question,
            "expect": self.expect,
            "min_confidence": self.min_confidence,
            "min_probability": self.min_probability,
        }
        if self.policy is not None:
            data["policy"] = self.policy
        if self.consecutive != 1:
            data["consecutive"] = self.consecutive
        if self.min_true_for:
            data["min_true_for"] = self.min_true_for
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DecisionCondition:
        """Build from :meth:`to_dict` output."""
        return cls(**dict(data))

    @property
    def has_hysteresis(self) -> bool:
        """Whether firing needs more than one qualifying decision."""
        return self.consecutive > 1 or self.min_true_for > 0


def _refuse_review_band(policy: Any) -> None:
    """An asset watch never asks a person: a policy's review band would keep its decisions from
    firing, and nothing would say why (``policy``: a :class:`~airflow_provider_systemzero.decisions.policy.DecisionPolicy`).

    :raises SystemZeroArgumentError: naming the bar, the reason and the fix.
    """
    if policy.review_above is not None:
        named = f"review_above ({policy.review_above})"
    else:
        option = next(o for o in policy.options if policy.bars_for(o)[1] is not None)
        named = f"options[{option!r}] review_above ({policy.bars_for(option)[1]})"
    raise SystemZeroArgumentError(
        f"policy: {named} sends a decision to a person, but an asset watch never asks one (nobody "
        "can review an asset event): a decision in the review band would never fire, and nothing "
        "would say why; drop review_above (only an answer that passes act_above fires), or wait "
        "with a SystemZeroDecisionSensor, which can ask a person",
        code="invalid_policy",
        field="policy",
    )


class Streak:
    """Hysteresis: a run of qualifying decisions over changing state.

    The condition fires once ``consecutive`` successive qualifying decisions — each about a
    different state (a replayed decision about the same state does not count twice) — have been
    seen, and the first of them is at least ``min_true_for`` seconds old. Any decision that does
    not qualify resets the run. Times come from the caller's clock (monotonic seconds).

    :param consecutive: decisions needed in a row.
    :param min_true_for: seconds the run must last.
    """

    # one per waiting trigger's rules: no per-instance __dict__
    __slots__ = ("_last_key", "consecutive", "count", "min_true_for", "since")

    def __init__(self, consecutive: int = 1, min_true_for: float = 0.0) -> None:
        self.consecutive = consecutive
        self.min_true_for = min_true_for
        self.count = 0
        self.since: float | None = None
        self._last_key: Any = None

    def observe(self, qualifies: bool, now: float, key: Any = None) -> None:
        """Record one decision (``key`` names its state; ``None`` always counts)."""
        if not qualifies:
            self.count, self.since, self._last_key = 0, None, None
            return
        if key is not None and key == self._last_key and self.count:
            return  # the same state again: not a new decision
        self.count += 1
        self._last_key = key
        if self.since is None:
            self.since = now

    def ready(self, now: float) -> bool:
        """The run is long enough, in decisions and in time."""
        return (
            self.count >= self.consecutive
            and self.since is not None
            and now - self.since >= self.min_true_for
        )

    def wait_time(self, now: float) -> float | None:
        """Seconds until the run is old enough, when only time is missing (else ``None``)."""
        if self.count < self.consecutive or self.since is None:
            return None
        return max(0.0, self.since + self.min_true_for - now)

    def short_of(self, now: float, *, more_time: str) -> str | None:
        """What the run still lacks, with the fix, when it has begun but is not yet long or old
        enough (``None`` otherwise): for a wait's timeout, which a hold rule, not the condition, kept.

        :param now: the current time (the caller's clock).
        :param more_time: the fix that gives the wait more time (which argument to raise).
        """
        if not self.count or self.since is None or self.ready(now):
            return None
        lacks, fixes = [], []
        if self.count < self.consecutive:
            lacks.append(
                f"consecutive={self.consecutive} needs {self.consecutive} qualifying decisions in a "
                f"row, each about a new state (had {self.count})"
            )
            fixes += ["a change of state (a decision about the same state does not count again)"]
            fixes += ["a smaller consecutive"]
        held = now - self.since
        if held < self.min_true_for:
            lacks.append(
                f"min_true_for ({readable(self.min_true_for)}) needs the condition to hold longer (held "
                f"{readable(held)})"
            )
            fixes.append("a shorter min_true_for" if fixes else "shorten min_true_for")
        return f"{', and '.join(lacks)}: {', '.join(fixes)}, or {more_time}"

    def to_dict(self, now: float) -> dict[str, Any]:
        """JSON summary for the ``decision`` record."""
        return {
            "consecutive": self.count,
            "true_for": round(now - self.since, 3) if self.since is not None else 0.0,
            "required": {"consecutive": self.consecutive, "min_true_for": self.min_true_for},
        }
