"""The gateway emulator: a ``websockets`` asyncio server running one
:class:`~airflow_provider_systemzero.protocol.gateway.GatewaySession` per connection.

The I/O layer is thin. Every protocol rule lives in the sans-I/O core; this module only

* answers the upgrade (WIRE.md §1) with the core's :func:`check_upgrade`, the account's stream
  capacity and the shutdown state, refusing with the core's status, envelope and ``Retry-After``;
* makes and owns, per stream, its websocket connection and the loop that runs its session
  (:mod:`.connection`: every frame, decide outcome, shutdown request and timer in, the session's
  actions performed in order, the send queue reported for the session to judge a slow reader);
* keeps stats, the billing ledger, the last accepted state of every stream (its
  :class:`~.stats.Tally`), how it answered each upgrade (:attr:`Emulator.upgrades`), and fault
  controls.

Native WebSocket pings are websockets' keepalive (``native_heartbeat_interval_ms``, with
``pong_timeout_ms`` to answer); frames over ``max_message_bytes`` are refused by websockets with
close 1009 before they are buffered whole.

Plaintext ``ws://`` is for loopback only: the emulator has no TLS, and the provider's client
refuses ``ws://`` to any host but a loopback one.

The HTTP control surface (:mod:`.control`) lives on the same port under ``/_emulator/`` and always
requires the admin token (``Authorization: Bearer <token>`` or ``X-Emulator-Token: <token>``; 401 otherwise).
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
import logging
import math
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.http11 import Request, Response
from websockets.server import ServerProtocol

import airflow_provider_systemzero
from airflow_provider_systemzero.emulator.backend import DecideBackend, LedgerEntry
from airflow_provider_systemzero.emulator.connection import ActionTap, EmulatorConnection, StreamLoop
from airflow_provider_systemzero.emulator.control import (
    CONTROL_PREFIX,
    apply_fault_params,
    read_control_request,
    respond,
    set_headers,
)
from airflow_provider_systemzero.emulator.deciders import Decider, load_decider
from airflow_provider_systemzero.emulator.faults import Faults
from airflow_provider_systemzero.emulator.redaction import RedactingLogger, mask_secret, masked_header
from airflow_provider_systemzero.emulator.stats import (
    AcceptedState,
    EmulatorStats,
    Tally,
    UpgradeRecord,
    session_totals,
)
from airflow_provider_systemzero.protocol.errors import ErrorEnvelope
from airflow_provider_systemzero.protocol.limits import Limits
from airflow_provider_systemzero.protocol.messages import PROTOCOL
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
    "UpgradeRecord",
    "mask_secret",
    "parse_api_key",
]

log = logging.getLogger(__name__)

#: ``max_concurrent`` of an API key given without one (stream capacity 4).
DEFAULT_MAX_CONCURRENT = 8
#: How many handshakes and upgrade records the emulator keeps (the newest).
_REQUEST_LOG_SIZE = 10_000


def _keep_newest(log: list[Any], entry: Any) -> None:
    """Append ``entry`` to one of the emulator's request logs, keeping the newest
    :data:`_REQUEST_LOG_SIZE`."""
    log.append(entry)
    if len(log) > _REQUEST_LOG_SIZE:
        del log[: len(log) - _REQUEST_LOG_SIZE]


def parse_api_key(spec: str) -> tuple[str, int]:
    """Parse ``KEY`` or ``KEY:MAX_CONCURRENT`` (the CLI's ``--api-key``).

    Whatever follows the last ``:`` is the account's ``max_concurrent``, so it must be a number:
    ``demo:abc`` is refused rather than read as a key named ``demo:abc`` (a key that holds a colon
    is given with its number, ``a:b:8``).

    :param spec: the key, optionally followed by ``:`` and the account's ``max_concurrent``.
    :return: the key and its ``max_concurrent`` (default :data:`DEFAULT_MAX_CONCURRENT`).
    :raises ValueError: for an empty key, a key with spaces, or a bad number.
    """
    key, sep, tail = spec.rpartition(":")
    if not sep:
        key, tail = spec, ""
    elif not tail.isdigit():
        raise ValueError(
            f"{spec!r} ends in {sep + tail!r}, which is not a number: give KEY or KEY:MAX_CONCURRENT "
            f"(such as {key or 'demo'}:8; a key that holds a colon ends in its number too)"
        )
    _check_key(key)
    return key, int(tail) if tail else DEFAULT_MAX_CONCURRENT


def _check_key(key: str) -> None:
    """Refuse a key the gateway could not be given (``Authorization: Bearer <key>``).

    :raises ValueError: for an empty key or a key with spaces.
    """
    if not key or any(c.isspace() for c in key):
        raise ValueError("an API key must be non-empty and contain no spaces")


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
        #: Upgrade requests seen on the stream path: header name → value, secrets masked.
        self.handshakes: list[dict[str, str]] = []
        #: How each upgrade request on the stream path was answered, in order of arrival: when it
        #: came, the status (101: accepted), and a refusal's code and ``Retry-After`` (the newest
        #: 10,000 are kept). Reconnect timing can be read here: how long after a refusal or a
        #: goodbye the next upgrade came.
        self.upgrades: list[UpgradeRecord] = []
        self._action_tap: ActionTap | None = None
        # the counts, reservations and accepted states, kept by the emulator and its streams
        self._tally = Tally(on_change=self._notify)
        self._server: Server | None = None
        self._port: int | None = None
        self._streams: dict[str, StreamLoop] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._shutting_down = False
        self._shutdown_retry_after_ms = shutdown_retry_after_ms
        self._changed: asyncio.Event | None = None
        self._waiting = 0  # wait_for calls waiting on _changed

    @staticmethod
    def _parse_keys(api_keys: Mapping[str, int] | Iterable[str] | None) -> dict[str, int]:
        if api_keys is None:
            return {"demo": DEFAULT_MAX_CONCURRENT}
        if isinstance(api_keys, Mapping):
            accounts = {}
            for key, max_concurrent in api_keys.items():
                _check_key(key)
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

        def connection_factory(protocol: ServerProtocol, server: Server, **kwargs: Any) -> ServerConnection:
            return EmulatorConnection(
                protocol, server, limits=lim, faults=self.faults, tally=self._tally, **kwargs
            )

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
            logger=RedactingLogger(
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
        return self._tally.snapshot([stream.session for stream in self._streams.values()], self.backend)

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
        stream_id = self._tally.latest_by_cache_key.get(prompt_cache_key)
        state = None if stream_id is None else self._tally.states.get(stream_id)
        return None if state is None else AcceptedState.of(state)

    @property
    def action_tap(self) -> ActionTap | None:
        """What each stream's gateway session decided to do passes through this first (``None``:
        nothing does): ``tap(stream, actions)`` returns the actions the stream then performs, so a
        test or a fault scenario can watch them, or drop some. It runs on the event loop; setting
        it sets it on the streams open now too."""
        return self._action_tap

    @action_tap.setter
    def action_tap(self, tap: ActionTap | None) -> None:
        self._action_tap = tap
        for stream in self._streams.values():
            stream.action_tap = tap

    @property
    def open_streams(self) -> list[StreamLoop]:
        """The streams open now (a snapshot), each with its websocket connection (``ws``)."""
        return list(self._streams.values())

    @property
    def reserved_streams(self) -> dict[str, int]:
        """Streams reserved per account at the upgrade and not yet released (a snapshot): the
        account's cap counts them."""
        return {account: n for account, n in self._tally.reserved.items() if n}

    @property
    def shutting_down(self) -> bool:
        """Whether :meth:`stop` (or :meth:`restart`) began the shutdown sequence: a new connection
        is refused with 503 until it ends."""
        return self._shutting_down

    @property
    def prompt_cache_keys(self) -> set[str]:
        """The keys :meth:`latest_state` knows: the ``prompt_cache_key`` of every stream that
        accepted a ``start`` (its ``stream_id`` for a stream without one); a snapshot."""
        return set(self._tally.latest_by_cache_key)

    @property
    def final_states(self) -> dict[str, AcceptedState]:
        """The last accepted state of every stream that accepted a ``start``, by ``stream_id``
        (a snapshot)."""
        return {stream_id: AcceptedState.of(state) for stream_id, state in dict(self._tally.states).items()}

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
                    self._waiting += 1
                    try:
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(0.1):
                                await changed.wait()
                    finally:
                        self._waiting -= 1
        except TimeoutError:
            raise TimeoutError(
                f"emulator condition not met within {timeout} s; stats: {self.stats}"
            ) from None

    def _notify(self) -> None:
        # Only a waiting wait_for needs the news: one that starts later checks its predicate first.
        if self._waiting and self._changed is not None:
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

    async def _shutdown_streams(self, streams: list[StreamLoop], retry_after_ms: int) -> None:
        for stream in streams:
            stream.shutdown(retry_after_ms)
        lim = self.limits
        bound = (
            lim.decision_settlement_timeout_ms
            + lim.write_progress_timeout_ms
            + lim.close_handshake_timeout_ms
        ) / 1000 + 1
        await self._wait_finished(streams, bound)

    async def _wait_finished(self, streams: list[StreamLoop], bound: float) -> None:
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
        arrived = time.monotonic()
        path = request.path
        on_stream_path = not (path.startswith(CONTROL_PREFIX) or path == CONTROL_PREFIX.rstrip("/"))
        try:
            if not on_stream_path:
                return self._control(connection, request)
            refusal = self._judge_upgrade(connection, request)
            if refusal is None:
                self._record_upgrade(UpgradeRecord(arrived, 101))
                return None
            response = self._refuse(connection, refusal)
            self._record_upgrade(
                UpgradeRecord(arrived, refusal.status, refusal.envelope.code, refusal.retry_after_s)
            )
            return response
        except Exception:  # never let one request break the server
            log.exception("upgrade handling failed")
            envelope = ErrorEnvelope(
                "api_error", "internal_error", "the emulator failed to handle the request"
            )
            if on_stream_path:
                self._record_upgrade(UpgradeRecord(arrived, 500, envelope.code))
            return respond(connection, 500, envelope.to_dict())

    def _judge_upgrade(self, connection: ServerConnection, request: Request) -> UpgradeRefusal | None:
        """The refusal of an upgrade request on the stream path, or ``None`` when it is accepted (its
        stream then reserved on the account)."""
        headers: dict[str, str] = {}
        for name, value in request.headers.raw_items():
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        self._record_handshake(headers)
        if request.method != "GET":
            return UpgradeRefusal(
                405,
                ErrorEnvelope(
                    "invalid_request_error", "method_not_allowed", "the upgrade request must use GET"
                ),
            )
        verdict = check_upgrade(request.path, headers, known_key=self.accounts.__contains__)
        if isinstance(verdict, UpgradeRefusal):
            return verdict
        account = verdict
        scripted = self.faults.take_upgrade_refusal()
        if scripted is not None:
            return scripted.refusal()
        if self._shutting_down:
            return maintenance_refusal(retry_after_s=math.ceil(self._shutdown_retry_after_ms / 1000))
        capacity = stream_capacity(self.accounts[account])
        if self._tally.reserved[account] >= capacity:
            return capacity_refusal(capacity, retry_after_s=self.capacity_retry_after_s)
        assert isinstance(connection, EmulatorConnection)
        connection.reserve(account)
        return None

    def _control(self, connection: ServerConnection, request: Request) -> Response:
        """Answer a request to the control surface (:mod:`.control`)."""
        call = read_control_request(connection, request, self.admin_token)
        if isinstance(call, Response):
            return call
        try:
            if call.endpoint == "stats":
                return respond(connection, 200, self.stats.to_dict(mask_accounts=True))
            if call.endpoint == "faults":
                if call.method == "POST":
                    apply_fault_params(self.faults, call.params)
                return respond(connection, 200, self.faults.to_dict())
            count = len(self._streams)
            if call.endpoint == "restart":
                retry_after_ms = call.int_param("retry_after_ms", 500)
                self._spawn(self.restart(retry_after_ms))
                return respond(
                    connection, 202, {"restarting_streams": count, "retry_after_ms": retry_after_ms}
                )
            self._spawn(self.drop_all())
            return respond(connection, 202, {"dropping_streams": count})
        except ValueError as exc:
            envelope = ErrorEnvelope("invalid_request_error", "invalid_parameter", str(exc))
            return respond(connection, 400, envelope.to_dict())

    def _record_handshake(self, headers: dict[str, str]) -> None:
        _keep_newest(self.handshakes, {name: masked_header(name, value) for name, value in headers.items()})

    def _record_upgrade(self, record: UpgradeRecord) -> None:
        _keep_newest(self.upgrades, record)
        self._notify()

    def _refuse(self, connection: ServerConnection, refusal: UpgradeRefusal) -> Response:
        self._tally.upgrade_refusals[refusal.status] += 1
        log.info("upgrade refused with HTTP %s (%s)", refusal.status, refusal.envelope.code)
        response = connection.respond(refusal.status, refusal.body())
        set_headers(response, refusal.headers())
        return response

    # ------------------------------------------------------------------ the stream handler

    async def _handler(self, ws: ServerConnection) -> None:
        assert isinstance(ws, EmulatorConnection) and ws.account is not None
        account = ws.account
        stream = StreamLoop(
            ws,
            account,
            limits=self.limits,
            backend=self.backend,
            tally=self._tally,
            spawn=self._spawn,
            action_tap=self._action_tap,
        )
        if self._shutting_down:  # it says hello, then goodbye
            stream.shutdown(self._shutdown_retry_after_ms)
        self._streams[stream.stream_id] = stream
        tally = self._tally
        tally.counters["streams_total"] += 1
        tally.counters["max_streams_open"] = max(tally.counters["max_streams_open"], len(self._streams))
        tally.by_account[account] += 1
        tally.peak_by_account[account] = max(tally.peak_by_account[account], tally.by_account[account])
        if log.isEnabledFor(logging.INFO):  # the account's tag costs a hash: only when it is printed
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
                tally.closes[code] += 1
            tally.finished_totals.update(session_totals(stream.session))
            del self._streams[stream.stream_id]
            tally.by_account[account] -= 1
            ws.release_reservation()
            stream.finished.set()
            log.info("stream %s closed with %s", stream.stream_id, code)
            self._notify()
