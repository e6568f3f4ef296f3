"""Message types of the System Zero stream protocol (WIRE.md §2), with strict decoding and a
canonical encoding.

One immutable type per message. :func:`decode_client_message` / :func:`decode_server_message`
turn one text frame into a message or raise
:class:`~airflow_provider_systemzero.protocol.errors.RemoteProtocolError` naming the field.
Decoding checks *shape* only — non-JSON, a non-object, an unknown ``type``, a missing or wrongly
typed field are *protocol refusals*; values that break a rule (a bad name, key or event ID) are
checked by the sessions and become *rejections*. :func:`encode_message` writes the canonical
compact JSON, keys in the order of the public example, so equal messages are byte-identical.

Client messages are decoded strictly (an unknown field is refused: it would silently change
nothing); server messages tolerate unknown fields so a newer gateway stays readable.

JSON-valued fields (``state``, ``items``, ``reply``) hold plain JSON values; treat them as
read-only.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeAlias

from airflow_provider_systemzero.protocol.body import compact_json, synthesize_decide_body
from airflow_provider_systemzero.protocol.errors import (
    MAX_SERVER_DELAY_MS,
    ErrorEnvelope,
    LocalProtocolError,
    RemoteProtocolError,
    RetryHint,
)
from airflow_provider_systemzero.protocol.limits import Limits
from airflow_provider_systemzero.protocol.validation import (
    QUESTION_TYPES,
    validate_attachments,
    validate_model,
    validate_prompt_cache_key,
    validate_question_name,
    validate_route_and_mode,
)

__all__ = [
    "PROTOCOL",
    "Ack",
    "AppendAttachments",
    "AppendItems",
    "AppendText",
    "Attachment",
    "ClientMessage",
    "Decide",
    "Decision",
    "Error",
    "Goodbye",
    "Hello",
    "Mutation",
    "Ping",
    "Pong",
    "Question",
    "Replace",
    "Scheduled",
    "ServerMessage",
    "Start",
    "StreamRequest",
    "decode_client_message",
    "decode_server_message",
    "encode_message",
    "event_id",
    "event_number",
]

#: The one subprotocol of v1.
PROTOCOL = "system-zero.stream.v1"

_EVENT_ID = re.compile(r"evt_([1-9][0-9]*)\Z")


def event_id(number: int) -> str:
    """The event ID of the ``number``-th mutation of a connection (``start`` is ``evt_1``)."""
    return f"evt_{number}"


def event_number(value: str) -> int | None:
    """The number of an event ID (``"evt_7"`` → 7), or ``None`` if it is not precisely ``evt_N``."""
    match = _EVENT_ID.match(value)
    return int(match.group(1)) if match else None


# --------------------------------------------------------------------------------------------
# strict field reading
# --------------------------------------------------------------------------------------------


def _refuse(problem: str, field: str | None) -> RemoteProtocolError:
    return RemoteProtocolError(problem, code="invalid_message", field=field, refusal=True)


class _Reader:
    """Reads typed fields from a decoded JSON object, refusing anything mistyped."""

    def __init__(
        self, data: Mapping[str, Any], where: str, unknown: list[tuple[str, str]] | None = None
    ) -> None:
        self.data = data
        self.where = where
        #: Where :meth:`only` notes unknown fields (path, rejection code) instead of refusing them;
        #: ``None`` refuses at once.
        self.unknown = unknown

    def nested(self, data: Mapping[str, Any], where: str) -> _Reader:
        """A reader for an object inside this one, noting unknown fields in the same place."""
        return _Reader(data, where, self.unknown)

    def _get(self, name: str, required: bool) -> Any:
        if name not in self.data:
            if required:
                raise _refuse(f"{self.where} is missing required field {name!r}", name)
            return None
        return self.data[name]

    def str(self, name: str, *, required: bool = True, nullable: bool = False) -> Any:
        value = self._get(name, required)
        if value is None and (nullable or not required):
            return None
        if not isinstance(value, str):
            raise _refuse(f"{self.where}.{name} must be a string, got {_json_type(value)}", name)
        return value

    def int(
        self, name: str, *, required: bool = True, nullable: bool = False, minimum: int | None = None
    ) -> Any:
        value = self._get(name, required)
        if value is None and (nullable or not required):
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise _refuse(f"{self.where}.{name} must be an integer, got {_json_type(value)}", name)
        if minimum is not None and value < minimum:
            raise _refuse(f"{self.where}.{name} must be at least {minimum}, got {value}", name)
        return value

    def number(self, name: str, *, nullable: bool = True) -> Any:
        value = self._get(name, False)
        if value is None and nullable:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _refuse(f"{self.where}.{name} must be a number or null, got {_json_type(value)}", name)
        return value

    def bool(self, name: str) -> bool:
        value = self._get(name, True)
        if not isinstance(value, bool):
            raise _refuse(f"{self.where}.{name} must be a boolean, got {_json_type(value)}", name)
        return value

    def obj(self, name: str, *, required: bool = True, nullable: bool = False) -> Any:
        value = self._get(name, required)
        if value is None and (nullable or not required):
            return None
        if not isinstance(value, dict):
            raise _refuse(f"{self.where}.{name} must be an object, got {_json_type(value)}", name)
        return value

    def array(self, name: str, *, required: bool = True) -> Any:
        value = self._get(name, required)
        if value is None and not required:
            return None
        if not isinstance(value, list):
            raise _refuse(f"{self.where}.{name} must be an array, got {_json_type(value)}", name)
        return value

    def state(self, name: str) -> Any:
        value = self._get(name, True)
        if not isinstance(value, str | list | dict):
            raise _refuse(
                f"{self.where}.{name} must be a string, an array or an object, got {_json_type(value)}", name
            )
        return value

    def only(self, allowed: set[str], *, code: str = "unknown_field") -> None:
        """Unknown fields: noted as a rejection with ``code`` (client messages, WIRE.md §2 lists
        the refusals exhaustively and an unknown field is not among them), else refused."""
        unknown = sorted(set(self.data) - allowed)
        if not unknown:
            return
        if self.unknown is None:
            raise _refuse(f"{self.where} has unknown field {unknown[0]!r}", unknown[0])
        self.unknown.append((f"{self.where}.{unknown[0]}", code))


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _parse_attachment_list(value: list[Any], where: str, parent: _Reader) -> tuple[Attachment, ...]:
    result = []
    for index, item in enumerate(value):
        if not isinstance(item, dict):
            raise _refuse(f"{where}[{index}] must be an object", f"{where}[{index}]")
        reader = parent.nested(item, f"{where}[{index}]")
        reader.only({"name", "data"}, code="invalid_attachment")
        result.append(Attachment(name=reader.str("name"), data=reader.str("data")))
    return tuple(result)


# --------------------------------------------------------------------------------------------
# shared value types
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Attachment:
    """An inline attachment: a name and a ``data:<mime>;base64,<payload>`` URL.

    :param name: unique name (letters, digits, ``_``, ``-``; starts with a letter; ≤ 64).
    :param data: the data URL.
    """

    name: str
    data: str

    def to_dict(self) -> dict[str, str]:
        """The wire form."""
        return {"name": self.name, "data": self.data}


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


@dataclass(frozen=True, slots=True)
class Question:
    """A typed question.

    :param type: ``boolean`` or ``choice``.
    :param instructions: what to decide, in plain words.
    :param options: the options of a ``choice`` question (``None`` for ``boolean``).
    """

    type: str
    instructions: str
    options: tuple[str, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The wire form (keys ``type``, ``instructions``, ``options``)."""
        data: dict[str, Any] = {"type": self.type, "instructions": self.instructions}
        if self.options is not None:
            data["options"] = list(self.options)
        return data

    def validate(self, name: str) -> None:
        """Check the question's shape.

        :raises LocalProtocolError: naming ``questions.<name>.<field>``.
        """
        where = f"questions.{name}"
        if self.type not in QUESTION_TYPES:
            raise LocalProtocolError(
                f"{where}.type {self.type!r} is not one of {list(QUESTION_TYPES)}",
                code="invalid_question",
                field=f"{where}.type",
            )
        if not isinstance(self.instructions, str) or not self.instructions.strip():
            raise LocalProtocolError(
                f"{where}.instructions must be a non-empty string: every question says what to decide",
                code="invalid_question",
                field=f"{where}.instructions",
            )
        if self.type == "boolean":
            if self.options is not None:
                raise LocalProtocolError(
                    f"{where}.options is only allowed on a choice question",
                    code="invalid_question",
                    field=f"{where}.options",
                )
            return
        if not self.options:
            raise LocalProtocolError(
                f"{where}.options must list at least one option for a choice question",
                code="invalid_question",
                field=f"{where}.options",
            )
        seen: set[str] = set()
        for index, option in enumerate(self.options):
            if not isinstance(option, str) or not option.strip():
                raise LocalProtocolError(
                    f"{where}.options[{index}] must be a non-empty string",
                    code="invalid_question",
                    field=f"{where}.options[{index}]",
                )
            if option in seen:
                raise LocalProtocolError(
                    f"{where}.options[{index}] {option!r} is listed twice: options are unique",
                    code="invalid_question",
                    field=f"{where}.options[{index}]",
                )
            seen.add(option)

    @classmethod
    def from_value(cls, value: Any, *, name: str = "?") -> Question:
        """Build a question from a :class:`Question` or its wire/dict form (``options`` optional).

        :raises LocalProtocolError: when the shape is wrong (for callers' input).
        """
        if isinstance(value, Question):
            return value
        where = f"questions.{name}"
        if not isinstance(value, Mapping):
            raise LocalProtocolError(
                f"{where} must be an object {{type, instructions[, options]}}",
                code="invalid_question",
                field=where,
            )
        unknown = sorted(set(value) - {"type", "instructions", "options"})
        if unknown:
            raise LocalProtocolError(
                f"{where} has unknown field {unknown[0]!r}: a question is {{type, instructions[, options]}}",
                code="invalid_question",
                field=f"{where}.{unknown[0]}",
            )
        options = value.get("options")
        if options is not None:
            if not isinstance(options, list | tuple):
                raise LocalProtocolError(
                    f"{where}.options must be an array of strings",
                    code="invalid_question",
                    field=f"{where}.options",
                )
            options = tuple(options)
        question = cls(type=value.get("type"), instructions=value.get("instructions"), options=options)
        return question


