"""Fault injection for the emulator: scripted decide failures, refused upgrades, delays and a
silent peer.

Restart and the abrupt drop of every socket are actions, not standing faults: see
:meth:`Emulator.restart <airflow_provider_systemzero.emulator.server.Emulator.restart>` and
:meth:`Emulator.drop_all <airflow_provider_systemzero.emulator.server.Emulator.drop_all>`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass
from typing import Any, Self

from airflow_provider_systemzero.protocol.errors import ErrorEnvelope, RetryHint
from airflow_provider_systemzero.protocol.upgrade import UpgradeRefusal

__all__ = ["DecideFailureSpec", "Faults", "UpgradeRefusalSpec", "default_error_code", "default_error_type"]


def default_error_type(status: int) -> str:
    """The envelope type the ordinary API uses for an HTTP status (WIRE.md §6)."""
    if status == 429:
        return "rate_limit_error"
    if status in (401, 403):
        return "authentication_error"
    if status in (409, 422):
        return "idempotency_error"
    if status in (503, 529):
        return "overloaded_error"
    if status >= 500:
        return "api_error"
    return "invalid_request_error"


def default_error_code(status: int) -> str:
    """A plausible envelope code for an HTTP status."""
    return {
        400: "invalid_request",
        401: "invalid_api_key",
        403: "forbidden",
        404: "not_found",
        409: "idempotency_conflict",
        422: "idempotency_key_reused",
        429: "rate_limited",
        500: "internal_error",
        503: "overloaded",
        529: "overloaded",
    }.get(status, "emulated_failure")


@dataclass(frozen=True, slots=True)
class _ScriptedError:
    """What every scripted failure answers with: an HTTP status and an error envelope."""

    status: int
    code: str
    error_type: str

    @classmethod
    def for_status(cls, status: int, code: str | None, error_type: str | None, *rest: Any) -> Self:
        """A failure with ``status``, its envelope code and type defaulted from the status.

        :param status: the HTTP status.
        :param code: the envelope code, or ``None`` for :func:`default_error_code`.
        :param error_type: the envelope type, or ``None`` for :func:`default_error_type`.
        :param rest: the subclass's own fields, in order.
        """
        return cls(
            status, code or default_error_code(status), error_type or default_error_type(status), *rest
        )

    def _envelope(self, what: str) -> ErrorEnvelope:
        return ErrorEnvelope(self.error_type, self.code, f"emulated {what}: HTTP {self.status} {self.code}")


@dataclass(frozen=True, slots=True)
class DecideFailureSpec(_ScriptedError):
    """One scripted decide failure.

    :param status: the HTTP status.
    :param code: the envelope code.
    :param error_type: the envelope type.
    :param retry_after_ms: the ``Retry-After-Ms`` header, or ``None``.
    :param retry_after_s: the ``Retry-After`` header (seconds), or ``None``.
    :param retryable: whether the response permits a retry.
    """

    retry_after_ms: int | None = None
    retry_after_s: int | None = None
    retryable: bool = True

    def headers(self) -> dict[str, str]:
        """The HTTP headers carrying the retry delay."""
        headers = {}
        if self.retry_after_s is not None:
            headers["Retry-After"] = str(self.retry_after_s)
        if self.retry_after_ms is not None:
            headers["Retry-After-Ms"] = str(self.retry_after_ms)
        return headers

    def envelope(self) -> ErrorEnvelope:
        """The error body."""
        return self._envelope("decide failure")

    def retry(self) -> RetryHint:
        """The retry hint, read from :meth:`headers` (``Retry-After-Ms`` wins)."""
        return RetryHint.from_headers(self.headers(), retryable=self.retryable)


@dataclass(frozen=True, slots=True)
class UpgradeRefusalSpec(_ScriptedError):
    """One scripted upgrade refusal.

    :param status: the HTTP status.
    :param code: the envelope code.
    :param error_type: the envelope type.
    :param retry_after_s: the ``Retry-After`` header (seconds), or ``None``.
    """

    retry_after_s: int | None = 1

    def refusal(self) -> UpgradeRefusal:
        """The refusal to answer."""
        return UpgradeRefusal(self.status, self._envelope("upgrade refusal"), self.retry_after_s)


class Faults:
    """The emulator's standing faults; change them at any time (tests, the control surface, CLI).

    :ivar delay_decisions_ms: extra delay before every decide answers (on top of the emulator's
        ``decide_latency_ms``).
    :ivar answer_pings: ``False`` makes every open stream a silent peer: it stops answering native
        pings and stops sending anything at all (JSON pings, acks, decisions, close frames) until
        set back to ``True``.
    """

    def __init__(self) -> None:
        self.delay_decisions_ms = 0
        self.answer_pings = True
        self._decide_failures: deque[DecideFailureSpec] = deque()
        self._upgrade_refusals: deque[UpgradeRefusalSpec] = deque()

    def fail_decides(
        self,
        count: int = 1,
        status: int = 503,
        code: str | None = None,
        error_type: str | None = None,
        retry_after_ms: int | None = None,
        retry_after_s: int | None = None,
        retryable: bool = True,
    ) -> None:
        """Make the next ``count`` decide calls fail (queued after any failures already scripted).

        :param count: how many calls fail.
        :param status: the HTTP status (503 by default).
        :param code: the envelope code (default from the status: 503 ``overloaded``, 429 ``rate_limited`` …).
        :param error_type: the envelope type (default from the status, WIRE.md §6).
        :param retry_after_ms: send ``Retry-After-Ms`` (wins over ``Retry-After``).
        :param retry_after_s: send ``Retry-After`` in seconds.
        :param retryable: whether the response permits a retry.
        """
        if count < 0 or not 100 <= status <= 599:
            raise ValueError(f"fail_decides needs count >= 0 and an HTTP status, got {count}, {status}")
        spec = DecideFailureSpec.for_status(
            status, code, error_type, retry_after_ms, retry_after_s, retryable
        )
        self._decide_failures.extend([spec] * count)

    def refuse_upgrades(
        self,
        count: int = 1,
        status: int = 503,
        code: str | None = None,
        retry_after_s: int | None = 1,
        error_type: str | None = None,
    ) -> None:
        """Refuse the next ``count`` otherwise valid upgrades (after the checks of WIRE.md §1,
        before capacity and shutdown).

        :param count: how many upgrades are refused.
        :param status: the HTTP status (503 by default).
        :param code: the envelope code (default from the status: 503 ``overloaded``, 429 ``rate_limited`` …).
        :param retry_after_s: the ``Retry-After`` header in seconds (``None``: none).
        :param error_type: the envelope type (default from the status).
        """
        if count < 0 or not 400 <= status <= 599:
            raise ValueError(f"refuse_upgrades needs count >= 0 and a 4xx/5xx status, got {count}, {status}")
        spec = UpgradeRefusalSpec.for_status(status, code, error_type, retry_after_s)
        self._upgrade_refusals.extend([spec] * count)

    @property
    def pending_decide_failures(self) -> int:
        """Scripted decide failures not yet used."""
        return len(self._decide_failures)

    @property
    def pending_upgrade_refusals(self) -> int:
        """Scripted upgrade refusals not yet used."""
        return len(self._upgrade_refusals)

    def take_decide_failure(self) -> DecideFailureSpec | None:
        """The next scripted decide failure, consumed, or ``None``."""
        return self._decide_failures.popleft() if self._decide_failures else None

    def take_upgrade_refusal(self) -> UpgradeRefusalSpec | None:
        """The next scripted upgrade refusal, consumed, or ``None``."""
        return self._upgrade_refusals.popleft() if self._upgrade_refusals else None

    def clear(self) -> None:
        """Remove every fault."""
        self.delay_decisions_ms = 0
        self.answer_pings = True
        self._decide_failures.clear()
        self._upgrade_refusals.clear()

    def to_dict(self) -> dict[str, Any]:
        """The current faults as JSON."""
        return {
            "delay_decisions_ms": self.delay_decisions_ms,
            "answer_pings": self.answer_pings,
            "decide_failures": [asdict(s) for s in self._decide_failures],
            "upgrade_refusals": [asdict(s) for s in self._upgrade_refusals],
        }
