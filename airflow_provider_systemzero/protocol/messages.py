"""Message types of the System Zero stream protocol (WIRE.md §2), with strict decoding and a
canonical encoding.

One immutable type per message, each field declared once with its wire form
(:func:`~airflow_provider_systemzero.protocol.wire.wire`): the encoding and the decoding are
derived from that declaration. :func:`decode_client_message` / :func:`decode_server_message`
turn one text frame into a message or raise
:class:`~airflow_provider_systemzero.protocol.errors.RemoteProtocolError` naming the field.
Decoding checks *shape* only — non-JSON, a non-object, an unknown ``type``, a missing or wrongly
typed field are *protocol refusals*; values that break a rule (a bad name, key or event ID) are
checked by the sessions and become *rejections*. :func:`encode_message` writes the canonical
compact JSON, keys in the order of the public example, so equal messages are byte-identical.

Client messages are decoded strictly (an unknown field is refused: it would silently change
nothing); server messages tolerate unknown fields so a newer gateway stays readable.

Every number of a server message has a range, declared with its field (``state_version`` 1 to
:data:`MAX_STATE_VERSION`, a dispatch's milliseconds 0 to :data:`MAX_DISPATCH_MS`, sizes up to
``max_decide_body_bytes``, ``http_status`` an HTTP status): a number outside it is refused naming
the field, so no value a gateway chooses reaches a computation the client cannot finish (a time
out of range, an overflow). The reply's own numbers are bounded where the reply is read
(:func:`~airflow_provider_systemzero.protocol.reply.check_reply_numbers`), the limits of ``hello``
and a server's retry delays are clamped (:meth:`Limits.from_hello`, :data:`MAX_SERVER_DELAY_MS`).

JSON-valued fields (``state``, ``items``, ``reply``) hold plain JSON values; treat them as
read-only. The request's value types (:class:`Attachment`, :class:`Question`,
:class:`StreamRequest`) live in :mod:`~airflow_provider_systemzero.protocol.request`.
"""

# ruff: noqa: RUF009 - wire() returns a dataclasses.field, whose defaults are immutable

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any, ClassVar, TypeAlias

from airflow_provider_systemzero.protocol.body import compact_json
from airflow_provider_systemzero.protocol.errors import (
    MAX_SERVER_DELAY_MS,
    ErrorEnvelope,
    RemoteProtocolError,
    RetryHint,
)
from airflow_provider_systemzero.protocol.limits import DOCUMENT_LIMITS, Limits
from airflow_provider_systemzero.protocol.request import (
    Attachment,
    Question,
    StreamRequest,
    attachments_to_wire,
    validate_attachment_tuple,
)
from airflow_provider_systemzero.protocol.wire import (
    MAX_SAFE_INTEGER,
    Reader,
    Record,
    RecordTuple,
    StringTuple,
    Via,
    decode_fields,
    encode_fields,
    load_object,
    wire,
)

