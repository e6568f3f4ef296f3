"""A typed view of the ordinary decide reply that ``decision`` messages embed.

The reply keeps the shape of the public example: ``id`` (``szd_`` + 32 hex), ``model``,
``served_by``, ``created``, ``context``, ``answers`` (name → answer with ``probability``,
``confidence``, ``calibration_version``, ``decision``, ``alternatives``, ``calibrated``) and
``usage``. :class:`DecisionResult` reads it leniently (a missing number is ``None``), keeps the
reply, and converts to a small JSON summary for trigger events and XCom.

Given the questions the stream asked, :meth:`DecisionResult.from_message` first checks the reply
against them (:func:`check_reply`): a decision that is not a success, an answer to a question never
asked or missing, an answer of the wrong kind (``"maybe"`` for a boolean question, an option not
offered), or a probability or confidence that is not a number from 0 to 1 is a contract breach
(:class:`~airflow_provider_systemzero.protocol.errors.RemoteProtocolError`), never a decision.

Its numbers have ranges too (:func:`check_reply_numbers`): ``created`` is a time from 1970 to the
end of year 9999, ``context.tokens`` and the ``usage`` counters are counts from 0; out of range is a
contract breach naming the field.

Every reply must also be one Airflow can store (:func:`storable_reply`): a decision becomes a trigger
event and XCom, which Airflow's serializer writes, hands to the worker through its Execution API and
reads back. A reply nested deeper than :data:`MAX_REPLY_DEPTH` levels, or holding a key Airflow's
serializer reserves (:data:`RESERVED_KEYS`), is a contract breach too, so the task fails with the
provider's error instead of an event Airflow cannot store. Once checked, every string of the reply
(but the checked decisions, which are the caller's own options) and the decision's ``request_id``
and ``covered_event_ids`` pass through :func:`~airflow_provider_systemzero.protocol.untrusted.safe_text`:
what a :class:`DecisionResult` holds is safe to log, raise, store and show.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from airflow_provider_systemzero.protocol.errors import RemoteProtocolError
from airflow_provider_systemzero.protocol.messages import MAX_SAFE_INTEGER, Decision, Question
from airflow_provider_systemzero.protocol.untrusted import safe_text

__all__ = [
    "MAX_CREATED",
    "MAX_REPLY_DEPTH",
    "RESERVED_KEYS",
    "USAGE_FIELDS",
    "Answer",
    "DecisionResult",
    "check_reply",
    "check_reply_numbers",
    "share",
    "storable_reply",
]

#: How deeply a reply may nest (the reply object is level 1; a reply of the public example is 5 deep).
#: Airflow stores a decision inside its trigger event (``next_kwargs["event"]``) and hands it to the
#: worker in an Execution API response, whose JSON parser (pydantic-core) refuses a document nested
#: 200 deep: a reply fails at 199 levels on Airflow 3.2+, at 99 on 3.1 (whose serializer wraps each
#: object in another). The serializer itself recurses once a level (twice on Python 3.11) up to the
#: interpreter's recursion limit. 32 keeps a reply far from all of these.
MAX_REPLY_DEPTH = 32
#: Keys Airflow's serializer reserves (its ``FORBIDDEN_XCOM_KEYS``): an object holding
#: ``__classname__`` or ``__id__`` is refused when the event is stored, and one holding ``__type``
#: and ``__var`` (or ``__classname__`` and ``__version__``) is read back on the worker as another
#: object than the gateway sent.
RESERVED_KEYS = frozenset(
    {"__classname__", "__version__", "__data__", "__id__", "__cache__", "__type", "__source", "__var"}
)

#: The counters of ``reply.usage``.
USAGE_FIELDS = (
    "input_tokens",
    "cached_input_tokens",
    "media_tokens",
    "long_input_tokens",
    "media_items",
    "thought_tokens",
)


#: The latest ``reply.created`` a reply may carry, in epoch seconds: the last second of year 9999,
#: the latest time Python's ``datetime`` (and so a record of the provider) holds.
MAX_CREATED = 253_402_300_799


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def share(value: Any) -> float | None:
    """A probability or confidence as a gate may use it: a finite number from 0 to 1, else ``None``.

    ``NaN``, infinities, booleans and numbers outside [0, 1] are no measure at all, so they count
    as uncertain and never meet a bar.

    :param value: the reported number.
    """
    number = _number(value)
    return number if number is not None and 0.0 <= number <= 1.0 else None


class _Unstorable(Exception):
    """Raised down a reply's walk; each level it leaves adds its key, so the refusal names the way."""

    def __init__(self, reserved: str | None = None) -> None:
        self.reserved = reserved
        self.path: list[str | int] = []