@dataclass(frozen=True, slots=True)
class StreamRequest:
    """The parts of ``start.request`` that stay fixed for a connection.

    ``state`` and ``attachments`` change over the stream and live in :class:`Start` and the
    mutations; questions, routing and the cache key may not change.

    :param model: the model ID.
    :param questions: name → :class:`Question`, in order.
    :param route: ``direct`` or ``committee`` (``None``: not sent, server default ``direct``).
    :param mode: ``fast`` or ``deliberate`` (``None``: not sent, server default ``fast``).
    :param prompt_cache_key: explicit cache key (``None``: the server uses the ``stream_id``).
    """

    model: str
    questions: tuple[tuple[str, Question], ...]
    route: str | None = None
    mode: str | None = None
    prompt_cache_key: str | None = None

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

    def to_wire(self, state: Any, attachments: tuple[Attachment, ...] = ()) -> dict[str, Any]:
        """``start.request`` for a state, keys in canonical order."""
        data: dict[str, Any] = {"model": self.model, "state": state, "questions": self.questions_wire()}
        if attachments:
            data["attachments"] = attachments_to_wire(attachments)
        if self.route is not None:
            data["route"] = self.route
        if self.mode is not None:
            data["mode"] = self.mode
        if self.prompt_cache_key is not None:
            data["prompt_cache_key"] = self.prompt_cache_key
        return data

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


