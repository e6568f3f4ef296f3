"""When a decision counts as "yes": the watched question, the expected answer and the bars.

A :class:`DecisionCondition` is plain data (it travels in trigger kwargs as a dict). A missing
confidence or probability never passes a bar: a model that reports no number counts as uncertain.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from airflow_provider_systemzero.protocol.errors import LocalProtocolError
from airflow_provider_systemzero.protocol.reply import Answer, DecisionResult
from airflow_provider_systemzero.protocol.validation import validate_question_name

__all__ = ["ConditionResult", "DecisionCondition"]


def _bar(value: Any, field: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise LocalProtocolError(f"{field} {value!r} must be a number from 0 to 1", code="invalid_threshold",
                                 field=field)
    return float(value)


@dataclass(frozen=True, slots=True)
class ConditionResult:
    """The outcome of checking one decision.

    :param met: the decision is the expected answer and passes every bar.
    :param answer: the watched answer (``None`` if the reply has none).
    :param reason: why it is (not) met, in plain words, for logs.
    """

    met: bool
    answer: Answer | None
    reason: str


@dataclass(frozen=True, slots=True)
class DecisionCondition:
    """What a sensor waits for.

    :param question: the question to watch.
    :param expect: the answer that satisfies the sensor (``True``/``False`` for a boolean question,
        an option or a list of options for a choice question).
    :param min_confidence: the answer's confidence must be at least this (``None``: no bar).
    :param min_probability: the answer's probability must be at least this (``None``: no bar).
    """

    question: str
    expect: Any = True
    min_confidence: float | None = None
    min_probability: float | None = None

    def __post_init__(self) -> None:
        validate_question_name(self.question, field="question")
        _bar(self.min_confidence, "min_confidence")
        _bar(self.min_probability, "min_probability")
        expect = self.expect
        if isinstance(expect, list):
            if not expect or not all(isinstance(option, str) for option in expect):
                raise LocalProtocolError("expect must be a boolean, an option, or a non-empty list of options",
                                         code="invalid_expect", field="expect")
        elif not isinstance(expect, bool | str):
            raise LocalProtocolError(f"expect {expect!r} must be a boolean, an option, or a list of options",
                                     code="invalid_expect", field="expect")

    def check_questions(self, questions: Mapping[str, Any]) -> None:
        """Check that the watched question is asked and ``expect`` fits its type.

        :param questions: the request's questions in wire form.
        :raises LocalProtocolError: naming the field.
        """
        if self.question not in questions:
            raise LocalProtocolError(f"question {self.question!r} is not among the questions asked "
                                     f"({sorted(questions)})", code="unknown_question", field="question")
        spec = questions[self.question]
        kind = spec.get("type") if isinstance(spec, Mapping) else getattr(spec, "type", None)
        options = spec.get("options") if isinstance(spec, Mapping) else getattr(spec, "options", None)
        if kind == "boolean" and not isinstance(self.expect, bool):
            raise LocalProtocolError(f"expect {self.expect!r} must be true or false for boolean question "
                                     f"{self.question!r}", code="invalid_expect", field="expect")
        if kind == "choice":
            wanted = self.expect if isinstance(self.expect, list) else [self.expect]
            missing = [w for w in wanted if w not in (options or ())]
            if missing:
                raise LocalProtocolError(f"expect {missing[0]!r} is not an option of choice question "
                                         f"{self.question!r} (options: {list(options or ())})",
                                         code="invalid_expect", field="expect")

    def evaluate(self, result: DecisionResult) -> ConditionResult:
        """Check a decision against the condition."""
        answer = result.answers.get(self.question)
        if answer is None:
            return ConditionResult(False, None, f"the reply has no answer for {self.question!r}")
        wanted = self.expect if isinstance(self.expect, list) else [self.expect]
        if answer.decision not in wanted or (isinstance(answer.decision, bool) != isinstance(wanted[0], bool)):
            return ConditionResult(False, answer, f"{self.question} = {answer.decision!r}, waiting for "
                                   f"{self.expect!r}")
        if self.min_confidence is not None and (answer.confidence is None or answer.confidence < self.min_confidence):
            return ConditionResult(False, answer, f"{self.question} = {answer.decision!r} but confidence "
                                   f"{answer.confidence} is below {self.min_confidence}")
        if self.min_probability is not None and (answer.probability is None
                                                 or answer.probability < self.min_probability):
            return ConditionResult(False, answer, f"{self.question} = {answer.decision!r} but probability "
                                   f"{answer.probability} is below {self.min_probability}")
        return ConditionResult(True, answer, f"{self.question} = {answer.decision!r} (probability "
                               f"{answer.probability}, confidence {answer.confidence})")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DecisionCondition:
        """Build from :meth:`to_dict` output."""
        return cls(**dict(data))
