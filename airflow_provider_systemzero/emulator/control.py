"""The emulator's HTTP control surface: ``/_emulator/stats``, ``/_emulator/faults``,
``/_emulator/restart`` and ``/_emulator/drop`` on the stream port, behind the admin token (the
table of endpoints and parameters is in :mod:`.server`).

:func:`read_control_request` checks a request (the token, the endpoint, the method) and says what
it asks for; the emulator does it and answers with :func:`respond`."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import ServerConnection
from websockets.http11 import Request, Response

from airflow_provider_systemzero.emulator.faults import Faults
from airflow_provider_systemzero.protocol.body import compact_json
from airflow_provider_systemzero.protocol.errors import ErrorEnvelope

__all__ = [
    "CONTROL_PREFIX",
    "ControlRequest",
    "apply_fault_params",
    "read_control_request",
    "respond",
    "set_headers",
]

#: Path prefix of the HTTP control surface.
CONTROL_PREFIX = "/_emulator/"

#: Each endpoint and the methods it accepts.
_ROUTES: dict[str, tuple[str, ...]] = {
    "/_emulator/stats": ("GET",),
    "/_emulator/faults": ("GET", "POST"),
    "/_emulator/restart": ("POST",),
    "/_emulator/drop": ("POST",),
}


@dataclass(frozen=True, slots=True)
class ControlRequest:
    """What an admitted request to the control surface asks for.

    :param endpoint: the endpoint's last path segment: ``stats``, ``faults``, ``restart`` or ``drop``.
    :param method: ``GET`` or ``POST``, one the endpoint accepts.
    :param params: the query parameters (the last value of each).
    """

    endpoint: str
    method: str
    params: dict[str, str]

    def int_param(self, name: str, default: int) -> int:
        """A non-negative integer parameter.

        :param name: its name.
        :param default: its value when absent or empty.
        :raises ValueError: naming the parameter when it is not a non-negative integer.
        """
        value = _int_param(self.params, name, default)
        assert value is not None
        return value


def read_control_request(
    connection: ServerConnection, request: Request, admin_token: str
) -> ControlRequest | Response:
    """Check one request to the control surface (any path under :data:`CONTROL_PREFIX`).

    :param connection: the connection the request came on.
    :param request: the request (its parameters are in the query string).
    :param admin_token: the emulator's admin token.
    :return: what it asks for, or the refusal to answer: 401 without the admin token, 404/405
        for an unknown endpoint or method.
    """
    auth = request.headers.get("Authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        token = request.headers.get("X-Emulator-Token", "")
    if not token or not secrets.compare_digest(token.strip().encode(), admin_token.encode()):
        return respond(
            connection,
            401,
            ErrorEnvelope(
                "authentication_error",
                "admin_token_required",
                "the control surface needs the emulator's admin token "
                "(Authorization: Bearer <token> or X-Emulator-Token)",
            ).to_dict(),
        )
    parts = urlsplit(request.path)
    route = parts.path.rstrip("/")
    params = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    method = request.method
    if route not in _ROUTES:
        return respond(
            connection,
            404,
            ErrorEnvelope(
                "invalid_request_error",
                "not_found",
                f"no control endpoint {route!r}; endpoints: {sorted(_ROUTES)}",
            ).to_dict(),
        )
    if method not in _ROUTES[route]:
        return respond(
            connection,
            405,
            ErrorEnvelope(
                "invalid_request_error",
                "method_not_allowed",
                f"{route} accepts {' or '.join(_ROUTES[route])}",
            ).to_dict(),
        )
    return ControlRequest(route.removeprefix(CONTROL_PREFIX), method, params)


def apply_fault_params(faults: Faults, params: dict[str, str]) -> None:
    """Change the standing faults from the control surface's query parameters.

    :param faults: the emulator's faults.
    :param params: the parameters (see the table in :mod:`.server`).
    :raises ValueError: naming an unknown parameter or a bad value.
    """
    known = {
        "clear",
        "fail",
        "status",
        "code",
        "type",
        "retry_after_ms",
        "retry_after_s",
        "retryable",
        "delay_ms",
        "answer_pings",
        "refuse",
        "refuse_status",
        "refuse_code",
        "refuse_retry_after_s",
    }
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(f"unknown fault parameter {unknown[0]!r}; known: {sorted(known)}")
    if _bool_param(params, "clear", False):
        faults.clear()
    if "fail" in params:
        faults.fail_decides(
            _int_param(params, "fail", 1),
            status=_int_param(params, "status", 503),
            code=params.get("code") or None,
            error_type=params.get("type") or None,
            retry_after_ms=_int_param(params, "retry_after_ms", None),
            retry_after_s=_int_param(params, "retry_after_s", None),
            retryable=_bool_param(params, "retryable", True),
        )
    if "delay_ms" in params:
        faults.delay_decisions_ms = _int_param(params, "delay_ms", 0) or 0
    if "answer_pings" in params:
        faults.answer_pings = _bool_param(params, "answer_pings", True)
    if "refuse" in params:
        faults.refuse_upgrades(
            _int_param(params, "refuse", 1),
            status=_int_param(params, "refuse_status", 503),
            code=params.get("refuse_code") or None,
            retry_after_s=_int_param(params, "refuse_retry_after_s", 1),
        )


def respond(connection: ServerConnection, status: int, payload: Any) -> Response:
    """A JSON response that no cache keeps.

    :param connection: the connection to answer on.
    :param status: the HTTP status.
    :param payload: the body, encoded as compact JSON.
    """
    response = connection.respond(status, compact_json(payload) + "\n")
    set_headers(response, {"Content-Type": "application/json", "Cache-Control": "no-store"})
    return response


def set_headers(response: Response, headers: Mapping[str, str]) -> None:
    """Set (not add) each header on a response.

    :param response: the response.
    :param headers: name → value.
    """
    for name, value in headers.items():
        with contextlib.suppress(KeyError):
            del response.headers[name]
        response.headers[name] = value


def _int_param(params: Mapping[str, str], name: str, default: int | None) -> int | None:
    raw = params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None
    if value < 0:
        raise ValueError(f"{name} must not be negative")
    return value


def _bool_param(params: Mapping[str, str], name: str, default: bool) -> bool:
    raw = params.get(name)
    if raw is None or raw == "":
        return default
    lowered = raw.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name} must be true or false, got {raw!r}")