def _stored(value: Any, depth: int) -> Any:
    """``value``, at ``depth`` in a reply, as a :class:`DecisionResult` keeps it: every string and
    key through :func:`~airflow_provider_systemzero.protocol.untrusted.safe_text`. It recurses no
    deeper than :data:`MAX_REPLY_DEPTH`, however deep the value."""
    if isinstance(value, str):
        return safe_text(value)
    if isinstance(value, dict):
        if depth > MAX_REPLY_DEPTH:
            raise _Unstorable()
        kept = {}
        for key, item in value.items():
            if key in RESERVED_KEYS:
                exc = _Unstorable(key)
                exc.path.append(key)
                raise exc
            try:
                kept[safe_text(str(key))] = _stored(item, depth + 1)
            except _Unstorable as exc:
                exc.path.append(key)
                raise
        return kept
    if isinstance(value, list):
        if depth > MAX_REPLY_DEPTH:
            raise _Unstorable()
        items = []
        for index, item in enumerate(value):
            try:
                items.append(_stored(item, depth + 1))
            except _Unstorable as exc:
                exc.path.append(index)
                raise
        return items
    return value


def storable_reply(reply: dict[str, Any]) -> dict[str, Any]:
    """``reply`` as a :class:`DecisionResult` keeps it, once checked that Airflow can store it in a
    trigger event and XCom and read it back as sent: a copy with every string and key passed
    through :func:`~airflow_provider_systemzero.protocol.untrusted.safe_text`.

    :param reply: the decoded reply.
    :raises RemoteProtocolError: ``unstorable_reply``, naming the field: the reply nests deeper than
        :data:`MAX_REPLY_DEPTH` levels, or an object in it holds a key of :data:`RESERVED_KEYS`.
    """
    try:
        return _stored(reply, 1)
    except _Unstorable as exc:
        steps = exc.path[::-1]
        key = steps.pop() if exc.reserved is not None else None
        where = "reply" + "".join(f"[{step}]" if isinstance(step, int) else f".{step}" for step in steps)
        shown = safe_text(where, 120)
        if key is None:
            problem = (
                f"the reply nests deeper than {MAX_REPLY_DEPTH} levels (at {shown}): Airflow could not "
                "store it as a trigger event and XCom, and no reply of the service nests so deep"
            )
            where = "reply"
        else:
            problem = (
                f"{shown} has the key {key!r}, which Airflow's serializer reserves: Airflow would refuse "
                "the event or read it back as another object"
            )
        raise RemoteProtocolError(problem, code="unstorable_reply", field=where) from None


def _out_of_range(field: str, value: Any, allowed: str) -> RemoteProtocolError:
    return RemoteProtocolError(
        f"{field} is {_shown(value)}, not {allowed}", code="invalid_reply", field=field
    )


def _check_count(value: Any, field: str) -> None:
    """A token or item count: absent/null, or an integer from 0 to 2**53 - 1."""
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SAFE_INTEGER
    ):
        raise _out_of_range(field, value, "a count (an integer from 0 to 2**53 - 1)")


def check_reply_numbers(reply: Mapping[str, Any]) -> None:
    """Check the numbers of a reply the client reads, whatever the questions: ``created`` (absent,
    null, or epoch seconds from 0 to :data:`MAX_CREATED`), ``context.tokens`` and each counter of
    ``usage`` (:data:`USAGE_FIELDS`: absent, null, or an integer from 0 to 2**53 - 1). Numbers the
    client does not read are kept as the gateway sent them (finite, as the wire requires).

    :param reply: the decoded reply.
    :raises RemoteProtocolError: ``invalid_reply``, naming the field and its range.
    """
    created = reply.get("created")
    if created is not None and (
        isinstance(created, bool) or not isinstance(created, int | float) or not 0 <= created <= MAX_CREATED
    ):
        raise _out_of_range(
            "reply.created", created, f"a time in epoch seconds from 0 to {MAX_CREATED} (year 9999)"
        )
    context = reply.get("context")
    if isinstance(context, Mapping):
        _check_count(context.get("tokens"), "reply.context.tokens")
    usage = reply.get("usage")
    if isinstance(usage, Mapping):
        for name in USAGE_FIELDS:
            _check_count(usage.get(name), f"reply.usage.{name}")