# --------------------------------------------------------------------------------------------
# client → server
# --------------------------------------------------------------------------------------------


class _Message:
    TYPE: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:  # pragma: no cover - overridden
        raise NotImplementedError


def _with_key(data: dict[str, Any], key: str | None) -> dict[str, Any]:
    if key is not None:
        data["idempotency_key"] = key
    return data


@dataclass(frozen=True, slots=True)
class Start(_Message):
    """``start``: opens the stream with the full state (``evt_1``).

    :param event_id: always ``evt_1`` on a valid start.
    :param request: the fixed request parts.
    :param state: the initial state (string, array or object).
    :param decision_mode: ``on_change`` or ``on_request``.
    :param attachments: initial inline attachments.
    :param min_interval_ms: minimum time between dispatch starts (0 … 60000), or ``None``.
    :param idempotency_key: key of state version 1, or ``None``.
    """

    TYPE: ClassVar[str] = "start"
    event_id: str
    request: StreamRequest
    state: Any
    decision_mode: str
    attachments: tuple[Attachment, ...] = ()
    min_interval_ms: int | None = None
    idempotency_key: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "type": self.TYPE,
            "event_id": self.event_id,
            "request": self.request.to_wire(self.state, self.attachments),
            "decision_mode": self.decision_mode,
        }
        if self.min_interval_ms is not None:
            data["min_interval_ms"] = self.min_interval_ms
        return _with_key(data, self.idempotency_key)


