"""The exceptions of the System Zero stream client: one tree, rooted at :class:`SystemZeroError`.

::

    SystemZeroError
    ├── SystemZeroValidationError   a request or change breaks a protocol rule; nothing was sent
    │                               (also a LocalProtocolError and a ValueError)
    ├── UpgradeRefused              the gateway refused the WebSocket upgrade with an HTTP status
    │   └── AuthenticationFailed    … with 401 or 403: the API key is missing, wrong or not allowed
    ├── DecisionFailed              a decide call failed (HTTP status, error envelope, retry hint)
    ├── StreamRejected              the gateway rejected a change for good (not a passing rate limit)
    ├── ProtocolViolation           the peer broke the stream protocol (or is not a System Zero gateway)
    ├── StreamClosed                the gateway closed the stream in a way a reconnect cannot fix
    ├── GatewayUnreachable          a local gateway never answered (refused, or TLS to a plaintext port)
    ├── DeadlineExceeded            the caller's deadline passed (also a TimeoutError)
    └── BudgetExceeded              a spend cap refused the next dispatch; nothing more was sent
                                    (defined with the budget arithmetic in decisions.budget)

Catch :class:`SystemZeroError` to handle every failure of the client. Messages name the cause
and the fix; none of them ever contains the API key (the client never puts request headers in
an exception). What the gateway said — an error envelope, a request ID — is kept and shown only
as :func:`~airflow_provider_systemzero.protocol.untrusted.safe_text` leaves it: escaped, bounded.
"""

from __future__ import annotations

from airflow_provider_systemzero.decisions.budget import BudgetExceeded
from airflow_provider_systemzero.exceptions import SystemZeroError
from airflow_provider_systemzero.protocol.errors import ErrorEnvelope, LocalProtocolError, RetryHint
from airflow_provider_systemzero.protocol.untrusted import safe_text
from airflow_provider_systemzero.stream.untrusted import server_text, server_token

__all__ = [
    "AuthenticationFailed",
    "BudgetExceeded",
    "DeadlineExceeded",
    "DecisionFailed",
    "GatewayUnreachable",
    "LocalProtocolError",
    "ProtocolViolation",
    "StreamClosed",
    "StreamRejected",
    "SystemZeroError",
    "SystemZeroValidationError",
    "UpgradeRefused",
]


class SystemZeroValidationError(SystemZeroError, LocalProtocolError):
    """A request, state or change breaks a protocol rule; nothing was sent and nothing changed.

    It is also a :class:`~airflow_provider_systemzero.protocol.errors.LocalProtocolError` (and so a
    :class:`ValueError`), with ``code`` (the wire error code) and ``field`` (the offending field).
    """

    @classmethod
    def from_local(cls, exc: LocalProtocolError) -> SystemZeroValidationError:
        """Wrap a core validation error.

        :param exc: the error raised by the sans-I/O core.
        """
        if isinstance(exc, SystemZeroValidationError):
            return exc
        return cls(exc.message, code=exc.code, field=exc.field)


def _safe_envelope(envelope: ErrorEnvelope) -> ErrorEnvelope:
    """The gateway's error envelope as an exception keeps it: each string through ``safe_text``, so
    whatever shows or stores an exception's ``envelope`` (a trigger's error event) gets it escaped
    and bounded."""
    return ErrorEnvelope(safe_text(envelope.type), safe_text(envelope.code), safe_text(envelope.message))


def _envelope_text(envelope: ErrorEnvelope | None) -> str:
    if envelope is None:
        return "no error body"
    # the gateway's own words: quoted, escaped and bounded (no forged log line, no megabyte message)
    return f"{server_token(envelope.type)}/{server_token(envelope.code)}: {server_text(envelope.message)}"


class UpgradeRefused(SystemZeroError):
    """The gateway answered the WebSocket upgrade with an HTTP error instead of ``101``.

    :param status: the HTTP status.
    :param envelope: the error envelope of the response body, if it carried one (kept with each
        string through ``safe_text``).
    :param retry_after_ms: the server's retry delay (``Retry-After-Ms`` or ``Retry-After``), if any.
    :param url: the stream URL (it never carries credentials).
    """

    def __init__(
        self,
        status: int,
        envelope: ErrorEnvelope | None = None,
        retry_after_ms: int | None = None,
        *,
        url: str = "",
    ) -> None:
        self.status = status
        self.envelope = None if envelope is None else _safe_envelope(envelope)
        self.retry_after_ms = retry_after_ms
        self.url = url
        super().__init__(self._describe())

    @property
    def retryable(self) -> bool:
        """Whether a later attempt may succeed (429, 500, 502, 503, 504)."""
        return self.status in (429, 500, 502, 503, 504)

    def _fix(self) -> str:
        code = self.envelope.code if self.envelope else None
        if 300 <= self.status < 400:
            return (
                "it answered with a redirect, and redirects are refused so the key is never sent to another "
                "address: set the connection's host to the API origin itself"
            )
        if self.status in (429, 503):
            return "the client retries after the server's delay; if it persists, run fewer concurrent streams"
        if code == "not_found" or self.status == 404:
            return "set the connection's host to the bare API origin (no path)"
        if code == "query_not_allowed":
            return "remove the query string from the connection's host"
        if code == "browser_context_forbidden":
            return "send no Origin or Cookie header (a proxy may be adding them)"
        if code == "compression_not_supported":
            return "disable WebSocket compression (a proxy may be negotiating it)"
        if code == "unsupported_protocol":
            return "request only the system-zero.stream.v1 subprotocol"
        return "check the connection's host and the gateway's status"

    def _describe(self) -> str:
        where = f" at {self.url}" if self.url else ""
        delay = f"; retry after {self.retry_after_ms} ms" if self.retry_after_ms is not None else ""
        return (
            f"the System Zero gateway{where} refused the stream upgrade with HTTP {self.status} "
            f"({_envelope_text(self.envelope)}){delay}: {self._fix()}"
        )


