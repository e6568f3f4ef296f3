"""Connecting to a System Zero gateway: the upgrade options (WIRE.md §1), refusals and :func:`probe`.

* :func:`connect_options` — the ``websockets`` options: only ``Authorization`` added to the
  request, the one subprotocol offered, no compression, no ``Origin``, no proxy from the
  environment, ``max_size`` from the limits, a logger that scrubs the key;
* :func:`open_socket` — the TCP connection (TLS, an explicit proxy) by websockets' opener, then
  the upgrade on a :class:`~airflow_provider_systemzero.stream.gateway_socket.GatewaySocket`, all
  within ``open_timeout``; redirects are never followed: a ``3xx`` answer is a refusal, so the
  key goes to one URL only;
* :func:`upgrade_refusal_error` — the typed error for an HTTP refusal of the upgrade;
* :func:`probe` — open, read ``hello``, close (the connection test), holding a slot of the stream cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
from typing import Any

from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus
from websockets.typing import Subprotocol

from airflow_provider_systemzero.protocol.client import check_hello
from airflow_provider_systemzero.protocol.errors import (
    ErrorEnvelope,
    RemoteProtocolError,
    RetryHint,
)
from airflow_provider_systemzero.protocol.limits import Limits
from airflow_provider_systemzero.protocol.messages import (
    PROTOCOL,
    Hello,
    decode_server_message,
)
from airflow_provider_systemzero.protocol.reconnect import CloseCode
from airflow_provider_systemzero.protocol.upgrade import (
    check_selected_subprotocol,
    request_headers,
)
from airflow_provider_systemzero.stream.capacity import StreamCapacity, default_capacity
from airflow_provider_systemzero.stream.exceptions import (
    AuthenticationFailed,
    ProtocolViolation,
    UpgradeRefused,
)
from airflow_provider_systemzero.stream.gateway_socket import GatewaySocket, SocketHandler
from airflow_provider_systemzero.stream.settings import StreamSettings
from airflow_provider_systemzero.stream.untrusted import scrub, server_text

__all__ = [
    "connect_options",
    "open_socket",
    "probe",
    "subprotocol_violation",
    "upgrade_refusal_error",
]

log = logging.getLogger(__name__)

#: Room for frame overhead above ``max_message_bytes`` (server messages embed whole replies).
_MAX_SIZE_MARGIN = 64 * 1024


class _RedactingLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """websockets logs request headers at DEBUG; this adapter removes the key from every record."""

    def __init__(self, logger: logging.Logger, secret: str) -> None:
        super().__init__(logger, {})
        self._secret = secret

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        if self.isEnabledFor(level):
            # websockets passes frames, headers and requests as objects: format first, then scrub
            try:
                text = str(msg) % args if args else str(msg)
            except (TypeError, ValueError):
                text = f"{msg} {args!r}"
            super().log(level, "%s", scrub(text, self._secret), **kwargs)


def connect_options(
    settings: StreamSettings, limits: Limits, ssl_context: ssl.SSLContext | None = None
) -> dict[str, Any]:
    """Keyword arguments for ``websockets.asyncio.client.connect`` per WIRE.md §1.

    Only ``Authorization`` is added to the request; the one subprotocol is offered; compression,
    ``Origin`` and environment proxies are off; native pings run at the advertised interval.

    :param settings: where and how to connect.
    :param limits: the limits in force (the last ``hello``'s, or the document's).
    :param ssl_context: a TLS context (from ``ca_bundle``) for ``wss://``; ``None``: the default.
    """
    options: dict[str, Any] = {
        "additional_headers": request_headers(settings.api_key),
        "subprotocols": [Subprotocol(PROTOCOL)],
        "compression": None,
        "origin": None,
        "proxy": settings.proxy or None,
        "user_agent_header": settings.user_agent,
        "open_timeout": settings.open_timeout,
        "ping_interval": (limits.native_heartbeat_interval_ms / 1000) or None,
        "ping_timeout": (limits.pong_timeout_ms / 1000) or None,
        "close_timeout": (limits.close_handshake_timeout_ms / 1000) or None,
        "max_size": limits.max_message_bytes + _MAX_SIZE_MARGIN,
        "logger": _RedactingLogger(logging.getLogger("websockets.client"), settings.api_key.strip()),
        "create_connection": GatewaySocket,
    }
    if ssl_context is not None and settings.url.startswith("wss://"):
        options["ssl"] = ssl_context
    return options


#: websockets' openers by what they are built from (settings, limits, TLS context); at most
#: :data:`_OPENERS_KEPT`. An opener keeps only its options (each TCP connection gets a protocol
#: and a socket of its own), so every stream to a gateway shares one.
_OPENERS: dict[tuple[StreamSettings, Limits, ssl.SSLContext | None], connect] = {}
_OPENERS_KEPT = 64


def _opener(settings: StreamSettings, limits: Limits, ssl_context: ssl.SSLContext | None) -> connect:
    """websockets' opener for :func:`connect_options` (made once per settings, limits and context)."""
    key = (settings, limits, ssl_context)
    opener = _OPENERS.get(key)
    if opener is None:
        if len(_OPENERS) >= _OPENERS_KEPT:
            _OPENERS.clear()
        opener = _OPENERS[key] = connect(settings.url, **connect_options(settings, limits, ssl_context))
    return opener