@dataclass(frozen=True, slots=True)
class AppendText(_Message):
    """``append_text``: concatenate ``text`` to a string state."""

    TYPE: ClassVar[str] = "append_text"
    event_id: str
    text: str
    idempotency_key: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return _with_key(
            {"type": self.TYPE, "event_id": self.event_id, "text": self.text}, self.idempotency_key
        )


@dataclass(frozen=True, slots=True)
class AppendItems(_Message):
    """``append_items``: append complete values to an array state."""

    TYPE: ClassVar[str] = "append_items"
    event_id: str
    items: list[Any]
    idempotency_key: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return _with_key(
            {"type": self.TYPE, "event_id": self.event_id, "items": self.items}, self.idempotency_key
        )


@dataclass(frozen=True, slots=True)
class Replace(_Message):
    """``replace``: a complete new state; ``attachments=None`` keeps the current list, ``()`` removes all."""

    TYPE: ClassVar[str] = "replace"
    event_id: str
    state: Any
    attachments: tuple[Attachment, ...] | None = None
    idempotency_key: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"type": self.TYPE, "event_id": self.event_id, "state": self.state}
        if self.attachments is not None:
            data["attachments"] = attachments_to_wire(self.attachments)
        return _with_key(data, self.idempotency_key)


@dataclass(frozen=True, slots=True)
class AppendAttachments(_Message):
    """``append_attachments``: add inline attachments; the state is unchanged."""

    TYPE: ClassVar[str] = "append_attachments"
    event_id: str
    attachments: tuple[Attachment, ...]
    idempotency_key: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return _with_key(
            {
                "type": self.TYPE,
                "event_id": self.event_id,
                "attachments": attachments_to_wire(self.attachments),
            },
            self.idempotency_key,
        )


@dataclass(frozen=True, slots=True)
class Decide(_Message):
    """``decide`` (on_request): ask for a decision on the current accepted version."""

    TYPE: ClassVar[str] = "decide"
    state_version: int

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.TYPE, "state_version": self.state_version}


@dataclass(frozen=True, slots=True)
class Pong(_Message):
    """``pong``: the answer to a JSON ``ping``, with the same nonce."""

    TYPE: ClassVar[str] = "pong"
    nonce: int

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.TYPE, "nonce": self.nonce}


Mutation: TypeAlias = Start | AppendText | AppendItems | Replace | AppendAttachments
ClientMessage: TypeAlias = Mutation | Decide | Pong

# --------------------------------------------------------------------------------------------
# server → client
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello(_Message):
    """``hello``: the first server message, with the limits of this connection."""

    TYPE: ClassVar[str] = "hello"
    stream_id: str
    seq: int
    protocol: str
    request_id: str
    limits: Limits
    rate_limit: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "stream_id": self.stream_id,
            "seq": self.seq,
            "protocol": self.protocol,
            "request_id": self.request_id,
            "limits": self.limits.advertised(),
            "rate_limit": self.rate_limit,
        }


@dataclass(frozen=True, slots=True)
class Ack(_Message):
    """``ack``: a mutation was accepted into gateway memory (no decision, bill or durable save)."""

    TYPE: ClassVar[str] = "ack"
    stream_id: str
    seq: int
    event_id: str
    state_version: int
    state_bytes: int
    synthesized_body_bytes: int
    scheduled: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "stream_id": self.stream_id,
            "seq": self.seq,
            "event_id": self.event_id,
            "state_version": self.state_version,
            "state_bytes": self.state_bytes,
            "synthesized_body_bytes": self.synthesized_body_bytes,
            "scheduled": self.scheduled,
        }


