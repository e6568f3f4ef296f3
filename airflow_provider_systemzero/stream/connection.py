"""Connecting to a System Zero gateway: the upgrade options (WIRE.md §1), refusals and :func:`probe`.

* :func:`connect_options` — the ``websockets`` options, with a logger that scrubs the key;
* :func:`open_socket` — the TCP connection (TLS, an explicit proxy) by websockets' opener, then
  the upgrade on a :class:`~airflow_provider_systemzero.stream.gateway_socket.GatewaySocket`, all
  within ``open_timeout``; redirects are never followed, so the key goes to one URL only. The
  first hop's name (the gateway's, or the proxy's) is resolved by
  :mod:`~airflow_provider_systemzero.stream.resolver` and each of its addresses tried in turn, so
  asyncio resolves nothing itself; a SOCKS proxy is spoken to with ``python-socks`` directly;
* :func:`upgrade_refusal_error` — the typed error for an HTTP refusal of the upgrade;
* :func:`probe` — open, read ``hello``, close (the connection test), holding a slot of the stream cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any
from urllib.parse import quote

from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus, ProxyError
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

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
from airflow_provider_systemzero.stream.resolver import ResolutionTimedOut, loopback_only, resolve
from airflow_provider_systemzero.stream.settings import ProxyParts, StreamSettings
from airflow_provider_systemzero.stream.tls import TLSContexts, ended_after_tls_handshake, load_tls
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
    settings: StreamSettings, limits: Limits, tls: TLSContexts | None = None, first_hop: str | None = None
) -> dict[str, Any]:
    """Keyword arguments for ``websockets.asyncio.client.connect`` per WIRE.md §1.

    Only ``Authorization`` is added to the request; the one subprotocol is offered; compression,
    ``Origin`` and environment proxies are off; native pings run at the advertised interval.

    :param settings: where and how to connect.
    :param limits: the limits in force (the last ``hello``'s, or the document's).
    :param tls: the TLS contexts from :func:`~airflow_provider_systemzero.stream.tls.load_tls`
        (``None``: the system trust store).
    :param first_hop: the address the TCP connection goes to — the gateway's, or an HTTP proxy's
        (``None``: the host names themselves, resolved by asyncio).
    """
    options: dict[str, Any] = {
        "additional_headers": request_headers(settings.api_key),
        "subprotocols": [Subprotocol(PROTOCOL)],
        "compression": None,
        "origin": None,
        "proxy": None,
        "user_agent_header": settings.user_agent,
        "open_timeout": settings.open_timeout,
        "ping_interval": (limits.native_heartbeat_interval_ms / 1000) or None,
        "ping_timeout": (limits.pong_timeout_ms / 1000) or None,
        "close_timeout": (limits.close_handshake_timeout_ms / 1000) or None,
        "max_size": limits.max_message_bytes + _MAX_SIZE_MARGIN,
        "logger": _RedactingLogger(logging.getLogger("websockets.client"), settings.api_key.strip()),
        "create_connection": GatewaySocket,
    }
    secure = settings.url.startswith("wss://")
    if tls is not None and tls.gateway is not None and secure:
        options["ssl"] = tls.gateway
    proxy = settings.proxy_parts
    if proxy is not None and proxy.scheme in ("http", "https"):
        options["proxy"] = _proxy_url(proxy, first_hop or proxy.host)
        if proxy.scheme == "https":
            options["proxy_ssl"] = (tls.proxy if tls is not None else None) or True
            options["proxy_server_hostname"] = proxy.host  # verified by name, connected by address
    elif first_hop is not None and proxy is None:
        options["host"] = first_hop  # the TLS handshake and the Host header keep the URL's name
    return options


def _proxy_url(proxy: ProxyParts, host: str) -> str:
    """An HTTP proxy's URL for websockets, connecting to ``host`` (its address), credentials kept."""
    credentials = ""
    if proxy.username is not None:
        credentials = f"{quote(proxy.username, safe='')}:{quote(proxy.password or '', safe='')}@"
    where = f"[{host}]" if ":" in host else host
    return f"{proxy.scheme}://{credentials}{where}:{proxy.port}"


#: websockets' openers by what they are built from (settings, limits, TLS contexts, first hop); at
#: most :data:`_OPENERS_KEPT`. An opener keeps only its options (each TCP connection gets a protocol
#: and a socket of its own), so every stream to a gateway shares one.
_OPENERS: dict[tuple[StreamSettings, Limits, TLSContexts | None, str], connect] = {}
_OPENERS_KEPT = 64


def _opener(settings: StreamSettings, limits: Limits, tls: TLSContexts | None, first_hop: str) -> connect:
    """websockets' opener for :func:`connect_options` (made once per settings, limits, contexts and hop)."""
    key = (settings, limits, tls, first_hop)
    opener = _OPENERS.get(key)
    if opener is None:
        if len(_OPENERS) >= _OPENERS_KEPT:
            _OPENERS.clear()
        opener = _OPENERS[key] = connect(settings.url, **connect_options(settings, limits, tls, first_hop))
    return opener


async def _resolved(host: str, port: int, resolving: list[str], *, plaintext: bool) -> list[Any]:
    """:func:`resolve`, with ``host`` in ``resolving`` meanwhile (what a timeout then names); for a
    ``plaintext`` (``ws://``) connection its loopback addresses only: the key goes nowhere else."""
    resolving.append(host)
    addresses = await resolve(host, port)
    resolving.remove(host)
    return loopback_only(host, addresses) if plaintext else addresses


