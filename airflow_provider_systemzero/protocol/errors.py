"""Errors of the System Zero stream protocol, in the style of h11.

The tree::

    ProtocolError                    (abstract: never raised directly)
    ├── LocalProtocolError           our side would break a rule: raised *before* anything is sent
    └── RemoteProtocolError          the peer broke a rule: its frame is refused or rejected

Every protocol error carries ``code`` (the wire error code, e.g. ``invalid_question_name``),
``field`` (the dotted path of the offending field, or ``None``) and a message that names the
field, the problem and the rule.

Two value types travel with decision failures and refusals:

* :class:`ErrorEnvelope` — ``{"error": {"type", "code", "message"}}``, the HTTP API's error body
  (WIRE.md §6).
* :class:`RetryHint` — ``{"retryable", "retry_after_ms"}``; built from HTTP headers,
  ``Retry-After-Ms`` beats ``Retry-After`` (public document, "Errors and close codes").
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ERROR_TYPES",
    "MAX_SERVER_DELAY_MS",
    "ErrorEnvelope",
    "LocalProtocolError",
    "ProtocolError",
    "RemoteProtocolError",
    "RetryHint",
    "did_you_mean",
    "refuse",
]

#: The error envelope types of WIRE.md §6.
ERROR_TYPES: frozenset[str] = frozenset(
    {
        "invalid_request_error",
        "authentication_error",
        "rate_limit_error",
        "idempotency_error",
        "api_error",
        "overloaded_error",
    }
)


class ProtocolError(Exception):
    """A rule of the stream protocol was broken.

    :param message: what is wrong, naming the field, the problem and the rule.
    :param code: the wire error code (``invalid_message``, ``event_id_out_of_sequence`` …).
    :param field: dotted path of the offending field, or ``None``.
    """

    def __init__(self, message: str, *, code: str, field: str | None = None) -> None:
        if type(self) is ProtocolError:
            raise TypeError("ProtocolError is abstract; raise LocalProtocolError or RemoteProtocolError")
        super().__init__(message)
        self.message = message
        self.code = code
        self.field = field

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, field={self.field!r}, message={self.message!r})"


class LocalProtocolError(ProtocolError, ValueError):
    """Our side (the caller) asked for something the protocol forbids; nothing was sent."""


class RemoteProtocolError(ProtocolError):
    """The peer sent something the protocol forbids.

    :param protocol_refusal: ``True`` for a *protocol refusal* (malformed frame, unknown type, a missing or
        wrongly typed field — WIRE.md §2), ``False`` for a *rejection* (a well-formed message whose
        values break a rule).
    """

    def __init__(
        self, message: str, *, code: str, field: str | None = None, protocol_refusal: bool = False
    ) -> None:
        super().__init__(message, code=code, field=field)
        self.protocol_refusal = protocol_refusal

    @classmethod
    def from_local(cls, exc: LocalProtocolError) -> RemoteProtocolError:
        """Re-raise a validation failure found in the peer's data as a rejection."""
        return cls(exc.message, code=exc.code, field=exc.field, protocol_refusal=False)


def refuse(problem: str, field: str | None) -> RemoteProtocolError:
    """A protocol refusal (``invalid_message``) naming the field.

    :param problem: what is wrong, in words.
    :param field: the field, or ``None`` for the frame as a whole.
    """
    return RemoteProtocolError(problem, code="invalid_message", field=field, protocol_refusal=True)


@dataclass(frozen=True, slots=True)
class ErrorEnvelope:
    """The HTTP API's error body: ``{"error": {"type": T, "code": C, "message": M}}``.

    :param type: one of :data:`ERROR_TYPES` (unknown types from a newer server are kept as-is).
    :param code: machine-readable code, e.g. ``rate_limited``.
    :param message: human-readable explanation.
    """

    type: str
    code: str
    message: str

    def to_dict(self) -> dict[str, Any]:
        """The wire form."""
        return {"error": {"type": self.type, "code": self.code, "message": self.message}}

    @classmethod
    def from_dict(cls, data: Any, *, field: str = "envelope") -> ErrorEnvelope:
        """Parse the wire form strictly.

        :raises RemoteProtocolError: (a refusal) naming the field when the shape is wrong.
        """
        inner = data.get("error") if isinstance(data, Mapping) else None
        if not isinstance(inner, Mapping):
            raise refuse(f"{field}.error must be an object", f"{field}.error")
        values = {}
        for key in ("type", "code", "message"):
            value = inner.get(key)
            if not isinstance(value, str):
                raise refuse(
                    f"{field}.error.{key} must be a string, got {type(value).__name__}",
                    f"{field}.error.{key}",
                )
            values[key] = value
        return cls(**values)


