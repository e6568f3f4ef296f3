"""The task that runs a :class:`~airflow_provider_systemzero.stream.DecisionStream`, and the signals it shares.

The run loop opens connection after connection (each served by
:mod:`~airflow_provider_systemzero.stream.serving`) and, when one ends, does what the core's
:class:`~airflow_provider_systemzero.protocol.reconnect.ReconnectPlanner` says: reconnect after the
planned delay (backoff that never undercuts the server's delay and grows across unproductive
connections), reconnect only once there is work, or stop and raise one of
:mod:`~airflow_provider_systemzero.stream.exceptions`; every reconnect replays the full desired state
byte-identically. Every open connection holds a slot of the process-wide
:class:`~airflow_provider_systemzero.stream.capacity.StreamCapacity`.

:class:`RunLoop` is the part of a :class:`~airflow_provider_systemzero.stream.DecisionStream` that
owns this task, the reconnects it made and what it says about failed attempts
(:class:`~airflow_provider_systemzero.stream.diagnosis.NetworkFailures`). It has no wake-up signal
of its own: it waits for work, and out its backoff, on the stream's pulse, and on_change for the
stream's turn under the account's decision ceiling before it connects (both in the table of
:mod:`~airflow_provider_systemzero.stream.life`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from airflow_provider_systemzero.protocol.reconnect import Backoff, PlanKind, ReconnectPlan, ReconnectPlanner
from airflow_provider_systemzero.stream.capacity import StreamCapacity
from airflow_provider_systemzero.stream.core_events import CoreEvents
from airflow_provider_systemzero.stream.diagnosis import NetworkFailures
from airflow_provider_systemzero.stream.exceptions import ProtocolViolation, StreamClosed, UpgradeRefused
from airflow_provider_systemzero.stream.life import StreamLife, StreamView
from airflow_provider_systemzero.stream.observer import ObserverRelay
from airflow_provider_systemzero.stream.serving import ConnectionServer, Ended
from airflow_provider_systemzero.stream.untrusted import server_token

__all__ = ["Reconnect", "RunLoop"]

log = logging.getLogger(__name__)


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
class _Pending:
    plan: ReconnectPlan
    close_code: int | None
    failed_at: float


class RunLoop:
    """The task that connects and reconnects a :class:`~airflow_provider_systemzero.stream.DecisionStream`.

    :param stream: the stream (its settings and session).
    :param life: the stream's life.
    :param connection: what serves each connection.
    :param events: what the core's events do (it waits for the stream's decision start turn).
    :param observations: what the observer hears.
    :param capacity: the stream cap (a slot per open connection).
    :param backoff: the reconnect backoff.
    :param fail: ends the stream with an error.
    :param wake_all: wakes every waiter once the loop ended.
    :param reached: an earlier stream of the same caller reached this gateway (see
        :class:`~airflow_provider_systemzero.stream.diagnosis.NetworkFailures`).
    """

    def __init__(
        self,
        stream: StreamView,
        life: StreamLife,
        connection: ConnectionServer,
        events: CoreEvents,
        observations: ObserverRelay,
        capacity: StreamCapacity,
        backoff: Backoff,
        *,
        fail: Callable[[BaseException], None],
        wake_all: Callable[[], None],
        reached: bool,
    ) -> None:
        self._stream = stream
        self._life = life
        self._connection = connection
        self._events = events
        self._observations = observations
        self._capacity = capacity
        self._backoff = backoff
        self._fail = fail
        self._wake_all = wake_all
        self._reached = reached
        #: Every reconnect made, in order (appended by the loop).
        self.reconnects: list[Reconnect] = []
        #: The loop's task (set by :meth:`start`).
        self._task: asyncio.Task[None] | None = None
        #: What the stream says about failed attempts (made when the loop starts).
        self.network: NetworkFailures | None = None
        #: Disconnected on purpose, waiting for work (set while the loop waits for it).
        self.dormant = False
        #: Callers of ``wait_in_sync`` now: a connection is work while one waits (counted by them).
        self.sync_waiters = 0

    @property
    def finished(self) -> bool:
        """Whether the loop's task ran and ended."""
        return self._task is not None and self._task.done()

    def start(self, owner: object, name: str) -> None:
        """Start the loop's task.

        :param owner: the stream, held by the task while it runs (its parts hold it weakly).
        :param name: the task's name.
        """
        self._task = asyncio.create_task(self._run(owner), name=name)

    def _origin(self) -> str | None:
        """The gateway this stream talks to, as the stream cap counts it."""
        settings = self._stream.settings
        return settings.url if settings else None

    # ------------------------------------------------------------------ stopping

    async def stop(self, grace: float | None) -> None:
        """End the loop's task: the close handshake in its time (at most ``grace``), then an
        abort; a cancellation of the caller meanwhile propagates once the task has ended.

        :param grace: seconds the close handshake may take at most (``None``: its own timeout).
        """
        runner = self._task
        if runner is None or runner.done():
            return
        connection = self._connection
        socket = connection.socket
        if socket is not None and socket.paused:
            # the peer is not reading: a close frame would queue behind the held-up write
            log.warning(
                "the System Zero gateway is not reading: closing the connection without a close handshake"
            )
            socket.abort()
        elif socket is not None:
            # serving: the writer's turn closes with 1000 and the run loop releases everything
            connection.flush()
        if socket is not None:
            try:
                # asyncio.wait, not wait_for(shield(...)): on Python 3.11 wait_for swallows a
                # cancellation that arrives as the runner ends, and the caller would never see it
                limit = connection.close_timeout() + 1
                await asyncio.wait((runner,), timeout=limit if grace is None else min(limit, grace))
            except asyncio.CancelledError:
                runner.cancel()
                raise
        if runner.done():
            return
        if connection.socket is not None:
            connection.socket.abort()  # the graceful close had its time
        runner.cancel()
        try:
            await runner
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the caller's own cancellation, not only the runner's
        except Exception:
            pass  # the runner's own failure: the stream is closing anyway

    # ------------------------------------------------------------------ the connection loop

    async def _run(self, owner: object) -> None:  # owner: the stream, held while the loop runs
        settings = self._stream.settings
        assert settings is not None
        network = self.network = NetworkFailures(
            settings.url,
            open_timeout=settings.open_timeout,
            proxy=settings.proxy,
            reached=self._reached,
        )
        life = self._life
        planner = ReconnectPlanner(self._backoff)
        pending: _Pending | None = None
        try:
            while not life.ending:
                attempt_number = planner.attempt
                if pending is not None:
                    plan = pending.plan
                    if plan.kind is PlanKind.WHEN_NEEDED:
                        await self._wait_for_work()
                        if life.ending:
                            return
                    remaining = plan.delay - (time.monotonic() - pending.failed_at)
                    if remaining > 0:
                        await life.sleep(remaining)
                        if life.ending:
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
                    self._observations.now("reconnecting", plan.reason, pending.close_code, plan.delay)
                    attempt_number = plan.attempt
                    pending = None
                await self._events.turn_to_open()
                await self._slot_after_turn()
                try:
                    self._observations.now("connecting", settings.url, attempt_number)
                    ended = await self._connection.connect_and_serve()
                finally:
                    self._capacity.release(self._origin())
                    self._events.slot_released()
                outcome = ended.outcome
                if ended.final:
                    if ended.error is not None:
                        self._fail(ended.error)
                    elif not life.ending:  # never leave waiters hanging
                        self._fail(StreamClosed(outcome.close_code, outcome.label))
                    return
                plan = planner.plan(outcome)
                if plan.kind is PlanKind.STOP:
                    self._fail(self._stop_error(ended, plan))
                    return
                if ended.error is not None:
                    life.last_error = ended.error
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
            self._wake_all()

    async def _slot_after_turn(self) -> None:
        """Take a slot of ``max_streams_per_process`` for the connection whose turn came. When none
        is free, the turn goes back (the stream stays first in line) while it waits for one, and is
        taken again once it holds the slot: a start's token is spent when its ``start`` can go out,
        not a socket's wait earlier, so the starts reach the gateway as the mirror spaced them."""
        origin = self._origin()
        capacity = self._capacity
        if capacity.try_acquire(origin):
            return
        self._events.turn_postponed()
        await capacity.acquire(origin)
        try:
            await self._events.turn_to_open()  # first in line: at most the wait for the next token
        except BaseException:
            capacity.release(origin)
            raise

    @staticmethod
    def _stop_error(ended: Ended, plan: ReconnectPlan) -> BaseException:
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
        """Wait, on the pulse, until the stream needs a connection (or closes, or fails)."""
        life = self._life
        session = self._stream.session
        self.dormant = True
        life.pulse()
        try:
            while not life.ending and not (session.has_work() or self.sync_waiters):
                await life.wait_pulse(None)
        finally:
            self.dormant = False
