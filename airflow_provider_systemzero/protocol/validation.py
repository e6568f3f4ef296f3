"""Value rules of the stream protocol (public document "Shared fields"; WIRE.md §2–3).

Each function raises :class:`~airflow_provider_systemzero.protocol.errors.LocalProtocolError`
with a message that names the field, the problem and the rule, and returns the (normalised)
value when it is valid. The client calls them before anything is sent; the gateway calls them
on received messages and turns a failure into a rejection.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_provider_systemzero.protocol.errors import LocalProtocolError, did_you_mean

__all__ = [
    "DECISION_MODES",
    "MODES",
    "QUESTION_TYPES",
    "ROUTES",
    "json_fault",
    "not_json_message",
    "validate_attachment_name",
    "validate_data_url",
    "validate_decision_mode",
    "validate_idempotency_key",
    "validate_min_interval_ms",
    "validate_model",
    "validate_prompt_cache_key",
    "validate_question_name",
    "validate_route_and_mode",
    "validate_state",
]

QUESTION_TYPES = ("boolean", "choice")
ROUTES = ("direct", "committee")
MODES = ("fast", "deliberate")
DECISION_MODES = ("on_change", "on_request")
MAX_NAME_LENGTH = 64
MAX_KEY_LENGTH = 255
MAXIMUM_DECISION_INTERVAL_MS = 60_000

_QUESTION_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_ATTACHMENT_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*\Z")
_MIME = re.compile(r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*\Z")
_PRINTABLE_ASCII = re.compile(r"[\x20-\x7e]*\Z")


def _fail(field: str, problem: str, rule: str, code: str) -> LocalProtocolError:
    return LocalProtocolError(f"{field} {problem}: {rule}", code=code, field=field)


@dataclass(frozen=True, slots=True)
class _NameRule:
    """What a name may hold (questions and attachments differ only in these).

    :param rule: the rule in words, ending every error.
    :param code: the error code.
    :param first: whether a character may start the name (an ASCII one).
    :param first_words: the characters that may start it, in words.
    :param whole: the whole name's pattern.
    :param whole_words: the characters allowed, in words.
    """

    rule: str
    code: str
    first: Callable[[str], bool]
    first_words: str
    whole: re.Pattern[str]
    whole_words: str

    def check(self, name: Any, field: str) -> str:
        """The name, or the error naming ``field``, the problem and the rule."""
        if not isinstance(name, str):
            raise _fail(field, f"must be a string, got {type(name).__name__}", self.rule, self.code)
        label = f"{field} {name!r}"
        if not name:
            raise _fail(label, "is empty", self.rule, self.code)
        if len(name) > MAX_NAME_LENGTH:
            raise _fail(label, f"is {len(name)} characters long", self.rule, self.code)
        if not (name[0].isascii() and self.first(name[0])):
            raise LocalProtocolError(
                f"{label} must start with {self.first_words}: {self.rule}", code=self.code, field=field
            )
        if not self.whole.match(name):
            raise _fail(label, f"contains a character other than {self.whole_words}", self.rule, self.code)
        return name


_QUESTION_NAME_RULE = _NameRule(
    "question names use at most 64 ASCII letters, digits and underscores, starting with a letter or underscore",
    "invalid_question_name",
    lambda first: first.isalpha() or first == "_",
    "a letter or underscore",
    _QUESTION_NAME,
    "an ASCII letter, digit or underscore",
)
_ATTACHMENT_NAME_RULE = _NameRule(
    "attachment names use at most 64 ASCII letters, digits, underscores or hyphens, starting with a letter",
    "invalid_attachment_name",
    str.isalpha,
    "a letter",
    _ATTACHMENT_NAME,
    "an ASCII letter, digit, underscore or hyphen",
)


def validate_question_name(name: Any, *, field: str = "question name") -> str:
    """Check a question name: at most 64 ASCII letters, digits and underscores, starting with a
    letter or underscore.

    :param name: the name.
    :param field: how to name the field in the error.
    """
    return _QUESTION_NAME_RULE.check(name, field)


def validate_attachment_name(name: Any, *, field: str = "attachment name") -> str:
    """Check an attachment name: at most 64 ASCII letters, digits, underscores or hyphens,
    starting with a letter.

    :param name: the name.
    :param field: how to name the field in the error.
    """
    return _ATTACHMENT_NAME_RULE.check(name, field)


def validate_data_url(data: Any, *, field: str = "attachment data") -> str:
    """Check an inline attachment: ``data:<mime>;base64,<payload>`` with a valid base64 payload.

    The MIME type lives in the data URL; there is no separate MIME field.

    :param data: the data URL.
    :param field: how to name the field in the error.
    """
    rule = "inline attachment data is a data URL 'data:<mime>;base64,<payload>'"
    if not isinstance(data, str):
        raise _fail(field, f"must be a string, got {type(data).__name__}", rule, "invalid_attachment")
    if not data.startswith("data:"):
        raise _fail(field, "does not start with 'data:'", rule, "invalid_attachment")
    header, sep, payload = data[5:].partition(",")
    if not sep:
        raise _fail(field, "has no ',' before the payload", rule, "invalid_attachment")
    mime, sep, encoding = header.partition(";")
    if not sep or encoding != "base64":
        raise _fail(field, "is not base64-encoded (';base64' missing)", rule, "invalid_attachment")
    if not _MIME.match(mime):
        raise _fail(field, f"has an invalid MIME type {mime!r}", rule, "invalid_attachment")
    if not payload:
        raise _fail(field, "has an empty payload", rule, "invalid_attachment")
    try:
        base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise _fail(field, "has a payload that is not valid base64", rule, "invalid_attachment") from None
    return data


def validate_attachments(
    attachments: Any, *, field: str = "attachments", existing: Iterable[str] = (), allow_empty: bool = True
) -> list[dict[str, str]]:
    """Check a list of attachments ``{"name", "data"}``: valid names, unique (also against
    ``existing`` names), valid data URLs.

    :param attachments: the list.
    :param field: how to name the field in the error.
    :param existing: names already present (for ``append_attachments``).
    :param allow_empty: whether ``[]`` is allowed (``replace``: yes; ``append_attachments``: no).
    :return: the attachments as plain dicts, in order.
    """
    if not isinstance(attachments, list | tuple):
        raise LocalProtocolError(
            f"{field} must be an array of attachments, got {type(attachments).__name__}",
            code="invalid_attachment",
            field=field,
        )
    if not attachments and not allow_empty:
        raise LocalProtocolError(
            f"{field} must not be empty: append_attachments carries at least one attachment",
            code="invalid_attachment",
            field=field,
        )
    seen = set(existing)
    result = []
    for index, item in enumerate(attachments):
        where = f"{field}[{index}]"
        if not isinstance(item, Mapping):
            raise LocalProtocolError(
                f"{where} must be an object with 'name' and 'data'", code="invalid_attachment", field=where
            )
        extra = set(item) - {"name", "data"}
        if extra:
            raise LocalProtocolError(
                f"{where} has unknown field(s) {sorted(extra)}: an attachment is {{name, data}}; "
                "the MIME type lives in the data URL",
                code="invalid_attachment",
                field=where,
            )
        name = validate_attachment_name(item.get("name"), field=f"{where}.name")
        if name in seen:
            raise LocalProtocolError(
                f"{where}.name {name!r} is used twice: attachment names must be unique",
                code="duplicate_attachment_name",
                field=f"{where}.name",
            )
        seen.add(name)
        result.append({"name": name, "data": validate_data_url(item.get("data"), field=f"{where}.data")})
    return result


def validate_idempotency_key(key: Any, *, field: str = "idempotency_key") -> str:
    """Check an idempotency key: 1 to 255 printable ASCII characters after trimming surrounding
    ASCII spaces.

    :param key: the key.
    :param field: how to name the field in the error.
    :return: the trimmed key (the value sent as ``Idempotency-Key``).
    """
    rule = (
        "idempotency keys contain 1 to 255 printable ASCII characters after trimming surrounding ASCII spaces"
    )
    if not isinstance(key, str):
        raise _fail(field, f"must be a string, got {type(key).__name__}", rule, "invalid_idempotency_key")
    trimmed = key.strip(" ")
    if not trimmed:
        raise _fail(field, "is empty after trimming spaces", rule, "invalid_idempotency_key")
    if len(trimmed) > MAX_KEY_LENGTH:
        raise _fail(field, f"is {len(trimmed)} characters long", rule, "invalid_idempotency_key")
    if not _PRINTABLE_ASCII.match(trimmed):
        raise _fail(
            field, "contains a character that is not printable ASCII", rule, "invalid_idempotency_key"
        )
    return trimmed


def validate_route_and_mode(
    route: Any, mode: Any, *, route_field: str = "request.route", mode_field: str = "request.mode"
) -> tuple[str | None, str | None]:
    """Check ``route`` (``direct``/``committee``) and ``mode`` (``fast``/``deliberate``), either may
    be omitted (``None``); ``committee`` with ``deliberate`` is refused.

    :param route_field: how to name the route in the error.
    :param mode_field: how to name the mode in the error.
    """
    if route is not None and route not in ROUTES:
        raise LocalProtocolError(
            f"{route_field} {route!r} is not one of {list(ROUTES)}{did_you_mean(route, ROUTES)}",
            code="invalid_route",
            field=route_field,
        )
    if mode is not None and mode not in MODES:
        raise LocalProtocolError(
            f"{mode_field} {mode!r} is not one of {list(MODES)}{did_you_mean(mode, MODES)}",
            code="invalid_mode",
            field=mode_field,
        )
    if route == "committee" and mode == "deliberate":
        raise LocalProtocolError(
            f"{route_field} 'committee' cannot be combined with {mode_field} 'deliberate': "
            "do not combine route committee with mode deliberate",
            code="incompatible_route_mode",
            field=mode_field,
        )
    return route, mode


def validate_min_interval_ms(value: Any, *, maximum: int = MAXIMUM_DECISION_INTERVAL_MS) -> int | None:
    """Check ``min_interval_ms``: an integer from 0 to ``maximum_decision_interval`` (60000), or ``None``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise LocalProtocolError(
            f"min_interval_ms must be an integer number of milliseconds from 0 to {maximum}, "
            f"got {type(value).__name__} {value!r}",
            code="invalid_min_interval",
            field="min_interval_ms",
        )
    if not 0 <= value <= maximum:
        raise _fail(
            "min_interval_ms",
            f"{value!r} is out of range",
            f"min_interval_ms is an integer from 0 to {maximum} (maximum_decision_interval)",
            "invalid_min_interval",
        )
    return value


