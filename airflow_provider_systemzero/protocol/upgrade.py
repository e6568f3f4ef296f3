"""The WebSocket upgrade (WIRE.md §1): the exact URL, the request headers, the refusal table.

The client builds its URL and headers here; the gateway emulator checks an upgrade request with
:func:`check_upgrade` and answers a refusal with the status and envelope it returns.
"""

from __future__ import annotations

import functools
import ipaddress
import math
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from airflow_provider_systemzero.protocol.body import compact_json
from airflow_provider_systemzero.protocol.errors import ErrorEnvelope, LocalProtocolError, RemoteProtocolError
from airflow_provider_systemzero.protocol.messages import PROTOCOL

__all__ = [
    "STREAM_PATH",
    "UpgradeRefusal",
    "capacity_refusal",
    "check_selected_subprotocol",
    "check_upgrade",
    "is_loopback_host",
    "maintenance_refusal",
    "request_headers",
    "stream_capacity",
    "stream_url",
]

STREAM_PATH = "/v1/system-zero/stream"


@functools.lru_cache(maxsize=256)
def is_loopback_host(host: str) -> bool:
    """Whether ``host`` is ``localhost`` or a loopback address (127.0.0.0/8, ::1); a pure function
    of it, worked out once per host (every connection asks)."""
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    # Only 127.0.0.0/8 and ::1 on every Python: 3.13 started to call an IPv4-mapped address
    # (::ffff:127.0.0.1) loopback too.
    return address.is_loopback and getattr(address, "ipv4_mapped", None) is None


@functools.lru_cache(maxsize=256)
def stream_url(origin: str) -> str:
    """The exact stream URL for an API origin (a pure function of it: worked out once per origin).

    ``https://h`` and ``wss://h`` become ``wss://h/v1/system-zero/stream``; a bare host means
    ``wss://``; ``ws://``/``http://`` are allowed only for a loopback host (the emulator).

    :param origin: the API origin (scheme, host, optional port; no path, query, fragment or userinfo).
    :raises LocalProtocolError: naming what is wrong with the origin.
    """
    if not isinstance(origin, str) or not origin.strip():
        raise LocalProtocolError(
            "connection host (the API origin) is empty: set it to wss://HOST or https://HOST",
            code="invalid_origin",
            field="host",
        )
    raw = origin.strip()
    if "://" not in raw:
        raw = "wss://" + raw
    parts = urlsplit(raw)
    scheme = parts.scheme.lower()
    if scheme not in ("wss", "https", "ws", "http"):
        raise LocalProtocolError(
            f"API origin scheme {parts.scheme!r} is not supported: use wss:// or https://",
            code="invalid_origin",
            field="host",
        )
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise LocalProtocolError(
            "API origin must not contain credentials (user:pass@): the key goes in the "
            "connection's password field",
            code="invalid_origin",
            field="host",
        )
    if parts.query or raw.rstrip().endswith("?"):
        raise LocalProtocolError(
            "API origin must not contain a query string: the stream URL takes none",
            code="invalid_origin",
            field="host",
        )
    if parts.fragment or "#" in raw:
        raise LocalProtocolError(
            "API origin must not contain a fragment", code="invalid_origin", field="host"
        )
    if parts.path not in ("", "/"):
        raise LocalProtocolError(
            f"API origin must not contain a path (got {parts.path!r}): the stream path "
            f"{STREAM_PATH} is added for you",
            code="invalid_origin",
            field="host",
        )
    host = parts.hostname
    if not host:
        raise LocalProtocolError("API origin has no host", code="invalid_origin", field="host")
    try:
        port = parts.port
    except ValueError:
        raise LocalProtocolError(
            "API origin has an invalid port", code="invalid_origin", field="host"
        ) from None
    secure = scheme in ("wss", "https")
    if not secure and not is_loopback_host(host):
        raise LocalProtocolError(
            f"plaintext {scheme}:// is allowed only to a loopback host, not {host!r}: "
            "use wss:// (System Zero requires TLS)",
            code="insecure_origin",
            field="host",
        )
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    return f"{'wss' if secure else 'ws'}://{netloc}{STREAM_PATH}"


def stream_capacity(max_concurrent: int) -> int:
    """Account stream capacity: ``max(1, floor(max_concurrent / 2))``."""
    return max(1, math.floor(max_concurrent / 2))


@dataclass(frozen=True, slots=True)
class UpgradeRefusal:
    """An HTTP refusal of the upgrade.

    :param status: the HTTP status.
    :param envelope: the error body.
    :param retry_after_s: the ``Retry-After`` header value in seconds, or ``None``.
    """

    status: int
    envelope: ErrorEnvelope
    retry_after_s: int | None = None

    def body(self) -> str:
        """The response body: the error envelope as compact JSON."""
        return compact_json(self.envelope.to_dict())

    def headers(self) -> dict[str, str]:
        """The response headers the refusal needs: ``Content-Type`` and, when set, ``Retry-After``."""
        headers = {"Content-Type": "application/json"}
        if self.retry_after_s is not None:
            headers["Retry-After"] = str(self.retry_after_s)
        return headers


