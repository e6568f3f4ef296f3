"""Deciders: what the emulator's decide backend answers.

A decider turns a parsed decide body into answers. The backend
(:class:`~airflow_provider_systemzero.emulator.backend.DecideBackend`) wraps them into the
full reply of the public example (``id``, ``usage``, the idempotency ledger and billing), so a
decider only says *what* it decides.

Interface (:class:`Decider`)::

    decide(request, *, now) -> {question_name: answer, ...}

``request`` is the decide body as a dict (``model``, ``state``, optional ``attachments``,
``questions``, optional ``route`` and ``mode``, ``prompt_cache_key``). Each answer is either a
bare decision (``True``/``False`` for a boolean question, one of the options for a choice
question) or a mapping with ``decision`` and optionally ``probability`` (of that decision),
``confidence`` and ``alternatives``; missing numbers default to 1.0, missing alternatives are
filled in. A reply-shaped ``{"answers": {...}}`` is accepted too (unless a question is named
``answers``). A decider may raise any exception: the backend answers HTTP 500 ``api_error``.

Three deciders ship (select them with :func:`load_decider`, or ``--decider`` on the CLI):

``keyword`` (default)
    Deterministic and explainable, no model. The *content words* of a question's instructions
    (lowercased, stopwords dropped, light stemming) are looked for in the newest part of the
    state: the last 2 KB of text, one line per text line, array item or top-level object key.
    Walking from the newest line back, the first line that mentions any content word is the
    evidence; its *match* is the fraction of content words it contains. A line with a negation
    (``not``, ``no``, ``never``, ``…n't``, ``cannot``) counts against the question. The score is
    ``0.5 + 0.5 × e × 0.9^d`` where ``e = 2·match − 1`` (or ``−match`` for a negated line) and
    ``d`` is how many newer lines follow the evidence; with no evidence the score is 0.2. A
    boolean question is answered ``true`` when the score is above 0.5, with
    ``P(true) = 0.05 + 0.9 × score``; ``probability`` is that of the answer given and
    ``confidence = |P(true) − 0.5| × 2``. A choice question scores each option's own words the
    same way and picks the best (ties: the first option); probabilities are the normalised
    scores and ``confidence`` is the margin over the runner-up. So "Is the job ready?" over a log
    whose last line is "Job is ready." answers ``true`` (probability 0.95), over
    ``"Initial log\\n"`` ``false``.

``rules:FILE``
    JSON rules, first match per question wins::

        {"rules": [{"question": "ready", "pattern": "(?i)job is ready", "answer": true,
                    "probability": 0.93, "confidence": 0.9},
                   {"question": "colour", "pattern": "sky", "answer": "blue"}],
         "default": {"answer": false, "probability": 0.2, "confidence": 0.8}}

    ``pattern`` is a Python regular expression searched over the state rendered as text (a
    string as-is, anything else as compact JSON). ``question`` may be omitted (or ``"*"``) to
    apply to every question. ``probability``/``confidence`` default to 1.0. ``default`` answers a
    question no rule matched; a rule for every question, or the default, whose answer does not fit
    a question (a boolean for a choice question) is passed over for it, and the fallback is
    ``false`` or the first option. Without ``default`` the fallback is ``false`` / the first option
    with probability and confidence 0.5. A rule that names its question and matches with an
    answer that does not fit that question (``"yes"`` for a boolean, an option not offered) is a
    mistake in the file: the decide fails (HTTP 500) naming the rule, rather than answering
    something else.

``python:module:function``
    Any callable ``function(request, now=now)`` returning answers as above, or an object with
    such a ``decide`` method (``module`` is imported; ``function`` may be dotted).
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from airflow_provider_systemzero.protocol.body import compact_json

__all__ = [
    "CallableDecider",
    "Decider",
    "KeywordDecider",
    "Rule",
    "RulesDecider",
    "content_words",
    "load_decider",
    "render_state_text",
]


@runtime_checkable
class Decider(Protocol):
    """Answers the questions of one decide body."""

    def decide(self, request: Mapping[str, Any], *, now: float) -> Mapping[str, Any]:
        """Answer every question of ``request``.

        :param request: the parsed decide body.
        :param now: the backend's monotonic time in seconds.
        :return: question name → answer (a bare decision or a mapping with ``decision``).
        """
        ...  # pragma: no cover


# --------------------------------------------------------------------------------------------
# text helpers
# --------------------------------------------------------------------------------------------


def _wordset(text: str) -> frozenset[str]:
    return frozenset(text.split())


STOPWORDS: frozenset[str] = _wordset(
    """a an the is are was were be been being am do does did doing done has have had having of to in
    on at by for with from as and or but if then than so that this these those it its there their
    they them we us you your our i me my he she his her what which who whom whose when where why how
    whether will would shall should can could may might must any all some each every yet already
    now still just please tell answer question decide true false yes"""
)
NEGATIONS: frozenset[str] = _wordset(
    """not no never cannot isn't aren't wasn't weren't won't can't don't doesn't didn't hasn't
    haven't hadn't shouldn't wouldn't couldn't"""
)
_TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
WINDOW_CHARS = 2048
MAX_LINES = 64
RECENCY_DECAY = 0.9
NO_EVIDENCE_SCORE = 0.2


