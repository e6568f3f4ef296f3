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
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from airflow_provider_systemzero.stream.exceptions import SystemZeroValidationError
from airflow_provider_systemzero.stream.settings import StreamSettings

__all__ = ["TLSContexts", "load_tls"]


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