def _breach(problem: str, field: str) -> RemoteProtocolError:
    return RemoteProtocolError(
        f"the decision does not answer the questions asked: {problem}", code="invalid_reply", field=field
    )


def _shown(value: Any) -> str:
    """A value of the reply, as a refusal quotes it."""
    return safe_text(repr(value), 64)


def _check_share(value: Any, field: str) -> None:
    """A probability or confidence: absent/null, or a number from 0 to 1."""
    if value is None:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 <= value <= 1
    ):
        raise _breach(f"{field} is {_shown(value)}, not a number from 0 to 1", field)


def _check_decision(value: Any, question: Question, field: str) -> None:
    if question.type == "boolean":
        if not isinstance(value, bool):
            raise _breach(f"{field} must be true or false for a boolean question, got {_shown(value)}", field)
    elif not isinstance(value, str) or value not in (question.options or ()):
        raise _breach(f"{field} {_shown(value)} is not one of the options offered", field)


def check_reply(message: Decision, questions: Sequence[tuple[str, Question]]) -> None:
    """Check a ``decision`` against the questions the stream asked.

    :param message: the decoded ``decision``.
    :param questions: the stream's questions, ``(name, Question)`` pairs.
    :raises RemoteProtocolError: ``invalid_reply``, naming the field: the status is not a success,
        ``reply.answers`` is not an object, answers a question never asked or leaves one out, or
        an answer's type, decision, probability or confidence (its alternatives' too) breaks the
        question's shape.
    """
    if not 200 <= message.http_status < 300:
        raise _breach(
            f"http_status is {message.http_status}: a decision carries a successful reply "
            "(a failed dispatch is an error message)",
            "http_status",
        )
    answers = message.reply.get("answers")
    if not isinstance(answers, Mapping):
        raise _breach("reply.answers must be an object", "reply.answers")
    asked = dict(questions)
    for name in answers:
        if name not in asked:
            raise _breach(
                f"reply.answers has an answer for {_shown(name)}, a question never asked", "reply.answers"
            )
    for name, question in asked.items():
        where = f"reply.answers.{name}"
        answer = answers.get(name)
        if not isinstance(answer, Mapping):
            raise _breach(f"{where} is missing or not an object", where)
        if "type" in answer and answer["type"] != question.type:
            raise _breach(
                f"{where}.type is {_shown(answer['type'])} for a {question.type} question", f"{where}.type"
            )
        _check_decision(answer.get("decision"), question, f"{where}.decision")
        for key in ("probability", "confidence"):
            _check_share(answer.get(key), f"{where}.{key}")
        alternatives = answer.get("alternatives")
        if isinstance(alternatives, list):
            for index, alternative in enumerate(alternatives):
                if isinstance(alternative, Mapping):
                    for key in ("probability", "confidence"):
                        _check_share(alternative.get(key), f"{where}.alternatives[{index}].{key}")