def _stem(token: str) -> str:
    if len(token) > 5 and token.endswith("ing"):
        return token[:-3]
    if len(token) > 4 and token.endswith("ied"):
        return token[:-3] + "y"
    if len(token) > 4 and token.endswith("ed"):
        return token[:-2]
    if len(token) > 4 and token.endswith("ies"):
        return token[:-3] + "y"
    if len(token) > 3 and token.endswith("s") and not token.endswith("ss"):
        return token[:-1]
    return token


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


def content_words(text: str) -> tuple[str, ...]:
    """The content words of ``text``: lowercased tokens without stopwords or negations, stemmed,
    unique, in order of first appearance."""
    seen: dict[str, None] = {}
    for token in _tokens(text):
        if token in STOPWORDS or token in NEGATIONS:
            continue
        seen.setdefault(_stem(token), None)
    return tuple(seen)


def _word_matches(word: str, stems: set[str]) -> bool:
    if word in stems:
        return True
    return len(word) >= 5 and any(len(s) >= 5 and (s.startswith(word) or word.startswith(s)) for s in stems)


def render_state_text(state: Any) -> str:
    """A state as text: a string as-is, anything else as compact JSON."""
    return state if isinstance(state, str) else compact_json(state)


def newest_lines(state: Any) -> list[str]:
    """The newest part of a state as lines, oldest first: the last :data:`WINDOW_CHARS` characters
    of a string (one line per text line), the last array items (one line each), or the top-level
    keys of an object (``key: value``), at most :data:`MAX_LINES` lines."""
    if isinstance(state, str):
        lines = state[-WINDOW_CHARS:].splitlines()
    else:
        if isinstance(state, list):
            rendered = [render_state_text(item) for item in state[-MAX_LINES:]]
        elif isinstance(state, Mapping):
            rendered = [
                f"{key}: {render_state_text(value)}" for key, value in list(state.items())[-MAX_LINES:]
            ]
        else:
            rendered = [render_state_text(state)]
        lines, used = [], 0
        for line in reversed(rendered):
            if used >= WINDOW_CHARS:
                break
            line = line[-(WINDOW_CHARS - used) :]
            used += len(line)
            lines.append(line)
        lines.reverse()
    return [line for line in lines if line.strip()][-MAX_LINES:]


def evidence_score(words: Sequence[str], lines: Sequence[str]) -> float:
    """The keyword score (0…1) of ``words`` over ``lines`` (oldest first); see the module docstring."""
    if not words:
        return NO_EVIDENCE_SCORE
    for distance, line in enumerate(reversed(lines)):
        tokens = _tokens(line)
        stems = {_stem(t) for t in tokens}
        matched = sum(1 for word in words if _word_matches(word, stems))
        if not matched:
            continue
        match = matched / len(words)
        negated = any(t in NEGATIONS for t in tokens)
        evidence = -match if negated else 2 * match - 1
        return 0.5 + 0.5 * evidence * RECENCY_DECAY**distance
    return NO_EVIDENCE_SCORE


def _r(value: float) -> float:
    return round(min(1.0, max(0.0, value)), 4)


# --------------------------------------------------------------------------------------------
# keyword
# --------------------------------------------------------------------------------------------


