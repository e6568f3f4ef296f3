"""What ``start.request`` carries besides the state: inline attachments (:class:`Attachment`),
typed questions (:class:`Question`) and the parts fixed for a connection (:class:`StreamRequest`).

Each type declares its wire fields once (:func:`~airflow_provider_systemzero.protocol.wire.wire`);
its wire form and its strict reading come from that declaration. A question's *shape* (which
keys, which JSON types) is that declaration, read the same way from a frame and from a caller's
dict; its *rules* (a known type, instructions that say something, unique options) are
:meth:`Question.validate`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow_provider_systemzero.protocol.body import synthesize_decide_body
from airflow_provider_systemzero.protocol.errors import LocalProtocolError, did_you_mean
from airflow_provider_systemzero.protocol.validation import (
    QUESTION_TYPES,
    validate_attachments,
    validate_model,
    validate_prompt_cache_key,
    validate_question_name,
    validate_route_and_mode,
)
from airflow_provider_systemzero.protocol.wire import (
    Reader,
    RecordMap,
    StringTuple,
    decode_fields,
    encode_fields,
    wire,
)

__all__ = [
    "Attachment",
    "Question",
    "StreamRequest",
    "attachments_to_wire",
    "validate_attachment_tuple",
]


@dataclass(frozen=True, slots=True)
class Attachment:
    """An inline attachment: a name and a ``data:<mime>;base64,<payload>`` URL.

    :param name: unique name (letters, digits, ``_``, ``-``; starts with a letter; ≤ 64).
    :param data: the data URL.
    """

    name: str = wire("str")
    data: str = wire("str")

    def to_dict(self) -> dict[str, str]:
        """The wire form."""
        return encode_fields(self)


def attachments_to_wire(attachments: tuple[Attachment, ...] | list[Attachment]) -> list[dict[str, str]]:
    """Wire form of a list of attachments."""
    return [a.to_dict() for a in attachments]


def validate_attachment_tuple(
    attachments: tuple[Attachment, ...],
    *,
    field: str,
    existing: tuple[Attachment, ...] = (),
    allow_empty: bool = True,
) -> None:
    """Validate attachments (names, uniqueness against ``existing``, data URLs)."""
    validate_attachments(
        attachments_to_wire(attachments),
        field=field,
        existing=[a.name for a in existing],
        allow_empty=allow_empty,
    )


def _question_error(problem: str, field: str, path: str) -> Exception:
    return LocalProtocolError(
        f"{problem}: a question is {{type, instructions[, options]}}", code="invalid_question", field=path
    )


@dataclass(frozen=True, slots=True)
class Question:
    """A typed question.

    :param type: ``boolean`` or ``choice``.
    :param instructions: what to decide, in plain words.
    :param options: the options of a ``choice`` question (``None`` for ``boolean``).
    """

    type: str = wire("str")
    instructions: str = wire("str")
    options: tuple[str, ...] | None = wire(
        "array", optional=True, omit="none", codec=StringTuple(), default=None
    )

    def to_dict(self) -> dict[str, Any]:
        """The wire form (keys ``type``, ``instructions``, ``options``)."""
        return encode_fields(self)

    def validate(self, name: str) -> None:
        """Check the question's rules (its shape is its declaration).

        :raises LocalProtocolError: naming ``questions.<name>.<field>``.
        """
        where = f"questions.{name}"

        def fail(field: str, problem: str) -> LocalProtocolError:
            return LocalProtocolError(
                f"{where}.{field} {problem}", code="invalid_question", field=f"{where}.{field}"
            )

        if self.type not in QUESTION_TYPES:
            raise fail(
                "type",
                f"{self.type!r} is not one of {list(QUESTION_TYPES)}{did_you_mean(self.type, QUESTION_TYPES)}",
            )
        if not isinstance(self.instructions, str) or not self.instructions.strip():
            raise fail("instructions", "must be a non-empty string: every question says what to decide")
        if self.type == "boolean":
            if self.options is not None:
                raise fail("options", "is only allowed on a choice question")
            return
        if not self.options:
            raise fail("options", "must list at least one option for a choice question")
        seen: set[str] = set()
        for index, option in enumerate(self.options):
            if not isinstance(option, str) or not option.strip():
                raise fail(f"options[{index}]", "must be a non-empty string")
            if option in seen:
                raise fail(f"options[{index}]", f"{option!r} is listed twice: options are unique")
            seen.add(option)

    @classmethod
    def from_value(cls, value: Any, *, name: str = "?") -> Question:
        """Build a question from a :class:`Question` or its wire/dict form (``options`` optional,
        a list or a tuple), read by the same declaration as a ``start`` frame's questions.

        :raises LocalProtocolError: when the shape is wrong (for callers' input).
        """
        if isinstance(value, Question):
            return value
        where = f"questions.{name}"
        if not isinstance(value, Mapping):
            # the shorthand {name: text} of the operators, given where the wire form is read: its
            # text, in the form to write (any other value: an example)
            text = value if isinstance(value, str) and 0 < len(value.strip()) <= 80 else "Is the job ready?"
            raise LocalProtocolError(
                f"{where} must be an object {{type, instructions[, options]}}: write each question as "
                f"{{'type': 'boolean', 'instructions': {text!r}}} (or 'choice' with 'options'), or turn "
                "the shorthand into that form with airflow_provider_systemzero.questions.normalise_questions",
                code="invalid_question",
                field=where,
            )
        data = dict(value)
        if isinstance(data.get("options"), tuple):
            data["options"] = list(data["options"])
        return cls(**decode_fields(cls, Reader(data, where, strict=True, fail=_question_error)))


@dataclass(frozen=True, slots=True)
class StreamRequest:
    """The parts of ``start.request`` that stay fixed for a connection.

    ``state`` and ``attachments`` change over the stream and live in
    :class:`~airflow_provider_systemzero.protocol.messages.Start` and the mutations; questions,
    routing and the cache key may not change.

    :param model: the model ID.
    :param questions: name → :class:`Question`, in order.
    :param route: ``direct`` or ``committee`` (``None``: not sent, server default ``direct``).
    :param mode: ``fast`` or ``deliberate`` (``None``: not sent, server default ``fast``).
    :param prompt_cache_key: explicit cache key (``None``: the server uses the ``stream_id``).
    """

    model: str = wire("str")
    questions: tuple[tuple[str, Question], ...] = wire("object", codec=RecordMap(Question))
    route: str | None = wire("str", optional=True, omit="none", default=None)
    mode: str | None = wire("str", optional=True, omit="none", default=None)
    prompt_cache_key: str | None = wire("str", optional=True, omit="none", default=None)

    @classmethod
    def build(
        cls,
        *,
        model: str,
        questions: Mapping[str, Any],
        route: str | None = None,
        mode: str | None = None,
        prompt_cache_key: str | None = None,
    ) -> StreamRequest:
        """Build and validate a request from plain values.

        :param model: the model ID.
        :param questions: name → question (a :class:`Question` or ``{"type", "instructions"[, "options"]}``).
        :param route: ``direct`` or ``committee``.
        :param mode: ``fast`` or ``deliberate``.
        :param prompt_cache_key: explicit stable cache key.
        :raises LocalProtocolError: naming the first invalid field.
        """
        if not isinstance(questions, Mapping):
            raise LocalProtocolError(
                "questions must be an object mapping names to questions",
                code="invalid_questions",
                field="questions",
            )
        pairs = tuple((name, Question.from_value(q, name=str(name))) for name, q in questions.items())
        request = cls(model=model, questions=pairs, route=route, mode=mode, prompt_cache_key=prompt_cache_key)
        request.validate()
        return request

    def validate(self) -> None:
        """Check every rule of the request.

        :raises LocalProtocolError: naming the first invalid field.
        """
        validate_model(self.model)
        if not self.questions:
            raise LocalProtocolError(
                "questions must contain at least one question", code="invalid_questions", field="questions"
            )
        for name, question in self.questions:
            validate_question_name(name, field="question name")
            question.validate(name)
        validate_route_and_mode(self.route, self.mode)
        validate_prompt_cache_key(self.prompt_cache_key)

    @property
    def question_names(self) -> tuple[str, ...]:
        """The question names, in order."""
        return tuple(name for name, _ in self.questions)

    def questions_wire(self) -> dict[str, Any]:
        """The questions in wire form."""
        return {name: q.to_dict() for name, q in self.questions}

    def decide_body(
        self, state: Any, attachments: tuple[Attachment, ...], *, stream_id: str | None = None
    ) -> str:
        """The synthesized HTTP decide body for a state (WIRE.md §3).

        :param state: the state.
        :param attachments: the current attachments.
        :param stream_id: the fallback cache key when ``prompt_cache_key`` is ``None``.
        """
        cache_key = self.prompt_cache_key if self.prompt_cache_key is not None else stream_id
        if cache_key is None:
            raise LocalProtocolError(
                "prompt_cache_key is required to predict the decide body before the stream_id is known",
                code="invalid_prompt_cache_key",
                field="request.prompt_cache_key",
            )
        return synthesize_decide_body(
            model=self.model,
            state=state,
            questions=self.questions_wire(),
            attachments=attachments_to_wire(attachments),
            route=self.route,
            mode=self.mode,
            prompt_cache_key=cache_key,
        )