@dataclass(frozen=True, slots=True)
class Scheduled(_Message):
    """``scheduled``: the answer to ``decide``; ``in_flight`` when another decide runs first."""

    TYPE: ClassVar[str] = "scheduled"
    stream_id: str
    seq: int
    state_version: int
    in_flight: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "stream_id": self.stream_id,
            "seq": self.seq,
            "state_version": self.state_version,
            "in_flight": self.in_flight,
        }


@dataclass(frozen=True, slots=True)
class Decision(_Message):
    """``decision``: a successful dispatch, embedding the ordinary HTTP reply.

    ``state_version`` is the coverage watermark; ``covered_event_ids`` the events newly covered.
    """

    TYPE: ClassVar[str] = "decision"
    stream_id: str
    seq: int
    state_version: int
    covered_event_ids: tuple[str, ...]
    reply: dict[str, Any]
    request_id: str
    http_status: int = 200
    server_timing: Any = None
    latency_ms: Any = None
    rate_limit: Any = None
    queue_ms: int | float | None = 0
    decide_ms: int | float | None = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "stream_id": self.stream_id,
            "seq": self.seq,
            "state_version": self.state_version,
            "covered_event_ids": list(self.covered_event_ids),
            "reply": self.reply,
            "request_id": self.request_id,
            "http_status": self.http_status,
            "server_timing": self.server_timing,
            "latency_ms": self.latency_ms,
            "rate_limit": self.rate_limit,
            "queue_ms": self.queue_ms,
            "decide_ms": self.decide_ms,
        }


@dataclass(frozen=True, slots=True)
class Error(_Message):
    """``error``: a rejection, a refusal or a failed dispatch; ``fatal`` is followed by a close."""

    TYPE: ClassVar[str] = "error"
    stream_id: str
    seq: int
    event_id: str | None
    state_version: int | None
    http_status: int | None
    request_id: str
    fatal: bool
    envelope: ErrorEnvelope
    retry: RetryHint = field(default_factory=lambda: RetryHint(retryable=False))

    @property
    def code(self) -> str:
        """The envelope's error code."""
        return self.envelope.code

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "stream_id": self.stream_id,
            "seq": self.seq,
            "event_id": self.event_id,
            "state_version": self.state_version,
            "http_status": self.http_status,
            "request_id": self.request_id,
            "fatal": self.fatal,
            "error": {"envelope": self.envelope.to_dict(), "retry": self.retry.to_dict()},
        }


@dataclass(frozen=True, slots=True)
class Ping(_Message):
    """``ping``: answer with ``pong`` and the same nonce within ``pong_timeout_ms``."""

    TYPE: ClassVar[str] = "ping"
    stream_id: str
    seq: int
    nonce: int

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.TYPE, "stream_id": self.stream_id, "seq": self.seq, "nonce": self.nonce}


@dataclass(frozen=True, slots=True)
class Goodbye(_Message):
    """``goodbye``: the server is about to close; reconnect and replay after ``retry_after_ms``."""

    TYPE: ClassVar[str] = "goodbye"
    stream_id: str
    seq: int
    reason: str
    state_version: int | None
    last_decision_state_version: int | None
    retry_after_ms: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "stream_id": self.stream_id,
            "seq": self.seq,
            "reason": self.reason,
            "state_version": self.state_version,
            "last_decision_state_version": self.last_decision_state_version,
            "resume": {
                "supported": False,
                "action": "reconnect_and_replay",
                "retry_after_ms": self.retry_after_ms,
            },
        }


ServerMessage: TypeAlias = Hello | Ack | Scheduled | Decision | Error | Ping | Goodbye

# --------------------------------------------------------------------------------------------
# encode / decode
# --------------------------------------------------------------------------------------------


def encode_message(message: ClientMessage | ServerMessage) -> str:
    """Canonical compact JSON text of a message (one text frame)."""
    return compact_json(message.to_dict())


#: The largest integer a server message may carry (I-JSON, RFC 7493: exact in every JSON parser).
MAX_SAFE_INTEGER = 2**53 - 1


def _safe_int(text: str) -> int:
    value = int(text)
    if not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
        raise _refuse(
            f"the frame holds the integer {text[:24]}{'…' if len(text) > 24 else ''} ({len(text)} "
            f"digits), outside ±(2**53 - 1): a number every JSON parser reads exactly",
            None,
        )
    return value


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _refuse(
            f"the frame holds the number {text[:24]!r}, which overflows to infinity: JSON numbers are finite",
            None,
        )
    return value