def validate_decision_mode(value: Any) -> str:
    """Check ``decision_mode``: ``on_change`` or ``on_request``."""
    if value not in DECISION_MODES:
        raise LocalProtocolError(
            f"decision_mode {value!r} is not one of {list(DECISION_MODES)}{did_you_mean(value, DECISION_MODES)}",
            code="invalid_decision_mode",
            field="decision_mode",
        )
    return value


def validate_state(state: Any, *, field: str = "state") -> Any:
    """Check that a state is a string, an array or an object (and JSON-serialisable)."""
    if not isinstance(state, str | list | dict):
        raise LocalProtocolError(
            f"{field} must be a string, an array or an object, got {type(state).__name__}",
            code="invalid_state",
            field=field,
        )
    return state


#: What to give instead of a value JSON cannot carry, by its type's name.
_JSON_FIXES = {
    "datetime": "its text: str(value), or value.isoformat()",
    "date": "its text: str(value), or value.isoformat()",
    "time": "its text: str(value), or value.isoformat()",
    "timedelta": "a number of seconds: value.total_seconds()",
    "Decimal": "float(value), or str(value) to keep every digit",
    "UUID": "its text: str(value)",
    "set": "a list: sorted(value)",
    "frozenset": "a list: sorted(value)",
    "bytes": "text: value.decode() (or base64 for binary data)",
    "bytearray": "text: value.decode() (or base64 for binary data)",
}