class KeywordDecider:
    """The default decider: deterministic keyword evidence from the newest part of the state
    (see the module docstring for the exact scoring)."""

    name = "keyword"

    def decide(self, request: Mapping[str, Any], *, now: float) -> dict[str, Any]:
        """Answer every question of ``request`` from keyword evidence.

        :param request: the parsed decide body.
        :param now: unused (the answer depends on the body only).
        """
        lines = newest_lines(request.get("state"))
        answers: dict[str, Any] = {}
        for name, question in request.get("questions", {}).items():
            if question.get("type") == "choice":
                answers[name] = self._choice(question, lines)
            else:
                answers[name] = self._boolean(question, lines)
        return answers

    @staticmethod
    def _boolean(question: Mapping[str, Any], lines: list[str]) -> dict[str, Any]:
        score = evidence_score(content_words(str(question.get("instructions", ""))), lines)
        p_true = _r(0.05 + 0.9 * score)
        decision = score > 0.5
        probability = p_true if decision else _r(1 - p_true)
        return {
            "decision": decision,
            "probability": probability,
            "confidence": _r(abs(p_true - 0.5) * 2),
            "alternatives": [{"decision": not decision, "confidence": _r(1 - probability)}],
        }

    @staticmethod
    def _choice(question: Mapping[str, Any], lines: list[str]) -> dict[str, Any]:
        options = [str(o) for o in question.get("options") or ()]
        scores = []
        for option in options:
            words = content_words(option) or tuple(_stem(t) for t in _tokens(option))
            scores.append(evidence_score(words, lines))
        total = sum(scores) or 1.0
        probabilities = [_r(s / total) for s in scores]
        best = max(range(len(options)), key=lambda i: (scores[i], -i))
        ranked = sorted((i for i in range(len(options)) if i != best), key=lambda i: (-scores[i], i))
        runner_up = probabilities[ranked[0]] if ranked else 0.0
        return {
            "decision": options[best],
            "probability": probabilities[best],
            "confidence": _r(probabilities[best] - runner_up),
            "alternatives": [{"decision": options[i], "confidence": probabilities[i]} for i in ranked],
        }