def _no_constant(name: str) -> Any:
    raise _refuse(f"the frame holds {name}, which is not JSON: numbers are finite", None)


def _load_object(text: str | bytes, *, strict_numbers: bool = False) -> dict[str, Any]:
    if isinstance(text, bytes | bytearray | memoryview):
        raise _refuse(
            "binary frames are not allowed: every message is one text frame holding a JSON object", None
        )
    try:
        data = (
            json.loads(text, parse_int=_safe_int, parse_float=_finite_float, parse_constant=_no_constant)
            if strict_numbers
            else json.loads(text)
        )
    except (ValueError, RecursionError):
        raise _refuse(
            "the frame is not valid JSON: every message is one text frame holding a JSON object", None
        ) from None
    if not isinstance(data, dict):
        raise _refuse(f"the frame holds a JSON {_json_type(data)}, not an object", None)
    kind = data.get("type")
    if not isinstance(kind, str):
        raise _refuse("the message has no string 'type'", "type")
    return data


def _decode_start(r: _Reader) -> Start:
    r.only({"type", "event_id", "request", "decision_mode", "min_interval_ms", "idempotency_key"})
    request = r.obj("request")
    rr = r.nested(request, "start.request")
    rr.only({"model", "state", "questions", "attachments", "route", "mode", "prompt_cache_key"})
    questions = rr.obj("questions")
    pairs = []
    for name, value in questions.items():
        if not isinstance(value, dict):
            raise _refuse(f"start.request.questions.{name} must be an object", f"request.questions.{name}")
        qr = rr.nested(value, f"start.request.questions.{name}")
        qr.only({"type", "instructions", "options"})
        options = qr.array("options", required=False)
        if options is not None:
            for index, option in enumerate(options):
                if not isinstance(option, str):
                    raise _refuse(
                        f"start.request.questions.{name}.options[{index}] must be a string",
                        f"request.questions.{name}.options[{index}]",
                    )
            options = tuple(options)
        pairs.append(
            (name, Question(type=qr.str("type"), instructions=qr.str("instructions"), options=options))
        )
    attachments = rr.array("attachments", required=False)
    stream_request = StreamRequest(
        model=rr.str("model"),
        questions=tuple(pairs),
        route=rr.str("route", required=False),
        mode=rr.str("mode", required=False),
        prompt_cache_key=rr.str("prompt_cache_key", required=False),
    )
    return Start(
        event_id=r.str("event_id"),
        request=stream_request,
        state=rr.state("state"),
        decision_mode=r.str("decision_mode"),
        attachments=_parse_attachment_list(attachments, "start.request.attachments", rr)
        if attachments
        else (),
        min_interval_ms=r.int("min_interval_ms", required=False),
        idempotency_key=r.str("idempotency_key", required=False),
    )


def decode_client_message(text: str | bytes) -> ClientMessage:
    """Decode one client frame strictly.

    :param text: the frame (``bytes`` stands for a binary frame and is always refused).
    :raises RemoteProtocolError: a refusal naming the field, or — for a well-typed message with an
        unknown field — a rejection (``refusal`` false; ``invalid_attachment`` inside an attachment).
    """
    data = _load_object(text)
    unknown: list[tuple[str, str]] = []
    message = _decode_client_object(_Reader(data, data["type"], unknown))
    if unknown:
        path, code = unknown[0]
        raise RemoteProtocolError(
            f"{path} is not a field of this message: remove it",
            code=code,
            field=path.partition(".")[2],
            refusal=False,
        )
    return message


