"""Why a connection attempt failed, in words a DAG author can act on.

A network failure below HTTP (refused, reset, DNS, TLS, timeout) is retried with backoff, so
without a word in the log a wait would look like a model that keeps saying no.
:func:`describe_connection_error` names the URL, the cause and the fix;
:class:`NetworkFailures` decides when a stream says so:

* the first network failure of a stream is logged at WARNING, then every
  :data:`WARN_EVERY`-th repeat of the same cause, and at once whenever the cause changes;
* a **loopback origin that never answered** — every attempt since the stream started was refused,
  or reset during the TLS handshake because the port speaks plaintext — ends the stream with
  :class:`~airflow_provider_systemzero.stream.exceptions.GatewayUnreachable` once at least
  :data:`LOOPBACK_GIVE_UP_ATTEMPTS` attempts over at least :data:`LOOPBACK_GIVE_UP_SECONDS`
  seconds failed that way. Until then the delay before the next attempt is capped so that this
  point is reached on time (the core's
  :func:`~airflow_provider_systemzero.protocol.reconnect.delay_within`): with the default settings the stream fails about 10 s after it
  started, not at the task's deadline. A local gateway that is still starting has those 10 s to
  come up; a stream that connected once keeps reconnecting (the gateway restarts), and so does a
  trigger's stream opened after one of its earlier streams connected (``reached``).
"""

from __future__ import annotations

import errno
import logging
import socket
import ssl
import time
from urllib.parse import urlsplit

from websockets.exceptions import ConnectionClosed, InvalidMessage, InvalidProxy

from airflow_provider_systemzero.protocol.reconnect import delay_within
from airflow_provider_systemzero.protocol.upgrade import is_loopback_host
from airflow_provider_systemzero.stream.exceptions import GatewayUnreachable
from airflow_provider_systemzero.stream.resolver import PlaintextBeyondLoopback, ResolutionTimedOut
from airflow_provider_systemzero.stream.tls import tls_refusal_text
from airflow_provider_systemzero.stream.untrusted import scrub

__all__ = [
    "LOOPBACK_GIVE_UP_ATTEMPTS",
    "LOOPBACK_GIVE_UP_SECONDS",
    "NETWORK_ERRORS",
    "WARN_EVERY",
    "NetworkFailures",
    "describe_connection_error",
    "is_network_error",
    "without_proxy_credentials",
]

log = logging.getLogger(__name__)

#: Repeats of one cause between two WARNING lines.
WARN_EVERY = 10
#: A never-answering loopback origin fails the stream after this many attempts …
LOOPBACK_GIVE_UP_ATTEMPTS = 4
#: … spread over at least this many seconds.
LOOPBACK_GIVE_UP_SECONDS = 10.0
#: Why a loopback origin that failed so will not answer, by the kind of failure (:func:`_kind`).
_NEVER_ANSWERS = {
    "refused": "nothing listens there",
    "tls_plaintext": "the port speaks plaintext, not TLS",
    "plaintext_elsewhere": "its name resolves to no loopback address, where a plaintext connection would "
    "send the key in clear text",
}

#: What a connection attempt raises when it failed below HTTP, by type: the socket's and the
#: resolver's errors (``OSError``, ``socket.gaierror``, a timeout), a peer that does not answer as a
#: WebSocket server (websockets' ``InvalidMessage``), a proxy that refused the tunnel
#: (``InvalidProxy``) and a connection lost during the upgrade (``ConnectionClosed``). The stream
#: retries these with backoff and describes them with :func:`describe_connection_error`; this is
#: the one place that names websockets' exception types for that.
NETWORK_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    InvalidMessage,
    InvalidProxy,
    ConnectionClosed,
)