class AuthenticationFailed(UpgradeRefused):
    """The upgrade was refused with 401 or 403: the API key is missing, wrong or not allowed."""

    def _fix(self) -> str:
        if self.status == 403:
            return (
                "the key is not allowed to stream (or the request carried browser headers): check the key's "
                "permissions and send no Origin or Cookie header"
            )
        return "set a valid API key in the connection's password field"


class DecisionFailed(SystemZeroError):
    """A decide call failed; the gateway forwarded the ordinary HTTP status and error envelope.

    :param http_status: the decide call's HTTP status.
    :param envelope: the API's error envelope (kept with each string through ``safe_text``).
    :param retry: the server's retry hint.
    :param retryable: whether the failure is one a client retries (429, 503 — ``maintenance``
        included: the gateway is going away and the state is decided again after it —, 409
        ``idempotency_conflict``, with retry permitted).
    :param state_version: the stream version the decide was for, if known.
    :param request_id: the decide call's request ID, as the gateway sent it (kept as
        :func:`~airflow_provider_systemzero.protocol.untrusted.safe_text` leaves it: escaped, bounded).
    """

    def __init__(
        self,
        http_status: int | None,
        envelope: ErrorEnvelope,
        retry: RetryHint,
        retryable: bool,
        *,
        state_version: int | None = None,
        request_id: str = "",
    ) -> None:
        self.http_status = http_status
        self.envelope = _safe_envelope(envelope)
        self.retry = retry
        self.retryable = retryable
        self.state_version = state_version
        self.request_id = safe_text(request_id)
        if retryable:
            fix = "retry later" + (
                f" (after {retry.retry_after_ms} ms)" if retry.retry_after_ms is not None else ""
            )
        elif envelope.type == "authentication_error":
            fix = "check the API key in the connection's password field"
        elif envelope.code == "idempotency_key_reused":
            fix = "use a new idempotency key for a different state (or let the client derive keys)"
        elif http_status is not None and 400 <= http_status < 500:
            fix = "fix the request (model, questions, state) and run again"
        else:
            fix = (
                "retry later; if it persists, report it with the request ID to whoever runs the gateway "
                "(System Zero support for the hosted API; for the emulator, its log and its decider)"
            )
        rid = f" (request {server_token(request_id)})" if request_id else ""
        version = f" for state version {state_version}" if state_version is not None else ""
        super().__init__(
            f"the decision{version} failed with HTTP {http_status}{rid}: {_envelope_text(envelope)}: {fix}"
        )


class StreamRejected(SystemZeroError):
    """The gateway rejected a change for a reason a retry cannot fix; the stream cannot continue.

    :param envelope: the rejection's error envelope (kept with each string through ``safe_text``).
    :param event_id: the rejected mutation's event ID, if any.
    """

    def __init__(self, envelope: ErrorEnvelope, event_id: str | None = None) -> None:
        self.envelope = _safe_envelope(envelope)
        self.event_id = event_id
        self.code = self.envelope.code
        what = f"change {server_token(event_id)}" if event_id else "request"
        super().__init__(
            f"the System Zero gateway rejected {what} ({_envelope_text(envelope)}): the desired "
            "state cannot be streamed; fix the state or request and open a new stream"
        )


class ProtocolViolation(SystemZeroError):
    """The peer broke the stream protocol, or is not a System Zero gateway.

    :param message: what was wrong.
    :param code: a machine-readable code (the core's error code).
    """

    def __init__(self, message: str, *, code: str = "protocol_violation") -> None:
        self.code = code
        super().__init__(message)


class StreamClosed(SystemZeroError):
    """The gateway closed the stream with a code that a reconnect cannot fix (or the stream is closed).

    :param code: the WebSocket close code (``None`` when the stream was closed locally).
    :param reason: the close reason.
    """

    def __init__(self, code: int | None, reason: str = "", *, message: str | None = None) -> None:
        self.code = code
        self.reason = reason
        super().__init__(
            message
            or (
                f"the System Zero gateway closed the stream with code {code} ({reason or 'no reason'}): "
                "this close is not retried; check the gateway's logs for the request that caused it"
            )
        )


class DeadlineExceeded(SystemZeroError, TimeoutError):
    """The caller's deadline passed before the stream was open or the decision arrived.

    :param message: what was being waited for and for how long.
    :param last_error: the last retryable failure seen while waiting, if any.
    :param detail: ``last_error`` described with its cause and fix (default: its own text).
    """

    def __init__(
        self, message: str, *, last_error: BaseException | None = None, detail: str | None = None
    ) -> None:
        self.last_error = last_error
        if last_error is not None:
            message = f"{message}; last error: {detail or last_error}"
        super().__init__(message)


class GatewayUnreachable(SystemZeroError, ConnectionError):
    """A loopback origin never answered: every attempt since the stream started was refused, or
    reset in the TLS handshake because the port speaks plaintext. The message names the URL and
    the fix (see :mod:`~airflow_provider_systemzero.stream.diagnosis`).
    """
