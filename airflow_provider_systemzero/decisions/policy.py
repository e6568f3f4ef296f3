"""What a task does with a decision: act on it, ask a person, or fall back.

A :class:`DecisionPolicy` has two bars. At or above ``act_above`` the task acts on the model's
answer by itself; at or above ``review_above`` (and below ``act_above``) a person is asked; below
``review_above`` the task does what ``below`` says: ``fail``, ``skip``, ``wait`` (sensors only:
keep waiting for more state) or ``default`` (take the policy's ``default`` answer). The bars
measure the answer's ``confidence`` (the default), its ``probability``, or ``both`` (the lower of
the two). A missing number counts as uncertain: it never passes a bar, and it goes to a person
when the policy has a review band. Choice questions may set bars per option.

::

    DecisionPolicy(act_above=0.8, review_above=0.5, below="skip", default=False,
                   review_timeout=3600)

The policy is plain data: :meth:`DecisionPolicy.to_dict` gives JSON that travels in trigger
kwargs and XCom, :meth:`DecisionPolicy.from_dict` reads it back. This module imports nothing
from Airflow.

:func:`decision_record` builds the ``decision`` XCom every System Zero operator and the sensor
push: what the model proposed, what was done, who decided and why, in JSON only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

from airflow_provider_systemzero.exceptions import SystemZeroArgumentError
from airflow_provider_systemzero.protocol.errors import did_you_mean
from airflow_provider_systemzero.protocol.reply import share

__all__ = [
    "ACTIONS",
    "BELOW_ACTIONS",
    "DECIDED_BY",
    "MEASURES",
    "DecisionPolicy",
    "OptionBars",
    "PolicyOutcome",
    "answer_numbers",
    "check_bar",
    "combine_actions",
    "decision_record",
    "ranked_answers",
    "state_info",
    "state_preview",
]

#: What a policy can say about an answer.
ACTIONS = ("act", "review", "fail", "skip", "wait", "default")
#: What a policy can do below the review bar.
BELOW_ACTIONS = ("fail", "skip", "wait", "default")
#: What the bars measure.
MEASURES = ("confidence", "probability", "both")
#: Who made the decision that took effect.
DECIDED_BY = ("model", "human", "policy", "timeout_default")
#: Version of the ``decision`` record layout.
RECORD_VERSION = 1

_PREVIEW_HEAD = 600
_PREVIEW_TAIL = 1200

_SEVERITY = {"act": 0, "default": 1, "review": 2, "wait": 3, "skip": 4, "fail": 5}


def check_bar(value: Any, field: str) -> float | None:
    """A confidence or probability bar as an author gives it: ``None`` (no bar) or a number from 0 to 1.

    The one check of every bar: a policy's ``act_above`` and ``review_above`` (its own and each
    option's) and a condition's ``min_confidence`` and ``min_probability``.

    :param value: the bar as written.
    :param field: the argument's name, for the message.
    :raises SystemZeroArgumentError: ``invalid_threshold``, naming the field, the value and the fix.
    """
    if value is None:
        return None
    # NaN fails both comparisons, so it is refused with the rest
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        fix = "a number from 0 to 1, or None for no bar"
        if not isinstance(value, bool) and isinstance(value, int | float) and 1 < value <= 100:
            fix += f" (a percentage: {value:g} % is {value / 100:g})"
        raise SystemZeroArgumentError(
            f"{field} {value!r} must be {fix}", code="invalid_threshold", field=field
        )
    return float(value)


def _seconds(value: Any, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number of seconds or a timedelta, got {value!r}")
    return float(value)


def answer_numbers(answer: Any) -> tuple[Any, float | None, float | None, list[dict[str, Any]]]:
    """``(decision, probability, confidence, alternatives)`` of an answer.

    :param answer: an :class:`~airflow_provider_systemzero.protocol.reply.Answer` or its dict form.
    """
    if isinstance(answer, Mapping):
        get = answer.get
    else:

        def get(key: str, default: Any = None) -> Any:
            return getattr(answer, key, default)

    alternatives = get("alternatives") or ()
    # NaN, infinities and numbers outside [0, 1] are no measure: they count as missing (uncertain)
    return (
        get("decision"),
        share(get("probability")),
        share(get("confidence")),
        [dict(a) for a in alternatives if isinstance(a, Mapping)],
    )


@dataclass(frozen=True, slots=True)
class OptionBars:
    """Bars for one option of a choice question (``None``: the policy's own bar).

    :param act_above: act automatically at or above this.
    :param review_above: ask a person at or above this.
    """

    act_above: float | None = None
    review_above: float | None = None

    def __post_init__(self) -> None:
        check_bar(self.act_above, "act_above")
        check_bar(self.review_above, "review_above")

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"act_above": self.act_above, "review_above": self.review_above}


@dataclass(frozen=True, slots=True)
class PolicyOutcome:
    """What a policy says about one answer (or a set of answers).

    :param action: ``act``, ``review``, ``fail``, ``skip``, ``wait`` or ``default``.
    :param reason: why, in plain words.
    :param code: why, for programs: ``no_bar``, ``above_act_bar``, ``in_review_band``,
        ``below_review_bar``, ``below_act_bar`` or ``missing_measure``.
    :param measured: the number compared with the bars (``None`` if missing).
    :param act_above: the act bar applied.
    :param review_above: the review bar applied.
    """

    action: str
    reason: str
    code: str
    measured: float | None = None
    act_above: float | None = None
    review_above: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON form: the fields, in their order."""
        return asdict(self)


@dataclass(frozen=True)
class DecisionPolicy:
    """Two bars and a fallback: act, ask a person, or fall back (see the module docstring).

    :param act_above: act on the model's answer when the measure is at or above this
        (``None``: always act — no gating).
    :param review_above: ask a person when the measure is at or above this and below
        ``act_above`` (``None``: no review band).
    :param below: what to do below the review bar (below the act bar without a review band):
        ``fail``, ``skip``, ``wait`` (sensors only) or ``default``.
    :param default: the default answer: taken when ``below="default"``, and when a review gets
        no answer before ``review_timeout``. ``True``/``False`` for a boolean question, an option
        for a choice question, a list of options for a multi-select branch.
    :param measure: ``confidence`` (default), ``probability``, or ``both`` (the lower of the two).
    :param options: per-option bars for choice questions: ``{option: OptionBars | {"act_above",
        "review_above"}}``; an option's own bar replaces the policy's.
    :param review_timeout: how long a person has to answer (seconds or a ``timedelta``; ``None``:
        no limit). When it passes, ``default`` applies, or ``below`` when there is no default.

    A value that breaks a rule (a bar out of range, an unknown ``below``) is refused when the policy
    is used, not when it is built: by the task it is given to, when the Dag is parsed, so the
    message starts with that task's ID (``wait_until_ready: act_above 1.5 must be …``), and by any
    of its methods. Its dict form is refused at once (:meth:`from_dict`).
    """

    act_above: float | None = None
    review_above: float | None = None
    below: str = "fail"
    default: Any = None
    measure: str = "confidence"
    options: Mapping[str, OptionBars] = field(default_factory=dict)
    review_timeout: float | None = None

    def __post_init__(self) -> None:
        try:
            self._settle()
        except ValueError as exc:  # said when the policy is used: by its task, whose ID it can name
            object.__setattr__(self, "_problem", exc)
        else:
            object.__setattr__(self, "_problem", None)

    def _usable(self) -> None:
        """Refuse a policy whose values break a rule (the same error each time, raised afresh)."""
        problem = getattr(self, "_problem", None)
        if problem is None:
            return
        if isinstance(problem, SystemZeroArgumentError):
            raise SystemZeroArgumentError(problem.message, code=problem.code, field=problem.field) from None
        raise ValueError(str(problem)) from None

    def _settle(self) -> None:
        """Check the values and put them in the form the policy keeps."""
        set_ = object.__setattr__
        set_(self, "act_above", check_bar(self.act_above, "act_above"))
        set_(self, "review_above", check_bar(self.review_above, "review_above"))
        set_(self, "review_timeout", _seconds(self.review_timeout, "review_timeout"))
        if self.below not in BELOW_ACTIONS:
            raise ValueError(
                f"below must be one of {', '.join(BELOW_ACTIONS)}, got {self.below!r}"
                f"{did_you_mean(self.below, BELOW_ACTIONS)}"
            )
        if self.measure not in MEASURES:
            raise ValueError(
                f"measure must be one of {', '.join(MEASURES)}, got {self.measure!r}"
                f"{did_you_mean(self.measure, MEASURES)}"
            )
        if self.below == "default" and self.default is None:
            raise ValueError("below='default' needs a default answer: DecisionPolicy(..., default=...)")
        if self.default is not None:
            _check_answer_shape(self.default, "default")
        if not isinstance(self.options, Mapping):
            raise ValueError("options must map option names to their bars")
        options: dict[str, OptionBars] = {}
        for name, bars in self.options.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"options keys must be option names (non-empty strings), got {name!r}")
            if isinstance(bars, Mapping):
                unknown = sorted(set(bars) - {"act_above", "review_above"})
                if unknown:
                    raise ValueError(
                        f"options[{name!r}] has unknown key {unknown[0]!r}"
                        f"{did_you_mean(unknown[0], ('act_above', 'review_above'))} (use act_above, review_above)"
                    )
                try:
                    bars = OptionBars(**bars)
                except SystemZeroArgumentError as exc:  # a bar out of range: say whose
                    raise SystemZeroArgumentError(
                        f"option {name!r}: {exc.message}", code=exc.code, field=f"options.{name}.{exc.field}"
                    ) from None
            elif not isinstance(bars, OptionBars):
                raise ValueError(f"options[{name!r}] must be OptionBars or a dict, got {type(bars).__name__}")
            options[name] = bars
        set_(self, "options", options)
        for option in (None, *options):
            act, review = self.bars_for(option)
            where = "the policy" if option is None else f"option {option!r}"
            if review is not None and act is None:
                raise ValueError(f"{where} has a review bar ({review}) but no act bar: set act_above too")
            if review is not None and act is not None and review > act:
                raise ValueError(f"{where}: review_above ({review}) must not be above act_above ({act})")

    # ------------------------------------------------------------------ reading

    @classmethod
    def coerce(cls, value: Any) -> DecisionPolicy | None:
        """A policy from a :class:`DecisionPolicy`, its dict form, or ``None``.

        :raises ValueError: the value is not a policy, or breaks a rule.
        """
        if isinstance(value, DecisionPolicy):
            value._usable()
            return value
        if value is None:
            return value
        if isinstance(value, Mapping):
            return cls.from_dict(value)
        raise ValueError(f"policy must be a DecisionPolicy or a dict, got {type(value).__name__}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DecisionPolicy:
        """Build from :meth:`to_dict` output (missing keys take their defaults).

        :raises ValueError: an unknown key or an invalid value.
        """
        known = {"act_above", "review_above", "below", "default", "measure", "options", "review_timeout"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"unknown policy key {unknown[0]!r}{did_you_mean(unknown[0], known)} "
                f"(known: {', '.join(sorted(known))})"
            )
        values = dict(data)
        values["options"] = dict(values.get("options") or {})
        if values.get("below") is None:
            values.pop("below", None)
        if values.get("measure") is None:
            values.pop("measure", None)
        policy = cls(**values)
        policy._usable()
        return policy

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON form (travels in trigger kwargs and the ``decision`` record)."""
        self._usable()
        default = list(self.default) if isinstance(self.default, tuple) else self.default
        return {
            "act_above": self.act_above,
            "review_above": self.review_above,
            "below": self.below,
            "default": default,
            "measure": self.measure,
            "options": {name: bars.to_dict() for name, bars in self.options.items()},
            "review_timeout": self.review_timeout,
        }

    def bars_for(self, option: Any = None) -> tuple[float | None, float | None]:
        """``(act_above, review_above)`` for an answer (an option's own bars replace the policy's)."""
        self._usable()
        bars = self.options.get(option) if isinstance(option, str) else None
        if bars is None:
            return self.act_above, self.review_above
        act = bars.act_above if bars.act_above is not None else self.act_above
        review = bars.review_above if bars.review_above is not None else self.review_above
        return act, review

    @property
    def review_timedelta(self) -> timedelta | None:
        """``review_timeout`` as a ``timedelta``."""
        self._usable()
        return None if self.review_timeout is None else timedelta(seconds=self.review_timeout)

    @property
    def has_review(self) -> bool:
        """Whether any answer can be sent to a person."""
        self._usable()
        return any(review is not None for _, review in (self.bars_for(o) for o in (None, *self.options)))

    def measure_of(self, answer: Any) -> float | None:
        """The number the bars compare for an answer (``None`` when it is missing)."""
        self._usable()
        _, probability, confidence, _ = answer_numbers(answer)
        if self.measure == "confidence":
            return confidence
        if self.measure == "probability":
            return probability
        if confidence is None or probability is None:
            return None
        return min(confidence, probability)

    # ------------------------------------------------------------------ checking

    def check(
        self,
        *,
        kind: str,
        options: Sequence[str] | None = None,
        multiple: bool = False,
        allow_wait: bool = False,
        where: str = "policy",
    ) -> None:
        """Check that the policy fits a question, before anything is asked.

        :param kind: ``boolean`` or ``choice``.
        :param options: the choice options.
        :param multiple: the answer is a set of options (a multi-select branch).
        :param allow_wait: ``below="wait"`` is allowed (sensors).
        :param where: how to name the policy in errors.
        :raises ValueError: naming what does not fit.
        """
        self._usable()
        if self.below == "wait" and not allow_wait:
            raise ValueError(
                f"{where}: below='wait' only applies to the sensor (it keeps waiting for more "
                "state); use fail, skip or default here"
            )
        known = list(options or ())
        if self.options and kind != "choice":
            raise ValueError(f"{where}: per-option bars need a choice question")
        for name in self.options:
            if name not in known:
                raise ValueError(
                    f"{where}: options names {name!r}, which is not an option ({known}){did_you_mean(name, known)}"
                )
        if self.default is None:
            return
        if multiple:
            chosen = [self.default] if isinstance(self.default, str) else self.default
            if not isinstance(chosen, list | tuple) or not all(c in known for c in chosen):
                raise ValueError(f"{where}: default {self.default!r} must be a list of options from {known}")
        elif kind == "boolean":
            if not isinstance(self.default, bool):
                raise ValueError(
                    f"{where}: default {self.default!r} must be true or false for a boolean question"
                )
        elif self.default not in known:
            raise ValueError(
                f"{where}: default {self.default!r} is not an option ({known}){did_you_mean(self.default, known)}"
            )

    # ------------------------------------------------------------------ evaluating

    def evaluate(self, answer: Any) -> PolicyOutcome:
        """What to do with one answer.

        :param answer: an ``Answer`` or its dict form (``decision``, ``probability``, ``confidence``).
        """
        self._usable()
        decision = answer_numbers(answer)[0]
        act, review = self.bars_for(decision)
        measured = self.measure_of(answer)
        name = self.measure if self.measure != "both" else "min(confidence, probability)"
        if act is None:
            return PolicyOutcome("act", "the policy sets no bar", "no_bar", measured, act, review)
        if measured is None:
            reason = f"the reply has no {name}: an answer without a number counts as uncertain"
            if review is not None:
                return PolicyOutcome("review", reason, "missing_measure", None, act, review)
            return PolicyOutcome(self.below, reason, "missing_measure", None, act, review)
        if measured >= act:
            return PolicyOutcome(
                "act",
                f"{name} {measured:g} is at or above the act bar {act:g}",
                "above_act_bar",
                measured,
                act,
                review,
            )
        if review is not None and measured >= review:
            return PolicyOutcome(
                "review",
                f"{name} {measured:g} is below the act bar {act:g} and at or above the review bar {review:g}",
                "in_review_band",
                measured,
                act,
                review,
            )
        if review is not None:
            return PolicyOutcome(
                self.below,
                f"{name} {measured:g} is below the review bar {review:g}",
                "below_review_bar",
                measured,
                act,
                review,
            )
        return PolicyOutcome(
            self.below,
            f"{name} {measured:g} is below the act bar {act:g}",
            "below_act_bar",
            measured,
            act,
            review,
        )

    def evaluate_options(self, answers: Mapping[str, Any]) -> PolicyOutcome:
        """What to do with a set of answers, one per option (a multi-select branch): each option's
        answer is measured against that option's bars, and the least certain one decides.

        :param answers: option → its (boolean) answer.
        """
        self._usable()
        outcomes = {}
        for option, answer in answers.items():
            act, review = self.bars_for(option)
            single = DecisionPolicy(
                act_above=act,
                review_above=review,
                below=self.below,
                default=self.default,
                measure=self.measure,
            )
            outcomes[option] = single.evaluate(answer)
        if not outcomes:
            return PolicyOutcome("act", "no options", "no_bar")
        worst_option, worst = max(
            outcomes.items(),
            key=lambda item: (
                _SEVERITY[item[1].action],
                -(item[1].measured if item[1].measured is not None else -1.0),
            ),
        )
        return PolicyOutcome(
            worst.action,
            f"option {worst_option!r}: {worst.reason}",
            worst.code,
            worst.measured,
            worst.act_above,
            worst.review_above,
        )


def _check_answer_shape(value: Any, name: str) -> None:
    if isinstance(value, bool | str):
        return
    if isinstance(value, list | tuple) and value and all(isinstance(v, str) for v in value):
        return
    raise ValueError(f"{name} must be true/false, an option, or a list of options, got {value!r}")


def _jsonable(value: Any) -> Any:
    """Dates as ISO strings, tuples as lists, everything else unchanged (JSON only)."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if hasattr(value, "isoformat") and callable(value.isoformat):
        return value.isoformat()
    return value


def decision_record(
    *,
    question: str,
    answer: Any,
    decision: Any,
    action: str,
    decided_by: str | None,
    reason: str,
    policy: DecisionPolicy | None = None,
    outcome: PolicyOutcome | None = None,
    model: str | None = None,
    reply_id: str | None = None,
    state_version: int | None = None,
    state_hash: str | None = None,
    status: str = "final",
    review: Mapping[str, Any] | None = None,
    effect: Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
    decided_at: str | None = None,
    answered_at: str | None = None,
) -> dict[str, Any]:
    """The ``decision`` XCom: one JSON object that says what happened and why.

    It holds nothing that changes between attempts (no request IDs, and no clock readings but
    when System Zero decided — the reply's own time, which a replayed reply keeps — and when a
    person answered), so a retry about the same state pushes the same record.

    :param question: the question that was gated.
    :param answer: the model's answer (``Answer`` or dict), or ``None`` for a multi-select branch.
    :param decision: the answer that took effect (``None`` when the task failed or skipped).
    :param action: the policy's action (``act``, ``review``, ``fail``, ``skip``, ``wait``, ``default``).
    :param decided_by: ``model``, ``human``, ``policy`` or ``timeout_default``; ``None`` when nothing was
        decided (a pending review, a sensor whose wait timed out).
    :param reason: why, in plain words.
    :param policy: the policy applied.
    :param outcome: the policy's verdict (bars and measured number).
    :param model: the model that answered.
    :param reply_id: the reply's ID (``szd_…``; a replay gives the same ID).
    :param state_version: the state version the decision covers.
    :param state_hash: SHA-256 of the state (canonical JSON).
    :param status: ``final``, or ``pending_review`` while a person is asked.
    :param review: the person's response (who, when, what).
    :param effect: what the task did (e.g. ``{"branches": [...]}``).
    :param options: per-option answers of a multi-select branch.
    :param extra: anything else to record (JSON).
    :param decided_at: when System Zero decided (UTC ISO 8601; ``None`` when nothing was decided).
    :param answered_at: when a person answered the review (UTC ISO 8601; ``None`` without one).
    """
    if decided_by is not None and decided_by not in DECIDED_BY:
        raise ValueError(f"decided_by must be one of {DECIDED_BY}, got {decided_by!r}")
    if action not in ACTIONS:
        raise ValueError(f"action must be one of {ACTIONS}, got {action!r}")
    proposed, probability, confidence, alternatives = (
        answer_numbers(answer) if answer is not None else (None, None, None, [])
    )
    if options is not None:
        proposed = [name for name, value in options.items() if answer_numbers(value)[0] is True]
    record: dict[str, Any] = {
        "version": RECORD_VERSION,
        "status": status,
        "model": model,
        "question": question,
        "proposed": proposed,
        "decision": decision,
        "action": action,
        "decided_by": decided_by,
        "decided_at": decided_at,
        "answered_at": answered_at,
        "reason": reason,
        "probability": probability,
        "confidence": confidence,
        "alternatives": alternatives,
        "bars": outcome.to_dict() if outcome is not None else None,
        "policy": policy.to_dict() if policy is not None else None,
        "reply_id": reply_id,
        "state_version": state_version,
        "state_hash": state_hash,
        "review": dict(review) if review is not None else None,
        "effect": dict(effect) if effect is not None else None,
    }
    if options is not None:
        record["options"] = {
            name: dict(zip(("decision", "probability", "confidence"), answer_numbers(value)[:3], strict=True))
            for name, value in options.items()
        }
    if extra:
        record.update(extra)
    return _jsonable(record)


def ranked_answers(answer: Any) -> list[dict[str, Any]]:
    """The proposed answer then its alternatives, best first: ``[{"decision", "probability"?, "confidence"}]``."""
    decision, probability, confidence, alternatives = answer_numbers(answer)
    ranked = [{"decision": decision, "probability": probability, "confidence": confidence}]
    seen = {_key(decision)}
    for alternative in alternatives:
        if _key(alternative.get("decision")) in seen:
            continue
        seen.add(_key(alternative.get("decision")))
        ranked.append(
            {
                "decision": alternative.get("decision"),
                "probability": alternative.get("probability"),
                "confidence": alternative.get("confidence"),
            }
        )
    return ranked


def _key(value: Any) -> Any:
    return (type(value).__name__, value) if not isinstance(value, list) else ("list", tuple(value))


def combine_actions(actions: Iterable[str]) -> str:
    """The most severe of several actions (``act`` < ``default`` < ``review`` < ``wait`` < ``skip`` < ``fail``)."""
    return max(actions, key=_SEVERITY.__getitem__, default="act")


def state_preview(state: Any) -> str:
    """A short text view of a state for a reviewer: the whole of a small state, else its start and
    its newest end."""
    from airflow_provider_systemzero.protocol.body import compact_json

    text = state if isinstance(state, str) else compact_json(state)
    if len(text) <= _PREVIEW_HEAD + _PREVIEW_TAIL:
        return text
    return (
        f"{text[:_PREVIEW_HEAD]}\n… ({len(text) - _PREVIEW_HEAD - _PREVIEW_TAIL} characters left out) …\n"
        f"{text[-_PREVIEW_TAIL:]}"
    )


def state_info(state: Any) -> dict[str, Any]:
    """What the ``decision`` record and a reviewer see of a state: ``{"state_hash", "state_bytes",
    "preview"}`` (the hash is :func:`~airflow_provider_systemzero.identity.state_hash`)."""
    from airflow_provider_systemzero.identity import state_hash
    from airflow_provider_systemzero.protocol.body import json_size

    return {"state_hash": state_hash(state), "state_bytes": json_size(state), "preview": state_preview(state)}