__all__ = [
    "HTTP_STATUSES",
    "MAX_DISPATCH_MS",
    "MAX_SAFE_INTEGER",
    "MAX_STATE_VERSION",
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
    "attachments_to_wire",
    "decode_client_message",
    "decode_server_message",
    "encode_message",
    "event_id",
    "event_number",
    "sent_event_id",
    "validate_attachment_tuple",
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
# the message base
# --------------------------------------------------------------------------------------------


class _Message:
    TYPE: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        """The wire object: ``type`` first, then the declared fields in canonical order."""
        return encode_fields(self, {"type": self.TYPE})


def _capped(delay_ms: int | None) -> int | None:
    return None if delay_ms is None else min(delay_ms, MAX_SERVER_DELAY_MS)


def _text_or_empty(value: str | None) -> str:
    return value or ""


def _key() -> Any:
    """``idempotency_key``: the key of the state version a mutation makes, sent when set."""
    return wire("str", optional=True, omit="none", default=None)


_ATTACHMENTS = RecordTuple(Attachment, code="invalid_attachment")

# --------------------------------------------------------------------------------------------
# client → server
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Start(_Message):
    """``start``: opens the stream with the full state (``evt_1``).

    On the wire the state and the attachments sit inside ``request``, around the fixed parts:
    ``{model, state, questions, attachments, route, mode, prompt_cache_key}``.

    :param event_id: always ``evt_1`` on a valid start.
    :param request: the fixed request parts.
    :param state: the initial state (string, array or object).
    :param decision_mode: ``on_change`` or ``on_request``.
    :param attachments: initial inline attachments.
    :param min_interval_ms: minimum time between dispatch starts (0 … 60000), or ``None``.
    :param idempotency_key: key of state version 1, or ``None``.
    """

    TYPE: ClassVar[str] = "start"
    event_id: str = wire("str")
    request: StreamRequest = wire("object", codec=Record(StreamRequest))
    state: Any = wire("state", at="request", after="model")
    decision_mode: str = wire("str")
    attachments: tuple[Attachment, ...] = wire(
        "array",
        at="request",
        after="questions",
        optional=True,
        omit="empty",
        codec=_ATTACHMENTS,
        absent=(),
        default=(),
    )
    min_interval_ms: int | None = wire("int", optional=True, omit="none", default=None)
    idempotency_key: str | None = _key()


@dataclass(frozen=True, slots=True)
class AppendText(_Message):
    """``append_text``: concatenate ``text`` to a string state."""

    TYPE: ClassVar[str] = "append_text"
    event_id: str = wire("str")
    text: str = wire("str")
    idempotency_key: str | None = _key()


@dataclass(frozen=True, slots=True)
class AppendItems(_Message):
    """``append_items``: append complete values to an array state."""

    TYPE: ClassVar[str] = "append_items"
    event_id: str = wire("str")
    items: list[Any] = wire("array")
    idempotency_key: str | None = _key()


@dataclass(frozen=True, slots=True)
class Replace(_Message):
    """``replace``: a complete new state; ``attachments=None`` keeps the current list, ``()`` removes all."""

    TYPE: ClassVar[str] = "replace"
    event_id: str = wire("str")
    state: Any = wire("state")
    attachments: tuple[Attachment, ...] | None = wire(
        "array", optional=True, omit="none", codec=_ATTACHMENTS, default=None
    )
    idempotency_key: str | None = _key()


@dataclass(frozen=True, slots=True)
class AppendAttachments(_Message):
    """``append_attachments``: add inline attachments; the state is unchanged."""

    TYPE: ClassVar[str] = "append_attachments"
    event_id: str = wire("str")
    attachments: tuple[Attachment, ...] = wire("array", codec=_ATTACHMENTS)
    idempotency_key: str | None = _key()


@dataclass(frozen=True, slots=True)
class Decide(_Message):
    """``decide`` (on_request): ask for a decision on the current accepted version."""

    TYPE: ClassVar[str] = "decide"
    state_version: int = wire("int")


@dataclass(frozen=True, slots=True)
class Pong(_Message):
    """``pong``: the answer to a JSON ``ping``, with the same nonce."""

    TYPE: ClassVar[str] = "pong"
    nonce: int = wire("int")


Mutation: TypeAlias = Start | AppendText | AppendItems | Replace | AppendAttachments
ClientMessage: TypeAlias = Mutation | Decide | Pong

# --------------------------------------------------------------------------------------------
# server → client
# --------------------------------------------------------------------------------------------

# The range of every number a server message carries is declared with its field (wire()'s
# ``minimum`` / ``maximum``); a number outside it is a refusal naming the field, never a value the
# client computes with. Every number is finite and every integer within ±(2**53 - 1) first
# (:func:`decode_server_message`). The limits of ``hello`` are clamped instead
# (:meth:`Limits.from_hello`), and so is a server's retry delay (:data:`MAX_SERVER_DELAY_MS`).

#: The highest ``state_version`` a connection can reach: each accepted event makes one version, and
#: the gateway ends the stream at ``max_events`` events (``start`` is version 1).
MAX_STATE_VERSION = DOCUMENT_LIMITS.max_events
#: The longest a dispatch can wait or take, in milliseconds (``queue_ms``, ``decide_ms``,
#: ``latency_ms``): it starts and ends within one stream, which lives at most ``max_duration_ms``.
MAX_DISPATCH_MS = DOCUMENT_LIMITS.max_duration_ms
#: What an ``http_status`` may be: an HTTP status code.
HTTP_STATUSES = (100, 599)


def _version(*, optional: bool = False) -> Any:
    """A ``state_version``: 1 to :data:`MAX_STATE_VERSION` (0 too where it may be absent)."""
    return wire(
        "int",
        optional=optional,
        minimum=0 if optional else 1,
        maximum=MAX_STATE_VERSION,
        why="a connection's versions count its accepted events, at most max_events",
    )


def _dispatch_ms(default: int | None) -> Any:
    """A dispatch's ``queue_ms``, ``decide_ms`` or ``latency_ms``: 0 to :data:`MAX_DISPATCH_MS`."""
    return wire(
        "number",
        optional=True,
        minimum=0,
        maximum=MAX_DISPATCH_MS,
        why="a dispatch starts and ends within one stream, which lives at most max_duration_ms",
        default=default,
    )


def _http_status(*, optional: bool = False, default: Any = dataclasses.MISSING) -> Any:
    """An ``http_status``: an HTTP status code, 100 to 599."""
    low, high = HTTP_STATUSES
    return wire(
        "int", optional=optional, minimum=low, maximum=high, why="an HTTP status code", default=default
    )


def _body_bytes() -> Any:
    """A size in bytes of the state or the decide body: at most ``max_decide_body_bytes``."""
    return wire(
        "int",
        minimum=0,
        maximum=DOCUMENT_LIMITS.max_decide_body_bytes,
        why="the state lives in the decide body, which is at most max_decide_body_bytes",
    )


@dataclass(frozen=True, slots=True)
class _ServerMessage(_Message):
    """What every server message carries first: its stream and its sequence number (from 1)."""

    stream_id: str = wire("str")
    seq: int = wire("int", minimum=1)


@dataclass(frozen=True, slots=True)
class Hello(_ServerMessage):
    """``hello``: the first server message, with the limits of this connection."""

    TYPE: ClassVar[str] = "hello"
    protocol: str = wire("str")
    request_id: str = wire("str")
    limits: Limits = wire(
        "object", codec=Via(lambda value, field: Limits.from_hello(value), Limits.advertised)
    )
    rate_limit: dict[str, Any] | None = wire("object", optional=True, default=None)


@dataclass(frozen=True, slots=True)
class Ack(_ServerMessage):
    """``ack``: a mutation was accepted into gateway memory (no decision, bill or durable save)."""

    TYPE: ClassVar[str] = "ack"
    event_id: str = wire("str")
    state_version: int = _version()
    state_bytes: int = _body_bytes()
    synthesized_body_bytes: int = _body_bytes()
    scheduled: bool = wire("bool")


@dataclass(frozen=True, slots=True)
class Scheduled(_ServerMessage):
    """``scheduled``: the answer to ``decide``; ``in_flight`` when another decide runs first."""

    TYPE: ClassVar[str] = "scheduled"
    state_version: int = _version()
    in_flight: bool = wire("bool")


@dataclass(frozen=True, slots=True)
class Decision(_ServerMessage):
    """``decision``: a successful dispatch, embedding the ordinary HTTP reply.

    ``state_version`` is the coverage watermark; ``covered_event_ids`` the events newly covered.
    A missing ``queue_ms`` / ``decide_ms`` / ``latency_ms`` reads as ``None``.
    """

    TYPE: ClassVar[str] = "decision"
    state_version: int = _version()
    covered_event_ids: tuple[str, ...] = wire("array", codec=StringTuple())
    reply: dict[str, Any] = wire("object")
    request_id: str = wire("str", nullable=True, convert=_text_or_empty)
    http_status: int = _http_status(default=200)
    server_timing: Any = wire(optional=True, default=None)
    latency_ms: Any = _dispatch_ms(None)
    rate_limit: Any = wire(optional=True, default=None)
    queue_ms: int | float | None = _dispatch_ms(0)
    decide_ms: int | float | None = _dispatch_ms(0)


def _envelope(value: Any, field: str) -> ErrorEnvelope:
    return ErrorEnvelope.from_dict(value, field=field)


def _retry(value: Any, field: str) -> RetryHint:
    return RetryHint.from_dict(value, field=field)


@dataclass(frozen=True, slots=True)
class Error(_ServerMessage):
    """``error``: a rejection, a refusal or a failed dispatch; ``fatal`` is followed by a close.

    On the wire the envelope and the retry hint sit in ``error: {envelope, retry}``.
    """

    TYPE: ClassVar[str] = "error"
    event_id: str | None = wire("str", optional=True)
    state_version: int | None = _version(optional=True)
    http_status: int | None = _http_status(optional=True)
    request_id: str = wire("str", nullable=True, convert=_text_or_empty)
    fatal: bool = wire("bool")
    envelope: ErrorEnvelope = wire("object", at="error", codec=Via(_envelope, ErrorEnvelope.to_dict))
    retry: RetryHint = wire(
        "object",
        at="error",
        codec=Via(_retry, RetryHint.to_dict),
        default_factory=lambda: RetryHint(retryable=False),
    )

    @property
    def code(self) -> str:
        """The envelope's error code."""
        return self.envelope.code


@dataclass(frozen=True, slots=True)
class Ping(_ServerMessage):
    """``ping``: answer with ``pong`` and the same nonce within ``pong_timeout_ms``."""

    TYPE: ClassVar[str] = "ping"
    nonce: int = wire("int")


@dataclass(frozen=True, slots=True)
class Goodbye(_ServerMessage):
    """``goodbye``: the server is about to close; reconnect and replay after ``retry_after_ms``.

    On the wire the delay sits in ``resume``, after the two fixed facts of v1: the stream cannot
    be resumed, the client reconnects and replays. A delay over the cap reads as the cap.
    """

    TYPE: ClassVar[str] = "goodbye"
    reason: str = wire("str")
    state_version: int | None = _version(optional=True)
    last_decision_state_version: int | None = _version(optional=True)
    resume_supported: bool = wire("bool", key="supported", at="resume", const=False)
    resume_action: str = wire("str", key="action", at="resume", const="reconnect_and_replay")
    retry_after_ms: int | None = wire(
        "int", at="resume", optional=True, minimum=0, convert=_capped, default=None
    )


ServerMessage: TypeAlias = Hello | Ack | Scheduled | Decision | Error | Ping | Goodbye

_CLIENT_TYPES: dict[str, type[Any]] = {
    cls.TYPE: cls for cls in (Start, AppendText, AppendItems, Replace, AppendAttachments, Decide, Pong)
}
_SERVER_TYPES: dict[str, type[Any]] = {
    cls.TYPE: cls for cls in (Hello, Ack, Scheduled, Decision, Error, Ping, Goodbye)
}
_TYPE = frozenset({"type"})

# --------------------------------------------------------------------------------------------
# encode / decode
# --------------------------------------------------------------------------------------------


def sent_event_id(text: str) -> str | None:
    """The ``event_id`` a frame carried, if it is a JSON object with a string one — also when it
    is refused or rejected, so that the error can name the event.

    :param text: the frame.
    """
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return None
    value = data.get("event_id") if isinstance(data, dict) else None
    return value if isinstance(value, str) else None


def encode_message(message: ClientMessage | ServerMessage) -> str:
    """Canonical compact JSON text of a message (one text frame)."""
    return compact_json(message.to_dict())


def _message_class(types: dict[str, type[Any]], kind: str, side: str) -> type[Any]:
    cls = types.get(kind)
    if cls is None:
        raise RemoteProtocolError(
            f"unknown {side} message type {kind!r}",
            code="unknown_message_type",
            field="type",
            protocol_refusal=True,
        )
    return cls


def decode_client_message(text: str | bytes) -> ClientMessage:
    """Decode one client frame strictly.

    :param text: the frame (``bytes`` stands for a binary frame and is always refused).
    :raises RemoteProtocolError: a refusal naming the field, or — for a well-typed message with an
        unknown field — a rejection (``protocol_refusal`` false; ``invalid_attachment`` inside an attachment).
    """
    data = load_object(text)
    kind = data["type"]
    cls = _message_class(_CLIENT_TYPES, kind, "client")
    unknown: list[tuple[str, str]] = []
    message = cls(**decode_fields(cls, Reader(data, kind, strict=True, unknown=unknown), also=_TYPE))
    if unknown:
        path, code = unknown[0]
        raise RemoteProtocolError(
            f"{path} is not a field of this message: remove it",
            code=code,
            field=path.partition(".")[2],
            protocol_refusal=False,
        )
    return message


def decode_server_message(text: str | bytes) -> ServerMessage:
    """Decode one server frame strictly (unknown fields are tolerated).

    :param text: the frame (``bytes`` stands for a binary frame and is always refused).
    Numbers must be finite and integers within ±(2**53 - 1) (``NaN``, ``Infinity``, ``1e999999``
    and a 400-digit integer are refused), so no value a gateway sends overflows later.

    :raises RemoteProtocolError: naming the field.
    """
    data = load_object(text, strict_numbers=True)
    kind = data["type"]
    cls = _message_class(_SERVER_TYPES, kind, "server")
    return cls(**decode_fields(cls, Reader(data, kind)))