@dataclass(frozen=True, slots=True)
class Answer:
    """One question's answer.

    :param name: the question name.
    :param type: ``boolean`` or ``choice``.
    :param decision: ``True``/``False`` for boolean questions, the chosen option for choice questions.
    :param probability: the model's probability for ``decision`` (``None`` if not reported).
    :param confidence: the calibrated confidence (``None`` if not reported: treat as uncertain).
    :param alternatives: the other answers, each ``{"decision", "confidence"}``, best first.
    :param calibrated: whether ``confidence`` is calibrated.
    :param calibration_version: the calibration's version label.
    """

    name: str
    type: str
    decision: Any
    probability: float | None
    confidence: float | None
    alternatives: tuple[dict[str, Any], ...] = ()
    calibrated: bool | None = None
    calibration_version: str | None = None

    @classmethod
    def from_reply(cls, name: str, data: Mapping[str, Any]) -> Answer:
        """Read one entry of ``reply.answers``."""
        alternatives = data.get("alternatives")
        return cls(
            name=name,
            type=str(data.get("type", "")),
            decision=data.get("decision"),
            probability=share(data.get("probability")),
            confidence=share(data.get("confidence")),
            alternatives=tuple(a for a in alternatives if isinstance(a, Mapping))
            if isinstance(alternatives, list)
            else (),
            calibrated=data.get("calibrated") if isinstance(data.get("calibrated"), bool) else None,
            calibration_version=data.get("calibration_version")
            if isinstance(data.get("calibration_version"), str)
            else None,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON form: every field in declaration order but ``name`` (the key it is filed under)."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "name"}
        data["alternatives"] = [dict(a) for a in self.alternatives]
        return data


@dataclass(frozen=True, slots=True)
class DecisionResult:
    """A decision: the typed answers plus where it stands in the stream.

    Built by :meth:`from_message`, it holds the gateway's text only as
    :func:`~airflow_provider_systemzero.protocol.untrusted.safe_text` leaves it, but ``stream_id``.

    :param reply: the decide reply, every string (but the checked decisions) passed through
        :func:`~airflow_provider_systemzero.protocol.untrusted.safe_text`.
    :param state_version: the version it covers (the coverage watermark).
    :param covered_event_ids: the events newly covered by this dispatch.
    :param request_id: the decide call's request ID.
    :param stream_id: the stream that delivered it, as the gateway sent it: the client matches it
        against the connection's, so whatever shows or stores it passes it through ``safe_text``.
    :param answers: question name → :class:`Answer`.
    :param queue_ms: how long the dispatch waited at the gateway before it started (``None``: not reported).
    :param decide_ms: how long the decide call took (``None``: not reported).
    :param latency_ms: the gateway's end-to-end latency for the dispatch (``None``: not reported).
    """

    reply: dict[str, Any]
    state_version: int
    covered_event_ids: tuple[str, ...]
    request_id: str
    stream_id: str
    answers: Mapping[str, Answer] = field(default_factory=dict)
    queue_ms: float | None = None
    decide_ms: float | None = None
    latency_ms: float | None = None

    @classmethod
    def from_message(
        cls, message: Decision, questions: Sequence[tuple[str, Question]] | None = None
    ) -> DecisionResult:
        """Build from a ``decision`` message: its reply checked, then made safe to show and store.

        :param message: the decoded ``decision``.
        :param questions: the questions asked; when given the reply is checked first (:func:`check_reply`).
        :raises RemoteProtocolError: the reply cannot be stored (:func:`storable_reply`), a number it
            holds is out of range (:func:`check_reply_numbers`), or it does not answer the questions asked.
        """
        reply = storable_reply(message.reply)
        check_reply_numbers(message.reply)
        if questions is not None:
            check_reply(message, questions)
        raw = reply.get("answers")
        if questions is not None:
            # checked: each decision is true, false or one of the caller's own options, kept as the
            # caller wrote it (escaping would turn an option that is not printable into another)
            for name, answer in message.reply["answers"].items():
                raw[name]["decision"] = answer.get("decision")
        answers = (
            {
                name: Answer.from_reply(name, value)
                for name, value in raw.items()
                if isinstance(value, Mapping)
            }
            if isinstance(raw, Mapping)
            else {}
        )
        return cls(
            reply=reply,
            state_version=message.state_version,
            covered_event_ids=tuple(map(safe_text, message.covered_event_ids)),
            request_id=safe_text(message.request_id),
            stream_id=message.stream_id,
            answers=answers,
            queue_ms=_number(message.queue_ms),
            decide_ms=_number(message.decide_ms),
            latency_ms=_number(message.latency_ms),
        )

    @property
    def reply_id(self) -> str | None:
        """``reply.id`` (``szd_…``)."""
        value = self.reply.get("id")
        return value if isinstance(value, str) else None

    @property
    def model(self) -> str | None:
        """``reply.model``."""
        value = self.reply.get("model")
        return value if isinstance(value, str) else None

    @property
    def usage(self) -> dict[str, int]:
        """``reply.usage`` counters (missing ones are 0)."""
        raw = self.reply.get("usage")
        raw = raw if isinstance(raw, Mapping) else {}
        return {
            key: int(raw[key]) if isinstance(raw.get(key), int) and not isinstance(raw.get(key), bool) else 0
            for key in USAGE_FIELDS
        }

    def answer(self, question: str) -> Answer:
        """The answer to ``question``.

        :raises KeyError: naming the question and the answers present.
        """
        try:
            return self.answers[question]
        except KeyError:
            raise KeyError(
                f"the reply has no answer for question {question!r}; answers: {sorted(self.answers)}"
            ) from None

    def decisions(self) -> dict[str, Any]:
        """``{question: decision}`` for every answer."""
        return {name: answer.decision for name, answer in self.answers.items()}

    def to_summary(self) -> dict[str, Any]:
        """A small JSON summary (no state content): for trigger events, XCom and logs."""
        return {
            "reply_id": self.reply_id,
            "model": self.model,
            "state_version": self.state_version,
            "covered_event_ids": list(self.covered_event_ids),
            "request_id": self.request_id,
            "answers": {name: a.to_dict() for name, a in self.answers.items()},
            "usage": self.usage,
        }
