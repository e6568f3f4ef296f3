"""The gateway emulator: a ``websockets`` asyncio server running one
:class:`~airflow_provider_systemzero.protocol.gateway.GatewaySession` per connection.

The I/O layer is thin. Every protocol rule lives in the sans-I/O core; this module only

* answers the upgrade (WIRE.md §1) with the core's :func:`check_upgrade`, the account's stream
  capacity and the shutdown state, refusing with the core's status, envelope and ``Retry-After``;
* per stream, runs one loop that feeds the session every frame, decide outcome, shutdown request
  and timer (``time.monotonic()`` at :meth:`GatewaySession.next_deadline`) and performs the
  returned actions in order: a text frame per :class:`SendMessage` (through a FIFO writer, so
  the loop never blocks on a slow reader and the send queue can be measured), a backend call
  per :class:`DispatchDecide`, a close per :class:`CloseConnection`;
* reports the send queue (queued bytes and frames, write progress) to the session, which decides
  when that is a ``slow_reader``;
* keeps stats, the billing ledger, the last accepted state of every stream, and fault controls.

Native WebSocket pings are websockets' keepalive (``native_heartbeat_interval_ms``, with
``pong_timeout_ms`` to answer); frames over ``max_message_bytes`` are refused by websockets with
close 1009 before they are buffered whole.

Plaintext ``ws://`` is for loopback only: the emulator has no TLS, and the provider's client
refuses ``ws://`` to any host but a loopback one.

The HTTP control surface lives on the same port under ``/_emulator/`` and always requires the
admin token (``Authorization: Bearer <token>`` or ``X-Emulator-Token: <token>``; 401 otherwise).
``websockets`` reads no request body, so parameters go in the query string:

==========================================  ================================================
``GET /_emulator/stats``                    the stats as JSON
``GET /_emulator/faults``                   the standing faults
``POST /_emulator/faults?…``                change faults: ``fail=N`` with ``status``, ``code``,
                                            ``type``, ``retry_after_ms``, ``retry_after_s``,
                                            ``retryable``; ``delay_ms``; ``answer_pings``;
                                            ``refuse=N`` with ``refuse_status``, ``refuse_code``,
                                            ``refuse_retry_after_s``; ``clear=true`` first
``POST /_emulator/restart?retry_after_ms=``  goodbye ``shutdown`` and close 1012 to every stream
``POST /_emulator/drop``                     abort every socket without a close frame
==========================================  ================================================
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import State
from websockets.server import ServerProtocol

import airflow_provider_systemzero
from airflow_provider_systemzero.emulator.backend import DecideBackend, LedgerEntry
from airflow_provider_systemzero.emulator.deciders import Decider, load_decider
from airflow_provider_systemzero.emulator.faults import Faults
from airflow_provider_systemzero.protocol.body import compact_json
from airflow_provider_systemzero.protocol.errors import ErrorEnvelope, RetryHint
from airflow_provider_systemzero.protocol.gateway import (
    CloseConnection,
    DecideFailure,
    DecideOutcome,
    DispatchDecide,
    GatewayAction,
    GatewaySession,
    SendMessage,
)
from airflow_provider_systemzero.protocol.limits import Limits
from airflow_provider_systemzero.protocol.messages import PROTOCOL, Ping, encode_message
from airflow_provider_systemzero.protocol.ratelimit import TokenBucket
from airflow_provider_systemzero.protocol.reconnect import CloseCode
from airflow_provider_systemzero.protocol.upgrade import (
    STREAM_PATH,
    UpgradeRefusal,
    capacity_refusal,
    check_upgrade,
    maintenance_refusal,
    stream_capacity,
)

__all__ = [
    "CONTROL_PREFIX",
    "DEFAULT_MAX_CONCURRENT",
    "AcceptedState",
    "Emulator",
    "EmulatorStats",
    "mask_secret",
    "parse_api_key",
]

log = logging.getLogger(__name__)

#: Path prefix of the HTTP control surface.
CONTROL_PREFIX = "/_emulator/"
#: ``max_concurrent`` of an API key given without one (stream capacity 4).
DEFAULT_MAX_CONCURRENT = 8
_HANDSHAKE_LOG_SIZE = 10_000
_SECRET_HEADERS = frozenset({"authorization", "x-emulator-token", "cookie", "proxy-authorization"})


def mask_secret(value: str) -> str:
    """A printable stand-in for a secret: never the secret, but stable (a short SHA-256 tag)."""
    return "sha256:" + hashlib.sha256(value.encode("utf-8")).hexdigest()[:8]


def parse_api_key(spec: str) -> tuple[str, int]:
    """Parse ``KEY`` or ``KEY:MAX_CONCURRENT`` (the CLI's ``--api-key``).

    :param spec: the key, optionally followed by ``:`` and the account's ``max_concurrent``.
    :return: the key and its ``max_concurrent`` (default :data:`DEFAULT_MAX_CONCURRENT`).
    :raises ValueError: for an empty key, a key with spaces, or a bad number.
    """
    key, sep, tail = spec.rpartition(":")
    if not sep or not tail.isdigit():
        key, tail = spec, ""
    if not key or any(c.isspace() for c in key):
        raise ValueError("an API key must be non-empty and contain no spaces")
    return key, int(tail) if tail else DEFAULT_MAX_CONCURRENT


class AcceptedState(NamedTuple):
    """A stream's last accepted state.

    :ivar state: the state (string, array or object; read-only).
    :ivar attachments: the inline attachments in wire form (``{"name", "data"}``).
    """

    state: Any
    attachments: list[dict[str, str]]


@dataclass(frozen=True, slots=True)
class EmulatorStats:
    """A snapshot of what the emulator did (take a new one with :attr:`Emulator.stats`).

    :param streams_open: streams whose handler runs now.
    :param streams_total: streams ever opened (successful upgrades).
    :param max_streams_open: the most streams open at once.
    :param events_accepted: mutations acknowledged, over every stream.
    :param decisions_dispatched: decide calls started by the gateway sessions.
    :param decisions_delivered: ``decision`` messages sent.
    :param decisions_billed: fresh decisions billed by the backend.
    :param decisions_replayed: original replies returned unbilled for a replayed key and body.
    :param decide_failures: failed decide calls by HTTP status.
    :param upgrade_refusals: refused upgrades by HTTP status.
    :param protocol_refusals: protocol refusals (WIRE.md §2), over every stream.
    :param rejections: non-fatal rejections, over every stream.
    :param closes_by_code: finished streams by close code (the gateway's code when it closed,
        else the client's, else 1006 for a connection lost without a close frame).
    :param connections_by_account: open streams per account.
    :param peak_connections_by_account: the most streams each account held at once.
    :param messages_sent: server messages sent, by ``type``.
    :param native_pings_sent: WebSocket ping frames sent by the keepalive.
    :param native_pongs_received: WebSocket pong frames received.
    :param native_control_floods: connections closed 1008 for native pings and pongs over the
        advertised native control limits.
    :param decision_starts_refused: decision starts the account limits refused (429
        ``rate_limited``), over every connection of every key.
    :param decision_starts_refused_per_minute: the same, in the last 60 seconds.
    """

    streams_open: int = 0
    streams_total: int = 0
    max_streams_open: int = 0
    events_accepted: int = 0
    decisions_dispatched: int = 0
    decisions_delivered: int = 0
    decisions_billed: int = 0
    decisions_replayed: int = 0
    decide_failures: dict[int, int] = field(default_factory=dict)
    upgrade_refusals: dict[int, int] = field(default_factory=dict)
    protocol_refusals: int = 0
    rejections: int = 0
    closes_by_code: dict[int, int] = field(default_factory=dict)
    connections_by_account: dict[str, int] = field(default_factory=dict)
    peak_connections_by_account: dict[str, int] = field(default_factory=dict)
    messages_sent: dict[str, int] = field(default_factory=dict)
    native_pings_sent: int = 0
    native_pongs_received: int = 0
    native_control_floods: int = 0
    decision_starts_refused: int = 0
    decision_starts_refused_per_minute: int = 0

    def to_dict(self, *, mask_accounts: bool = False) -> dict[str, Any]:
        """JSON form (integer keys become strings).

        :param mask_accounts: replace account names (API keys) by :func:`mask_secret` tags.
        """
        data = asdict(self)
        for name in ("decide_failures", "upgrade_refusals", "closes_by_code"):
            data[name] = {str(k): v for k, v in data[name].items()}
        if mask_accounts:
            for name in ("connections_by_account", "peak_connections_by_account"):
                data[name] = {mask_secret(k): v for k, v in data[name].items()}
        return data


# --------------------------------------------------------------------------------------------
# the connection class: counts native control frames, and can play a silent peer
# --------------------------------------------------------------------------------------------


class _EmulatorConnection(ServerConnection):
    def __init__(
        self, protocol: ServerProtocol, server: Server, *, emulator: Emulator, **kwargs: Any
    ) -> None:
        super().__init__(protocol, server, **kwargs)
        self.emulator = emulator
        self.account: str | None = None
        self.reservation_released = True
        # the client's native pings and pongs, against the advertised native control limits
        lim, now = emulator.limits, time.monotonic()
        self._control_frames = TokenBucket(
            lim.max_native_control_frames_per_second, max(1, lim.native_control_frame_burst), now
        )
        self._control_bytes = TokenBucket(
            lim.max_native_control_bytes_per_second, max(1, lim.native_control_byte_burst), now
        )

    def send_data(self) -> None:
        # A silent peer: once open, every outgoing byte is dropped (pongs, pings, messages, the
        # close frame). The protocol state still advances, so a close times out and aborts.
        if not self.emulator.faults.answer_pings and self.protocol.state is not State.CONNECTING:
            self.protocol.data_to_send()
            return
        super().send_data()

    async def ping(self, data: Any = None) -> Awaitable[float]:
        self.emulator._counters["native_pings_sent"] += 1
        return await super().ping(data)

    def process_event(self, event: Any) -> None:
        if isinstance(event, Frame) and event.opcode in (Opcode.PING, Opcode.PONG):
            if event.opcode is Opcode.PONG:
                self.emulator._counters["native_pongs_received"] += 1
            now = time.monotonic()
            size = max(1, len(event.data))  # an empty ping still costs a byte of the budget
            if not (self._control_frames.try_take(now) and self._control_bytes.try_take(now, size)):
                # over max_native_control_frames_per_second / _bytes_per_second (and their bursts):
                # the public document names the limits, not the outcome; the emulator closes 1008
                if self.protocol.state is State.OPEN:
                    self.emulator._counters["native_control_floods"] += 1
                    self.protocol.fail(CloseCode.POLICY_VIOLATION, "native_control_rate_limited")
                    self.send_data()
                return
        super().process_event(event)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        # A close frame from the client ends the stream for capacity at once: the client can only
        # see its connection closed (and open the next one) after this point.
        if self.protocol.close_rcvd is not None:
            self.release_reservation()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.release_reservation()

    def release_reservation(self) -> None:
        if not self.reservation_released and self.account is not None:
            self.reservation_released = True
            self.emulator._reserved[self.account] -= 1


# --------------------------------------------------------------------------------------------
# one stream
# --------------------------------------------------------------------------------------------

_TICK = ("tick",)
_LOST = ("lost",)
_CLOSE = object()


class _Stream:
    """The I/O loop of one stream connection.

    Three tasks: a reader putting frames in the inbox, a writer taking frames from the outbox,
    and :meth:`run`, the only one that touches the session. Decide calls (emulator-owned tasks,
    so a decide outlives a dropped connection and settles in the ledger as it would on the real
    service), shutdown requests and completed ping writes arrive through the inbox too.
    """

    def __init__(self, emulator: Emulator, ws: _EmulatorConnection, account: str) -> None:
        self.emulator = emulator
        self.ws = ws
        self.account = account
        self.stream_id = "szws_" + secrets.token_hex(16)
        self.limits = emulator.limits
        self.session = GatewaySession(stream_id=self.stream_id, now=time.monotonic(), limits=self.limits)
        self.inbox: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
        self.outbox: asyncio.Queue[Any] = asyncio.Queue()
        self.out_bytes = 0
        self.writing = False
        self.last_progress = time.monotonic()
        self.close_action: CloseConnection | None = None
        self.counted_close: int | None = None
        self.finished = asyncio.Event()
        self._state_seen: Any = None

    # ------------------------------------------------------------------ tasks

    async def _read(self) -> None:
        try:
            async for message in self.ws:
                if isinstance(message, str):
                    self.inbox.put_nowait(("text", message))
                else:
                    self.inbox.put_nowait(("binary",))
        except ConnectionClosed:
            pass
        finally:
            self.inbox.put_nowait(_LOST)

    async def _write(self) -> None:
        while True:
            item = await self.outbox.get()
            if item is _CLOSE:
                assert self.close_action is not None
                await self.ws.close(self.close_action.code, self.close_action.reason)
                return
            text, size, nonce = item
            self.writing = True
            try:
                await self.ws.send(text)
            except ConnectionClosed:
                return
            finally:
                self.writing = False
            self.out_bytes -= size
            now = time.monotonic()
            self.last_progress = now
            if nonce is not None:
                self.inbox.put_nowait(("ping_written", nonce, now))

    # ------------------------------------------------------------------ the loop

    async def run(self) -> None:
        reader = asyncio.create_task(self._read())
        writer = asyncio.create_task(self._write())
        try:
            self._perform(self.session.actions())
            if self.emulator._shutting_down:
                self._perform(
                    self.session.begin_shutdown(time.monotonic(), self.emulator._shutdown_retry_after_ms)
                )
            while not self.session.closed:
                event = await self._next_event()
                now = time.monotonic()
                kind = event[0]
                if kind == "text":
                    self._perform(self.session.receive_text(event[1], now))
                    self._observe_state()
                elif kind == "binary":
                    self._perform(self.session.receive_binary(now))
                elif kind == "decided":
                    self._perform(self.session.dispatch_finished(event[1], event[2], now))
                elif kind == "ping_written":
                    self.session.ping_written(event[1], event[2])
                elif kind == "shutdown":
                    self._perform(self.session.begin_shutdown(now, event[1]))
                elif kind == "lost":
                    self.session.connection_lost()
                    break
                else:
                    self._perform(self.session.tick(now))
                if not self.outbox.empty():
                    # Let the writer hand what is queued to the transport before the next event:
                    # a burst of client frames must not look like a slow reader. Only real
                    # backpressure (a paused transport) leaves frames queued.
                    await asyncio.sleep(0)
                self._report_send_queue(time.monotonic())
                self.emulator._notify()
            if self.close_action is not None:
                await self._finish_close(writer)
        finally:
            reader.cancel()
            if not writer.done():
                writer.cancel()
            self.session.connection_lost()

    async def _next_event(self) -> tuple[Any, ...]:
        deadlines = [d for d in (self.session.next_deadline(), self._send_queue_deadline()) if d is not None]
        timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
        try:
            async with asyncio.timeout(timeout):
                return await self.inbox.get()
        except TimeoutError:
            return _TICK

    def _perform(self, actions: Iterable[GatewayAction]) -> None:
        for action in actions:
            if isinstance(action, SendMessage):
                message = action.message
                text = encode_message(message)
                size = len(text.encode("utf-8"))
                if self.outbox.empty() and not self.writing:
                    self.last_progress = time.monotonic()
                self.out_bytes += size
                self.outbox.put_nowait((text, size, message.nonce if isinstance(message, Ping) else None))
                self.emulator._messages_sent[message.TYPE] += 1
                if message.TYPE == "decision":
                    log.info(
                        "stream %s: decision for state version %s",
                        self.stream_id,
                        getattr(message, "state_version", "?"),
                    )
            elif isinstance(action, DispatchDecide):
                self.emulator._spawn(self._decide(action))
            elif isinstance(action, CloseConnection):
                self.close_action = action
                self.outbox.put_nowait(_CLOSE)
                # Counted now, before the close frame is written, so a test that saw the close
                # sees it in the stats. websockets may have closed first (1009, a keepalive
                # timeout): then that is the code on the wire.
                sent = self.ws.protocol.close_sent
                self.counted_close = sent.code if sent is not None else action.code
                self.emulator._closes[self.counted_close] += 1

    async def _decide(self, action: DispatchDecide) -> None:
        try:
            outcome: DecideOutcome = await self.emulator.backend.decide(
                self.account, action.body, action.idempotency_key
            )
        except Exception as exc:  # keep the stream alive whatever the backend does
            log.exception("decide backend failed")
            outcome = DecideFailure(
                500,
                ErrorEnvelope("api_error", "internal_error", f"backend failure: {exc}"),
                RetryHint(False),
                "req_" + secrets.token_hex(12),
            )
        self.inbox.put_nowait(("decided", action.dispatch_id, outcome))

    def _observe_state(self) -> None:
        current = self.session.stream_state
        if current is None or current is self._state_seen:
            return
        if self._state_seen is None and self.session.request is not None:
            key = self.session.request.prompt_cache_key
            self.emulator._latest_by_cache_key[key if key is not None else self.stream_id] = self.stream_id
        self._state_seen = current
        self.emulator.final_states[self.stream_id] = AcceptedState(
            current.state, [a.to_dict() for a in current.attachments]
        )

    # ------------------------------------------------------------------ send queue

    def _queued_frames(self) -> int:
        return self.outbox.qsize() - (1 if self.close_action is not None and not self.outbox.empty() else 0)

    def _send_queue_pending(self) -> bool:
        return self.writing or self._queued_frames() > 0

    def _send_queue_deadline(self) -> float | None:
        if self.session.closed or not self._send_queue_pending():
            return None
        return self.last_progress + self.limits.write_progress_timeout_ms / 1000

    def _report_send_queue(self, now: float) -> None:
        if self.session.closed:
            return
        transport_bytes = 0
        with contextlib.suppress(Exception):
            transport_bytes = self.ws.transport.get_write_buffer_size()
        stalled = now - self.last_progress if self._send_queue_pending() else 0.0
        self._perform(
            self.session.send_queue_report(
                queued_bytes=self.out_bytes + transport_bytes,
                queued_frames=self._queued_frames(),
                write_stalled_for=stalled,
                now=now,
            )
        )

    async def _finish_close(self, writer: asyncio.Task[None]) -> None:
        # The writer flushes what is queued, then closes. A reader too slow to take the backlog
        # gets write_progress_timeout, then the close frame is queued directly; if even that
        # cannot be written within the close handshake timeout, the TCP connection is aborted.
        assert self.close_action is not None
        with contextlib.suppress(TimeoutError, ConnectionClosed):
            await asyncio.wait_for(asyncio.shield(writer), self.limits.write_progress_timeout_ms / 1000)
        if writer.done():
            return
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
            await writer
        try:
            async with asyncio.timeout(self.limits.close_handshake_timeout_ms / 1000):
                await self.ws.close(self.close_action.code, self.close_action.reason)
        except TimeoutError:
            self.ws.transport.abort()

    def close_code(self) -> int:
        """The close code of a stream the gateway session did not close itself."""
        protocol = self.ws.protocol
        if protocol.close_sent is not None:
            return protocol.close_sent.code
        if protocol.close_rcvd is not None:
            return protocol.close_rcvd.code
        return CloseCode.ABNORMAL_CLOSURE


# --------------------------------------------------------------------------------------------
# the emulator
# --------------------------------------------------------------------------------------------


class Emulator:
    """A local System Zero stream gateway.

    Use it as ``async with Emulator(...) as emu:`` — on entry it listens, on exit it shuts down
    gracefully (goodbye ``shutdown`` and close 1012 to every stream, WIRE.md §7).

    :param host: the address to bind (loopback: the emulator speaks plaintext ``ws://``).
    :param port: the port (0: pick a free one, see :attr:`port`).
    :param api_keys: API key → the account's ``max_concurrent`` (stream capacity
        ``max(1, floor(max_concurrent / 2))``), or an iterable of ``KEY`` / ``KEY:N`` strings.
        Each key is its own account. Default ``{"demo": 8}``.
    :param limits: the limits to advertise and enforce (default: the public document's).
    :param decider: ``keyword``, ``rules:FILE``, ``python:module:function`` or a :class:`Decider`.
    :param decide_latency_ms: simulated inference time of each fresh decision.
    :param admin_token: the control surface's token (default: a random one, see :attr:`admin_token`).
    :param shutdown_retry_after_ms: ``goodbye.resume.retry_after_ms`` on the final shutdown.
    :param capacity_retry_after_s: ``Retry-After`` of a 429 ``stream_capacity`` refusal.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        api_keys: Mapping[str, int] | Iterable[str] | None = None,
        limits: Limits | None = None,
        decider: str | Decider = "keyword",
        decide_latency_ms: int = 0,
        admin_token: str | None = None,
        shutdown_retry_after_ms: int = 500,
        capacity_retry_after_s: int = 1,
    ) -> None:
        self.host = host
        self._requested_port = port
        self.limits = limits or Limits()
        self.accounts: dict[str, int] = self._parse_keys(api_keys)
        self.decider = load_decider(decider)
        self.faults = Faults()
        self.backend = DecideBackend(
            self.decider,
            limits=self.limits,
            faults=self.faults,
            decide_latency_ms=decide_latency_ms,
            on_change=self._notify,
        )
        self.admin_token = admin_token if admin_token is not None else secrets.token_urlsafe(24)
        self.shutdown_retry_after_ms = shutdown_retry_after_ms
        self.capacity_retry_after_s = capacity_retry_after_s
        #: The last accepted state of every stream that accepted a ``start``, by ``stream_id``.
        self.final_states: dict[str, AcceptedState] = {}
        #: Upgrade requests seen on the stream path: header name → value, secrets masked.
        self.handshakes: list[dict[str, str]] = []
        self._latest_by_cache_key: dict[str, str] = {}
        self._server: Server | None = None
        self._port: int | None = None
        self._streams: dict[str, _Stream] = {}
        self._reserved: Counter[str] = Counter()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._shutting_down = False
        self._shutdown_retry_after_ms = shutdown_retry_after_ms
        self._changed: asyncio.Event | None = None
        self._counters: Counter[str] = Counter()
        self._messages_sent: Counter[str] = Counter()
        self._upgrade_refusals: Counter[int] = Counter()
        self._closes: Counter[int] = Counter()
        self._by_account: Counter[str] = Counter()
        self._peak_by_account: Counter[str] = Counter()
        self._finished_totals: Counter[str] = Counter()

    @staticmethod
    def _parse_keys(api_keys: Mapping[str, int] | Iterable[str] | None) -> dict[str, int]:
        if api_keys is None:
            return {"demo": DEFAULT_MAX_CONCURRENT}
        if isinstance(api_keys, Mapping):
            accounts = {}
            for key, max_concurrent in api_keys.items():
                parse_api_key(key)  # validates the key
                if (
                    isinstance(max_concurrent, bool)
                    or not isinstance(max_concurrent, int)
                    or max_concurrent < 0
                ):
                    raise ValueError("max_concurrent must be a non-negative integer")
                accounts[key] = max_concurrent
            return accounts
        if isinstance(api_keys, str):
            api_keys = [api_keys]
        return dict(parse_api_key(spec) for spec in api_keys)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Listen. Idempotent."""
        if self._server is not None:
            return
        self._changed = asyncio.Event()
        lim = self.limits
        emulator = self

        def connection_factory(protocol: ServerProtocol, server: Server, **kwargs: Any) -> ServerConnection:
            return _EmulatorConnection(protocol, server, emulator=emulator, **kwargs)

        self._server = await serve(
            self._handler,
            self.host,
            self._requested_port,
            process_request=self._process_request,
            select_subprotocol=lambda _connection, offered: PROTOCOL if PROTOCOL in offered else None,
            compression=None,
            max_size=lim.max_message_bytes or None,
            ping_interval=lim.native_heartbeat_interval_ms / 1000 or None,
            ping_timeout=lim.pong_timeout_ms / 1000 or None,
            close_timeout=lim.close_handshake_timeout_ms / 1000,
            server_header=f"systemzero-emulator/{airflow_provider_systemzero.__version__}",
            create_connection=connection_factory,  # type: ignore[arg-type]
            logger=_RedactingLogger(
                logging.getLogger(f"{__name__}.websockets"), lambda: [*self.accounts, self.admin_token]
            ),
        )
        self._port = self._server.sockets[0].getsockname()[1]
        log.info("emulator listening on %s", self.origin)

    async def stop(self, *, retry_after_ms: int | None = None) -> None:
        """Shut down gracefully: refuse new upgrades (503 ``maintenance``), send every stream the
        shutdown sequence (an in-flight decide may settle for ``decision_settlement_timeout``, then
        goodbye ``shutdown`` and close 1012), then stop listening. Idempotent.

        :param retry_after_ms: ``goodbye.resume.retry_after_ms`` (default: the constructor's).
        """
        if self._server is None:
            return
        self._shutting_down = True
        self._shutdown_retry_after_ms = (
            self.shutdown_retry_after_ms if retry_after_ms is None else retry_after_ms
        )
        await self._shutdown_streams(list(self._streams.values()), self._shutdown_retry_after_ms)
        server, self._server = self._server, None
        server.close(close_connections=True, code=CloseCode.SERVICE_RESTART, reason="shutdown")
        await server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        log.info("emulator stopped")

    async def __aenter__(self) -> Emulator:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # ------------------------------------------------------------------ addresses

    @property
    def port(self) -> int:
        """The port listened on."""
        if self._port is None:
            raise RuntimeError("the emulator is not started")
        return self._port

    @property
    def origin(self) -> str:
        """``ws://HOST:PORT`` — what goes in the connection's host."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"ws://{host}:{self.port}"

    @property
    def url(self) -> str:
        """The stream URL, ``ws://HOST:PORT/v1/system-zero/stream``."""
        return self.origin + STREAM_PATH

    # ------------------------------------------------------------------ observation

    @property
    def stats(self) -> EmulatorStats:
        """A snapshot of the counters."""
        totals = Counter(self._finished_totals)
        for stream in self._streams.values():
            totals.update(_session_totals(stream.session))
        counters = self._counters
        return EmulatorStats(
            streams_open=len(self._streams),
            streams_total=counters["streams_total"],
            max_streams_open=counters["max_streams_open"],
            events_accepted=totals["events_accepted"],
            decisions_dispatched=totals["decisions_dispatched"],
            decisions_delivered=self._messages_sent["decision"],
            decisions_billed=self.backend.billed,
            decisions_replayed=self.backend.replayed,
            decide_failures=dict(self.backend.failures_by_status),
            upgrade_refusals=dict(self._upgrade_refusals),
            protocol_refusals=totals["protocol_refusals"],
            rejections=totals["rejections"],
            closes_by_code=dict(self._closes),
            connections_by_account={a: n for a, n in self._by_account.items() if n},
            peak_connections_by_account=dict(self._peak_by_account),
            messages_sent=dict(self._messages_sent),
            native_pings_sent=counters["native_pings_sent"],
            native_pongs_received=counters["native_pongs_received"],
            native_control_floods=counters["native_control_floods"],
            decision_starts_refused=self.backend.starts_refused,
            decision_starts_refused_per_minute=self.backend.starts_refused_per_minute(),
        )

    @property
    def ledger(self) -> dict[str, list[LedgerEntry]]:
        """Answered decide calls per account, in order (billed and replayed)."""
        return self.backend.ledger

    def billed_bodies(self) -> list[str]:
        """SHA-256 of every billed decide body, in order (assert "billed once per distinct state")."""
        return self.backend.billed_bodies()

    def latest_state(self, prompt_cache_key: str) -> AcceptedState | None:
        """The last accepted state of the most recently started stream with this
        ``prompt_cache_key`` (a stream without one is keyed by its ``stream_id``), or ``None``.

        :param prompt_cache_key: the key.
        """
        stream_id = self._latest_by_cache_key.get(prompt_cache_key)
        return None if stream_id is None else self.final_states.get(stream_id)

    async def wait_for(self, predicate: Callable[[Emulator], bool], timeout: float = 10.0) -> None:  # noqa: ASYNC109 (a helper for tests: the bound is the point)
        """Wait until ``predicate(self)`` is true; it is re-checked whenever a stream, the backend
        or a connection changes something.

        :param predicate: the condition.
        :param timeout: seconds to wait at most.
        :raises TimeoutError: naming the stats when the condition did not come true in time.
        """
        try:
            async with asyncio.timeout(timeout):
                while not predicate(self):
                    changed = self._changed or asyncio.Event()
                    # Re-check at least every 100 ms for conditions that only time changes.
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(0.1):
                            await changed.wait()
        except TimeoutError:
            raise TimeoutError(
                f"emulator condition not met within {timeout} s; stats: {self.stats}"
            ) from None

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()

    # ------------------------------------------------------------------ faults and actions

    async def restart(self, retry_after_ms: int = 500) -> None:
        """The WIRE.md §7 shutdown sequence to every open stream (goodbye ``shutdown`` with this
        delay, close 1012), waiting until they are closed; new connections keep being served.

        :param retry_after_ms: ``goodbye.resume.retry_after_ms``.
        """
        await self._shutdown_streams(list(self._streams.values()), retry_after_ms)

    async def drop_all(self) -> None:
        """Abort every stream's TCP connection without a close frame (the client sees 1006), and
        wait until their handlers noticed."""
        streams = list(self._streams.values())
        for stream in streams:
            stream.ws.transport.abort()
        await self._wait_finished(streams, 5.0)

    async def _shutdown_streams(self, streams: list[_Stream], retry_after_ms: int) -> None:
        for stream in streams:
            stream.inbox.put_nowait(("shutdown", retry_after_ms))
        lim = self.limits
        bound = (
            lim.decision_settlement_timeout_ms
            + lim.write_progress_timeout_ms
            + lim.close_handshake_timeout_ms
        ) / 1000 + 1
        await self._wait_finished(streams, bound)

    async def _wait_finished(self, streams: list[_Stream], bound: float) -> None:
        pending = [asyncio.ensure_future(s.finished.wait()) for s in streams if not s.finished.is_set()]
        if not pending:
            return
        _, late = await asyncio.wait(pending, timeout=bound)
        for future in late:
            future.cancel()
        for stream in streams:
            if not stream.finished.is_set():
                stream.ws.transport.abort()

    def _spawn(self, coroutine: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ the upgrade

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        try:
            path = request.path
            if path.startswith(CONTROL_PREFIX) or path == CONTROL_PREFIX.rstrip("/"):
                return self._control(connection, request)
            headers: dict[str, str] = {}
            for name, value in request.headers.raw_items():
                headers[name] = f"{headers[name]}, {value}" if name in headers else value
            self._record_handshake(headers)
            if request.method != "GET":
                return self._refuse(
                    connection,
                    UpgradeRefusal(
                        405,
                        ErrorEnvelope(
                            "invalid_request_error", "method_not_allowed", "the upgrade request must use GET"
                        ),
                    ),
                )
            verdict = check_upgrade(path, headers, known_key=self.accounts.__contains__)
            if isinstance(verdict, UpgradeRefusal):
                return self._refuse(connection, verdict)
            account = verdict
            scripted = self.faults.take_upgrade_refusal()
            if scripted is not None:
                return self._refuse(connection, scripted.refusal())
            if self._shutting_down:
                return self._refuse(
                    connection,
                    maintenance_refusal(retry_after_s=math.ceil(self._shutdown_retry_after_ms / 1000)),
                )
            capacity = stream_capacity(self.accounts[account])
            if self._reserved[account] >= capacity:
                return self._refuse(
                    connection, capacity_refusal(capacity, retry_after_s=self.capacity_retry_after_s)
                )
            assert isinstance(connection, _EmulatorConnection)
            self._reserved[account] += 1
            connection.account = account
            # Released when the client's close frame arrives, when the TCP connection is lost
            # (also before the stream started), or when the stream handler ends.
            connection.reservation_released = False
            return None
        except Exception:  # never let one request break the server
            log.exception("upgrade handling failed")
            return self._respond(
                connection,
                500,
                ErrorEnvelope(
                    "api_error", "internal_error", "the emulator failed to handle the request"
                ).to_dict(),
            )

    def _record_handshake(self, headers: dict[str, str]) -> None:
        masked = {name: _masked_header(name, value) for name, value in headers.items()}
        self.handshakes.append(masked)
        if len(self.handshakes) > _HANDSHAKE_LOG_SIZE:
            del self.handshakes[: len(self.handshakes) - _HANDSHAKE_LOG_SIZE]

    def _refuse(self, connection: ServerConnection, refusal: UpgradeRefusal) -> Response:
        self._upgrade_refusals[refusal.status] += 1
        log.info("upgrade refused with HTTP %s (%s)", refusal.status, refusal.envelope.code)
        self._notify()
        response = connection.respond(refusal.status, refusal.body())
        _set_headers(response, refusal.headers())
        return response

    @staticmethod
    def _respond(connection: ServerConnection, status: int, payload: Any) -> Response:
        response = connection.respond(status, compact_json(payload) + "\n")
        _set_headers(response, {"Content-Type": "application/json", "Cache-Control": "no-store"})
        return response

    # ------------------------------------------------------------------ the control surface

    def _control(self, connection: ServerConnection, request: Request) -> Response:
        auth = request.headers.get("Authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            token = request.headers.get("X-Emulator-Token", "")
        if not token or not secrets.compare_digest(token.strip().encode(), self.admin_token.encode()):
            return self._respond(
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
        routes: dict[str, tuple[str, ...]] = {
            "/_emulator/stats": ("GET",),
            "/_emulator/faults": ("GET", "POST"),
            "/_emulator/restart": ("POST",),
            "/_emulator/drop": ("POST",),
        }
        if route not in routes:
            return self._respond(
                connection,
                404,
                ErrorEnvelope(
                    "invalid_request_error",
                    "not_found",
                    f"no control endpoint {route!r}; endpoints: {sorted(routes)}",
                ).to_dict(),
            )
        if method not in routes[route]:
            return self._respond(
                connection,
                405,
                ErrorEnvelope(
                    "invalid_request_error",
                    "method_not_allowed",
                    f"{route} accepts {' or '.join(routes[route])}",
                ).to_dict(),
            )
        try:
            if route == "/_emulator/stats":
                return self._respond(connection, 200, self.stats.to_dict(mask_accounts=True))
            if route == "/_emulator/faults":
                if method == "POST":
                    self._apply_fault_params(params)
                return self._respond(connection, 200, self.faults.to_dict())
            if route == "/_emulator/restart":
                retry_after_ms = _int_param(params, "retry_after_ms", 500)
                count = len(self._streams)
                self._spawn(self.restart(retry_after_ms))
                return self._respond(
                    connection, 202, {"restarting_streams": count, "retry_after_ms": retry_after_ms}
                )
            count = len(self._streams)
            self._spawn(self.drop_all())
            return self._respond(connection, 202, {"dropping_streams": count})
        except ValueError as exc:
            return self._respond(
                connection,
                400,
                ErrorEnvelope("invalid_request_error", "invalid_parameter", str(exc)).to_dict(),
            )

    def _apply_fault_params(self, params: dict[str, str]) -> None:
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
            self.faults.clear()
        if "fail" in params:
            self.faults.fail_decides(
                _int_param(params, "fail", 1),
                status=_int_param(params, "status", 503),
                code=params.get("code") or None,
                error_type=params.get("type") or None,
                retry_after_ms=_int_param(params, "retry_after_ms", None),
                retry_after_s=_int_param(params, "retry_after_s", None),
                retryable=_bool_param(params, "retryable", True),
            )
        if "delay_ms" in params:
            self.faults.delay_decisions_ms = _int_param(params, "delay_ms", 0) or 0
        if "answer_pings" in params:
            self.faults.answer_pings = _bool_param(params, "answer_pings", True)
        if "refuse" in params:
            self.faults.refuse_upgrades(
                _int_param(params, "refuse", 1),
                status=_int_param(params, "refuse_status", 503),
                code=params.get("refuse_code") or None,
                retry_after_s=_int_param(params, "refuse_retry_after_s", 1),
            )

    # ------------------------------------------------------------------ the stream handler

    async def _handler(self, ws: ServerConnection) -> None:
        assert isinstance(ws, _EmulatorConnection) and ws.account is not None
        account = ws.account
        stream = _Stream(self, ws, account)
        self._streams[stream.stream_id] = stream
        counters = self._counters
        counters["streams_total"] += 1
        counters["max_streams_open"] = max(counters["max_streams_open"], len(self._streams))
        self._by_account[account] += 1
        self._peak_by_account[account] = max(self._peak_by_account[account], self._by_account[account])
        log.info("stream %s opened (account %s)", stream.stream_id, mask_secret(account))
        self._notify()
        try:
            await stream.run()
        except Exception:
            log.exception("stream %s failed", stream.stream_id)
            ws.transport.abort()
        finally:
            code = stream.counted_close
            if code is None:
                code = stream.close_code()
                self._closes[code] += 1
            self._finished_totals.update(_session_totals(stream.session))
            del self._streams[stream.stream_id]
            self._by_account[account] -= 1
            ws.release_reservation()
            stream.finished.set()
            log.info("stream %s closed with %s", stream.stream_id, code)
            self._notify()


def _masked_header(name: str, value: str) -> str:
    """A header value safe to record or log: secret headers keep only their scheme (``Bearer ***``)."""
    if name.lower() not in _SECRET_HEADERS:
        return value
    scheme, sep, _secret = value.partition(" ")
    return f"{scheme} ***" if sep and name.lower() != "cookie" else "***"


class _RedactingLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """websockets logs every request header at DEBUG (``< Authorization: Bearer …``): secret headers
    are masked, and no configured API key or admin token appears in any record."""

    def __init__(self, logger: logging.Logger, secrets: Callable[[], Iterable[str]]) -> None:
        super().__init__(logger, {})
        self._secrets = secrets

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        if not self.isEnabledFor(level):
            return
        if len(args) == 2 and isinstance(args[0], str) and isinstance(args[1], str):
            args = (args[0], _masked_header(args[0], args[1]))
        super().log(level, self._redact(msg), *(self._redact(a) for a in args), **kwargs)

    def _redact(self, value: object) -> object:
        if isinstance(value, str):
            for secret in self._secrets():
                if secret and secret in value:
                    value = value.replace(secret, mask_secret(secret))
        return value


def _session_totals(session: GatewaySession) -> dict[str, int]:
    return {
        "events_accepted": session.accepted_events,
        "decisions_dispatched": session.dispatches,
        "protocol_refusals": session.refusal_count,
        "rejections": session.rejections,
    }


def _set_headers(response: Response, headers: Mapping[str, str]) -> None:
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
