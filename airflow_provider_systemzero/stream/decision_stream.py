"""The resilient asyncio client of a System Zero stream: a thin I/O adapter over the sans-I/O core.

:class:`DecisionStream` owns one :class:`~airflow_provider_systemzero.protocol.client.ClientSession`
(the desired state, pacing, replay, decide intents — every protocol rule lives there); this module
is its public API: construction, the read-only view, entering and closing, and changes. The rest
of the stream lives by job in:

* :mod:`~airflow_provider_systemzero.stream.delivery` — the decisions: ``decide()``,
  ``decisions()``, and the reader-to-consumer hand-over underneath (``take_decision()``,
  ``wake_on_decision()``);
* :mod:`~airflow_provider_systemzero.stream.run_loop` — the task that connects and reconnects as the
  core plans, and the wake-ups it shares with the waiters;
* :mod:`~airflow_provider_systemzero.stream.serving` — one connection: opening it, each message
  to the session as its socket parses it, the writer's turns, the watchdogs and how it ended
  (over :mod:`~airflow_provider_systemzero.stream.gateway_socket`);
* :mod:`~airflow_provider_systemzero.stream.core_events` — what the core's events do: acks,
  decisions, failures, the budget's gate, the log lines and the observer.

No Airflow imports here: the benchmarks and the emulator tests use this module directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeAlias

from airflow_provider_systemzero.decisions.budget import (
    BudgetExceeded,
    DecisionBudget,
    Usage,
    connection_window,
)
from airflow_provider_systemzero.protocol import keys
from airflow_provider_systemzero.protocol.client import ClientSession
from airflow_provider_systemzero.protocol.client_events import ClientEvent
from airflow_provider_systemzero.protocol.errors import LocalProtocolError
from airflow_provider_systemzero.protocol.messages import Attachment, Error, Goodbye, StreamRequest
from airflow_provider_systemzero.protocol.reply import DecisionResult
from airflow_provider_systemzero.stream.accounting import DispatchAccounting
from airflow_provider_systemzero.stream.capacity import Backoff, StreamCapacity, default_capacity
from airflow_provider_systemzero.stream.core_events import CoreEventHandling
from airflow_provider_systemzero.stream.delivery import DecisionDelivery
from airflow_provider_systemzero.stream.diagnosis import NetworkFailures
from airflow_provider_systemzero.stream.exceptions import (
    StreamClosed,
    SystemZeroValidationError,
)
from airflow_provider_systemzero.stream.gateway_socket import GatewaySocket
from airflow_provider_systemzero.stream.observer import StreamObserver
from airflow_provider_systemzero.stream.request import build_request
from airflow_provider_systemzero.stream.run_loop import Reconnect, StreamRunLoop
from airflow_provider_systemzero.stream.serving import ConnectionServing
from airflow_provider_systemzero.stream.settings import StreamSettings
from airflow_provider_systemzero.stream.starts import DecisionStarts, decision_starts
from airflow_provider_systemzero.stream.tls import TLSContexts, load_tls

__all__ = ["DecisionResult", "DecisionStream", "Reconnect"]

log = logging.getLogger(__name__)


#: Undelivered on_change decisions kept for :meth:`DecisionStream.decisions` (the oldest are dropped).
_MAX_QUEUED_DECISIONS = 10_000

_Source: TypeAlias = StreamSettings | Callable[[], Awaitable[StreamSettings]]


class DecisionStream(DecisionDelivery, StreamRunLoop, ConnectionServing, CoreEventHandling):
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
    :param reached: an earlier stream of the same caller reached this gateway (a trigger's stream
        before the one it gave back): a loopback gateway that refuses now is restarting, so this
        stream keeps reconnecting instead of giving up after 10 s (see
        :mod:`~airflow_provider_systemzero.stream.diagnosis`).
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
        reached: bool = False,
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
        self._reached = reached
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
        self._ws: GatewaySocket | None = None  # the open connection
        self._wake: asyncio.Event | None = None
        self._pulse_event: asyncio.Event | None = None
        self._ready = False
        self._started_this_connection = False
        self._decided_this_connection = False
        self._goodbye: Goodbye | None = None
        self._last_fatal: Error | None = None
        #: the one connection a :meth:`release` was asked for (never carried to the next one)
        self._release_for: GatewaySocket | None = None
        self._dormant = False
        #: callers of :meth:`wait_in_sync` now: a connection is work while one waits
        self._sync_waiters = 0
        self._state_version = 0
        self._intent_futures: dict[int, asyncio.Future[DecisionResult]] = {}
        self._decisions: deque[DecisionResult | BaseException] = deque(maxlen=_MAX_QUEUED_DECISIONS)
        self._queue_decisions = decision_mode == "on_change"
        self._tls: TLSContexts | None = None  # the connection's TLS files, loaded on entering
        if budget is None:
            budget = DecisionBudget()
        self.budget = budget
        self.observer = observer or StreamObserver()
        #: What this stream's dispatches cost the budget (see :class:`DispatchAccounting`).
        self._accounting = DispatchAccounting(budget, decision_mode, id(self))
        self._refused: BudgetExceeded | None = None  # what the budget refused, holding this stream
        #: what the observer hears once the tasks a frame woke have run (see ``_observe_later``)
        self._observations: deque[tuple[str, tuple[Any, ...], dict[str, Any]]] = deque()
        #: why the current connection ends (see ConnectionServing): a message that broke the
        #: protocol, the subprotocol refused, the receipt deadline passed, a replay on a new
        #: connection, this side began the close
        self._frame_error: BaseException | None = None
        self._violation: BaseException | None = None
        self._silent = self._recycle = self._closed_by_us = False
        self._opened_at = 0.0  # monotonic time the current connection opened
        self._scrub_secret: str | None = None  # the key, as removed from every frame of the connection
        self._flush_handle: asyncio.Handle | None = None  # a writer's turn asked for (see _flush_soon)
        self._pong_flush: asyncio.TimerHandle | None = None
        self._alarm: asyncio.TimerHandle | None = None  # the writer's timer (see _set_alarm)
        #: the decision wait last said in the log: (since, next report, gap); see _report_decision_wait
        self._decision_wait_report: tuple[float | None, float, float] = (None, 0.0, 0.0)
        self._pulse_waiting = 0  # tasks waiting for a pulse
        #: resolved by the reader the moment there is something to take: a queued decision, a
        #: failure, the end (see :meth:`wake_on_decision`)
        self._decision_waiter: asyncio.Future[Any] | None = None
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
    def state_hash(self) -> str:
        """SHA-256 (hex) of :attr:`state`'s canonical JSON
        (:func:`~airflow_provider_systemzero.identity.state_hash`), without encoding the state
        again once the stream has a session."""
        if self._session is not None:
            return self._session.desired_state_hash
        from airflow_provider_systemzero.identity import state_hash

        return state_hash(self._initial[0])

    @property
    def attachments(self) -> tuple[Attachment, ...]:
        """The desired attachments."""
        return self._session.desired_attachments if self._session else self._initial[1]

    @property
    def state_version(self) -> int:
        """The latest version the gateway acknowledged (numbering restarts on every connection)."""
        return self._state_version

    @property
    def last_decision(self) -> DecisionResult | None:
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
    def deciding_for(self) -> float | None:
        """How long (seconds) the gateway has owed this connection a decision: since the first
        dispatch nothing has answered yet, or the last answer that left one owed; ``None`` when
        none is owed."""
        since = self._accounting.waiting_since
        return None if since is None else time.monotonic() - since

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
        """What this stream spent: dispatches, billed and replayed decisions, tokens (see :mod:`~airflow_provider_systemzero.decisions.budget`)."""
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
        session.dispatch_admission = self._admit
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
            self.budget.attach_window(
                connection_window(
                    settings.conn_id or settings.url,
                    settings.budget_decisions_per_hour,
                    settings.budget_input_tokens_per_hour,
                )
            )
            self._tls = await asyncio.to_thread(load_tls, settings)  # refused here, before any connect
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
            # The stream never opened (its start was not acknowledged): nothing the gateway holds
            # needs a close handshake, and the caller's time to open is up (its deadline, or a
            # cancellation at one): the connection, if any, is aborted at once.
            await self._shutdown(grace=0)
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._shutdown()

    async def aclose(self, *, grace: float | None = None) -> None:
        """Close the stream: the connection ends with close code 1000; pending waits end.

        :param grace: seconds the close handshake may take at most (default: the gateway's close
            handshake timeout, 5 s); the connection is then aborted. A caller with a deadline
            passes the time it has left, so a gateway that never answers the close frame cannot
            hold the caller past it.
        """
        await self._shutdown(grace)

    def close_soon(self) -> None:
        """Begin closing the stream now, without waiting: the close (1000) goes out at once, and
        its slot of ``max_streams_per_process`` is given back once the close completed.
        :meth:`aclose` must still be awaited (it waits for the close, and ends it).

        For a caller that has decided to close but has its own work to finish first: the close
        handshake runs meanwhile instead of after.
        """
        if self._closing or self._closed or not self._entered:
            return
        self._closing = True
        self._turn_now()  # the close frame goes out now

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

    def _unlink(self) -> None:
        """The stream is closed: its parts let go of it (the session's admission callback, the
        observer's stream), so that reference counting frees a closed stream at once instead of
        leaving a cycle for the collector's next full pass (which visits every waiting trigger)."""
        if self._session is not None:
            self._session.dispatch_admission = None
        self._observe_pending()  # what it was to hear later, it hears before it lets go
        self.observer.unbind()

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
        self._turn_now()  # from the caller's task: one loop turn less between a change and the wire
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
        """Wait until the gateway acknowledged the complete desired state on an open connection.

        A stream left disconnected because it had nothing to do (after a restart of the gateway,
        an idle goodbye, or :meth:`release`) reconnects for this wait.

        :param timeout: seconds (``None``: no limit).
        :raises DeadlineExceeded: not in sync in time.
        """
        self._check_usable()
        # a stream left disconnected with nothing to do (everything acknowledged and decided, or
        # given back) reconnects for this caller: being in sync needs an open connection
        self._sync_waiters += 1
        self._kick()
        try:
            await self._wait_until(
                lambda: self.in_sync,
                timeout,
                lambda: f"the gateway did not acknowledge the desired state within {timeout} s",
            )
        finally:
            self._sync_waiters -= 1