def _type_name(value: Any) -> str:
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def _fault(value: Any, path: str, holders: set[int]) -> tuple[str, str, str] | None:
    if value is None or isinstance(value, str | bool | int):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else (path, f"the number {value!r}", "a finite number, or None")
    if isinstance(value, list | tuple | dict):
        if id(value) in holders:
            return (
                path,
                f"the {type(value).__name__} that holds it",
                "a copy that does not refer back to itself",
            )
        holders.add(id(value))
        try:
            if isinstance(value, dict):
                for key, item in value.items():
                    if key is not None and not isinstance(key, str | int | float | bool):
                        return (
                            path,
                            f"an object with a key of type {_type_name(key)}",
                            "string keys: str(key)",
                        )
                    found = _fault(item, f"{path}[{key!r}]", holders)
                    if found is not None:
                        return found
            else:
                for index, item in enumerate(value):
                    found = _fault(item, f"{path}[{index}]", holders)
                    if found is not None:
                        return found
        finally:
            holders.discard(id(value))
        return None
    fix = _JSON_FIXES.get(type(value).__name__, "its text, str(value), or the plain JSON values it holds")
    name = _type_name(value)
    return path, f"{'an' if name[0].lower() in 'aeiou' else 'a'} {name}", fix


def json_fault(value: Any, *, root: str = "state") -> tuple[str, str, str] | None:
    """The first value inside ``value`` that JSON cannot carry (compact JSON refuses it), depth
    first, or ``None`` when there is none (or the value nests too deep to search).

    :param value: the value, e.g. a state.
    :param root: the name its path starts with.
    :return: ``(path, what, instead)``: the path to the value (``state['deploy']['started']``), what
        it is (``a datetime.datetime``) and what to give instead (``its text: str(value), …``).
    """
    try:
        return _fault(value, root, set())
    except RecursionError:
        return None


