"""The resilient asyncio client of a System Zero stream: a thin I/O adapter over the sans-I/O core.

:class:`DecisionStream` owns one :class:`~airflow_provider_systemzero.protocol.client.ClientSession`
(the desired state, pacing, replay, decide intents — every protocol rule lives there) and a
reconnect loop written around ``async with websockets.asyncio.client.connect(...)``:

* the upgrade follows WIRE.md §1: the exact URL from the origin, ``Authorization: Bearer``, only
  the ``system-zero.stream.v1`` subprotocol (checked after connecting), no compression, no
  ``Origin``, no cookies, no proxy from the environment, ``max_size`` from the limits;
* per connection one reader task feeds frames to the session; the writer flushes
  ``session.data_to_send(now)`` after every input and at ``session.next_wakeup(now)``; a watchdog
  treats a peer silent past ``session.receipt_deadline()`` as dead (native pings run too);
* nothing waits on the peer without a bound: a write that makes no progress within
  ``write_progress_timeout`` drops the connection, a close takes at most the close-handshake
  timeout, a redirect of the upgrade is refused, and pongs are coalesced and rate-bounded;
* the gateway's words are untrusted: a key echoed back is scrubbed from every frame, and server
  text is escaped and bounded before it is logged or raised (:mod:`~airflow_provider_systemzero.stream.untrusted`);
* when a connection ends it describes what it saw in a
  :class:`~airflow_provider_systemzero.protocol.reconnect.ConnectionOutcome` and does what the
  core's :class:`~airflow_provider_systemzero.protocol.reconnect.ReconnectPlanner` says: reconnect
  after the planned delay (backoff that never undercuts the server's delay and grows across
  unproductive connections), reconnect only once there is work, or stop and raise one of
  :mod:`~airflow_provider_systemzero.stream.exceptions`; every reconnect replays the full desired
  state byte-identically;
* a :class:`~airflow_provider_systemzero.budget.DecisionBudget` is asked before anything that can
  start a dispatch is written (on_change: every mutation; on_request: ``decide``), and counts
  every decision (billed, or replayed under a reply id it already holds);
* a :class:`~airflow_provider_systemzero.observability.StreamObserver` hears connections, acks,
  decisions, reconnects, refusals and rate-limit waits (metrics and spans); the INFO log lines
  say the same for a person reading the task log — never the state's content or the key.

Every open connection holds a slot of the process-wide :class:`StreamCapacity`.

No Airflow imports here: the benchmarks and the emulator tests use this module directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import (
    ConnectionClosed,
    InvalidHandshake,
    InvalidMessage,
    InvalidProxy,
    InvalidStatus,
    InvalidURI,
)
from websockets.protocol import State

from airflow_provider_systemzero.observability import GOODBYE_REASONS, StreamObserver
from airflow_provider_systemzero.protocol import keys
from airflow_provider_systemzero.protocol.client import ClientSession
from airflow_provider_systemzero.protocol.client_events import (
    Acknowledged,
    ClientEvent,
    DecisionReceived,
    DecisionRepeated,
    GoodbyeReceived,
    HelloReceived,
    MutationRejected,
    ServerError,
    StreamFailed,
)
from airflow_provider_systemzero.protocol.client_events import DecisionFailed as DecisionFailedEvent
from airflow_provider_systemzero.protocol.errors import (
    LocalProtocolError,
    RemoteProtocolError,
)
from airflow_provider_systemzero.protocol.messages import (
    Attachment,
    ClientMessage,
    Error,
    Goodbye,
    Hello,
    StreamRequest,
)
from airflow_provider_systemzero.protocol.reconnect import (
    CloseCode,
    ConnectionOutcome,
    DecideRetry,
    PlanKind,
    ReconnectPlan,
    ReconnectPlanner,
    classify_decide_failure,
)
from airflow_provider_systemzero.protocol.reply import DecisionResult
from airflow_provider_systemzero.stream.accounting import DispatchAccounting
from airflow_provider_systemzero.stream.capacity import Backoff, StreamCapacity, default_capacity
from airflow_provider_systemzero.stream.connection import (
    NoRedirectsConnect,
    connect_options,
    refusal_error,
    subprotocol_violation,
)
from airflow_provider_systemzero.stream.diagnosis import NetworkFailures
from airflow_provider_systemzero.stream.exceptions import (
    DeadlineExceeded,
    DecisionFailed,
    ProtocolViolation,
    StreamClosed,
    StreamRejected,
    SystemZeroValidationError,
    UpgradeRefused,
)
from airflow_provider_systemzero.stream.request import build_request
from airflow_provider_systemzero.stream.settings import StreamSettings
from airflow_provider_systemzero.stream.starts import DecisionStarts, decision_starts
from airflow_provider_systemzero.stream.untrusted import scrub, server_text, server_token

if TYPE_CHECKING:  # budget imports the stream's exceptions: imported where used, to keep imports acyclic
    from airflow_provider_systemzero.budget import BudgetExceeded, DecisionBudget, Usage

__all__ = ["Decision", "DecisionStream", "Reconnect"]

log = logging.getLogger(__name__)

#: The typed decision a stream yields: the core's :class:`DecisionResult` (raw reply kept).
Decision: TypeAlias = DecisionResult

#: 409 ``idempotency_conflict`` answers waited out by one ``decide()`` (the original call is still running).
_MAX_CONFLICT_RETRIES = 600
#: Undelivered on_change decisions kept for :meth:`DecisionStream.decisions` (the oldest are dropped).
_MAX_QUEUED_DECISIONS = 10_000
#: Pongs are flushed at most this often (seconds): the document's application message rate, 40 a second.
_PONG_FLUSH_INTERVAL = 1 / 40


@dataclass(frozen=True, slots=True)
class Reconnect:
    """One reconnect, as the tests and operators see it.

    :param reason: why the previous connection ended (``goodbye:shutdown`` — ``goodbye:other`` for a
        reason the document does not name —, ``close``, ``network``, ``upgrade_refused``,
        ``receipt_timeout``, ``write_timeout``, ``protocol_violation``, ``released`` …).
    :param close_code: the close code seen (1006 for an abrupt loss; ``None`` if there was no connection).
    :param server_delay: the server's minimum delay in seconds, if it named one.
    :param planned_delay: the delay chosen (backoff, never below ``server_delay``).
    :param waited: seconds actually waited between the end of the previous attempt and this one.
    :param attempt: the backoff attempt (0 after a connection that got its ``start`` acknowledged).
    """

    reason: str
    close_code: int | None
    server_delay: float | None
    planned_delay: float
    waited: float
    attempt: int


@dataclass(slots=True)
class _Ended:
    """How a connection attempt ended: what the core plans from, and the error to raise or keep.

    ``final`` means the stream ends whatever the plan (the caller closed it or it failed, or the
    peer is not a System Zero gateway at all).
    """

    outcome: ConnectionOutcome
    error: BaseException | None = None
    final: bool = False


@dataclass(slots=True)
class _Pending:
    plan: ReconnectPlan
    close_code: int | None
    failed_at: float


_Source: TypeAlias = StreamSettings | Callable[[], Awaitable[StreamSettings]]


# ------------------------------------------------------------------------------------ the stream


class DecisionStream:
    """One logical System Zero stream that survives reconnects.

    Use it as an async context manager; entering waits until the gateway acknowledged ``start``
    (retrying retryable failures until ``open_deadline``)::

        async with DecisionStream(settings, {"questions": {...}}, state="Initial log\\n",
                                  decision_mode="on_request", identity="dag.task") as stream:
            await stream.append_text("Job is ready.\\n")
            decision = await stream.decide()

    Changes (:meth:`append_text` …) return once accepted locally; they are paced under the
    gateway's buckets and coalesce when the caller is faster. ``decide()`` / ``decisions()`` wait
    for the gateway.

    :param settings: the :class:`StreamSettings`, or an async callable returning them (resolved on enter).
    :param request: a :class:`StreamRequest` or a dict (see :func:`build_request`).
    :param state: the initial state (string, array or object).
    :param decision_mode: ``on_change`` (every change schedules a decision) or ``on_request``.
    :param attachments: the initial inline attachments.
    :param min_interval_ms: minimum milliseconds between dispatch starts.
    :param idempotency_key: the initial state's key (default: derived from the state).
    :param key_namespace: namespace of derived per-state keys (default: derived from the cache key).
    :param identity: the caller's identity for the stream, hashed into a derived ``prompt_cache_key``.
    :param open_deadline: seconds allowed for entering (``None``: retry until cancelled).
    :param decide_retries: retries of a retryable on_request decision failure.
    :param backoff: the reconnect backoff (tests shrink it).
    :param capacity: the stream cap (default: the process-wide one).
    :param budget: the spend caps asked before every dispatch, and where usage is counted
        (default: an uncapped :class:`DecisionBudget`, so :attr:`usage` is always there). The
        connection's per-hour caps (``budget_decisions_per_hour`` …) are added on entering.
    :param observer: hears what the stream does (metrics, spans); default: nothing.
    :param starts: the account's decision starts shared in this process (default: looked up on
        entering, per gateway and key; see :mod:`~airflow_provider_systemzero.stream.starts`).
    """

    def __init__(
        self,
        settings: _Source,
        request: StreamRequest | Mapping[str, Any],
        *,
        state: Any = "",
        decision_mode: str = "on_change",
        attachments: Sequence[Attachment] = (),
        min_interval_ms: int | None = None,
        idempotency_key: str | None = None,
        key_namespace: str | None = None,
        identity: str | None = None,
        open_deadline: float | None = None,
        decide_retries: int = 3,
        backoff: Backoff | None = None,
        capacity: StreamCapacity | None = None,
        budget: DecisionBudget | None = None,
        observer: StreamObserver | None = None,
        starts: DecisionStarts | None = None,
    ) -> None:
        self._starts = starts
        self._source = settings
        self._settings: StreamSettings | None = settings if isinstance(settings, StreamSettings) else None
        self._request_arg = request
        self._initial = (state, tuple(attachments))
        self._decision_mode = decision_mode
        self._min_interval_ms = min_interval_ms
        self._idempotency_key = idempotency_key
        self._key_namespace = key_namespace
        self._identity = identity
        self._open_deadline = open_deadline
        self._decide_retries = decide_retries
        self.backoff = backoff or Backoff()
        self.capacity = capacity or default_capacity()
        self.reconnects: list[Reconnect] = []
        self._session: ClientSession | None = None
        self._entered = False
        self._closed = False
        self._closing = False
        self._failure: BaseException | None = None
        self._last_error: BaseException | None = None
        self._network: NetworkFailures | None = None
        self._runner: asyncio.Task[None] | None = None
        self._ws: ClientConnection | None = None
        self._wake: asyncio.Event | None = None
        self._pulse_event: asyncio.Event | None = None
        self._ready = False
        self._started_this_connection = False
        self._decided_this_connection = False
        self._goodbye: Goodbye | None = None
        self._last_fatal: Error | None = None
        #: the one connection a :meth:`release` was asked for (never carried to the next one)
        self._release_for: ClientConnection | None = None
        self._dormant = False
        self._state_version = 0
        self._intent_futures: dict[int, asyncio.Future[DecisionResult]] = {}
        self._decisions: deque[DecisionResult | BaseException] = deque(maxlen=_MAX_QUEUED_DECISIONS)
        self._queue_decisions = decision_mode == "on_change"
        self._ssl: ssl.SSLContext | None = None
        if budget is None:
            from airflow_provider_systemzero.budget import DecisionBudget

            budget = DecisionBudget()
        self.budget = budget
        self.observer = observer or StreamObserver()
        #: What this stream's dispatches cost the budget (see :class:`DispatchAccounting`).
        self._accounting = DispatchAccounting(budget, decision_mode, id(self))
        self._refused: BudgetExceeded | None = None  # the budget's refusal that holds this stream
        self._writing = False  # a frame is being written (its write is waiting for the peer)
        self._pong_flush: asyncio.TimerHandle | None = None
        self._last_pong_flush = -math.inf
        if self._settings is not None:
            self._session = self._build_session(self._settings)
        with contextlib.suppress(Exception):
            self.observer.bind(self)

    # ------------------------------------------------------------------ read-only view

    @property
    def settings(self) -> StreamSettings | None:
        """The resolved settings (``None`` before entering when given as a resolver)."""
        return self._settings

    @property
    def session(self) -> ClientSession:
        """The sans-I/O session (advanced use and tests)."""
        if self._session is None:
            raise RuntimeError("the stream's settings are resolved on entering: use 'async with' first")
        return self._session

    @property
    def request(self) -> StreamRequest:
        """The request as streamed (with its explicit ``prompt_cache_key``)."""
        return self.session.request

    @property
    def state(self) -> Any:
        """The desired state (what the caller asked for, acknowledged or not)."""
        return self._session.desired_state if self._session else self._initial[0]

    @property
    def attachments(self) -> tuple[Attachment, ...]:
        """The desired attachments."""
        return self._session.desired_attachments if self._session else self._initial[1]

    @property
    def state_version(self) -> int:
        """The latest version the gateway acknowledged (numbering restarts on every connection)."""
        return self._state_version

    @property
    def last_decision(self) -> Decision | None:
        """The newest decision received, or ``None``."""
        return self._session.last_decision if self._session else None

    @property
    def stream_id(self) -> str | None:
        """The current (or last) connection's ``stream_id``."""
        return self._session.stream_id if self._session else None

    @property
    def connected(self) -> bool:
        """Whether a WebSocket connection is open now."""
        return self._ws is not None

    @property
    def dormant(self) -> bool:
        """Whether the stream is disconnected on purpose, waiting for work (after :meth:`release`
        or an ``idle_timeout`` / ``max_duration`` goodbye)."""
        return self._dormant

    @property
    def in_sync(self) -> bool:
        """Whether the gateway acknowledged the complete desired state on the open connection."""
        return bool(self._session and self._session.in_sync)

    @property
    def failure(self) -> BaseException | None:
        """The error that ended the stream, if any."""
        return self._failure

    @property
    def last_error_text(self) -> str | None:
        """The last retryable failure, with its cause and fix (``None`` if there was none)."""
        if self._network is None:
            return None if self._last_error is None else str(self._last_error)
        return self._network.describe(self._last_error)

    @property
    def decision_mode(self) -> str:
        """``on_change`` or ``on_request``."""
        return self._decision_mode

    @property
    def usage(self) -> Usage:
        """What this stream spent: dispatches, billed and replayed decisions, tokens (see :mod:`~airflow_provider_systemzero.budget`)."""
        return self.budget.usage

    def __repr__(self) -> str:
        origin = self._settings.origin if self._settings else "?"
        return (
            f"<DecisionStream origin={origin!r} mode={self._decision_mode} version={self._state_version} "
            f"connected={self.connected} reconnects={len(self.reconnects)}>"
        )

    # ------------------------------------------------------------------ lifecycle

    def _build_session(self, settings: StreamSettings) -> ClientSession:
        request = build_request(self._request_arg, settings, identity=self._identity)
        assert request.prompt_cache_key is not None
        namespace = self._key_namespace or keys.default_key_namespace(request.prompt_cache_key)
        state, attachments = self._initial
        try:
            session = ClientSession(
                request=request,
                state=state,
                decision_mode=self._decision_mode,
                attachments=attachments,
                min_interval_ms=self._min_interval_ms,
                idempotency_key=self._idempotency_key,
                key_namespace=namespace,
            )
        except LocalProtocolError as exc:
            raise SystemZeroValidationError.from_local(exc) from None
        session.dispatch_gate = self._gate
        return session

    async def __aenter__(self) -> DecisionStream:
        if self._entered:
            raise RuntimeError("a DecisionStream can be entered once; create a new one")
        self._entered = True
        self._wake = asyncio.Event()
        self._pulse_event = asyncio.Event()
        try:
            if self._settings is None:
                resolver = self._source
                assert callable(resolver)
                settings = await resolver()
                if not isinstance(settings, StreamSettings):
                    raise TypeError(
                        f"the settings resolver returned {type(settings).__name__}, not StreamSettings"
                    )
                self._settings = settings
            if self._session is None:
                self._session = self._build_session(self._settings)
            settings = self._settings
            self._starts = self._starts or decision_starts(settings.url, settings.api_key)
            from airflow_provider_systemzero.budget import connection_window

            self.budget.attach_window(
                connection_window(
                    settings.conn_id or settings.url,
                    settings.budget_decisions_per_hour,
                    settings.budget_input_tokens_per_hour,
                )
            )
            if self._settings.ca_bundle and self._settings.url.startswith("wss://"):
                self._ssl = await asyncio.to_thread(
                    ssl.create_default_context, cafile=self._settings.ca_bundle
                )
            self._runner = asyncio.create_task(self._run(), name=f"systemzero-stream-{id(self):x}")
            await self._wait_until(
                lambda: self._ready,
                self._open_deadline,
                lambda: (
                    f"the stream to {self._settings.url if self._settings else '?'} did not "
                    f"open within {self._open_deadline} s"
                ),
            )
        except BaseException:
            await self._shutdown()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._shutdown()

    async def aclose(self) -> None:
        """Close the stream: the connection ends with close code 1000; pending waits end."""
        await self._shutdown()

    async def _shutdown(self) -> None:
        if self._closed:
            return
        self._closing = True
        self._closed = True
        if self._starts is not None:
            self._starts.withdraw(self)
        runner = self._runner
        if runner is not None and not runner.done():
            if self._ws is not None and self._writing:
                # the peer is not reading: a close frame would queue behind the blocked write
                log.warning(
                    "the System Zero gateway is not reading: closing the connection without a close handshake"
                )
                self._ws.transport.abort()
            if self._ws is not None:
                # serving: let the loop close with 1000 and release everything itself
                self._kick()
                try:
                    await asyncio.wait_for(asyncio.shield(runner), timeout=self._close_timeout() + 1)
                except TimeoutError:
                    pass
                except asyncio.CancelledError:
                    runner.cancel()
                    raise
            if not runner.done():
                if self._ws is not None:
                    self._ws.transport.abort()  # the graceful close had its time
                runner.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await runner
        closed = StreamClosed(None, "closed", message="the stream was closed before the decision arrived")
        for future in self._intent_futures.values():
            if not future.done():
                future.set_exception(closed)
        self._pulse()

    def _close_timeout(self) -> float:
        limits = self._session.limits if self._session else None
        return (limits.close_handshake_timeout_ms / 1000) if limits else 5.0

    async def release(self) -> None:
        """Close the connection (1000) but keep the stream; it reconnects when there is work.

        Use it to lease a connection: the session (desired state, pending decide) is kept and
        replayed on the next connection, which opens as soon as :meth:`has_work` is true.
        """
        self._check_usable()
        ws = self._ws
        if ws is None:
            return
        # The release is about this connection only: when it ends for another reason first (a drop,
        # a goodbye) or before its start was acknowledged, the next connection must not inherit it.
        self._release_for = ws
        self._kick()
        await self._wait_until(
            lambda: self._ws is not ws, self._close_timeout() + 1, lambda: "release timed out"
        )

    def has_work(self) -> bool:
        """Whether the stream needs a connection (a change to send or a decision to wait for)."""
        return self.session.has_work()

    # ------------------------------------------------------------------ changes

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._closed:
            raise StreamClosed(None, "closed", message="the stream is closed: open a new one")
        if not self._entered:
            raise RuntimeError("use the stream inside 'async with' first")

    async def _apply(self, change: Callable[[], list[ClientEvent]]) -> None:
        self._check_usable()
        try:
            events = change()
        except LocalProtocolError as exc:
            raise SystemZeroValidationError.from_local(exc) from None
        if events:
            self._dispatch(events)
        self._kick()
        await asyncio.sleep(0)

    async def append_text(self, text: str, *, idempotency_key: str | None = None) -> None:
        """Append text to a string state.

        :param text: the text to append.
        :param idempotency_key: the key naming the resulting state (default: derived).
        :raises SystemZeroValidationError: the change breaks a rule; nothing changed.
        """
        await self._apply(lambda: self.session.append_text(text, idempotency_key=idempotency_key))

    async def append_items(self, items: Sequence[Any], *, idempotency_key: str | None = None) -> None:
        """Append complete values to an array state.

        :param items: the values to append (at least one).
        :param idempotency_key: the key naming the resulting state (default: derived).
        :raises SystemZeroValidationError: the change breaks a rule; nothing changed.
        """
        await self._apply(lambda: self.session.append_items(items, idempotency_key=idempotency_key))

    async def replace(
        self,
        state: Any,
        *,
        attachments: Sequence[Attachment] | None = None,
        idempotency_key: str | None = None,
    ) -> None:
        """Replace the complete state (and the attachments when given; ``[]`` removes all).

        :param state: the new state (string, array or object).
        :param attachments: the new attachment list, or ``None`` to keep it.
        :param idempotency_key: the key naming the resulting state (default: derived).
        :raises SystemZeroValidationError: the change breaks a rule; nothing changed.
        """
        await self._apply(
            lambda: self.session.replace(state, attachments=attachments, idempotency_key=idempotency_key)
        )

    async def append_attachments(
        self, attachments: Sequence[Attachment], *, idempotency_key: str | None = None
    ) -> None:
        """Add inline attachments; the state is unchanged.

        :param attachments: the attachments to add (unique names).
        :param idempotency_key: the key naming the resulting state (default: derived).
        :raises SystemZeroValidationError: the change breaks a rule; nothing changed.
        """
        await self._apply(
            lambda: self.session.append_attachments(attachments, idempotency_key=idempotency_key)
        )

    async def set_state(self, state: Any, *, idempotency_key: str | None = None) -> None:
        """Make ``state`` the desired state; the minimal change is sent (nothing if unchanged).

        :param state: the complete desired state.
        :param idempotency_key: the key naming the resulting state (default: derived).
        :raises SystemZeroValidationError: the change breaks a rule; nothing changed.
        """
        await self._apply(lambda: self.session.set_desired(state, idempotency_key=idempotency_key))

    async def wait_in_sync(self, timeout: float | None = None) -> None:  # noqa: ASYNC109 - raises DeadlineExceeded
        """Wait until the gateway acknowledged the complete desired state.

        :param timeout: seconds (``None``: no limit).
        :raises DeadlineExceeded: not in sync in time.
        """
        self._check_usable()
        await self._wait_until(
            lambda: self.in_sync,
            timeout,
            lambda: f"the gateway did not acknowledge the desired state within {timeout} s",
        )

    # ------------------------------------------------------------------ decisions

    async def decide(self, *, timeout: float | None = None) -> Decision:  # noqa: ASYNC109 - see DeadlineExceeded
        """A decision covering the desired state as it is now.

        on_request: sends ``decide`` for the version that holds every change made so far and
        waits for its decision; a retryable failure (429, 503 other than maintenance, 409
        ``idempotency_conflict``) is retried after the server's delay, up to ``decide_retries``
        times (409 ``idempotency_conflict`` — the same state's call still running after a
        reconnect — is waited out without spending that budget). on_change: returns the decision
        covering the current state, waiting for it if needed. A connection
        lost meanwhile is replayed and the decide re-sent; the caller sees one decision.

        :param timeout: seconds (``None``: no limit).
        :raises DecisionFailed: a non-retryable failure, or retries exhausted.
        :raises DeadlineExceeded: no decision in time.
        """
        self._check_usable()
        session = self.session
        if self._decision_mode == "on_change":
            if session.current_decision is not None:
                return session.current_decision  # already decided: on_change dispatches nothing new for it
            if session.current_failure is not None:
                # the gateway will not dispatch this state again: its final failure is the answer
                raise self._decision_error(session.current_failure)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        failures = conflicts = 0
        while True:
            intent = session.request_decision()
            future: asyncio.Future[DecisionResult] = loop.create_future()
            self._intent_futures[intent] = future
            self._kick()
            try:
                async with asyncio.timeout_at(deadline):
                    return await future
            except DecisionFailed as exc:
                if exc.http_status == 429 and self._starts is not None:
                    continue  # asked again: the process's start queue waits out the Retry-After, once
                conflict = exc.http_status == 409 and exc.envelope.code == "idempotency_conflict"
                if conflict:
                    # the same state's call still runs (a decide re-sent after a reconnect): it will
                    # finish, so wait for it without spending the retry budget
                    conflicts += 1
                else:
                    failures += 1
                if not exc.retryable or failures > self._decide_retries or conflicts > _MAX_CONFLICT_RETRIES:
                    raise
                server = exc.retry.retry_after_ms / 1000 if exc.retry.retry_after_ms is not None else None
                delay = self.backoff.delay(0 if conflict else failures - 1, server)
                if deadline is not None and loop.time() + delay >= deadline:
                    raise DeadlineExceeded(
                        f"no decision within {timeout} s (the server asked to wait "
                        f"{delay:.3f} s before retrying)",
                        last_error=exc,
                    ) from exc
                log.info(
                    "decision failed with HTTP %s (%s); retrying in %.3f s",
                    exc.http_status,
                    server_token(exc.envelope.code),
                    delay,
                )
                await self._sleep(delay)
                self._check_usable()
            except TimeoutError:
                if self._failure is not None:
                    raise self._failure from None
                raise DeadlineExceeded(
                    f"no decision within {timeout} s",
                    last_error=self._last_error,
                    detail=self.last_error_text,
                ) from None
            finally:
                self._intent_futures.pop(intent, None)
                session.cancel_intent(intent)

    async def decisions(self) -> AsyncIterator[Decision]:
        """Decisions as they arrive (on_change), in order; ends when the stream closes.

        One consumer at a time. A non-retryable on_change decision failure is raised here.

        :raises DecisionFailed: a dispatch failed and the gateway will not retry it.
        """
        self._check_usable()
        self._queue_decisions = True
        while True:
            while self._decisions:
                item = self._decisions.popleft()
                if isinstance(item, BaseException):
                    raise item
                yield item
            if self._failure is not None:
                raise self._failure
            if self._closed:
                return
            await self._wait_pulse(None)

    # ------------------------------------------------------------------ waiting helpers

    def _kick(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _kick_soon(self) -> None:
        """Wake the writer for pongs, at most every :data:`_PONG_FLUSH_INTERVAL`: a ping flood costs
        a bounded number of writes (the session keeps only the newest pongs owed)."""
        if self._pong_flush is not None:
            return
        loop = asyncio.get_running_loop()
        delay = self._last_pong_flush + _PONG_FLUSH_INTERVAL - loop.time()
        if delay <= 0:
            self._last_pong_flush = loop.time()
            self._kick()
            return

        def fire() -> None:
            self._pong_flush = None
            self._last_pong_flush = loop.time()
            self._kick()

        self._pong_flush = loop.call_later(delay, fire)

    def _pulse(self) -> None:
        if self._pulse_event is not None:
            self._pulse_event.set()
            self._pulse_event = asyncio.Event()

    async def _wait_pulse(self, seconds: float | None) -> None:
        assert self._pulse_event is not None
        event = self._pulse_event
        async with asyncio.timeout(seconds):
            await event.wait()

    async def _wait_until(
        self, condition: Callable[[], bool], seconds: float | None, describe: Callable[[], str]
    ) -> None:
        loop = asyncio.get_running_loop()
        deadline = None if seconds is None else loop.time() + seconds
        while not condition():
            if self._failure is not None:
                raise self._failure
            if self._closed and self._runner is not None and self._runner.done():
                raise StreamClosed(None, "closed", message="the stream is closed: open a new one")
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                raise DeadlineExceeded(describe(), last_error=self._last_error, detail=self.last_error_text)
            with contextlib.suppress(TimeoutError):
                await self._wait_pulse(remaining)

    async def _sleep(self, seconds: float) -> None:
        """Sleep, but wake early when the stream closes or fails."""
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        while not self._closing and self._failure is None:
            remaining = end - loop.time()
            if remaining <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await self._wait_pulse(remaining)

    # ------------------------------------------------------------------ failure

    def _fail(self, exc: BaseException) -> None:
        if self._failure is None:
            self._failure = exc
            # every waiter raises it, so the caller reports it: said once, by the caller
            log.debug("System Zero stream failed: %s", exc)
        for future in self._intent_futures.values():
            if not future.done():
                future.set_exception(exc)
        self._kick()
        self._pulse()

    def _decision_error(self, error: Error) -> DecisionFailed:
        retryable = (
            error.http_status is not None
            and classify_decide_failure(error.http_status, error.envelope, error.retry)
            is not DecideRetry.NONE
        )
        return DecisionFailed(
            error.http_status,
            error.envelope,
            error.retry,
            retryable,
            state_version=error.state_version,
            request_id=error.request_id,
        )

    # ------------------------------------------------------------------ events

    def _dispatch(self, events: list[ClientEvent]) -> None:
        for event in events:
            if isinstance(event, HelloReceived):
                self.capacity.adopt_advertised(event.hello.limits.max_streams_per_process, self._origin())
                self._log_hello(event.hello)
                self._observe("hello", event.hello)
            elif isinstance(event, Acknowledged):
                self._on_ack(event)
            elif isinstance(event, DecisionReceived):
                if not event.repeated:  # a repeated one was counted and queued when it arrived
                    self._on_decision(event.result)
                for intent in event.intents:
                    future = self._intent_futures.get(intent)
                    if future is not None and not future.done():
                        future.set_result(event.result)
                if self._queue_decisions and not event.repeated:
                    self._decisions.append(event.result)
                self._settle_refusal()
            elif isinstance(event, DecisionFailedEvent):
                self._on_decision_failed(event)
                self._settle_refusal()
            elif isinstance(event, MutationRejected):
                log.debug(
                    "change %s deferred by the gateway (%s); it is sent again",
                    server_token(event.error.event_id),
                    server_token(event.error.code),
                )
                if event.error.code == "event_rate_limited":
                    delay = event.error.retry.retry_after_ms
                    self._observe("rate_limited", "event", None if delay is None else delay / 1000)
            elif isinstance(event, StreamFailed):
                self._fail(StreamRejected(event.error.envelope, event.error.event_id))
            elif isinstance(event, ServerError):
                if event.error.fatal:
                    self._last_fatal = event.error
                log.info(
                    "gateway error %s (fatal=%s): %s",
                    server_token(event.error.code),
                    event.error.fatal,
                    server_text(event.error.envelope.message),
                )
            elif isinstance(event, GoodbyeReceived):
                self._goodbye = event.goodbye
            elif isinstance(event, DecisionRepeated):
                log.warning(
                    "the System Zero gateway repeated the decision for state version %d: ignored",
                    event.state_version,
                )
        self._pulse()

    def _on_decision_failed(self, event: DecisionFailedEvent) -> None:
        error = self._decision_error(event.error)
        self._last_error = error
        self._accounting.failed(event.error, retryable=error.retryable)
        self._observe(
            "decision_failed",
            error.http_status,
            error.envelope.code,
            error.retryable,
            event.error.state_version,
        )
        if error.http_status == 429:
            delay = error.retry.retry_after_ms
            self._observe("rate_limited", "decide", None if delay is None else delay / 1000)
        if self._starts is not None:
            on_request = self._decision_mode == "on_request"
            self._starts.ended(self, event.error, self.session.generation, requeue=on_request)
        if event.error.fatal:
            self._last_fatal = event.error
        for intent in event.intents:
            future = self._intent_futures.get(intent)
            if future is not None and not future.done():
                future.set_exception(error)
        if self._decision_mode != "on_change":
            return
        if error.retryable:
            if classify_decide_failure(error.http_status, error.envelope, error.retry) is DecideRetry.CLIENT:
                log.info(
                    "decision failed with HTTP 503 (maintenance): the gateway is going away; the state is "
                    "decided again on the next connection"
                )
            else:
                log.info(
                    "decision failed with HTTP %s (%s); the gateway retries it",
                    error.http_status,
                    server_token(error.envelope.code),
                )
            return
        # the gateway will not retry: whoever waits for this state's decision must hear it
        for intent, future in list(self._intent_futures.items()):
            if not future.done():
                future.set_exception(error)
                self.session.cancel_intent(intent)
        if self._queue_decisions:
            self._decisions.append(error)

    # ------------------------------------------------------------------ budget and accounting

    def _gate(self, message: ClientMessage) -> bool:
        """Asked by the session before writing a message that can start a dispatch."""
        starts = self._starts
        if starts is not None and not starts.may_start(
            self, message, self.session.generation, self._ask_again
        ):
            if self._decided_this_connection and self.capacity.waiting and self._ws is not None:
                self._release_for = self._ws  # had its turn: its slot goes to a stream waiting for one
            return False  # its turn under the account's decision ceiling comes: _ask_again
        refused = self._accounting.gate(message, self.session.desired_body_bytes())
        if refused is not None:
            self._refuse(refused)
            return False
        return True

    def _ask_again(self) -> None:
        """Let the session ask for its decision start again: its turn came (it starts on its newest
        state), or a new connection asks anew."""
        if self._refused is None and self._session is not None:
            self._session.dispatch_held = False
            self._kick()

    def _refuse(self, exc: BudgetExceeded) -> None:
        first = self._refused is None
        self._refused = exc
        if first:
            log.warning("%s", exc)
            self._observe("budget_refused", exc)
        if self._decision_mode == "on_request":
            # nothing was sent: whoever waits for this decision hears why at once
            for intent, future in list(self._intent_futures.items()):
                if not future.done():
                    future.set_exception(exc)
                    self.session.cancel_intent(intent)
            return
        if first:
            log.info(
                "holding further changes locally; %d dispatch(es) already scheduled settle first",
                self._accounting.outstanding(),
            )
        self._settle_refusal()

    def _settle_refusal(self) -> None:
        """on_change: once nothing scheduled is outstanding, a refused stream fails (and closes)."""
        if (
            self._refused is not None
            and self._decision_mode == "on_change"
            and self._accounting.outstanding() == 0
        ):
            self._fail(self._refused)

    def _on_ack(self, event: Acknowledged) -> None:
        ack = event.ack
        self._state_version = ack.state_version
        self._accounting.acknowledged(ack)
        if event.message_type == "start":
            self._started_this_connection = True
            self._ready = True
        log.info(
            "state version %d acknowledged (%s%s): state %d bytes, decide body %d bytes%s",
            ack.state_version,
            event.message_type,
            ", replayed" if event.replayed else "",
            ack.state_bytes,
            ack.synthesized_body_bytes,
            ", decision scheduled" if ack.scheduled else "",
        )
        self._observe("acknowledged", ack, event.message_type, event.replayed)

    def _on_decision(self, result: DecisionResult) -> None:
        version = result.state_version
        self._decided_this_connection = True
        if self._starts is not None:
            self._starts.ended(self, None, self.session.generation, requeue=False)
        billed = self._accounting.decided(result)
        answers = "; ".join(
            f"{name}={answer.decision!r} (probability {_fmt(answer.probability)}, confidence "
            f"{_fmt(answer.confidence)})"
            for name, answer in result.answers.items()
        )
        usage = result.usage
        log.info(
            "decision for state version %d (covers %s): %s — reply %s, %s; %d input tokens; queue %s ms, "
            "decide %s ms",
            version,
            ", ".join(map(server_token, result.covered_event_ids)) or "nothing new",
            answers or "no answers",
            server_token(result.reply_id),
            "billed" if billed else "replayed unbilled",
            usage.get("input_tokens", 0),
            _fmt(result.queue_ms, 0),
            _fmt(result.decide_ms, 0),
        )
        self._observe("decided", result, billed=billed)

    def _connection_ended(self) -> None:
        """Account for dispatches the lost connection may leave behind (billed, reply never seen)."""
        if self._starts is not None:
            self._starts.withdraw(self)  # a start is granted to a connected stream only
            self._ask_again()
        if self._accounting.connection_ended():
            log.info(
                "the connection ended with a dispatch possibly in flight: counted as one unconfirmed decision "
                "against the budget"
            )

    def _log_hello(self, hello: Hello) -> None:
        lim = hello.limits
        log.info(
            "System Zero stream %s open (%s): max_message_bytes=%d, max_decide_body_bytes=%d, "
            "max_events_per_second=%s (burst %d), max_pending_events=%d, heartbeat every %d ms, idle timeout "
            "%d ms, max duration %d ms, max_streams_per_process=%d",
            server_token(hello.stream_id),
            hello.protocol,
            lim.max_message_bytes,
            lim.max_decide_body_bytes,
            lim.max_events_per_second,
            lim.event_burst,
            lim.max_pending_events,
            lim.heartbeat_interval_ms,
            lim.idle_timeout_ms,
            lim.max_duration_ms,
            lim.max_streams_per_process,
        )

    def _observe(self, method: str, *args: Any, **kwargs: Any) -> None:
        try:
            getattr(self.observer, method)(*args, **kwargs)
        except Exception as exc:  # an observer never breaks the stream
            log.debug("stream observer %s failed: %s", method, exc)

    # ------------------------------------------------------------------ the connection loop

    async def _run(self) -> None:
        assert self._settings is not None
        network = self._network = NetworkFailures(
            self._settings.url, open_timeout=self._settings.open_timeout
        )
        planner = ReconnectPlanner(self.backoff)
        pending: _Pending | None = None
        try:
            while not self._closing and self._failure is None:
                attempt_number = planner.attempt
                if pending is not None:
                    plan = pending.plan
                    if plan.kind is PlanKind.WHEN_NEEDED:
                        await self._wait_for_work()
                        if self._closing or self._failure is not None:
                            return
                    remaining = plan.delay - (time.monotonic() - pending.failed_at)
                    if remaining > 0:
                        await self._sleep(remaining)
                        if self._closing or self._failure is not None:
                            return
                    waited = time.monotonic() - pending.failed_at
                    self.reconnects.append(
                        Reconnect(
                            plan.reason,
                            pending.close_code,
                            plan.server_delay,
                            plan.delay,
                            waited,
                            plan.attempt,
                        )
                    )
                    log.info(
                        "reconnecting the System Zero stream after %s (close %s, waited %.3f s)",
                        plan.reason,
                        pending.close_code,
                        waited,
                    )
                    self._observe("reconnecting", plan.reason, pending.close_code, plan.delay)
                    attempt_number = plan.attempt
                    pending = None
                await self.capacity.acquire(self._origin())
                try:
                    self._observe("connecting", self._settings.url if self._settings else "", attempt_number)
                    ended = await self._connect_and_serve()
                finally:
                    self.capacity.release(self._origin())
                outcome = ended.outcome
                if ended.final:
                    if ended.error is not None:
                        self._fail(ended.error)
                    elif not self._closing and self._failure is None:  # never leave waiters hanging
                        self._fail(StreamClosed(outcome.close_code, outcome.label))
                    return
                plan = planner.plan(outcome)
                if plan.kind is PlanKind.STOP:
                    self._fail(self._stop_error(ended, plan))
                    return
                if ended.error is not None:
                    self._last_error = ended.error
                if outcome.kind == "network" and ended.error is not None:
                    network.record(ended.error)
                    if (unreachable := network.give_up()) is not None:
                        self._fail(unreachable)
                        return
                else:
                    network.answered()
                if plan.kind is PlanKind.RECONNECT:
                    plan = dataclasses.replace(plan, delay=network.bound_delay(plan.delay))
                pending = _Pending(plan, outcome.close_code, time.monotonic())
                if plan.kind is PlanKind.WHEN_NEEDED:
                    log.info(
                        "System Zero stream connection ended (%s, close %s); reconnecting when there is "
                        "something to send or to wait for, not before %.3f s",
                        plan.reason,
                        outcome.close_code,
                        plan.delay,
                    )
                else:
                    log.info(
                        "System Zero stream connection ended (%s, close %s); reconnecting in %.3f s",
                        plan.reason,
                        outcome.close_code,
                        plan.delay,
                    )
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a bug: never leave waiters hanging
            log.exception("System Zero stream loop crashed")
            self._fail(exc)
        finally:
            self._pulse()

    @staticmethod
    def _stop_error(ended: _Ended, plan: ReconnectPlan) -> BaseException:
        """The error a stopped stream raises: the connection's own, or why its close is final."""
        error = ended.error
        if isinstance(error, ProtocolViolation | UpgradeRefused):
            return error
        outcome = ended.outcome
        detail = f" after error {server_token(outcome.fatal_code)}" if outcome.fatal_code else ""
        return StreamClosed(
            outcome.close_code,
            outcome.close_reason,
            message=(
                f"the System Zero gateway closed the stream with code {outcome.close_code} "
                f"({outcome.close_reason or 'no reason'}){detail}: {plan.final}; check the request and the "
                "gateway's limits"
            ),
        )

    async def _wait_for_work(self) -> None:
        assert self._wake is not None
        session = self.session
        self._dormant = True
        self._pulse()
        try:
            while not self._closing and self._failure is None and not session.has_work():
                self._wake.clear()
                await self._wake.wait()
        finally:
            self._dormant = False

    def _connect_kwargs(self) -> dict[str, Any]:
        assert self._settings is not None
        return connect_options(self._settings, self.session.limits, self._ssl)

    async def _connect_and_serve(self) -> _Ended:
        settings = self._settings
        assert settings is not None
        url = settings.url
        self._started_this_connection = False
        self._decided_this_connection = False
        self._goodbye = None
        self._last_fatal = None
        try:
            ws = await NoRedirectsConnect(url, **self._connect_kwargs())
            try:
                violation = subprotocol_violation(ws, url)
                if violation is not None:
                    await self._close(ws, CloseCode.PROTOCOL_ERROR, "subprotocol not selected")
                    return _Ended(
                        ConnectionOutcome(CloseCode.PROTOCOL_ERROR, kind="violation"), violation, final=True
                    )
                return await self._serve(ws)
            finally:
                await self._close(ws, CloseCode.NORMAL_CLOSURE)
        except InvalidStatus as exc:
            return self._upgrade_refused(exc, url)
        except (InvalidMessage, InvalidProxy, OSError, TimeoutError, ConnectionClosed) as exc:
            return _Ended(ConnectionOutcome(kind="network"), exc)
        except InvalidURI as exc:
            return _Ended(
                ConnectionOutcome(kind="network"),
                SystemZeroValidationError(
                    f"the stream URL {url} is invalid: {exc}", code="invalid_origin", field="host"
                ),
                final=True,
            )
        except InvalidHandshake as exc:
            return _Ended(
                ConnectionOutcome(kind="violation"),
                ProtocolViolation(
                    f"the opening handshake with {url} failed: {server_text(str(exc), self._secret())}: check that the "
                    "connection's host is a System Zero API origin",
                    code="invalid_handshake",
                ),
                final=True,
            )

    def _upgrade_refused(self, exc: InvalidStatus, url: str) -> _Ended:
        error = refusal_error(exc, url, self._secret())
        if 300 <= error.status < 400:
            log.warning(
                "the System Zero gateway redirected the upgrade to %s: redirects are refused",
                server_text(exc.response.headers.get("Location", ""), self._secret()),
            )
        if error.retryable:  # a final refusal is raised to the caller, who reports it once
            log.info(
                "the System Zero gateway refused the upgrade with HTTP %s (%s)",
                error.status,
                server_token(error.envelope.code) if error.envelope else "no error body",
            )
            if error.status == 429:
                self._observe(
                    "rate_limited",
                    "upgrade",
                    None if error.retry_after_ms is None else error.retry_after_ms / 1000,
                )
        return _Ended(
            ConnectionOutcome(
                server_delay_ms=error.retry_after_ms,
                kind="refused",
                retryable=error.retryable,
                status=error.status,
            ),
            error,
        )

    async def _read(self, ws: ClientConnection) -> None:
        session = self.session
        secret = self._secret()
        with contextlib.suppress(ConnectionClosed):
            async for frame in ws:
                if isinstance(frame, str):
                    frame = scrub(frame, secret)  # a key echoed back never reaches a message, log or error
                events = session.receive_text(frame, time.monotonic())
                self._dispatch(events)
                if events:
                    self._kick()
                else:  # a ping (or scheduled): pongs go out at a bounded rate, coalesced
                    self._kick_soon()
                await asyncio.sleep(0)  # a flood of frames never holds the event loop

    async def _serve(self, ws: ClientConnection) -> _Ended:
        assert self._wake is not None
        session = self.session
        opened_at = time.monotonic()
        session.connection_opened(opened_at)
        self._ws = ws
        replay = session.connections > 1
        log.info(
            "connected to %s (%s)",
            self._settings.url if self._settings else "the gateway",
            "replaying the stream's state" if replay else "first connection",
        )
        self._observe("connected", self._settings.url if self._settings else "", replay)
        reader = asyncio.create_task(self._read(ws), name="systemzero-stream-reader")
        reader.add_done_callback(lambda _: self._kick())
        silent = recycle = lost = stalled = False

        def outcome(code: int | None, kind: str = "closed") -> ConnectionOutcome:
            goodbye, fatal = self._goodbye, self._last_fatal
            delay_ms = goodbye.retry_after_ms if goodbye is not None else None
            if fatal is not None and fatal.retry.retry_after_ms is not None:
                delay_ms = max(delay_ms or 0, fatal.retry.retry_after_ms)
            return ConnectionOutcome(
                code,
                server_text(ws.close_reason or "", self._secret()),
                goodbye.reason if goodbye else None,
                delay_ms,
                fatal.code if fatal else None,
                self._started_this_connection,
                self._decided_this_connection,
                time.monotonic() - opened_at,
                kind,
                released=self._release_for is ws,
            )

        try:
            try:
                while not reader.done():
                    self._wake.clear()
                    now = time.monotonic()
                    for frame in session.data_to_send(now):
                        if not await self._write(ws, frame):
                            stalled = True
                            break
                    if stalled:
                        break
                    if self._closing or self._failure is not None or self._release_for is ws:
                        break
                    now = time.monotonic()
                    if session.recycle_due(now):
                        recycle = True
                        break
                    deadline = session.receipt_deadline()
                    if deadline is not None and now >= deadline:
                        silent = True
                        break
                    times = [
                        t for t in (deadline, session.next_wakeup(now)) if t is not None and math.isfinite(t)
                    ]
                    timeout = max(0.0, min(times) - now) if times else None
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(timeout):
                            await self._wake.wait()
            except ConnectionClosed:
                lost = True  # a write failed: the connection is gone, and the reader ends with it
            if stalled:
                log.warning(
                    "the System Zero gateway read nothing for %.1f s while this client had a frame to "
                    "send: treating the connection as dead",
                    self._write_timeout(),
                )
                return _Ended(outcome(CloseCode.ABNORMAL_CLOSURE, "stalled"))
            if silent:
                log.warning(
                    "the System Zero gateway sent nothing for %.1f s: treating the connection as dead",
                    (session.limits.heartbeat_interval_ms + session.limits.pong_timeout_ms) / 1000,
                )
                ws.transport.abort()
                return _Ended(outcome(CloseCode.ABNORMAL_CLOSURE, "silent"))
            if lost:
                # the reader's own outcome (a protocol error included) is examined below
                with contextlib.suppress(TimeoutError, RemoteProtocolError):
                    await asyncio.wait_for(asyncio.shield(reader), self._close_timeout())
                if not reader.done():
                    ws.transport.abort()
                    return _Ended(outcome(CloseCode.ABNORMAL_CLOSURE))
            if not reader.done():
                # we close: the stream ends, fails, is released, or replays on a new connection
                if recycle:
                    log.info(
                        "the gateway does not retry the failed decision on this connection and said no "
                        "goodbye: reconnecting to replay the state"
                    )
                await self._close(ws, CloseCode.NORMAL_CLOSURE)
                # a peer may send until it sees our close: a bad frame then changes nothing
                with contextlib.suppress(TimeoutError, RemoteProtocolError):
                    await asyncio.wait_for(asyncio.shield(reader), self._close_timeout())
                if self._closing or self._failure is not None:
                    return _Ended(outcome(CloseCode.NORMAL_CLOSURE), final=True)
                if recycle:
                    return _Ended(outcome(CloseCode.NORMAL_CLOSURE, "recycled"))
                if self._release_for is ws:
                    return _Ended(outcome(CloseCode.NORMAL_CLOSURE, "released"))
                return _Ended(outcome(CloseCode.NORMAL_CLOSURE), final=True)
            error = reader.exception()
            if isinstance(error, RemoteProtocolError):
                # the message quotes the gateway's values: bounded, escaped, without the key
                problem = server_text(error.message, self._secret(), limit=400, quote=False)
                log.warning("the System Zero gateway broke the protocol: %s", problem)
                await self._close(ws, CloseCode.PROTOCOL_ERROR, "protocol error")
                return _Ended(
                    outcome(CloseCode.PROTOCOL_ERROR, "violation"),
                    ProtocolViolation(
                        f"the System Zero gateway broke the stream protocol: {problem}", code=error.code
                    ),
                )
            if error is not None:
                raise error
            final = self._failure is not None or self._closing
            sent = ws.protocol.close_sent
            if sent is not None and sent.code == CloseCode.MESSAGE_TOO_BIG and not final:
                # websockets refused a frame over max_size: the gateway broke max_message_bytes
                limit = session.limits.max_message_bytes
                log.warning(
                    "the System Zero gateway sent a frame over max_message_bytes (%d bytes): closed with "
                    "1009",
                    limit,
                )
                return _Ended(
                    outcome(CloseCode.MESSAGE_TOO_BIG, "violation"),
                    ProtocolViolation(
                        f"the System Zero gateway sent a frame over max_message_bytes ({limit} bytes)",
                        code="message_too_big",
                    ),
                )
            goodbye = self._goodbye
            if goodbye is not None and goodbye.reason not in GOODBYE_REASONS:
                log.info(
                    "the System Zero gateway said goodbye for an unknown reason %s",
                    server_text(goodbye.reason, self._secret()),
                )
            code = ws.close_code if ws.close_code is not None else CloseCode.ABNORMAL_CLOSURE
            reason = server_text(ws.close_reason or "", self._secret())
            return _Ended(
                outcome(code),
                StreamClosed(code, reason, message=f"connection closed with code {code} ({reason})"),
                final=final,
            )
        finally:
            if not reader.done():
                reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            session.connection_lost()
            self._connection_ended()
            self._release_for = None
            self._ws = None
            self._observe(
                "closed",
                ws.close_code if ws.close_code is not None else CloseCode.ABNORMAL_CLOSURE,
                server_text(ws.close_reason or "", self._secret()),
            )
            self._pulse()

    def _origin(self) -> str | None:
        """The gateway this stream talks to, as the stream cap counts it."""
        return self._settings.url if self._settings else None

    def _secret(self) -> str | None:
        return self._settings.api_key.strip() if self._settings else None

    def _write_timeout(self) -> float:
        return self.session.limits.write_progress_timeout_ms / 1000

    async def _write(self, ws: ClientConnection, frame: str) -> bool:
        """Send one frame within ``write_progress_timeout``; ``False`` (the connection aborted) when
        the peer read nothing meanwhile. No write waits longer, whatever the peer does."""
        self._writing = True
        try:
            async with asyncio.timeout(self._write_timeout()):
                await ws.send(frame)
            return True
        except TimeoutError:
            ws.transport.abort()
            return False
        finally:
            self._writing = False

    async def _close(self, ws: ClientConnection, code: int, reason: str = "") -> None:
        """Close within the close-handshake timeout, else abort (a peer that stopped reading never
        takes the close frame)."""
        if ws.state is State.CLOSED:
            return
        try:
            async with asyncio.timeout(self._close_timeout()):
                await ws.close(code, reason)
        except TimeoutError:
            ws.transport.abort()
        except asyncio.CancelledError:
            ws.transport.abort()  # cancelled while closing: the socket is released all the same
            raise


def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "n/a"
    return f"{value:.{digits}f}"