def _decode_client_object(r: _Reader) -> ClientMessage:
    kind = r.where
    if kind == "start":
        return _decode_start(r)
    if kind == "append_text":
        r.only({"type", "event_id", "text", "idempotency_key"})
        return AppendText(r.str("event_id"), r.str("text"), r.str("idempotency_key", required=False))
    if kind == "append_items":
        r.only({"type", "event_id", "items", "idempotency_key"})
        return AppendItems(r.str("event_id"), r.array("items"), r.str("idempotency_key", required=False))
    if kind == "replace":
        r.only({"type", "event_id", "state", "attachments", "idempotency_key"})
        attachments = r.array("attachments", required=False)
        return Replace(
            r.str("event_id"),
            r.state("state"),
            None if attachments is None else _parse_attachment_list(attachments, "replace.attachments", r),
            r.str("idempotency_key", required=False),
        )
    if kind == "append_attachments":
        r.only({"type", "event_id", "attachments", "idempotency_key"})
        return AppendAttachments(
            r.str("event_id"),
            _parse_attachment_list(r.array("attachments"), "append_attachments.attachments", r),
            r.str("idempotency_key", required=False),
        )
    if kind == "decide":
        r.only({"type", "state_version"})
        return Decide(r.int("state_version"))
    if kind == "pong":
        r.only({"type", "nonce"})
        return Pong(r.int("nonce"))
    raise RemoteProtocolError(
        f"unknown client message type {kind!r}", code="unknown_message_type", field="type", refusal=True
    )


def decode_server_message(text: str | bytes) -> ServerMessage:
    """Decode one server frame strictly (unknown fields are tolerated).

    :param text: the frame (``bytes`` stands for a binary frame and is always refused).
    Numbers must be finite and integers within ±(2**53 - 1) (``NaN``, ``Infinity``, ``1e999999``
    and a 400-digit integer are refused), so no value a gateway sends overflows later.

    :raises RemoteProtocolError: naming the field.
    """
    data = _load_object(text, strict_numbers=True)
    kind = data["type"]
    r = _Reader(data, kind)
    if kind not in _SERVER_TYPES:
        raise RemoteProtocolError(
            f"unknown server message type {kind!r}", code="unknown_message_type", field="type", refusal=True
        )
    stream_id = r.str("stream_id")
    seq = r.int("seq", minimum=1)
    if kind == "hello":
        limits = Limits.from_hello(r.obj("limits"))
        return Hello(
            stream_id,
            seq,
            r.str("protocol"),
            r.str("request_id"),
            limits,
            r.obj("rate_limit", required=False, nullable=True),
        )
    if kind == "ack":
        return Ack(
            stream_id,
            seq,
            r.str("event_id"),
            r.int("state_version", minimum=1),
            r.int("state_bytes", minimum=0),
            r.int("synthesized_body_bytes", minimum=0),
            r.bool("scheduled"),
        )
    if kind == "scheduled":
        return Scheduled(stream_id, seq, r.int("state_version", minimum=1), r.bool("in_flight"))
    if kind == "decision":
        covered = r.array("covered_event_ids")
        for index, item in enumerate(covered):
            if not isinstance(item, str):
                raise _refuse(f"decision.covered_event_ids[{index}] must be a string", "covered_event_ids")
        return Decision(
            stream_id,
            seq,
            r.int("state_version", minimum=1),
            tuple(covered),
            r.obj("reply"),
            r.str("request_id", nullable=True) or "",
            r.int("http_status"),
            data.get("server_timing"),
            r.number("latency_ms"),
            data.get("rate_limit"),
            r.number("queue_ms"),
            r.number("decide_ms"),
        )
    if kind == "error":
        err = r.obj("error")
        er = _Reader(err, "error.error")
        envelope = ErrorEnvelope.from_dict(er.obj("envelope"), field="error.envelope")
        retry = RetryHint.from_dict(er.obj("retry"), field="error.retry")
        return Error(
            stream_id,
            seq,
            r.str("event_id", required=False, nullable=True),
            r.int("state_version", required=False, nullable=True),
            r.int("http_status", required=False, nullable=True),
            r.str("request_id", nullable=True) or "",
            r.bool("fatal"),
            envelope,
            retry,
        )
    if kind == "ping":
        return Ping(stream_id, seq, r.int("nonce"))
    # goodbye
    resume = r.obj("resume")
    rr = _Reader(resume, "goodbye.resume")
    return Goodbye(
        stream_id,
        seq,
        r.str("reason"),
        r.int("state_version", required=False, nullable=True),
        r.int("last_decision_state_version", required=False, nullable=True),
        _capped(rr.int("retry_after_ms", required=False, nullable=True, minimum=0)),
    )


def _capped(delay_ms: int | None) -> int | None:
    return None if delay_ms is None else min(delay_ms, MAX_SERVER_DELAY_MS)


_SERVER_TYPES = frozenset({"hello", "ack", "scheduled", "decision", "error", "ping", "goodbye"})
