"""The task that runs a :class:`~airflow_provider_systemzero.stream.DecisionStream`, and the signals it shares.

The run loop opens connection after connection (each served by
:mod:`~airflow_provider_systemzero.stream.serving`) and, when one ends, does what the core's
:class:`~airflow_provider_systemzero.protocol.reconnect.ReconnectPlanner` says: reconnect after the
planned delay (backoff that never undercuts the server's delay and grows across unproductive
connections), reconnect only once there is work, or stop and raise one of
:mod:`~airflow_provider_systemzero.stream.exceptions`; every reconnect replays the full desired state
byte-identically. Every open connection holds a slot of the process-wide
:class:`~airflow_provider_systemzero.stream.capacity.StreamCapacity`.

Two signals connect the loop and its callers: the *kick* (``_kick``) says there is something to
send or to look at (a writer's turn on an open connection; the loop wakes if it waits for work);
the *pulse* (``_pulse``) tells waiters (``decide()``,
``decisions()``, entering) that something happened. :class:`StreamRunLoop` is one part of
:class:`~airflow_provider_systemzero.stream.DecisionStream`; it is not used on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from airflow_provider_systemzero.protocol.reconnect import PlanKind, ReconnectPlan, ReconnectPlanner
from airflow_provider_systemzero.stream.diagnosis import NetworkFailures
from airflow_provider_systemzero.stream.exceptions import (
    DeadlineExceeded,
    ProtocolViolation,
    StreamClosed,
    UpgradeRefused,
)
from airflow_provider_systemzero.stream.serving import Ended
from airflow_provider_systemzero.stream.untrusted import server_token

__all__ = ["Reconnect", "StreamRunLoop"]

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


class StreamRunLoop:
    """The run loop and the signals of a :class:`~airflow_provider_systemzero.stream.DecisionStream`."""

    # ------------------------------------------------------------------ stopping

    async def _shutdown(self, grace: float | None = None) -> None:
        """Close: the close handshake may take the gateway's close handshake timeout (or
        ``grace`` seconds, when less: the caller's deadline), then the connection is aborted."""
        if self._closed:
            return
        self._closing = True
        self._closed = True
        if self._starts is not None:
            self._starts.withdraw(self)
        try:
            await self._stop_runner(grace)
        finally:  # also when the caller is cancelled meanwhile: its cancellation propagates
            closed = StreamClosed(None, "closed", message="the stream was closed before the decision arrived")
            for future in self._intent_futures.values():
                if not future.done():
                    future.set_exception(closed)
            self._wake_all()
            self._unlink()

    async def _stop_runner(self, grace: float | None) -> None:
        """End the run loop's task: the close handshake in its time (at most ``grace``), then an
        abort; a cancellation of the caller meanwhile propagates once the task has ended."""
        runner = self._runner
        if runner is None or runner.done():
            return
        socket = self._ws
        if socket is not None and socket.paused:
            # the peer is not reading: a close frame would queue behind the held-up write
            log.warning(
                "the System Zero gateway is not reading: closing the connection without a close handshake"
            )
            socket.abort()
        elif socket is not None:
            # serving: the writer's turn closes with 1000 and the run loop releases everything
            self._flush()
        if socket is not None:
            try:
                # asyncio.wait, not wait_for(shield(...)): on Python 3.11 wait_for swallows a
                # cancellation that arrives as the runner ends, and the caller would never see it
                limit = self._close_timeout() + 1
                await asyncio.wait((runner,), timeout=limit if grace is None else min(limit, grace))
            except asyncio.CancelledError:
                runner.cancel()
                raise
        if runner.done():
            return
        if self._ws is not None:
            self._ws.abort()  # the graceful close had its time
        runner.cancel()
        try:
            await runner
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the caller's own cancellation, not only the runner's
        except Exception:
            pass  # the runner's own failure: the stream is closing anyway

    # ------------------------------------------------------------------ waiting helpers

    def _kick(self) -> None:
        """Something to send or to look at: a writer's turn soon on an open connection, and the
        run loop wakes if it waits for work."""
        if self._wake is not None:
            self._wake.set()
        self._flush_soon()

    def _pulse(self) -> None:
        """Wake whoever waits for the stream to change (entering, ``wait_in_sync``, retries …);
        nothing is done when nobody waits."""
        if self._pulse_waiting and self._pulse_event is not None:
            self._pulse_event.set()
            self._pulse_event = asyncio.Event()

    def _wake_all(self) -> None:
        """The stream failed or ended: every waiter, the decisions consumer included, looks again."""
        self._pulse()
        self._decisions_ready()

    async def _wait_pulse(self, seconds: float | None) -> None:
        assert self._pulse_event is not None
        event = self._pulse_event
        self._pulse_waiting += 1
        try:
            async with asyncio.timeout(seconds):
                await event.wait()
        finally:
            self._pulse_waiting -= 1

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
        self._wake_all()

    # ------------------------------------------------------------------ the connection loop

    async def _run(self) -> None:
        assert self._settings is not None
        network = self._network = NetworkFailures(
            self._settings.url,
            open_timeout=self._settings.open_timeout,
            proxy=self._settings.proxy,
            reached=self._reached,
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
            self._wake_all()

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
        assert self._wake is not None
        session = self.session
        self._dormant = True
        self._pulse()
        try:
            while (
                not self._closing and self._failure is None and not (session.has_work() or self._sync_waiters)
            ):
                self._wake.clear()
                await self._wake.wait()
        finally:
            self._dormant = False