def capacity_refusal(capacity: int, *, retry_after_s: int = 1) -> UpgradeRefusal:
    """The refusal of an upgrade whose account already holds ``capacity`` streams
    (429 ``stream_capacity`` with ``Retry-After``).

    :param capacity: the account's stream capacity (see :func:`stream_capacity`).
    :param retry_after_s: the ``Retry-After`` delay in seconds.
    """
    return UpgradeRefusal(
        429,
        ErrorEnvelope(
            "rate_limit_error",
            "stream_capacity",
            f"the account already holds its {capacity} streams "
            "(max(1, floor(max_concurrent / 2))): close one or retry later",
        ),
        max(0, retry_after_s),
    )


def maintenance_refusal(*, retry_after_s: int = 1) -> UpgradeRefusal:
    """The refusal of an upgrade while the gateway shuts down (503 ``maintenance`` with ``Retry-After``).

    :param retry_after_s: the ``Retry-After`` delay in seconds.
    """
    return UpgradeRefusal(
        503,
        ErrorEnvelope(
            "overloaded_error", "maintenance", "the gateway is shutting down: reconnect after Retry-After"
        ),
        max(0, retry_after_s),
    )


def check_upgrade(path: str, headers: Mapping[str, str], *, known_key: object) -> UpgradeRefusal | str:
    """Check an upgrade request against WIRE.md §1 (everything but capacity and shutdown, which
    depend on the gateway's state: see :func:`capacity_refusal` and :func:`maintenance_refusal`).

    :param path: the request target (path and query).
    :param headers: the request headers (case-insensitive mapping, multi-valued joined by ``,``).
    :param known_key: a callable ``key -> bool`` telling whether an API key exists.
    :return: the refusal, or the API key when the request may proceed.
    """
    target = urlsplit(path)
    if target.path != STREAM_PATH:
        return UpgradeRefusal(
            404,
            ErrorEnvelope(
                "invalid_request_error",
                "not_found",
                f"no stream at {target.path!r}: the path is exactly {STREAM_PATH}",
            ),
        )
    if target.query or "?" in path:
        return UpgradeRefusal(
            400,
            ErrorEnvelope(
                "invalid_request_error", "query_not_allowed", "the stream URL takes no query string"
            ),
        )
    lowered = {k.lower(): v for k, v in headers.items()}
    if "origin" in lowered or "cookie" in lowered:
        return UpgradeRefusal(
            403,
            ErrorEnvelope(
                "invalid_request_error",
                "browser_context_forbidden",
                "streaming is server to server only: send no Origin or Cookie",
            ),
        )
    if "sec-websocket-extensions" in lowered:
        return UpgradeRefusal(
            400,
            ErrorEnvelope(
                "invalid_request_error",
                "compression_not_supported",
                "send no Sec-WebSocket-Extensions: compression is not supported",
            ),
        )
    offered = [p.strip() for p in lowered.get("sec-websocket-protocol", "").split(",") if p.strip()]
    if offered != [PROTOCOL]:
        return UpgradeRefusal(
            400,
            ErrorEnvelope(
                "invalid_request_error",
                "unsupported_protocol",
                f"request only {PROTOCOL} in Sec-WebSocket-Protocol",
            ),
        )
    auth = lowered.get("authorization", "")
    scheme, _, key = auth.partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key or " " in key:
        return UpgradeRefusal(
            401,
            ErrorEnvelope(
                "authentication_error",
                "missing_credentials",
                "authenticate with 'Authorization: Bearer <key>'",
            ),
        )
    if not known_key(key):  # type: ignore[operator]
        return UpgradeRefusal(
            401, ErrorEnvelope("authentication_error", "invalid_api_key", "the API key is not valid")
        )
    return key


def request_headers(api_key: str) -> dict[str, str]:
    """The one header the client adds to the upgrade (WIRE.md §1): ``Authorization: Bearer``.

    ``Sec-WebSocket-Protocol`` offers :data:`~.messages.PROTOCOL` alone; ``Origin``, ``Cookie`` and
    ``Sec-WebSocket-Extensions`` are never sent (the gateway refuses them: see :func:`check_upgrade`).

    :param api_key: the API key (surrounding spaces are not part of it).
    """
    return {"Authorization": f"Bearer {api_key.strip()}"}


def check_selected_subprotocol(selected: str | None) -> None:
    """The gateway must select the one subprotocol the client offered.

    :raises RemoteProtocolError: it selected another or none (the peer is not a System Zero gateway).
    """
    if selected != PROTOCOL:
        shown = "".join(c if c.isprintable() else "?" for c in str(selected)[:60])
        raise RemoteProtocolError(
            f"the server did not select the {PROTOCOL} subprotocol (it selected {shown!r}): "
            "check that the connection's host is a System Zero API origin",
            code="unsupported_protocol",
            field="Sec-WebSocket-Protocol",
        )