def is_network_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure below HTTP (see :data:`NETWORK_ERRORS`): retried, and described
    by :func:`describe_connection_error`.

    :param exc: what a connection attempt raised.
    """
    return isinstance(exc, NETWORK_ERRORS)


def _unresolved(exc: BaseException) -> bool:
    """A host name that did not resolve (``getaddrinfo``'s errors), or not within ``open_timeout``."""
    return isinstance(exc, socket.gaierror | ResolutionTimedOut)


def _unreachable(exc: BaseException) -> bool:
    """No route to the host or its network."""
    return getattr(exc, "errno", None) in (errno.EHOSTUNREACH, errno.ENETUNREACH)


def _refused(exc: BaseException) -> bool:
    if isinstance(exc, ConnectionRefusedError):
        return True
    # several addresses tried (``localhost``): one OSError listing each refusal
    text = str(exc)
    return (
        isinstance(exc, OSError)
        and exc.errno is None
        and text.startswith("Multiple exceptions")
        and text.count("Connect call failed") == text.count("[Errno") > 0
    )


def _tls_to_plaintext(exc: BaseException, url: str) -> bool:
    """A TLS handshake the peer broke off: what a plaintext port does with a ClientHello."""
    if not url.startswith("wss://") or isinstance(exc, ssl.SSLCertVerificationError):
        return False
    if isinstance(exc, ConnectionResetError | ConnectionAbortedError | EOFError):
        return True
    if isinstance(exc, ssl.SSLError):
        reason = (getattr(exc, "reason", None) or str(exc)).upper()
        return any(
            word in reason
            for word in (
                "WRONG_VERSION_NUMBER",
                "RECORD_LAYER",
                "EOF",
                "PACKET_LENGTH",
                "UNEXPECTED_MESSAGE",
                "HTTP_REQUEST",
            )
        )
    return False


def _kind(exc: BaseException, url: str) -> str:
    """A short name of the cause, to tell a changed cause from a repeat."""
    if isinstance(exc, PlaintextBeyondLoopback):
        return "plaintext_elsewhere"
    if tls_refusal_text(exc, url) is not None:
        return "tls_refused"
    if _refused(exc):
        return "refused"
    if _tls_to_plaintext(exc, url):
        return "tls_plaintext"
    code = getattr(exc, "errno", None)
    return f"{type(exc).__name__}:{code}" if code is not None else type(exc).__name__


def _proxy_failure(exc: BaseException, url: str, proxy: str) -> str | None:
    """A failure to reach the proxy itself (the TCP connection goes to it, not to the gateway),
    named as the proxy's, with the proxy's URL and no credentials; ``None``: not such a failure."""
    parts = urlsplit(proxy)
    try:
        where = f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    except ValueError:
        where = f"{parts.scheme}://{parts.hostname}"
    fix = "check the connection's proxy extra, and that the proxy runs and is reachable from this machine"
    raw = str(exc).strip() or "no detail"
    if _refused(exc):
        return f"connection to the proxy {where} refused on the way to {url}: nothing listens there; {fix}"
    if _unresolved(exc):
        return f"cannot resolve the proxy's host {parts.hostname!r} ({raw}) on the way to {url}: {fix}"
    if _unreachable(exc):
        return f"the proxy {where} is unreachable ({raw}) on the way to {url}: {fix}"
    return None


def without_proxy_credentials(text: str, proxy: str | None) -> str:
    """``text`` with the proxy URL and its password replaced by ``***`` (a library's message may
    quote either).

    :param text: a message about a connection attempt.
    :param proxy: the connection's proxy URL (``None``: nothing to remove).
    """
    if not proxy:
        return text
    text = scrub(text, proxy)
    password = urlsplit(proxy).password if "://" in proxy else None
    with_user = proxy.split("://", 1)[-1].rpartition("@")[0]
    for secret in (with_user, password):
        if secret:
            text = scrub(text, secret)
    return text


def describe_connection_error(
    exc: BaseException, url: str, *, open_timeout: float | None = None, proxy: str | None = None
) -> str:
    """The cause of a failed connection attempt and its fix, naming the URL.

    :param exc: what the attempt raised (an ``OSError``, ``TimeoutError``, a websockets error …).
    :param url: the stream URL (it never carries credentials).
    :param open_timeout: the connection's ``open_timeout``, for a timed-out handshake.
    :param proxy: the connection's proxy (its credentials are never quoted): the TCP connection
        goes to it, so a refusal, a name that does not resolve or an unreachable host is its.
    """
    return without_proxy_credentials(_described(exc, url, open_timeout, proxy), proxy)


def _described(exc: BaseException, url: str, open_timeout: float | None, proxy: str | None) -> str:
    parts = urlsplit(url)
    host = parts.hostname or "?"
    try:
        port = parts.port or (443 if parts.scheme == "wss" else 80)
    except ValueError:
        port = None
    if isinstance(exc, PlaintextBeyondLoopback):
        return (
            f"no connection to {url}: {exc}, and a plaintext ws:// connection would send the API key in "
            f"clear text, so it goes to this machine only (decided by the address, not the name): use "
            f"wss:// for a gateway elsewhere, or ws://127.0.0.1:{port} for a local one"
        )
    if (refused := tls_refusal_text(exc, url)) is not None:  # a TLS alert, named with its fix
        return refused
    if proxy and (about_proxy := _proxy_failure(exc, url, proxy)) is not None:
        return about_proxy
    loopback = is_loopback_host(host)
    raw = str(exc).strip() or "no detail"
    if _refused(exc):
        if loopback:
            return (
                f"connection to {url} refused: is the gateway (or `systemzero-emulator`) running on port "
                f"{port}?"
            )
        return (
            f"connection to {url} refused: nothing listens on {host}:{port}; check the connection's host and "
            "port, and that the gateway is reachable from this machine"
        )
    if _tls_to_plaintext(exc, url):
        if loopback:
            return (
                f"the TLS handshake with {url} failed ({type(exc).__name__}: {raw}): port {port} speaks "
                f"plaintext, as the local emulator does; set the connection's host to ws://{parts.netloc}"
            )
        return (
            f"the TLS handshake with {url} failed ({type(exc).__name__}: {raw}): check that port {port} "
            "serves TLS (wss://) and that no proxy or firewall cuts the connection"
        )
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (
            f"the TLS certificate of {url} is not trusted ({raw}): for a private CA set the connection's "
            "ca_bundle extra to its PEM file"
        )
    if isinstance(exc, ssl.SSLError):
        return f"the TLS handshake with {url} failed ({raw}): check that the host serves TLS (wss://)"
    if _unresolved(exc):
        return f"cannot resolve host {host!r} ({raw}): check the connection's host for a typo, and DNS"
    if isinstance(exc, TimeoutError):
        within = f" within open_timeout ({open_timeout:g} s)" if open_timeout else " in time"
        return (
            f"{url} did not complete the opening handshake{within}: check the host, the port, firewalls, "
            "the proxy extra and open_timeout"
        )
    if _unreachable(exc):
        return f"{host} is unreachable ({raw}): check the connection's host and this machine's network"
    if isinstance(exc, InvalidMessage):
        return (
            f"{url} did not answer as a WebSocket server ({raw}): check that the connection's host and port "
            "are a System Zero API origin"
        )
    return f"connecting to {url} failed: {type(exc).__name__}: {raw}"


class NetworkFailures:
    """What a stream says about its failed connection attempts, and when it gives up (see the module).

    :param url: the stream URL.
    :param open_timeout: the connection's ``open_timeout`` (for messages).
    :param proxy: the connection's proxy, if any (see :func:`describe_connection_error`).
    :param reached: the caller reached this gateway before (an earlier stream of a trigger's): it
        is restarting, not absent, and the stream never gives up on it.
    """

    def __init__(
        self, url: str, *, open_timeout: float | None = None, proxy: str | None = None, reached: bool = False
    ) -> None:
        self.url = url
        self.open_timeout = open_timeout
        self.proxy = proxy
        # the TCP connection goes to the proxy when there is one
        self.loopback = is_loopback_host(urlsplit(proxy or url).hostname or "")
        #: the last network failure, described (``None`` before the first)
        self.last_text: str | None = None
        self._kind: str | None = None
        self._repeats = 0
        self._answered = False
        self._hopeless_attempts = 0
        self._hopeless_kinds: set[str] = set()  # the kinds of those attempts' failures
        #: whether every attempt so far failed as a never-answering loopback origin does
        self._may_give_up = self.loopback and not reached
        self._first_failure: float | None = None

    def describe(self, exc: BaseException | None) -> str | None:
        """:func:`describe_connection_error` for a network error; ``str(exc)`` for anything else."""
        if exc is None:
            return None
        if is_network_error(exc):
            return describe_connection_error(exc, self.url, open_timeout=self.open_timeout, proxy=self.proxy)
        return without_proxy_credentials(str(exc), self.proxy)

    def answered(self) -> None:
        """An attempt reached the gateway (any HTTP answer): the next outage is reported afresh."""
        self._answered = True
        self._kind = None
        self._repeats = 0

    def record(self, exc: BaseException) -> None:
        """A connection attempt failed below HTTP: log it when it is news (first, changed, every Nth)."""
        kind = _kind(exc, self.url)
        self.last_text = text = self.describe(exc)
        if kind == self._kind:
            self._repeats += 1
        else:
            self._kind, self._repeats = kind, 0
        if self._repeats % WARN_EVERY == 0:
            again = f" (the same failure {self._repeats + 1} times in a row)" if self._repeats else ""
            log.warning("System Zero stream: %s; retrying with backoff%s", text, again)
        if self._may_give_up and not self._answered and kind in _NEVER_ANSWERS:
            self._hopeless_attempts += 1
            self._hopeless_kinds.add(kind)
            if self._first_failure is None:
                self._first_failure = time.monotonic()
        else:
            self._may_give_up = False  # something else happened once: the origin may be there

    def _hopeless_for(self) -> float | None:
        if not self._may_give_up or self._answered or self._first_failure is None:
            return None
        return time.monotonic() - self._first_failure

    def give_up(self) -> GatewayUnreachable | None:
        """The error that ends the stream, once a loopback origin has never answered for long enough."""
        elapsed = self._hopeless_for()
        if (
            elapsed is None
            or self._hopeless_attempts < LOOPBACK_GIVE_UP_ATTEMPTS
            or elapsed < LOOPBACK_GIVE_UP_SECONDS
        ):
            return None
        why = ", or ".join(text for kind, text in _NEVER_ANSWERS.items() if kind in self._hopeless_kinds)
        return GatewayUnreachable(
            f"{self.last_text} (every attempt since the stream started failed so, {self._hopeless_attempts} in "
            f"{elapsed:.0f} s: {why}, so the stream stops retrying)"
        )

    def bound_delay(self, delay: float) -> float:
        """The delay before the next attempt, capped while a loopback origin has never answered, so
        :meth:`give_up` is reached about :data:`LOOPBACK_GIVE_UP_SECONDS` after the first attempt.

        :param delay: the backoff's delay.
        """
        elapsed = self._hopeless_for()
        return delay_within(delay, None if elapsed is None else LOOPBACK_GIVE_UP_SECONDS - elapsed)
