"""Where and how a stream connects: :class:`StreamSettings` (the API key is never shown or serialised).

Every setting is checked when the settings are made, before anything is sent: the origin, the
key, ``open_timeout``, the per-hour caps and the ``proxy`` (:func:`proxy_parts`). The TLS files
(``ca_bundle``, ``client_cert``, ``client_key``) are read and checked when a stream or the
connection test loads them (:mod:`~airflow_provider_systemzero.stream.tls`), before the first
connection too. No message quotes the key or anything of the proxy but its scheme, host and port.
"""

from __future__ import annotations

import functools
import importlib
import weakref
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

from airflow_provider_systemzero.decisions.budget import parse_limit
from airflow_provider_systemzero.durations import is_seconds
from airflow_provider_systemzero.protocol.errors import (
    LocalProtocolError,
)
from airflow_provider_systemzero.protocol.upgrade import (
    is_loopback_host,
    request_headers,
    stream_url,
)
from airflow_provider_systemzero.stream.exceptions import (
    SystemZeroValidationError,
)

__all__ = [
    "SOCKS_PACKAGE",
    "ProxyParts",
    "StreamSettings",
    "proxy_parts",
    "shared_settings",
    "socks_available",
]

#: Proxy schemes and their default ports (those websockets knows).
_PROXY_PORTS = {"http": 80, "https": 443, "socks5": 1080, "socks5h": 1080, "socks4": 1080, "socks4a": 1080}
#: The package a SOCKS proxy needs, and the extra that installs it.
SOCKS_PACKAGE = "python-socks"
_SOCKS_EXTRA = "airflow-provider-systemzero[socks]"