async def open_socket(
    settings: StreamSettings,
    limits: Limits,
    handler: SocketHandler,
    ssl_context: ssl.SSLContext | None = None,
) -> GatewaySocket:
    """Open the TCP connection and upgrade it, within ``open_timeout``: the socket, open.

    websockets' opener makes the TCP connection (with TLS and an explicit proxy, from
    :func:`connect_options`) and the socket; the upgrade request carries the options' headers.
    Its answer is never followed anywhere: anything but ``101`` raises ``InvalidStatus``.
    ``handler`` hears of the socket from the moment the upgrade succeeded, so the messages that
    came with the response (``hello``) reach it in the same callback.

    :param settings: where and how to connect.
    :param limits: the limits in force (the last ``hello``'s, or the document's).
    :param handler: what the socket tells of its messages.
    :param ssl_context: a TLS context (from ``ca_bundle``) for ``wss://``.
    :raises InvalidStatus: the gateway refused the upgrade (a redirect included).
    :raises TimeoutError: no answer within ``open_timeout``.
    """
    opener = _opener(settings, limits, ssl_context)
    try:
        async with asyncio.timeout(settings.open_timeout):
            socket = await opener.open_tcp_connection()
            assert isinstance(socket, GatewaySocket)
            socket.handler = handler
            try:
                await socket.handshake(opener.additional_headers, opener.user_agent_header)
            except BaseException:
                socket.abort()
                raise
    except TimeoutError as exc:
        raise TimeoutError("timed out during opening handshake") from exc
    return socket


def upgrade_refusal_error(exc: InvalidStatus, url: str, secret: str | None = None) -> UpgradeRefused:
    """The typed error for an HTTP refusal of the upgrade (401/403 → :class:`AuthenticationFailed`;
    a redirect is a refusal too).

    :param exc: the websockets exception carrying the response.
    :param url: the stream URL.
    :param secret: the API key, removed from the response body should the gateway echo it.
    """
    response = exc.response
    headers = {name: value for name, value in response.headers.raw_items()}
    delay_ms = RetryHint.delay_from_headers(headers)
    envelope: ErrorEnvelope | None = None
    with contextlib.suppress(Exception):
        body = (response.body or b"").decode("utf-8", "replace")
        envelope = ErrorEnvelope.from_dict(json.loads(scrub(body, secret)))
    status = response.status_code
    cls = AuthenticationFailed if status in (401, 403) else UpgradeRefused
    return cls(status, envelope, delay_ms, url=url)


class _Hello:
    """What :func:`probe` hears of its socket: the first message."""

    def __init__(self) -> None:
        self.first: asyncio.Future[str | bytes] = asyncio.get_running_loop().create_future()

    def socket_opened(self, socket: GatewaySocket) -> None:
        return None

    def socket_message(self, message: str | bytes) -> None:
        if not self.first.done():
            self.first.set_result(message)

    def socket_writable(self) -> None:
        return None


async def probe(settings: StreamSettings, capacity: StreamCapacity | None = None) -> Hello:
    """Open a stream, read ``hello`` and close with 1000 (a connection test).

    The connection holds a slot of the process-wide stream cap like any stream.

    :param settings: where and how to connect.
    :param capacity: the stream cap (default: the process-wide one).
    :raises UpgradeRefused: the gateway refused the upgrade (:class:`AuthenticationFailed` for 401/403).
    :raises ProtocolViolation: the peer is not a System Zero gateway.
    :raises OSError: the network failed (``TimeoutError`` for the open timeout).
    """
    url = settings.url
    ssl_context = None
    if settings.ca_bundle and url.startswith("wss://"):
        ssl_context = await asyncio.to_thread(ssl.create_default_context, cafile=settings.ca_bundle)
    limits = Limits()
    async with (capacity or default_capacity()).slot(url):
        return await _probe(settings, url, limits, ssl_context)


async def _probe(
    settings: StreamSettings, url: str, limits: Limits, ssl_context: ssl.SSLContext | None
) -> Hello:
    heard = _Hello()
    try:
        socket = await open_socket(settings, limits, heard, ssl_context)
    except InvalidStatus as exc:
        raise upgrade_refusal_error(exc, url, settings.api_key.strip()) from None
    try:
        violation = subprotocol_violation(socket, url)
        if violation is not None:
            socket.close(CloseCode.PROTOCOL_ERROR, "subprotocol not selected")
            raise violation
        async with asyncio.timeout(limits.start_timeout_ms / 1000):
            await asyncio.wait((heard.first, socket.lost), return_when=asyncio.FIRST_COMPLETED)
        if not heard.first.done():
            raise ConnectionError(f"{url} closed the connection before its hello")
        try:
            hello = check_hello(decode_server_message(heard.first.result()))
        except RemoteProtocolError as exc:
            raise ProtocolViolation(
                f"the server at {url} did not open with a valid {PROTOCOL} hello: {exc.message}",
                code=exc.code,
            ) from None
        return hello
    finally:
        socket.close(CloseCode.NORMAL_CLOSURE)
        await asyncio.shield(socket.lost)  # the close completes, or close_timeout aborts it


def subprotocol_violation(ws: GatewaySocket, url: str) -> ProtocolViolation | None:
    """The error to raise when the server did not select the one subprotocol offered, else ``None``."""
    try:
        check_selected_subprotocol(ws.subprotocol)
    except RemoteProtocolError as exc:
        return ProtocolViolation(f"{url}: {server_text(exc.message)}", code=exc.code)
    return None