#: The longest delay a server may ask for (``goodbye.resume.retry_after_ms``, ``error.retry``,
#: ``Retry-After-Ms`` / ``Retry-After``): a longer one is read as this many milliseconds (5 minutes).
MAX_SERVER_DELAY_MS = 300_000


def _parse_non_negative_number(value: str) -> float | None:
    try:
        number = float(value.strip())
    except ValueError:
        return None
    if not math.isfinite(number) or number < 0:
        return None
    return number


@dataclass(frozen=True, slots=True)
class RetryHint:
    """Whether and when a failed call may be retried.

    :param retryable: the server permits a retry.
    :param retry_after_ms: the server's minimum delay before a retry, or ``None``.
    """

    retryable: bool
    retry_after_ms: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The wire form."""
        return {"retryable": self.retryable, "retry_after_ms": self.retry_after_ms}

    @classmethod
    def from_dict(cls, data: Any, *, field: str = "retry") -> RetryHint:
        """Parse the wire form strictly.

        :raises RemoteProtocolError: (a refusal) naming the field when the shape is wrong.
        """
        if not isinstance(data, Mapping):
            raise refuse(f"{field} must be an object", field)
        retryable = data.get("retryable")
        if not isinstance(retryable, bool):
            raise refuse(f"{field}.retryable must be a boolean", f"{field}.retryable")
        delay = data.get("retry_after_ms")
        if delay is not None and (isinstance(delay, bool) or not isinstance(delay, int) or delay < 0):
            raise refuse(
                f"{field}.retry_after_ms must be a non-negative integer or null", f"{field}.retry_after_ms"
            )
        return cls(
            retryable=retryable, retry_after_ms=None if delay is None else min(delay, MAX_SERVER_DELAY_MS)
        )

    @staticmethod
    def delay_from_headers(headers: Mapping[str, str]) -> int | None:
        """The server's retry delay in milliseconds from HTTP headers, or ``None``.

        ``Retry-After-Ms`` takes precedence over ``Retry-After`` (seconds). HTTP-date forms of
        ``Retry-After`` are not used by System Zero and are ignored. A delay is capped at
        :data:`MAX_SERVER_DELAY_MS`.

        :param headers: response headers; names are matched case-insensitively.
        """
        lowered = {k.lower(): v for k, v in headers.items()}
        if "retry-after-ms" in lowered:
            number = _parse_non_negative_number(lowered["retry-after-ms"])
            if number is not None:
                return math.ceil(min(number, MAX_SERVER_DELAY_MS))
        if "retry-after" in lowered:
            number = _parse_non_negative_number(lowered["retry-after"])
            if number is not None:
                return math.ceil(min(number * 1000, MAX_SERVER_DELAY_MS))
        return None

    @classmethod
    def from_headers(cls, headers: Mapping[str, str], *, retryable: bool) -> RetryHint:
        """Build a hint from HTTP response headers.

        :param headers: response headers.
        :param retryable: whether the status permits a retry.
        """
        return cls(retryable=retryable, retry_after_ms=cls.delay_from_headers(headers))


def did_you_mean(value: Any, choices: Iterable[Any]) -> str:
    """``"; did you mean 'x'?"`` when ``value`` is a near miss of one of ``choices`` (a typo such
    as ``choise`` or ``files``), else ``""``: the words every refusal of a closed set of words ends
    with, so a message names the word that was meant.

    :param value: the word given.
    :param choices: the words allowed.
    """
    if not isinstance(value, str):
        return ""
    words = [choice for choice in choices if isinstance(choice, str)]
    close = difflib.get_close_matches(value, words, n=1, cutoff=0.6) or difflib.get_close_matches(
        value.lower(), words, n=1, cutoff=0.6
    )
    return f"; did you mean {close[0]!r}?" if close else ""
