"""The resilient asyncio client of a System Zero stream: a thin I/O adapter over the sans-I/O core.

:class:`DecisionStream` owns one :class:`~airflow_provider_systemzero.protocol.client.ClientSession`
(the desired state, pacing, replay, decide intents — every protocol rule lives there); this module
is its public API: construction, the read-only view, entering and closing, changes and decisions.
The stream owns its parts, each a class with its own state, documented where it is declared:

| part | module | what it holds |
|---|---|---|
| ``_life`` | :class:`~airflow_provider_systemzero.stream.life.StreamLife` | entered, ready, closing, closed, failed; the pulse every waiter waits on |
| ``_delivery`` | :class:`~airflow_provider_systemzero.stream.delivery.DecisionDelivery` | the ``decide()`` futures, the ``decisions()`` queue and its waiter |
| ``_accounting`` | :class:`~airflow_provider_systemzero.stream.accounting.DispatchAccounting` | what the gateway may still dispatch, against the budget |
| ``_events`` | :class:`~airflow_provider_systemzero.stream.core_events.CoreEvents` | what the core's events do; the acknowledged version; the budget's refusal; the connection's facts; the turn under the account's decision ceiling |
| ``_connection`` | :class:`~airflow_provider_systemzero.stream.serving.ConnectionServer` | the open socket, the writer's timers, why the connection ends |
| ``_loop`` | :class:`~airflow_provider_systemzero.stream.run_loop.RunLoop` | the task that connects and reconnects, the reconnects made, dormancy |
| ``_observations`` | :class:`~airflow_provider_systemzero.stream.observer.ObserverRelay` | what the observer hears, in order |

The parts reach the stream only through its public view (``settings``, ``session``,
``last_error_text``) and each other through the methods named in their constructors; the signals
they wake each other with are the table of :mod:`~airflow_provider_systemzero.stream.life`.

No Airflow imports here: the benchmarks and the emulator tests use this module directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeAlias

from airflow_provider_systemzero.decisions.budget import (
    DecisionBudget,
    Usage,
    connection_window,
)
from airflow_provider_systemzero.protocol import keys
from airflow_provider_systemzero.protocol.client import ClientSession
from airflow_provider_systemzero.protocol.client_events import ClientEvent
from airflow_provider_systemzero.protocol.errors import LocalProtocolError
from airflow_provider_systemzero.protocol.messages import Attachment, StreamRequest
from airflow_provider_systemzero.protocol.reply import DecisionResult
from airflow_provider_systemzero.stream.accounting import DispatchAccounting
from airflow_provider_systemzero.stream.capacity import Backoff, StreamCapacity, default_capacity
from airflow_provider_systemzero.stream.core_events import CoreEvents
from airflow_provider_systemzero.stream.delivery import DecisionDelivery
from airflow_provider_systemzero.stream.exceptions import (
    DeadlineExceeded,
    StreamClosed,
    SystemZeroValidationError,
)
from airflow_provider_systemzero.stream.life import StreamLife
from airflow_provider_systemzero.stream.observer import ObserverRelay, StreamObserver
from airflow_provider_systemzero.stream.request import build_request
from airflow_provider_systemzero.stream.run_loop import Reconnect, RunLoop
from airflow_provider_systemzero.stream.serving import ConnectionServer
from airflow_provider_systemzero.stream.settings import StreamSettings
from airflow_provider_systemzero.stream.starts import DecisionStarts, decision_starts
from airflow_provider_systemzero.stream.tls import load_tls

__all__ = ["DecisionResult", "DecisionStream", "Reconnect"]

log = logging.getLogger(__name__)

_Source: TypeAlias = StreamSettings | Callable[[], Awaitable[StreamSettings]]


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
        starts: DecisionStarts | None = None,
    ) -> None:
        #: The account's decision starts (given, or looked up on entering).
        self._starts = starts
        #: The settings, or the resolver that gives them on entering.
        self._source = settings
        #: The resolved settings (``None`` until a resolver gave them).
        self._settings: StreamSettings | None = settings if isinstance(settings, StreamSettings) else None
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
        #: The reconnect backoff (also the delays between ``decide()`` retries).
        self.backoff = backoff or Backoff()
        #: The stream cap this stream holds a slot of while connected.
        self.capacity = capacity or default_capacity()
        if budget is None:
            budget = DecisionBudget()
        self.budget = budget
        #: Hears what the stream does (bound to the stream until it closes).
        self.observer = observer or StreamObserver()
        #: The sans-I/O session (built with the settings: at once, or on entering).
        self._session: ClientSession | None = None
        # The parts (see the module's table), each with its own state. They hold the stream weakly
        # (its running loop's task holds it while it runs), so that a closed stream leaves no
        # reference cycle and is freed by reference counting, not by the collector's next pass.
        me = weakref.proxy(self)

        def kick() -> None:
            me._kick()

        def fail(exc: BaseException) -> None:
            me._fail(exc)

        def wake_all() -> None:
            me._wake_all()

        #: entered, ready, closing, closed, failed; the pulse
        self._life = StreamLife()
        #: what the observer hears, in order
        self._observations = ObserverRelay(self.observer)
        #: what the dispatches cost the budget
        self._accounting = DispatchAccounting(budget, decision_mode, id(self))
        #: the decide() futures, the decisions() queue and its waiter
        self._delivery = DecisionDelivery(
            me,
            self._life,
            kick,
            decision_mode=decision_mode,
            decide_retries=decide_retries,
            backoff=self.backoff,
        )
        #: what the core's events do; the acknowledged version; the connection's facts
        self._events = CoreEvents(
            me,
            weakref.ref(self),
            self._life,
            self._delivery,
            self._accounting,
            self._observations,
            self.capacity,
            fail=fail,
            kick=kick,
            decision_mode=decision_mode,
        )
        #: the open socket, the writer and its timers, why a connection ends
        self._connection = ConnectionServer(
            me, self._life, self._events, self._accounting, self._observations
        )
        #: the task that connects and reconnects; the reconnects made; dormancy
        self._loop = RunLoop(
            me,
            self._life,
            self._connection,
            self._events,
            self._observations,
            self.capacity,
            self.backoff,
            fail=fail,
            wake_all=wake_all,
            reached=reached,
        )
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
        return self._events.state_version

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
        return self._connection.socket is not None

    @property
    def dormant(self) -> bool:
        """Whether the stream is disconnected on purpose, waiting for work (after :meth:`release`
        or an ``idle_timeout`` / ``max_duration`` goodbye)."""
        return self._loop.dormant

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
        network = self._loop.network
        if network is None:
            return None if last_error is None else str(last_error)
        return network.describe(last_error)

    @property
    def reconnects(self) -> list[Reconnect]:
        """Every reconnect so far, in order."""
        return self._loop.reconnects

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
        self._life.start()
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
            self._events.starts = self._starts
            self._events.origin = settings.url
            self._delivery.shares_starts = True
            self.budget.attach_window(
                connection_window(
                    settings.conn_id or settings.url,
                    settings.budget_decisions_per_hour,
                    settings.budget_input_tokens_per_hour,
                )
            )
            # refused here, before any connect
            self._connection.tls = await asyncio.to_thread(load_tls, settings)
            self._loop.start(self, f"systemzero-stream-{id(self):x}")
            await self._wait_until(
                lambda: self._life.ready,
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
        life = self._life
        if life.closing or life.closed or not life.entered:
            return
        life.closing = True
        self._connection.turn_now()  # the close frame goes out now

    async def release(self) -> None:
        """Close the connection (1000) but keep the stream; it reconnects when there is work.

        Use it to lease a connection: the session (desired state, pending decide) is kept and
        replayed on the next connection, which opens as soon as :meth:`has_work` is true.
        """
        self._life.check_usable()
        connection = self._connection
        ws = connection.socket
        if ws is None:
            return
        # The release is about this connection only (its facts): when it ends for another reason
        # first (a drop, a goodbye) or before its start was acknowledged, the next one starts afresh.
        connection.facts.release = True
        self._kick()
        await self._wait_until(
            lambda: connection.socket is not ws, connection.close_timeout() + 1, lambda: "release timed out"
        )

    def _unlink(self) -> None:
        """The stream is closed: its parts let go of it (the session's admission callback, the
        observer's stream), so that reference counting frees a closed stream at once instead of
        leaving a cycle for the collector's next full pass (which visits every waiting trigger)."""
        self._observations.flush()  # what it was to hear later, it hears before it lets go
        self.observer.unbind()

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
            self._events.dispatch(events)
        self._events.changed()  # waiting for its start: the start is for this state
        self._connection.turn_now()  # from the caller's task: one loop turn less between a change and the wire
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
        loop = self._loop
        loop.sync_waiters += 1
        self._kick()
        try:
            await self._wait_until(
                lambda: self.in_sync,
                timeout,
                lambda: f"the gateway did not acknowledge the desired state within {timeout} s",
            )
        finally:
            loop.sync_waiters -= 1

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
        return await self._delivery.decide(timeout)

    def decisions(self) -> AsyncIterator[DecisionResult]:
        """Decisions as they arrive (on_change), in order; ends when the stream closes.

        One consumer at a time. A non-retryable on_change decision failure is raised here.

        :raises DecisionFailed: a dispatch failed and the gateway will not retry it.
        """
        return self._delivery.decisions()

    def take_decision(self) -> DecisionResult | None:
        """The oldest on_change decision not taken yet, or ``None`` when there is none now.

        Together with :meth:`wake_on_decision` it is :meth:`decisions` without a task or an
        iterator in between: the consumer takes what is there, and waits on its own future.

        :raises DecisionFailed: a dispatch failed and the gateway will not retry it (in order).
        :raises StreamClosed: the stream closed (or the error that ended it).
        """
        return self._delivery.take_decision()

    def wake_on_decision(self, waiter: asyncio.Future[Any]) -> None:
        """Resolve ``waiter`` (with ``None``) the moment :meth:`take_decision` has something new:
        a decision, a failure, the end. The stream's reader resolves it itself, so the consumer
        awaiting it is the next task to run — no queue, task or event in between.

        One waiter at a time (a new one replaces the previous); a waiter already done (it timed
        out, was cancelled, or something else resolved it) is left alone.

        :param waiter: a future of the running loop.
        """
        self._delivery.wake_on_decision(waiter)

    def settle_usage(self) -> None:
        """Count a dispatch the gateway may still make for this connection as one unconfirmed
        decision now, as the connection's end would count it: for a caller that reports what the
        stream spent before it closes the stream (a trigger's event goes out before its cleanup).
        Once the connection ends, nothing is counted twice, and a decision that still arrives
        takes the unconfirmed one's place."""
        self._events.settle_usage()

    # ------------------------------------------------------------------ the parts, together

    def _kick(self) -> None:
        """Something to send or to look at: the stream pulses, and an open connection gets a
        writer's turn soon."""
        self._connection.kick()

    def _wake_all(self) -> None:
        """The stream failed or ended: every waiter, the decisions consumer included, looks again."""
        self._life.pulse()
        self._delivery.ready()

    def _fail(self, exc: BaseException) -> None:
        """End the stream with ``exc`` (the first error stays): every waiter raises it."""
        life = self._life
        if life.failure is None:
            life.failure = exc
            # every waiter raises it, so the caller reports it: said once, by the caller
            log.debug("System Zero stream failed: %s", exc)
        self._delivery.fail_all(exc)
        self._kick()
        self._wake_all()

    async def _shutdown(self, grace: float | None = None) -> None:
        """Close: the close handshake may take the gateway's close handshake timeout (or
        ``grace`` seconds, when less: the caller's deadline), then the connection is aborted."""
        life = self._life
        if life.closed:
            return
        life.closing = True
        life.closed = True
        self._events.withdraw_start()
        try:
            await self._loop.stop(grace)
        finally:  # also when the caller is cancelled meanwhile: its cancellation propagates
            self._delivery.fail_all(
                StreamClosed(None, "closed", message="the stream was closed before the decision arrived")
            )
            self._wake_all()
            self._unlink()

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
            if life.closed and self._loop.finished:
                raise StreamClosed(None, "closed", message="the stream is closed: open a new one")
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                raise DeadlineExceeded(describe(), last_error=life.last_error, detail=self.last_error_text)
            with contextlib.suppress(TimeoutError):
                await life.wait_pulse(remaining)
