"""The resilient asyncio client of a System Zero stream: the session that decides, over the connection that does the I/O.

:class:`DecisionStream` is a tree, as httpcore's pool is over its connections and websockets'
connection over its protocol::

    DecisionStream        the public API, and what every event means for the caller
    ├── ClientSession     the sans-I/O core: desired state, pacing, replay, decide intents
    ├── StreamLife        entered, ready, closing, closed, failed; the pulse the stream's waits wait on
    ├── DecisionDelivery  the decide() futures, the decisions() queue and its one waiter
    ├── DispatchAccounting  what the dispatches cost the budget
    ├── StreamStarts      may the stream start a decision now (the account's ceiling)
    ├── ObserverRelay     what the observer hears, in order
    └── StreamConnection  the socket, the writer, the task that connects and reconnects

The stream decides; its parts hold state and do what they are told. The connection drives the
session's I/O side and hands everything else up through one entry, ``DecisionStream._handle``
(given to :meth:`StreamConnection.start
<airflow_provider_systemzero.stream.stream_connection.StreamConnection.start>`): the session's
events of each frame, the session's question before a dispatch
(:class:`~airflow_provider_systemzero.protocol.client_events.AdmissionWanted`, answered here with
the account's decision starts and the budget), and the connection's own end. No part holds the
stream but the connection, and only while its loop runs: a closed stream is freed by reference
counting.

No Airflow imports here: the benchmarks and the emulator tests use this module directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeAlias

from airflow_provider_systemzero.decisions.budget import (
    BudgetExceeded,
    DecisionBudget,
    Usage,
    connection_window,
)
from airflow_provider_systemzero.protocol import keys
from airflow_provider_systemzero.protocol.client import ClientSession
from airflow_provider_systemzero.protocol.client_events import (
    Acknowledged,
    AdmissionWanted,
    ClientEvent,
    DecisionFailedEvent,
    DecisionReceived,
    DecisionRepeated,
    HelloReceived,
    MutationRejected,
    ServerError,
    StreamFailed,
)
from airflow_provider_systemzero.protocol.client_input import DECIDE_REFUSALS
from airflow_provider_systemzero.protocol.errors import LocalProtocolError
from airflow_provider_systemzero.protocol.messages import Attachment, ClientMessage, Hello, StreamRequest
from airflow_provider_systemzero.protocol.reconnect import DecideRetry, classify_decide_failure
from airflow_provider_systemzero.protocol.reply import DecisionResult
from airflow_provider_systemzero.stream.accounting import DispatchAccounting
from airflow_provider_systemzero.stream.capacity import Backoff, StreamCapacity, default_capacity
from airflow_provider_systemzero.stream.delivery import DecisionDelivery, decision_error
from airflow_provider_systemzero.stream.exceptions import (
    DeadlineExceeded,
    DecisionFailed,
    StreamClosed,
    StreamRejected,
    SystemZeroValidationError,
)
from airflow_provider_systemzero.stream.life import StreamLife
from airflow_provider_systemzero.stream.observer import ObserverRelay, StreamObserver
from airflow_provider_systemzero.stream.request import build_request
from airflow_provider_systemzero.stream.settings import StreamSettings
from airflow_provider_systemzero.stream.starts import AccountStarts, StreamStarts, decision_starts
from airflow_provider_systemzero.stream.stream_connection import (
    ConnectionFailed,
    ConnectionLost,
    ConnectionStopped,
    Reconnect,
    StreamConnection,
    StreamEvent,
)
from airflow_provider_systemzero.stream.tls import load_tls
from airflow_provider_systemzero.stream.untrusted import server_text, server_token

__all__ = ["DecisionResult", "DecisionStream", "Reconnect"]

log = logging.getLogger(__name__)

_Source: TypeAlias = StreamSettings | Callable[[], Awaitable[StreamSettings]]
#: 409 ``idempotency_conflict`` answers waited out by one ``decide()`` (the original call is still running).
_MAX_CONFLICT_RETRIES = 600


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
        starts: AccountStarts | None = None,
    ) -> None:
        #: The account's decision starts shared in this process (``None``: looked up on entering).
        self._account = starts
        #: The settings (``None`` until the resolver gave them on entering).
        self._settings: StreamSettings | None = settings if isinstance(settings, StreamSettings) else None
        #: What gives the settings on entering, when they were not given (dropped once it did).
        self._resolver: Callable[[], Awaitable[StreamSettings]] | None = (
            None if isinstance(settings, StreamSettings) else settings
        )
        # What the session is built from once the settings are known (the parameters):
        self._request_arg = request
        #: the initial state and attachments (the desired ones until there is a session)
        self._initial = (state, tuple(attachments))
        self._decision_mode = decision_mode
        self._min_interval_ms = min_interval_ms
        self._idempotency_key = idempotency_key
        self._key_namespace = key_namespace
        self._identity = identity
        self._open_deadline = open_deadline
        self._decide_retries = decide_retries
        self._reached = reached
        #: The reconnect backoff (also the delays between ``decide()`` retries).
        self.backoff = backoff or Backoff()
        #: The stream cap this stream holds a slot of while connected.
        self.capacity = capacity or default_capacity()
        self.budget = budget if budget is not None else DecisionBudget()
        #: Hears what the stream does (bound to the stream until it closes).
        self.observer = observer or StreamObserver()
        #: The sans-I/O session (built with the settings: at once, or on entering).
        self._session: ClientSession | None = None
        # The parts (see the module); the last two are made on entering.
        self._life = StreamLife()
        self._observations = ObserverRelay(self.observer)
        self._accounting = DispatchAccounting(self.budget, decision_mode, id(self))
        self._delivery = DecisionDelivery(decision_mode)
        self._starts: StreamStarts | None = None
        self._connection: StreamConnection | None = None
        #: The latest state version the gateway acknowledged (numbering restarts per connection).
        self._state_version = 0
        #: What the budget refused, holding this stream (set once, by :meth:`_budget_exceeded`).
        self._refused: BudgetExceeded | None = None
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
        return self._connection is not None and self._connection.open

    @property
    def dormant(self) -> bool:
        """Whether the stream is disconnected on purpose, waiting for work (after :meth:`release`
        or an ``idle_timeout`` / ``max_duration`` goodbye)."""
        return self._connection is not None and self._connection.dormant

    @property
    def waiting_for_turn(self) -> bool:
        """Whether a decision start of the stream waits for its turn under the account's decision
        ceiling (see :mod:`~airflow_provider_systemzero.stream.starts`)."""
        return self._starts is not None and self._starts.waiting

    @property
    def connection(self) -> StreamConnection | None:
        """The stream's connection (advanced use and tests): its socket while one is open, its
        writer's turn; ``None`` before entering."""
        return self._connection

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
        return self._life.failure

    @property
    def last_error_text(self) -> str | None:
        """The last retryable failure, with its cause and fix (``None`` if there was none)."""
        last_error = self._life.last_error
        if self._connection is None:
            return None if last_error is None else str(last_error)
        return self._connection.network.describe(last_error)

    @property
    def reconnects(self) -> list[Reconnect]:
        """Every reconnect so far, in order."""
        return self._connection.reconnects if self._connection is not None else []

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
            f"<DecisionStream origin={origin!r} mode={self._decision_mode} version={self.state_version} "
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
                admission=True,
            )
        except LocalProtocolError as exc:
            raise SystemZeroValidationError.from_local(exc) from None
        return session

    async def __aenter__(self) -> DecisionStream:
        if self._life.entered:
            raise RuntimeError("a DecisionStream can be entered once; create a new one")
        self._life.entered = True
        try:
            if self._resolver is not None:
                settings = await self._resolver()
                if not isinstance(settings, StreamSettings):
                    raise TypeError(
                        f"the settings resolver returned {type(settings).__name__}, not StreamSettings"
                    )
                self._settings, self._resolver = settings, None
            if self._session is None:
                self._session = self._build_session(self._settings)
            settings, session = self._settings, self._session
            self._starts = StreamStarts(
                self._account or decision_starts(settings.url, settings.api_key),
                session,
                self.capacity,
                origin=settings.url,
            )
            self.budget.attach_window(
                connection_window(
                    settings.conn_id or settings.url,
                    settings.budget_decisions_per_hour,
                    settings.budget_input_tokens_per_hour,
                )
            )
            tls = await asyncio.to_thread(load_tls, settings)  # refused here, before any connect
            self._connection = StreamConnection(
                session,
                settings,
                tls,
                self._starts.turn,
                self._accounting,
                self._observations,
                backoff=self.backoff,
                reached=self._reached,
            )
            self._connection.start(self._handle, f"systemzero-stream-{id(self):x}")
            await self._wait_until(
                lambda: self._life.ready,
                self._open_deadline,
                lambda: f"the stream to {settings.url} did not open within {self._open_deadline} s",
            )
        except BaseException:
            # The stream never opened (its start was not acknowledged): nothing the gateway holds
            # needs a close handshake, and the caller's time to open is up (its deadline, or a
            # cancellation at one): the connection, if any, is aborted at once.
            await self.aclose(grace=0)
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self, *, grace: float | None = None) -> None:
        """Close the stream: the connection ends with close code 1000; pending waits end.

        :param grace: seconds the close handshake may take at most (default: the gateway's close
            handshake timeout, 5 s); the connection is then aborted. A caller with a deadline
            passes the time it has left, so a gateway that never answers the close frame cannot
            hold the caller past it.
        """
        life = self._life
        if life.closed:
            return
        life.closing = True
        life.closed = True
        if self._starts is not None:
            self._starts.leave()
        try:
            if self._connection is not None:
                await self._connection.stop(grace)
        finally:  # also when the caller is cancelled meanwhile: its cancellation propagates
            self._delivery.fail_all(
                StreamClosed(None, "closed", message="the stream was closed before the decision arrived")
            )
            self._wake_all()
            # the observer lets go of the stream, so that reference counting frees a closed stream
            # at once instead of leaving a cycle for the collector's next full pass (which visits
            # every waiting trigger); what it was to hear later, it hears before
            self._observations.flush()
            self.observer.unbind()

    def close_soon(self) -> None:
        """Begin closing the stream now, without waiting: the close (1000) goes out at once, and
        its slot of ``max_streams_per_process`` is given back once the close completed.
        :meth:`aclose` must still be awaited (it waits for the close, and ends it).

        For a caller that has decided to close but has its own work to finish first: the close
        handshake runs meanwhile instead of after.
        """
        life = self._life
        if life.closing or not life.entered:
            return
        life.closing = True
        connection = self._connection
        if connection is not None:
            connection.close()
            connection.turn_now()  # the close frame goes out now

    async def release(self) -> None:
        """Close the connection (1000) but keep the stream; it reconnects when there is work.

        Use it to lease a connection: the session (desired state, pending decide) is kept and
        replayed on the next connection, which opens as soon as :meth:`has_work` is true.
        """
        self._life.check_usable()
        connection = self._connection
        ws = connection.socket if connection is not None else None
        if connection is None or ws is None:
            return
        # The release is about this connection only: when it ends for another reason first (a
        # drop, a goodbye) or before its start was acknowledged, the next one starts afresh.
        connection.give_back()
        await self._wait_until(
            lambda: connection.socket is not ws, connection.close_timeout() + 1, lambda: "release timed out"
        )

    def has_work(self) -> bool:
        """Whether the stream needs a connection (a change to send or a decision to wait for)."""
        return self.session.has_work()

    # ------------------------------------------------------------------ changes

    async def _apply(self, change: Callable[[], list[ClientEvent]]) -> None:
        self._life.check_usable()
        try:
            events = change()
        except LocalProtocolError as exc:
            raise SystemZeroValidationError.from_local(exc) from None
        if events:
            self._handle(events)
        if self._starts is not None:
            self._starts.changed()  # waiting for its start: the start is for this state
        if self._connection is not None:
            # from the caller's task: one loop turn less between a change and the wire
            self._connection.turn_now()
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
        self._life.check_usable()
        # a stream left disconnected with nothing to do (everything acknowledged and decided, or
        # given back) reconnects for this caller: being in sync needs an open connection
        connection = self._connection
        with connection.needed() if connection is not None else contextlib.nullcontext():
            await self._wait_until(
                lambda: self.in_sync,
                timeout,
                lambda: f"the gateway did not acknowledge the desired state within {timeout} s",
            )

    # ------------------------------------------------------------------ decisions

    async def decide(self, *, timeout: float | None = None) -> DecisionResult:  # noqa: ASYNC109 - see DeadlineExceeded
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
        life = self._life
        life.check_usable()
        session = self.session
        if self._decision_mode == "on_change":
            if session.current_decision is not None:
                return session.current_decision  # already decided: on_change dispatches nothing new for it
            if session.current_failure is not None:
                # the gateway will not dispatch this state again: its final failure is the answer
                raise decision_error(session.current_failure)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        failures = conflicts = 0
        while True:
            intent = session.request_decision()
            future = self._delivery.expect(intent)
            if self._connection is not None:
                self._connection.kick()
            try:
                async with asyncio.timeout_at(deadline):
                    return await future
            except DecisionFailed as exc:
                if self._starts is not None and self._starts.asks_again(exc.http_status):
                    continue  # asked again: the account's queue waits out the Retry-After, once
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
                        f"no decision within {round(timeout, 1):g} s (the server asked to wait "
                        f"{delay:.3f} s before retrying)",
                        last_error=exc,
                    ) from exc
                log.info(
                    "decision failed with HTTP %s (%s); retrying in %.3f s",
                    exc.http_status,
                    server_token(exc.envelope.code),
                    delay,
                )
                await life.pulse.sleep(delay, until=lambda: life.ending)
                life.check_usable()
            except TimeoutError:
                if life.failure is not None:
                    raise life.failure from None
                raise DeadlineExceeded(
                    f"no decision within {round(timeout, 1):g} s",
                    last_error=life.last_error,
                    detail=self.last_error_text,
                ) from None
            finally:
                self._delivery.forget(intent)
                session.cancel_intent(intent)

    async def decisions(self) -> AsyncIterator[DecisionResult]:
        """Decisions as they arrive (on_change), in order; ends when the stream closes.

        One consumer at a time. A non-retryable on_change decision failure is raised here.

        :raises DecisionFailed: a dispatch failed and the gateway will not retry it.
        """
        self._life.check_usable()
        self._delivery.read_from_now()
        loop = asyncio.get_running_loop()
        while True:
            try:
                decision = self.take_decision()
            except StreamClosed:
                if self._life.failure is None:
                    return
                raise
            if decision is not None:
                yield decision
                continue
            # woken by a queued decision, a failure or the end, not by every frame
            waiter = loop.create_future()
            self.wake_on_decision(waiter)
            await waiter

    def take_decision(self) -> DecisionResult | None:
        """The oldest on_change decision not taken yet, or ``None`` when there is none now.

        Together with :meth:`wake_on_decision` it is :meth:`decisions` without a task or an
        iterator in between: the consumer takes what is there, and waits on its own future.

        :raises DecisionFailed: a dispatch failed and the gateway will not retry it (in order).
        :raises StreamClosed: the stream closed (or the error that ended it).
        """
        item = self._delivery.take()
        if item is not None:
            if isinstance(item, BaseException):
                raise item
            return item
        life = self._life
        if life.failure is not None:
            raise life.failure
        if life.closed:
            raise StreamClosed(None, "closed", message="the stream closed: no further decision")
        return None

    def wake_on_decision(self, waiter: asyncio.Future[Any]) -> None:
        """Resolve ``waiter`` (with ``None``) the moment :meth:`take_decision` has something new:
        a decision, a failure, the end. The stream's reader resolves it itself, so the consumer
        awaiting it is the next task to run — no queue, task or event in between.

        One waiter at a time (a new one replaces the previous); a waiter already done (it timed
        out, was cancelled, or something else resolved it) is left alone.

        :param waiter: a future of the running loop.
        """
        life = self._life
        self._delivery.wait(waiter, ended=life.failure is not None or life.closed)

    def settle_usage(self) -> None:
        """Count a dispatch the gateway may still make for this connection as one unconfirmed
        decision now, as the connection's end would count it: for a caller that reports what the
        stream spent before it closes the stream (a trigger's event goes out before its cleanup).
        Once the connection ends, nothing is counted twice, and a decision that still arrives
        takes the unconfirmed one's place."""
        if self._accounting.settle():
            _said_unconfirmed("the stream's usage was reported")

    # ------------------------------------------------------------------ what the connection tells

    def _handle(self, events: Sequence[StreamEvent]) -> None:
        """The stream's one entry (see the module), also for the events of a change of the
        caller's that settles something at once; then the stream pulses. The INFO log lines say
        what happened for a person reading the task log — never the state's content or the key.

        :param events: what the session or the connection returned.
        """
        for event in events:
            if isinstance(event, AdmissionWanted):
                self.session.admit(self._admits(event.message))
            elif isinstance(event, HelloReceived):
                if self._starts is not None:
                    self._starts.hello(event.hello.limits)
                _log_hello(event.hello)
                self._observations.later("hello", event.hello)  # after the start it makes due is written
            elif isinstance(event, Acknowledged):
                self._on_ack(event)
            elif isinstance(event, DecisionReceived):
                if not event.repeated:  # a repeated one was counted and queued when it arrived
                    self._on_decision(event.result)
                self._delivery.answer(event.intents, event.result)
                if not event.repeated:
                    self._delivery.queue(event.result)
                self._settle_exceeded()
            elif isinstance(event, DecisionFailedEvent):
                if not event.repeated:  # a repeated one was counted when it arrived
                    self._on_decision_failed(event)
                else:  # the caller returned to a state whose dispatch failed for good
                    error = decision_error(event.error)
                    self._delivery.answer(event.intents, error)
                    if event.current:
                        self._delivery.queue(error)
                self._settle_exceeded()
            elif isinstance(event, MutationRejected):
                self._accounting.refused(event.error)
                self._settle_exceeded()
                log.debug(
                    "change %s deferred by the gateway (%s); it is sent again",
                    server_token(event.error.event_id),
                    server_token(event.error.code),
                )
                if event.error.code == "event_rate_limited":
                    delay = event.error.retry.retry_after_ms
                    self._observations.now("rate_limited", "event", None if delay is None else delay / 1000)
            elif isinstance(event, StreamFailed):
                self._fail(StreamRejected(event.error.envelope, event.error.event_id))
            elif isinstance(event, ServerError):
                if (
                    not event.error.fatal
                    and event.error.event_id is None
                    and event.error.code in DECIDE_REFUSALS
                ):
                    self._accounting.refused(event.error)  # no dispatch follows the decide
                log.info(
                    "gateway error %s (fatal=%s): %s",
                    server_token(event.error.code),
                    event.error.fatal,
                    server_text(event.error.envelope.message),
                )
            elif isinstance(event, DecisionRepeated):
                log.warning(
                    "the System Zero gateway repeated the decision for state version %d: ignored",
                    event.state_version,
                )
            elif isinstance(event, ConnectionLost):
                # what the lost connection may leave behind: a dispatch billed, its reply never seen
                if self._accounting.connection_ended():
                    _said_unconfirmed("the connection ended")
            elif isinstance(event, ConnectionFailed):
                self._life.last_error = event.error
            elif isinstance(event, ConnectionStopped):
                if event.error is not None:
                    self._fail(event.error)
                self._wake_all()
            # a goodbye is the connection's to plan from
        self._life.pulse.fire()

    def _admits(self, message: ClientMessage) -> bool:
        """The answer to the session's question before it writes ``message``, which can start a
        dispatch: the account's decision starts let it go now (else the session is asked again
        when the stream's turn comes), and the budget lets what it may cost through.

        :param message: the message about to be written.
        """
        if self._starts is not None and not self._starts.admit(message):
            return False
        refused = self._accounting.admit(message, self.session.desired_body_bytes())
        if refused is not None:
            self._budget_exceeded(refused)
            return False
        return True

    def _on_ack(self, event: Acknowledged) -> None:
        ack = event.ack
        self._state_version = ack.state_version
        self._accounting.acknowledged(ack)
        if event.message_type == "start":
            self._life.ready = True
        log.info(
            "state version %d acknowledged (%s%s): state %d bytes, decide body %d bytes%s",
            ack.state_version,
            event.message_type,
            ", replayed" if event.replayed else "",
            ack.state_bytes,
            ack.synthesized_body_bytes,
            ", decision scheduled" if ack.scheduled else "",
        )
        self._observations.later("acknowledged", ack, event.message_type, event.replayed)

    def _on_decision(self, result: DecisionResult) -> None:
        self._life.last_error = None  # overcome: a later timeout does not blame a failure of before
        if self._starts is not None:
            self._starts.ended(None)
        billed = self._accounting.decided(result)
        self._observations.later("decided", result, billed=billed)
        if not log.isEnabledFor(logging.INFO):
            return  # the line below is built only for a log that shows it
        answers = "; ".join(
            f"{name}={answer.decision!r} (probability {_fmt(answer.probability)}, confidence "
            f"{_fmt(answer.confidence)})"
            for name, answer in result.answers.items()
        )
        log.info(
            "decision for state version %d (covers %s): %s — reply %s, %s; %d input tokens; queue %s ms, "
            "decide %s ms",
            result.state_version,
            ", ".join(map(server_token, result.covered_event_ids)) or "nothing new",
            answers or "no answers",
            server_token(result.reply_id),
            "a new reply, counted as billed"
            if billed
            else "a reply already counted: replayed, not billed again",
            result.usage.get("input_tokens", 0),
            _fmt(result.queue_ms, 0),
            _fmt(result.decide_ms, 0),
        )

    def _on_decision_failed(self, event: DecisionFailedEvent) -> None:
        error = decision_error(event.error)
        self._life.last_error = error
        self._accounting.failed(event.error, retryable=error.retryable)
        self._observations.now(
            "decision_failed",
            error.http_status,
            error.envelope.code,
            error.retryable,
            event.error.state_version,
        )
        if error.http_status == 429:
            delay = error.retry.retry_after_ms
            self._observations.now("rate_limited", "decide", None if delay is None else delay / 1000)
        # the account's starts hear it (a 429 adapts the mirror; on_change the connection is given back)
        gave_back = self._starts.ended(event.error) if self._starts is not None else False
        self._delivery.answer(event.intents, error)
        if self._decision_mode != "on_change" or gave_back:
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
        # the gateway will not retry: whoever waited for this state's decision heard it above
        if not event.current:
            log.info(
                "decision for state version %s failed with HTTP %s (%s), not retried; the state has "
                "changed since, and the newer one is decided on its own",
                event.error.state_version,
                error.http_status,
                server_token(error.envelope.code),
            )
            return
        self._delivery.queue(error)

    def _budget_exceeded(self, exc: BudgetExceeded) -> None:
        """The budget refused a dispatch: said once; on_request whoever waits hears why at once,
        on_change the stream holds its changes and fails once what was scheduled settled."""
        first = self._refused is None
        self._refused = exc
        if self._starts is not None:
            self._starts.budget_exceeded()
        if first:
            log.warning("%s", exc)
            self._observations.now("budget_exceeded", exc)
        if self._decision_mode == "on_request":
            # nothing was sent: whoever waits for this decision hears why at once
            for intent in self._delivery.fail_all(exc):
                self.session.cancel_intent(intent)
            return
        if first:
            log.info(
                "holding further changes locally; %d dispatch(es) already scheduled settle first",
                self._accounting.outstanding(),
            )
        self._settle_exceeded()

    def _settle_exceeded(self) -> None:
        """on_change: once nothing scheduled is outstanding, a refused stream fails (and closes)."""
        if (
            self._refused is not None
            and self._decision_mode == "on_change"
            and self._accounting.outstanding() == 0
        ):
            self._fail(self._refused)

    # ------------------------------------------------------------------ the parts, together

    def _wake_all(self) -> None:
        """The stream failed or ended: every waiter, the decisions consumer included, looks again."""
        self._life.pulse.fire()
        self._delivery.ready()

    def _fail(self, exc: BaseException) -> None:
        """End the stream with ``exc`` (the first error stays): every waiter raises it, and the
        connection closes."""
        life = self._life
        if life.failure is None:
            life.failure = exc
            # every waiter raises it, so the caller reports it: said once, by the caller
            log.debug("System Zero stream failed: %s", exc)
        self._delivery.fail_all(exc)
        if self._connection is not None:
            self._connection.close()
        self._wake_all()

    async def _wait_until(
        self, condition: Callable[[], bool], seconds: float | None, describe: Callable[[], str]
    ) -> None:
        """Wait on the pulse until ``condition()`` holds; the stream's failure or end is raised, and
        :class:`DeadlineExceeded` (with the last failure's cause and fix) after ``seconds``."""
        life = self._life
        loop = asyncio.get_running_loop()
        deadline = None if seconds is None else loop.time() + seconds
        while not condition():
            if life.failure is not None:
                raise life.failure
            if life.closed and (self._connection is None or self._connection.finished):
                raise StreamClosed(None, "closed", message="the stream is closed: open a new one")
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                raise DeadlineExceeded(describe(), last_error=life.last_error, detail=self.last_error_text)
            with contextlib.suppress(TimeoutError):
                await life.pulse.wait(remaining)


def _said_unconfirmed(why: str) -> None:
    log.info(
        "%s with a dispatch possibly in flight: counted as one unconfirmed decision against the budget",
        why,
    )


def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "n/a"
    return f"{value:.{digits}f}"


def _log_hello(hello: Hello) -> None:
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