# --------------------------------------------------------------------------------------------
# rules
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule of a rules file.

    :param pattern: compiled regular expression searched over the state text.
    :param answer: the decision when it matches.
    :param question: the question it answers (``None``: every question).
    :param probability: the probability reported.
    :param confidence: the confidence reported.
    :param where: how errors name the rule (``FILE: rules[i]``).
    """

    pattern: re.Pattern[str]
    answer: Any
    question: str | None = None
    probability: float = 1.0
    confidence: float = 1.0
    where: str = "rules"


def _unit(value: Any, where: str, default: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ValueError(f"{where} must be a number between 0 and 1, got {value!r}")
    return float(value)


def _fits(question: Mapping[str, Any], answer: Any) -> bool:
    if question.get("type") == "choice":
        return isinstance(answer, str) and answer in (question.get("options") or ())
    return isinstance(answer, bool)


def _misfit(name: str, question: Mapping[str, Any], answer: Any) -> str:
    """Why ``answer`` does not fit question ``name``, and the fix."""
    if question.get("type") == "choice":
        return (
            f"its answer {answer!r} is not one of the options of choice question {name!r} "
            f"{list(question.get('options') or ())}: make the rule's answer one of them"
        )
    return f"its answer {answer!r} does not fit boolean question {name!r}: make it true or false"


class RulesDecider:
    """Answers from JSON rules (see the module docstring for the file format).

    :param rules: the rules, in order.
    :param default: ``{"answer", "probability", "confidence"}`` for unmatched questions, or ``None``.
    """

    name = "rules"

    def __init__(self, rules: Sequence[Rule], default: Mapping[str, Any] | None = None) -> None:
        self.rules = tuple(rules)
        self.default = dict(default) if default is not None else None

    @classmethod
    def from_file(cls, path: str | Path) -> RulesDecider:
        """Load a rules file.

        :param path: the JSON file.
        :raises ValueError: naming what is wrong with the file.
        """
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read rules file {str(path)!r}: {exc}") from exc
        return cls.from_dict(data, where=str(path))

    @classmethod
    def from_dict(cls, data: Any, *, where: str = "rules") -> RulesDecider:
        """Build from the parsed rules document.

        :param data: ``{"rules": [...], "default": {...}}``.
        :param where: how to name the source in errors.
        :raises ValueError: naming what is wrong.
        """
        if not isinstance(data, Mapping) or not isinstance(data.get("rules", []), list):
            raise ValueError(f"{where}: expected an object with a 'rules' array")
        unknown = sorted(set(data) - {"rules", "default"})
        if unknown:
            raise ValueError(f"{where}: unknown key {unknown[0]!r} (expected 'rules' and 'default')")
        rules = []
        for index, raw in enumerate(data.get("rules", [])):
            at = f"{where}: rules[{index}]"
            if not isinstance(raw, Mapping):
                raise ValueError(f"{at} must be an object")
            extra = sorted(set(raw) - {"question", "pattern", "answer", "probability", "confidence"})
            if extra:
                raise ValueError(f"{at} has unknown key {extra[0]!r}")
            if not isinstance(raw.get("pattern"), str):
                raise ValueError(f"{at}.pattern must be a string (a regular expression)")
            if "answer" not in raw or not isinstance(raw["answer"], bool | str):
                raise ValueError(f"{at}.answer must be true, false or an option string")
            question = raw.get("question")
            if question is not None and not isinstance(question, str):
                raise ValueError(f"{at}.question must be a string")
            try:
                pattern = re.compile(raw["pattern"])
            except re.error as exc:
                raise ValueError(f"{at}.pattern is not a valid regular expression: {exc}") from exc
            rules.append(
                Rule(
                    pattern=pattern,
                    answer=raw["answer"],
                    question=None if question in (None, "*") else question,
                    probability=_unit(raw.get("probability"), f"{at}.probability", 1.0),
                    confidence=_unit(raw.get("confidence"), f"{at}.confidence", 1.0),
                    where=at,
                )
            )
        default = data.get("default")
        if default is not None:
            if not isinstance(default, Mapping) or not isinstance(default.get("answer"), bool | str):
                raise ValueError(f"{where}: default must be an object with an 'answer'")
            default = {
                "answer": default["answer"],
                "probability": _unit(default.get("probability"), f"{where}: default.probability", 1.0),
                "confidence": _unit(default.get("confidence"), f"{where}: default.confidence", 1.0),
            }
        return cls(rules, default)

    def decide(self, request: Mapping[str, Any], *, now: float) -> dict[str, Any]:
        """Answer every question with its first matching rule, else the default.

        :param request: the parsed decide body.
        :param now: unused.
        """
        text = render_state_text(request.get("state"))
        answers: dict[str, Any] = {}
        for name, question in request.get("questions", {}).items():
            answers[name] = self._answer(name, question, text)
        return answers

    def _answer(self, name: str, question: Mapping[str, Any], text: str) -> dict[str, Any]:
        for rule in self.rules:
            if rule.question not in (None, name) or not rule.pattern.search(text):
                continue
            if _fits(question, rule.answer):
                return {
                    "decision": rule.answer,
                    "probability": rule.probability,
                    "confidence": rule.confidence,
                }
            if rule.question == name:  # a rule for this very question cannot mean another answer
                raise ValueError(f"{rule.where} matched, but {_misfit(name, question, rule.answer)}")
        fallback: Any = (question.get("options") or [""])[0] if question.get("type") == "choice" else False
        if self.default is not None:
            answer = self.default["answer"] if _fits(question, self.default["answer"]) else fallback
            return {
                "decision": answer,
                "probability": self.default["probability"],
                "confidence": self.default["confidence"],
            }
        return {"decision": fallback, "probability": 0.5, "confidence": 0.5}


# --------------------------------------------------------------------------------------------
# python:module:function and loading
# --------------------------------------------------------------------------------------------


class CallableDecider:
    """Adapts a plain function ``function(request, now=now) -> answers`` to :class:`Decider`.

    :param function: the function.
    :param name: a label for logs and stats.
    """

    def __init__(self, function: Callable[..., Mapping[str, Any]], name: str = "python") -> None:
        self.function = function
        self.name = name

    def decide(self, request: Mapping[str, Any], *, now: float) -> Mapping[str, Any]:
        """Call the function.

        :param request: the parsed decide body.
        :param now: the backend's monotonic time.
        """
        return self.function(request, now=now)


def load_decider(spec: str | Decider) -> Decider:
    """A decider from its CLI spelling: ``keyword``, ``rules:FILE`` or ``python:module:function``.

    :param spec: the spelling, or a ready :class:`Decider` (returned as-is).
    :raises ValueError: naming what is wrong with the spec.
    """
    if not isinstance(spec, str):
        if not callable(getattr(spec, "decide", None)):
            raise ValueError(f"decider {spec!r} has no decide(request, *, now) method")
        return spec
    kind, _, rest = spec.partition(":")
    if kind == "keyword" and not rest:
        return KeywordDecider()
    if kind == "rules" and rest:
        return RulesDecider.from_file(rest)
    if kind == "python" and rest:
        module_name, _, attribute = rest.partition(":")
        if not module_name or not attribute:
            raise ValueError(f"decider {spec!r}: expected python:module:function")
        try:
            target: Any = importlib.import_module(module_name)
            for part in attribute.split("."):
                target = getattr(target, part)
        except (ImportError, AttributeError) as exc:
            raise ValueError(
                f"decider {spec!r}: cannot load {attribute!r} from {module_name!r}: {exc}"
            ) from exc
        if callable(getattr(target, "decide", None)) and not isinstance(target, type):
            return target  # type: ignore[no-any-return]
        if callable(target):
            return CallableDecider(target, name=f"python:{rest}")
        raise ValueError(f"decider {spec!r}: {attribute!r} is neither callable nor has a decide method")
    raise ValueError(f"unknown decider {spec!r}: use keyword, rules:FILE or python:module:function")
