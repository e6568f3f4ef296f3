"""The TLS of a connection: verifying the gateway (and an ``https://`` proxy), and a client certificate.

:func:`load_tls` reads the connection's files once per stream (or connection test), before the
first connection, and checks each: a ``ca_bundle`` that cannot be read, or holds no PEM
certificate, and a client certificate or key that cannot be read, is not PEM, does not match, or
is encrypted, are refused with a :class:`~airflow_provider_systemzero.stream.exceptions.SystemZeroValidationError`
naming the field, the file and the fix — not retried as a network failure until a deadline.

* ``ca_bundle`` replaces the system trust store for the gateway and for an ``https://`` proxy
  (a bundle for both holds both CAs);
* ``client_cert`` (and ``client_key`` when the key has a file of its own) is presented to the
  gateway (mutual TLS), never to a proxy.

Verification is never switched off: the contexts are :func:`ssl.create_default_context`'s.
Reading files blocks, so async callers run :func:`load_tls` in a thread.

When the gateway refuses the TLS connection itself (a TLS alert, or
:class:`EndedAfterTLSHandshake`), what it said is named with the fix (:func:`tls_refusal_text`).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from websockets.exceptions import InvalidMessage

from airflow_provider_systemzero.stream.exceptions import SystemZeroValidationError
from airflow_provider_systemzero.stream.settings import StreamSettings

__all__ = [
    "EndedAfterTLSHandshake",
    "TLSContexts",
    "ended_after_tls_handshake",
    "load_tls",
    "tls_refusal_text",
]


@dataclass(frozen=True, slots=True)
class TLSContexts:
    """The TLS contexts of a connection (``None``: websockets' default, the system trust store).

    Equal when they hold the same contexts (a context is only equal to itself), so every stream
    without TLS files shares websockets' opener.

    :param gateway: for the ``wss://`` connection to the gateway.
    :param proxy: for the connection to an ``https://`` proxy.
    """

    gateway: ssl.SSLContext | None = None
    proxy: ssl.SSLContext | None = None


def _refused(
    settings: StreamSettings, name: str, path: str, problem: str, fix: str
) -> SystemZeroValidationError:
    where = f"connection {settings.conn_id!r}: " if settings.conn_id else ""
    return SystemZeroValidationError(
        f"{where}extra {name!r} ({path!r}) {problem}: {fix}", code=f"invalid_{name}", field=name
    )


def _readable(settings: StreamSettings, name: str, path: str) -> bytes:
    """The file's bytes, or the error naming the field and the file."""
    fix = f"set {name} to the path of a PEM file that the user running Airflow can read on this machine"
    try:
        with open(path, "rb") as file:
            return file.read()
    except FileNotFoundError:
        raise _refused(settings, name, path, "does not exist", fix) from None
    except IsADirectoryError:
        raise _refused(settings, name, path, "is a directory, not a file", fix) from None
    except PermissionError:
        raise _refused(settings, name, path, "cannot be read (permission denied)", fix) from None
    except OSError as exc:
        raise _refused(settings, name, path, f"cannot be read ({exc.strerror or exc})", fix) from None


def _trusting(settings: StreamSettings) -> ssl.SSLContext:
    """A verifying context that trusts ``ca_bundle`` (or the system trust store)."""
    if settings.ca_bundle is None:
        return ssl.create_default_context()
    path = settings.ca_bundle
    data = _readable(settings, "ca_bundle", path)
    problem = None
    if b"-----BEGIN CERTIFICATE-----" not in data:
        problem = "holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
    else:
        try:
            return ssl.create_default_context(cadata=data.decode("ascii", "replace"))
        except ssl.SSLError as exc:
            problem = f"is not a valid PEM bundle of CA certificates ({exc.reason or exc})"
    raise _refused(
        settings, "ca_bundle", path, problem, "set ca_bundle to a PEM file of the CA certificates to trust"
    )


def _key_is_encrypted() -> str:
    raise ValueError("encrypted")


def load_tls(settings: StreamSettings) -> TLSContexts:
    """The TLS contexts ``settings`` call for, every file checked (blocking: run it in a thread
    from async code).

    :param settings: the connection's settings.
    :raises SystemZeroValidationError: a file is missing, unreadable, not PEM, or a key does not fit.
    """
    secure = settings.url.startswith("wss://")
    proxy = settings.proxy_parts
    proxy_tls = proxy is not None and proxy.scheme == "https"
    if settings.ca_bundle is None and settings.client_cert is None:
        return TLSContexts()
    gateway = _trusting(settings) if secure or settings.client_cert is not None else None
    if settings.client_cert is not None:
        assert gateway is not None
        cert = settings.client_cert
        key = settings.client_key
        _readable(settings, "client_cert", cert)
        if key is not None:
            _readable(settings, "client_key", key)
        try:
            gateway.load_cert_chain(cert, key, password=_key_is_encrypted)
        except ValueError:
            raise _refused(
                settings,
                "client_key" if key else "client_cert",
                key or cert,
                "holds an encrypted private key",
                "give the provider an unencrypted PEM key file that only the user running Airflow can read",
            ) from None
        except ssl.SSLError as exc:
            reason = str(exc.reason or exc)
            if "KEY_VALUES_MISMATCH" in reason.upper():
                problem, name, path = "does not belong to the client certificate", "client_key", key or cert
            else:
                problem, name, path = (
                    f"is not a PEM certificate with its private key ({reason})",
                    "client_cert",
                    cert,
                )
                if key is not None:
                    problem = (
                        f"and client_key ({key!r}) are not a PEM certificate and its private key ({reason})"
                    )
            raise _refused(
                settings,
                name,
                path,
                problem,
                "set client_cert to the PEM client certificate and client_key to its PEM private key "
                "(or put both in the client_cert file)",
            ) from None
    return TLSContexts(
        gateway=gateway if secure else None,
        proxy=_trusting(settings) if proxy_tls and settings.ca_bundle is not None else None,
    )


#: How to make a gateway that asks for a client certificate accept this connection.
_CLIENT_CERT_FIX = (
    "set the connection's client_cert extra to the PEM client certificate the gateway trusts (and "
    "client_key to its key, unless the client_cert file holds both)"
)
#: How to make a gateway that refused the client certificate presented accept it.
_REFUSED_CERT_FIX = (
    "check that client_cert is a certificate the gateway trusts (issued by its client CA, neither "
    "expired nor revoked) and that client_key is its key"
)
#: How to agree on a TLS version.
_VERSION_FIX = (
    "this client speaks TLS 1.2 and TLS 1.3 only, with Python's default ciphers: the gateway (or a "
    "TLS-terminating proxy in front of it) must accept TLS 1.2 or newer"
)
_CERT_REFUSED = "the gateway refused this connection's client certificate"
#: What each TLS alert (or local refusal) OpenSSL names means here, and its fix.
_ALERTS: dict[str, tuple[str, str]] = {
    "TLSV13_ALERT_CERTIFICATE_REQUIRED": (
        "the gateway requires a client certificate (mutual TLS) and this connection presented none",
        _CLIENT_CERT_FIX,
    ),
    "SSLV3_ALERT_HANDSHAKE_FAILURE": (
        "the gateway ended the TLS handshake (handshake failure): it requires a client certificate "
        "(mutual TLS) or refused the one presented, or it refuses this client's TLS versions or ciphers",
        f"if it uses mutual TLS, {_CLIENT_CERT_FIX}; {_VERSION_FIX}",
    ),
    "SSLV3_ALERT_BAD_CERTIFICATE": (_CERT_REFUSED, _REFUSED_CERT_FIX),
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN": (_CERT_REFUSED, _REFUSED_CERT_FIX),
    "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE": (_CERT_REFUSED, _REFUSED_CERT_FIX),
    "SSLV3_ALERT_CERTIFICATE_EXPIRED": (f"{_CERT_REFUSED} as expired", _REFUSED_CERT_FIX),
    "SSLV3_ALERT_CERTIFICATE_REVOKED": (f"{_CERT_REFUSED} as revoked", _REFUSED_CERT_FIX),
    "TLSV1_ALERT_UNKNOWN_CA": (
        "the gateway does not trust the CA of this connection's client certificate",
        _REFUSED_CERT_FIX,
    ),
    "TLSV1_ALERT_ACCESS_DENIED": (
        "the gateway denied this connection's client certificate",
        _REFUSED_CERT_FIX,
    ),
    "TLSV1_ALERT_PROTOCOL_VERSION": ("the gateway refused this client's TLS version", _VERSION_FIX),
    "TLSV1_ALERT_INSUFFICIENT_SECURITY": (
        "the gateway refused this client's TLS version or ciphers as too weak",
        _VERSION_FIX,
    ),
    "UNSUPPORTED_PROTOCOL": ("the gateway offered a TLS version this client refuses", _VERSION_FIX),
    "NO_PROTOCOLS_AVAILABLE": ("the gateway offered no TLS version this client accepts", _VERSION_FIX),
}


def _alert(exc: BaseException) -> str | None:
    """The TLS alert (or local refusal) OpenSSL names in ``exc`` or its cause, if one of :data:`_ALERTS`."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLError):
            reason = str(getattr(seen, "reason", None) or "").upper()
            if reason in _ALERTS:
                return reason
        seen = seen.__cause__ or seen.__context__
    return None


def tls_refusal_text(exc: BaseException, url: str) -> str | None:
    """What the gateway's refusal of the TLS connection means, with its fix, or ``None`` when
    ``exc`` is no such refusal: a TLS alert of :data:`_ALERTS` (in ``exc`` or its cause), or an
    :class:`EndedAfterTLSHandshake`.

    :param exc: what the connection attempt raised.
    :param url: the stream URL.
    """
    alert = _alert(exc)
    if alert is not None:
        meaning, fix = _ALERTS[alert]
        return f"the TLS connection to {url} was refused ({alert}): {meaning}; {fix}"
    if isinstance(exc, EndedAfterTLSHandshake):
        why = (
            f"the gateway may not accept this connection's client certificate: {_REFUSED_CERT_FIX}"
            if exc.client_certificate
            else "a gateway that requires a client certificate (mutual TLS) does so when none is "
            f"presented: {_CLIENT_CERT_FIX}; otherwise check that the host and port are a System Zero "
            "API origin"
        )
        return f"{url} ended the connection right after the TLS handshake, before any HTTP answer: {why}"
    return None


class EndedAfterTLSHandshake(ConnectionError):
    """The gateway ended a TLS connection right after its handshake, before answering the upgrade —
    what a TLS 1.3 gateway that requires a client certificate does when none is presented (its alert
    often lost to the reset that follows).

    :param client_certificate: the connection presented a client certificate.
    """

    def __init__(self, client_certificate: bool) -> None:
        super().__init__("the connection ended right after the TLS handshake, before any HTTP answer")
        self.client_certificate = client_certificate


def ended_after_tls_handshake(exc: BaseException, settings: StreamSettings) -> BaseException | None:
    """The error to raise for an upgrade over TLS that failed as ``exc``, when the gateway ended the
    connection before any HTTP answer (a reset, an end of stream while the status line was awaited):
    an :class:`EndedAfterTLSHandshake` (``exc`` its cause); ``None`` for any other failure.

    :param exc: what the upgrade raised (the TLS handshake had completed).
    :param settings: the connection's settings.
    """
    if not settings.url.startswith("wss://") or _alert(exc) is not None:
        return None
    ended = isinstance(exc, ConnectionResetError | ConnectionAbortedError | EOFError) or (
        isinstance(exc, InvalidMessage) and isinstance(exc.__cause__, EOFError)
    )
    return EndedAfterTLSHandshake(settings.client_cert is not None) if ended else None
