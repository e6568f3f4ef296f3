"""Connecting to a System Zero gateway: the upgrade options (WIRE.md §1), refusals and :func:`probe`.

* :func:`connect_options` — the ``websockets`` options: only ``Authorization`` added to the
  request, the one subprotocol offered, no compression, no ``Origin``, no proxy from the
  environment, ``max_size`` from the limits, a logger that scrubs the key;
* redirects are never followed: a ``3xx`` answer is a refusal, so the key goes to one URL only;
* :func:`upgrade_refusal_error` — the typed error for an HTTP refusal of the upgrade;
* :func:`probe` — open, read ``hello``, close (the connection test), holding a slot of the stream cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import (
    InvalidStatus,
)
from websockets.frames import Opcode
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
from airflow_provider_systemzero.protocol.reconnect import (
    CloseCode,
)
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
from airflow_provider_systemzero.stream.settings import StreamSettings
from airflow_provider_systemzero.stream.untrusted import scrub, server_text
from airflow_provider_systemzero.websocket_frames import parser_waits_for_a_frame, take_text_frames

if TYPE_CHECKING:  # budget imports the stream's exceptions: imported where used, to keep imports acyclic
    pass

__all__ = [
    "FRAMES_PER_READ",
    "NoRedirectsConnect",
    "StreamConnection",
    "connect_options",
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


#: Frames of one read handed to the session in the transport's callback, at most; the rest of a
#: flood goes to the reader task, which lets other tasks run every few frames.
FRAMES_PER_READ = 16


class StreamConnection(ClientConnection):
    """websockets' client connection, handing each complete text frame to :attr:`on_text` as it is
    parsed, in the transport's callback: no queue, task or loop turn between the socket and the
    stream's session.

    Only what websockets itself would hand over unchanged takes this way: a text frame that is not
    fragmented, is valid UTF-8 and has nothing queued ahead of it. Everything else — a fragmented
    message (reassembled by websockets), a binary frame, invalid UTF-8 (websockets closes with
    1007), a frame behind one still queued — goes through websockets' message queue to the
    stream's reader task, so frames are handled in the order they arrived.
    """

    #: Handles one frame; returns whether the next frames of the same read may follow at once
    #: (``False``: the writer should run first, and they queue for the reader). ``None``: the
    #: reader task reads every frame.
    on_text: Callable[[str], bool] | None = None
    _direct = True
    _handed = 0  # frames handed over at once during the current read

    def data_received(self, data: bytes) -> None:
        self._direct = True
        self._handed = 0
        if (
            self.on_text is not None
            and self.response is not None
            and not len(self.recv_messages.frames)
            and parser_waits_for_a_frame(self.protocol)
        ):
            # the complete text frames in front are read here; websockets parses from the first
            # byte of anything else (see airflow_provider_systemzero.websocket_frames)
            taken = take_text_frames(
                data, masked=False, max_size=self.protocol.max_message_size, handle=self._take
            )
            if taken:
                data = data[taken:]
                if not data:
                    return
        super().data_received(data)

    def take_queued(self, handle: Callable[[str], bool]) -> None:
        """Hand to ``handle`` the complete text frames websockets queued before :attr:`on_text` was
        set (the ``hello`` that came with the handshake's response), in order, before the reader
        task first runs; stop at anything else, which the reader reads.

        :param handle: as :attr:`on_text`: takes a frame, ``False`` leaves the rest to the reader.
        """
        queue = self.recv_messages.frames.queue
        self._handed = 0
        while queue:
            frame = queue[0]
            if frame.opcode is not Opcode.TEXT or not frame.fin:
                break
            try:
                text = str(frame.data, "utf-8")
            except UnicodeDecodeError:
                break  # websockets' own reading closes with 1007
            queue.popleft()
            if not self._hand(handle, text):
                break
        self.recv_messages.maybe_resume()

    def _take(self, text: str, _size: int) -> bool:
        return self._hand(self.on_text, text)  # type: ignore[arg-type]  # set: checked before the read

    def _hand(self, on_text: Callable[[str], bool], text: str) -> bool:
        """Hand one frame over; whether the next of this read may follow at once: the handler says
        so, and at most :data:`FRAMES_PER_READ` do (a flood then queues for the reader task, which
        lets the loop run between frames)."""
        self._handed += 1
        self._direct = on_text(text) and self._handed < FRAMES_PER_READ
        return self._direct

    def process_event(self, event: Any) -> None:
        on_text = self.on_text
        if (
            on_text is not None
            and self._direct
            and self.response is not None  # the handshake is over: a frame
            and event.opcode is Opcode.TEXT
            and event.fin
            and not len(self.recv_messages.frames)
        ):
            try:
                text = str(event.data, "utf-8")
            except UnicodeDecodeError:
                pass  # websockets' own reading closes with 1007
            else:
                self._hand(on_text, text)
                return
        super().process_event(event)


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
        "create_connection": StreamConnection,
    }
    if ssl_context is not None and settings.url.startswith("wss://"):
        options["ssl"] = ssl_context
    return options


class NoRedirectsConnect(connect):
    """``websockets.asyncio.client.connect`` that never follows a redirect: a ``3xx`` answer to the
    upgrade is a refusal (:class:`UpgradeRefused`), so the key is never sent to another address."""

    def process_redirect(self, exc: Exception) -> Exception | str:
        return exc


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
    try:
        async with NoRedirectsConnect(url, **connect_options(settings, limits, ssl_context)) as ws:
            violation = subprotocol_violation(ws, url)
            if violation is not None:
                await ws.close(CloseCode.PROTOCOL_ERROR, "subprotocol not selected")
                raise violation
            async with asyncio.timeout(limits.start_timeout_ms / 1000):
                text = await ws.recv()
            try:
                hello = check_hello(decode_server_message(text))
            except RemoteProtocolError as exc:
                raise ProtocolViolation(
                    f"the server at {url} did not open with a valid {PROTOCOL} hello: {exc.message}",
                    code=exc.code,
                ) from None
            await ws.close(CloseCode.NORMAL_CLOSURE)
            return hello
    except InvalidStatus as exc:
        raise upgrade_refusal_error(exc, url, settings.api_key.strip()) from None


def subprotocol_violation(ws: ClientConnection, url: str) -> ProtocolViolation | None:
    """The error to raise when the server did not select the one subprotocol offered, else ``None``."""
    try:
        check_selected_subprotocol(ws.subprotocol)
    except RemoteProtocolError as exc:
        return ProtocolViolation(f"{url}: {server_text(exc.message)}", code=exc.code)
    return None