@functools.cache
def socks_available() -> bool:
    """Whether the package a SOCKS proxy needs (``python-socks``, with its asyncio client) imports."""
    try:
        importlib.import_module("python_socks")
        importlib.import_module("python_socks.async_.asyncio")
    except ImportError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class ProxyParts:
    """A proxy URL, checked: where the TCP connection goes, and the credentials it carries.

    :param scheme: ``http``, ``https``, ``socks5``, ``socks5h``, ``socks4`` or ``socks4a``.
    :param host: the proxy's host name or address (no brackets).
    :param port: its port (the scheme's default when the URL names none).
    :param username: the user name, if the URL carries credentials.
    :param password: the password, if the URL carries credentials. Never shown.
    """

    scheme: str
    host: str
    port: int
    username: str | None
    password: str | None

    @property
    def shown(self) -> str:
        """The proxy as messages show it: scheme, host and port, never its credentials."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


def proxy_parts(proxy: str, where: str = "") -> ProxyParts:
    """Check a ``proxy`` extra: a scheme websockets speaks, a host, a port if any, nothing else.

    The messages never quote the value: a malformed URL may hold its password anywhere.

    :param proxy: the proxy URL, e.g. ``http://proxy.internal:3128``.
    :param where: the prefix naming the connection (``"connection 'x': "``), for messages.
    :raises SystemZeroValidationError: naming the field, the problem and the fix.
    """

    def refuse(problem: str) -> SystemZeroValidationError:
        return SystemZeroValidationError(
            f"{where}extra 'proxy' {problem} (the value is not shown: it may hold a password)",
            code="invalid_proxy",
            field="proxy",
        )

    if not isinstance(proxy, str):
        raise refuse(f"must be a URL string, got {type(proxy).__name__}")
    if "://" not in proxy:
        raise refuse("has no scheme: write it as http://HOST:PORT (or https://, socks5://, socks5h://)")
    parts = urlsplit(proxy.strip())
    scheme = parts.scheme.lower()
    if scheme not in _PROXY_PORTS:
        schemes = ", ".join(f"{name}://" for name in _PROXY_PORTS)
        raise refuse(f"has the scheme {scheme!r}; use one of {schemes}")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise refuse("has a path, a query or a fragment; a proxy URL is a scheme, a host and a port only")
    try:
        port = parts.port
    except ValueError:
        raise refuse("has a port that is not a number from 1 to 65535") from None
    host = parts.hostname
    if not host:
        raise refuse(f"names no host: write it as {scheme}://HOST:PORT")
    if port == 0:
        raise refuse("has a port that is not a number from 1 to 65535")
    if parts.username is not None and parts.password is None:
        raise refuse("has a user name without a password: write it as SCHEME://USER:PASSWORD@HOST:PORT")
    if scheme.startswith("socks") and not socks_available():
        raise SystemZeroValidationError(
            f"{where}extra 'proxy' is a {scheme}:// proxy, which needs the {SOCKS_PACKAGE} package: install "
            f"it with `pip install '{_SOCKS_EXTRA}'` wherever the connection is used (workers, the "
            "triggerer, the API server), or use an http:// or https:// proxy",
            code="missing_dependency",
            field="proxy",
        )
    return ProxyParts(
        scheme,
        host,
        port or _PROXY_PORTS[scheme],
        None if parts.username is None else unquote(parts.username),
        None if parts.password is None else unquote(parts.password),
    )


@functools.cache
def _user_agent() -> str:
    from importlib import metadata

    try:
        version = metadata.version("airflow-provider-systemzero")
    except metadata.PackageNotFoundError:  # pragma: no cover - source tree
        version = "0"
    return f"airflow-provider-systemzero/{version}"


@dataclass(frozen=True, slots=True, weakref_slot=True)
class StreamSettings:
    """Where and how to connect. The API key is never shown (``repr``) nor serialised (pickle).

    :param origin: the API origin (``wss://HOST``, ``https://HOST``, a bare host, or ``ws://`` to loopback).
    :param api_key: the API key, sent only as ``Authorization: Bearer`` on the upgrade.
    :param open_timeout: seconds for TCP + TLS + the opening handshake.
    :param ca_bundle: path of a PEM CA bundle for TLS verification (``None``: system trust store).
    :param proxy: explicit proxy URL (``None``: no proxy; environment proxies are never used):
        ``http://``, ``https://`` or, with ``python-socks`` installed, ``socks5://``/``socks5h://``/
        ``socks4://``/``socks4a://``. A ``ws://`` origin goes through a proxy only when the proxy
        is on loopback too: the key would otherwise cross the network in clear text.
    :param client_cert: path of a PEM client certificate (mutual TLS), with its key unless
        ``client_key`` names the key's own file.
    :param client_key: path of the client certificate's PEM private key (unencrypted).
    :param user_agent: the ``User-Agent`` header.
    :param default_model: the model used when a request names none (the connection's ``model``).
    :param prompt_cache_key_prefix: prefix of derived ``prompt_cache_key`` values.
    :param conn_id: the Airflow connection the settings came from (for messages only).
    :param budget_decisions_per_hour: billed decisions allowed per hour on this connection, in this
        process (``None``: no cap); see :func:`~airflow_provider_systemzero.decisions.budget.connection_window`.
    :param budget_input_tokens_per_hour: input tokens allowed per hour on this connection, in this process.
    """

    origin: str
    api_key: str = field(repr=False)
    open_timeout: float = 10.0
    ca_bundle: str | None = None
    proxy: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    user_agent: str = field(default_factory=_user_agent)
    default_model: str | None = None
    prompt_cache_key_prefix: str | None = None
    conn_id: str | None = None
    budget_decisions_per_hour: int | None = None
    budget_input_tokens_per_hour: int | None = None

    def __post_init__(self) -> None:
        where = f"connection {self.conn_id!r}: " if self.conn_id else ""
        for name in ("budget_decisions_per_hour", "budget_input_tokens_per_hour"):
            try:
                object.__setattr__(self, name, parse_limit(getattr(self, name), name))
            except ValueError as exc:
                raise SystemZeroValidationError(
                    f"{where}extra {name!r}: {exc}", code=f"invalid_{name}", field=name
                ) from None
        try:
            stream_url(self.origin)
        except LocalProtocolError as exc:
            raise SystemZeroValidationError(f"{where}{exc.message}", code=exc.code, field=exc.field) from None
        key = self.api_key
        if not isinstance(key, str) or not key.strip():
            raise SystemZeroValidationError(
                f"{where}the API key is empty: set it in the connection's password field",
                code="missing_api_key",
                field="password",
            )
        if any(not (0x21 <= ord(ch) <= 0x7E) for ch in key.strip()):
            raise SystemZeroValidationError(
                f"{where}the API key contains spaces, control or non-ASCII characters: "
                "paste the key exactly as issued",
                code="invalid_api_key",
                field="password",
            )
        if not is_seconds(self.open_timeout, positive=True):
            raise SystemZeroValidationError(
                f"{where}open_timeout must be a positive number of seconds, got {self.open_timeout!r}",
                code="invalid_open_timeout",
                field="open_timeout",
            )
        if self.proxy is not None:
            proxy = proxy_parts(self.proxy, where)
            if self.url.startswith("ws://") and not is_loopback_host(proxy.host):
                raise SystemZeroValidationError(
                    f"{where}extra 'proxy' ({proxy.shown}) is not on this machine, and the origin is a "
                    "plaintext ws:// one: the API key would cross the network in clear text. Use a proxy "
                    "on loopback, or no proxy, for a local gateway",
                    code="plaintext_through_proxy",
                    field="proxy",
                )
        if self.client_key is not None and self.client_cert is None:
            raise SystemZeroValidationError(
                f"{where}extra 'client_key' is set without 'client_cert': set client_cert to the PEM "
                "certificate the key belongs to",
                code="invalid_client_cert",
                field="client_cert",
            )

    @property
    def proxy_parts(self) -> ProxyParts | None:
        """The proxy, checked (``None``: no proxy)."""
        return None if self.proxy is None else proxy_parts(self.proxy)

    @property
    def url(self) -> str:
        """The exact stream URL (never carries credentials)."""
        return stream_url(self.origin)

    @property
    def authorization(self) -> str:
        """The ``Authorization`` header value. Never log it."""
        return request_headers(self.api_key)["Authorization"]

    def __reduce__(self) -> Any:
        raise TypeError(
            "StreamSettings holds an API key and cannot be serialised: pass the Airflow connection "
            "ID and resolve the settings where they are used"
        )


#: Settings in use in this process, by hash: one object for equal settings (:func:`shared_settings`).
_IN_USE: weakref.WeakValueDictionary[int, StreamSettings] = weakref.WeakValueDictionary()


def shared_settings(settings: StreamSettings) -> StreamSettings:
    """An object equal to ``settings`` that this process already holds, else ``settings`` (held
    from now on for the next caller): the waits on one connection keep one copy of its settings,
    not one each. Equal settings are interchangeable (frozen, compared field by field, the key
    included), and a connection that changed gives unequal settings, so nothing is shared with them.

    :param settings: settings just read from a connection.
    """
    key = hash(settings)
    held = _IN_USE.get(key)
    if held is not None and held == settings:
        return held
    if held is None:  # another with the same hash is in use: this one is simply not shared
        _IN_USE[key] = settings
    return settings