async def _tcp_connection(
    settings: StreamSettings, limits: Limits, tls: TLSContexts | None, resolving: list[str]
) -> Any:
    """The TCP connection (TLS and a proxy included) with its socket, the upgrade not sent yet.

    The first hop's name is resolved off the loop's executor (and is in ``resolving`` until it
    is); its addresses are tried in turn and, when every one fails, the error of each is raised
    together (a single one as it is).
    """
    proxy = settings.proxy_parts
    if proxy is not None and proxy.scheme.startswith("socks"):
        return await _through_socks(settings, limits, tls, proxy, resolving)
    uri_host, uri_port = _host_and_port(settings.url)
    host, port = (proxy.host, proxy.port) if proxy is not None else (uri_host, uri_port)
    errors: list[OSError] = []
    plaintext = settings.url.startswith("ws://")
    addresses = await _resolved(host, port, resolving, plaintext=plaintext)
    if plaintext and proxy is not None:  # the proxy connects to the gateway's name: this machine's too
        await _resolved(uri_host, uri_port, resolving, plaintext=True)
    for address in addresses:
        try:
            return await _opener(settings, limits, tls, address[4][0]).open_tcp_connection()
        except OSError as exc:
            errors.append(exc)
    if len(errors) == 1 or all(isinstance(e, ConnectionRefusedError) for e in errors):
        raise errors[0]
    raise OSError(f"Multiple exceptions: {', '.join(str(e) for e in errors)}")


def _host_and_port(url: str) -> tuple[str, int]:
    uri = parse_uri(url)
    return uri.host, uri.port


async def _through_socks(
    settings: StreamSettings, limits: Limits, tls: TLSContexts | None, proxy: ProxyParts, resolving: list[str]
) -> Any:
    """Through a SOCKS proxy, by ``python-socks``: the proxy's name and (unless the proxy resolves
    it) the gateway's are resolved here, off the loop's executor."""
    from python_socks import ProxyError as SocksError
    from python_socks import ProxyType
    from python_socks.async_.asyncio import Proxy as SocksProxy

    remote_names = proxy.scheme in ("socks5h", "socks4a")
    host, port = _host_and_port(settings.url)
    plaintext = settings.url.startswith("ws://")
    destination = host
    if plaintext or not remote_names:  # a name the proxy resolves must be this machine's here too
        addresses = await _resolved(host, port, resolving, plaintext=plaintext)
        destination = host if remote_names else addresses[0][4][0]
    proxy_address = (await _resolved(proxy.host, proxy.port, resolving, plaintext=plaintext))[0][4][0]
    socks = SocksProxy(
        ProxyType.SOCKS5 if proxy.scheme.startswith("socks5") else ProxyType.SOCKS4,
        proxy_address,
        proxy.port,
        proxy.username,
        proxy.password,
        remote_names,
    )
    try:
        sock = await socks.connect(destination, port)
    except SocksError as exc:
        raise ProxyError(f"the SOCKS proxy {proxy.shown} refused the connection") from exc
    try:
        options = connect_options(settings, limits, tls)
        options["sock"] = sock
        return await connect(settings.url, **options).open_tcp_connection()
    except BaseException:
        sock.close()
        raise


async def open_socket(
    settings: StreamSettings,
    limits: Limits,
    handler: SocketHandler,
    tls: TLSContexts | None = None,
) -> GatewaySocket:
    """Open the TCP connection and upgrade it, within ``open_timeout``: the socket, open.

    websockets' opener makes the TCP connection (with TLS and an explicit proxy, from
    :func:`connect_options`) to an address :mod:`~airflow_provider_systemzero.stream.resolver`
    found, and the socket; the upgrade request carries the options' headers.
    Its answer is never followed anywhere: anything but ``101`` raises ``InvalidStatus``.
    ``handler`` hears of the socket from the moment the upgrade succeeded, so the messages that
    came with the response (``hello``) reach it in the same callback.

    :param settings: where and how to connect.
    :param limits: the limits in force (the last ``hello``'s, or the document's).
    :param handler: what the socket tells of its messages.
    :param tls: the TLS contexts (from :func:`~airflow_provider_systemzero.stream.tls.load_tls`).
    :raises InvalidStatus: the gateway refused the upgrade (a redirect included).
    :raises ResolutionTimedOut: a host name was still being resolved when ``open_timeout`` passed.
    :raises TimeoutError: no answer within ``open_timeout``.
    """
    resolving: list[str] = []
    try:
        async with asyncio.timeout(settings.open_timeout):
            socket = await _tcp_connection(settings, limits, tls, resolving)
            assert isinstance(socket, GatewaySocket)
            socket.handler = handler
            try:
                await socket.handshake(request_headers(settings.api_key), settings.user_agent)
            except BaseException as exc:
                socket.abort()
                ended = ended_after_tls_handshake(exc, settings)  # what mutual TLS does without a certificate
                if ended is not None:
                    raise ended from exc
                raise
    except TimeoutError as exc:
        if resolving:
            raise ResolutionTimedOut(resolving[-1]) from exc
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
    :raises SystemZeroValidationError: a TLS file of the connection is missing or invalid.
    :raises UpgradeRefused: the gateway refused the upgrade (:class:`AuthenticationFailed` for 401/403).
    :raises ProtocolViolation: the peer is not a System Zero gateway.
    :raises OSError: the network failed (``TimeoutError`` for the open timeout).
    """
    url = settings.url
    tls = await asyncio.to_thread(load_tls, settings)
    limits = Limits()
    async with (capacity or default_capacity()).slot(url):
        heard = _Hello()
        try:
            socket = await open_socket(settings, limits, heard, tls)
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