def not_json_message(
    value: Any, field: str, error: BaseException, *, root: str = "state", templated: bool = False
) -> str:
    """Why ``value`` cannot be sent, naming the path to the first value JSON cannot carry and what
    to give instead (:func:`json_fault`).

    :param value: the value compact JSON refused.
    :param field: what the value is called where it was given (``state``, an upstream task's output).
    :param error: the encoder's error (quoted when no single value is to blame).
    :param root: the name the path starts with.
    :param templated: the value is a templated argument: a template that renders to text is a fix too.
    """
    found = json_fault(value, root=root)
    if found is None:
        return f"{field} is not JSON ({error}): give plain JSON values (text, numbers, lists, objects); nothing was sent"
    path, what, instead = found
    where = "" if field == root else f" ({field})"
    # a value of the wrong type (not a number, a key or a loop) can come from a template as text
    template = (
        " — or a template that renders it as text, e.g. '{{ ts }}'" if templated and "text" in instead else ""
    )
    return f"{path} is {what}, which JSON cannot carry{where}: give {instead}{template}; nothing was sent"


def validate_model(model: Any) -> str:
    """Check ``request.model``: a non-empty string."""
    if not isinstance(model, str) or not model.strip():
        raise LocalProtocolError(
            f"request.model must be a non-empty string, got {model!r}",
            code="invalid_model",
            field="request.model",
        )
    return model


def validate_prompt_cache_key(value: Any) -> str | None:
    """Check ``request.prompt_cache_key``: omitted, or 1 to 255 printable ASCII characters."""
    if value is None:
        return None
    if (
        not isinstance(value, str)
        or not value
        or len(value) > MAX_KEY_LENGTH
        or not _PRINTABLE_ASCII.match(value)
    ):
        raise _fail(
            "request.prompt_cache_key",
            f"{value!r} is invalid",
            "a prompt cache key is 1 to 255 printable ASCII characters",
            "invalid_prompt_cache_key",
        )
    return value
