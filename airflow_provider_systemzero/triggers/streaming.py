"""A trigger's streams: each built through the hook with the task's budget, one at a time, and what
the trigger's events say about them.

:class:`TriggerStream` is what a trigger keeps across the streams its watch opens and gives back:
the connection's settings (looked up once per trigger run), whether the gateway was reached, the
task's :class:`~airflow_provider_systemzero.decisions.budget.DecisionBudget` (one budget for every
stream of the run) and the stream held now. The watch decides when a stream opens and closes
(:mod:`~airflow_provider_systemzero.decisions.source_watch`); its driver
(:mod:`~airflow_provider_systemzero.triggers.driver`) calls :meth:`TriggerStream.build` and
:meth:`TriggerStream.enter`.

Nothing here blocks the event loop; :class:`asyncio.CancelledError` always propagates.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import TYPE_CHECKING, Any

from airflow_provider_systemzero.exceptions import SystemZeroArgumentError
from airflow_provider_systemzero.protocol.body import compact_json
from airflow_provider_systemzero.tasks.deadlines import STILL_DECIDING
from airflow_provider_systemzero.tasks.payloads import timeout_payload

if TYPE_CHECKING:
    from airflow_provider_systemzero.decisions.budget import DecisionBudget
    from airflow_provider_systemzero.sources.base import StateSource
    from airflow_provider_systemzero.stream.capacity import OpeningPlace
    from airflow_provider_systemzero.stream.decision_stream import DecisionStream
    from airflow_provider_systemzero.stream.settings import StreamSettings

__all__ = ["TriggerStream"]

log = logging.getLogger(__name__)

#: Seconds a trigger's cleanup waits for its stream's close handshake.
_CLOSE_GRACE = 5.0


class TriggerStream:
    """A trigger's streams, one at a time, opened with the task's budget and closed on every exit.

    :param systemzero_conn_id: the System Zero connection.
    :param request: the request dict.
    :param key_namespace: the deterministic namespace of the task's keys (and the stream's identity).
    :param deadline: absolute deadline in epoch seconds, or ``None``.
    :param budget: :meth:`~airflow_provider_systemzero.decisions.budget.DecisionBudget.to_kwargs` from
        the task (``None``: no budget, no usage report).
    :raises SystemZeroArgumentError: the request is not plain JSON.
    """

    # one per waiting trigger, and a triggerer holds thousands: no per-instance __dict__
    __slots__ = (
        "_budget",
        "_budget_kwargs",
        "_request",
        "_settings",
        "deadline",
        "key_namespace",
        "reached",
        "stream",
        "systemzero_conn_id",
    )

    def __init__(
        self,
        systemzero_conn_id: str,
        request: dict[str, Any],
        *,
        key_namespace: str,
        deadline: float | None = None,
        budget: dict[str, Any] | None = None,
    ) -> None:
        self.systemzero_conn_id = systemzero_conn_id
        #: the request as compact JSON text: what a trigger keeps of it between its streams (a
        #: tree of dicts for every waiting trigger otherwise); each stream decodes it
        try:
            self._request = compact_json(request)
        except (TypeError, ValueError) as exc:
            raise SystemZeroArgumentError(
                f"request is not plain JSON ({exc}): a trigger's request holds dicts with string "
                "keys, lists, strings, numbers, booleans and None, e.g. "
                '{"model": "...", "questions": {"ready": {"type": "boolean", "instructions": "..."}}}',
                code="invalid_request",
                field="request",
            ) from None
        self.key_namespace = key_namespace
        self.deadline = deadline
        #: the stream held now (``None``: none)
        self.stream: DecisionStream | None = None
        self._budget_kwargs = budget
        self._budget: DecisionBudget | None = None
        #: the connection's settings, looked up once per trigger run
        self._settings: StreamSettings | None = None
        #: one of the trigger's streams opened: the gateway exists, and a loopback one that refuses
        #: a later stream is restarting (that stream keeps reconnecting, see ``reached`` of
        #: :class:`~airflow_provider_systemzero.stream.DecisionStream`)
        self.reached = False

    @property
    def request(self) -> dict[str, Any]:
        """The request dict (decoded, a new copy each time)."""
        return json.loads(self._request)

    @property
    def budget(self) -> DecisionBudget | None:
        """This run's budget (``None`` without one): one for all the run's streams."""
        if self._budget is None and self._budget_kwargs:
            from airflow_provider_systemzero.decisions.budget import DecisionBudget

            self._budget = DecisionBudget.from_kwargs(self._budget_kwargs)
        return self._budget

    def with_usage(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The final event's payload plus what this run spent (the worker adds it to the task's
        total). A dispatch still in flight is counted as unconfirmed first: the stream closes
        after this event, and its reply, billed or not, will never reach the task."""
        from airflow_provider_systemzero.decisions.budget import event_usage

        if self._budget is not None and self.stream is not None:
            self.stream.settle_usage()
        # the budget as given, even when no stream was built: what it carries goes back to the task
        return {**payload, **event_usage(self.budget)}

    async def resolve_settings(self) -> None:
        """Look the connection up (once per run): a stream built afterwards has its session at once,
        so a state can be made its desired state while it waits to open; an asset watch also does
        it when it starts, so a connection that does not exist is found then.

        :raises SystemZeroValidationError: the connection does not exist, or is not a System Zero one.
        """
        if self._settings is None:
            from airflow_provider_systemzero.hooks.systemzero import SystemZeroHook
            from airflow_provider_systemzero.stream.settings import shared_settings

            settings = await SystemZeroHook(systemzero_conn_id=self.systemzero_conn_id).aget_settings()
            self._settings = shared_settings(settings)  # the waits on one connection keep one copy

    def forget_settings(self) -> None:
        """Look the connection up again for the next stream (an asset watch trying again after a
        failure: a connection fixed meanwhile is used without a restart). What the trigger knew of
        the gateway goes too: the connection may now name another, never reached."""
        self._settings = None
        self.reached = False

    def ask_opening(self) -> OpeningPlace:
        """A place among the streams being built and opened to this connection's gateway
        (:meth:`StreamCapacity.ask_opening <airflow_provider_systemzero.stream.capacity.StreamCapacity.ask_opening>`):
        the next stream is built and entered once its future completes (its slot is near), and the
        place goes back through :meth:`leave_opening`. The connection is looked up first
        (:meth:`resolve_settings`)."""
        from airflow_provider_systemzero.stream.capacity import default_capacity

        return default_capacity().ask_opening(self._settings.url if self._settings is not None else None)

    @staticmethod
    def leave_opening(place: OpeningPlace) -> None:
        """Give up a place :meth:`ask_opening` gave (the stream is open, its opening failed, or the
        run no longer waits for it)."""
        from airflow_provider_systemzero.stream.capacity import default_capacity

        default_capacity().leave_opening(place)

    def build(self, state: Any, **kwargs: Any) -> DecisionStream:
        """Build the next stream about ``state`` (``kwargs`` go to the hook's ``stream()``); it is
        :attr:`stream` from now on, entered with :meth:`enter`."""
        from airflow_provider_systemzero.hooks.systemzero import SystemZeroHook

        # the hook reads the backoff, and the stream's observer spans and content capture, from
        # Airflow's configuration for each stream: nothing is kept across the waits between them
        hook = SystemZeroHook(systemzero_conn_id=self.systemzero_conn_id)
        self.stream = hook.stream(
            self.request,
            state=state,
            reached=self.reached,
            key_namespace=self.key_namespace,
            identity=self.key_namespace,
            budget=self.budget,
            settings=self._settings,
            **kwargs,
        )
        return self.stream

    async def enter(self, stream: DecisionStream) -> None:
        """Enter ``stream``: it waits for a slot of ``max_streams_per_process``, connects, and returns
        once the gateway acknowledged its ``start``."""
        await stream.__aenter__()
        self.reached = True

    async def close(self, stream: DecisionStream, *, grace: float = _CLOSE_GRACE) -> None:
        """Close ``stream`` (given back, or the run ends): errors are ignored, the close handshake
        takes at most ``grace`` seconds."""
        if self.stream is stream:
            self.stream = None
        with contextlib.suppress(Exception):
            await asyncio.wait_for(stream.aclose(), timeout=grace)

    async def aclose(self) -> None:
        """Close the stream held now, if any (every exit of the trigger)."""
        stream = self.stream
        if stream is not None:
            await self.close(stream)

    # ------------------------------------------------------------------ what the events say

    def late(self, extra: dict[str, Any], message: str) -> dict[str, Any] | None:
        """The ``timeout`` payload when the deadline passed before the trigger started, else ``None``.

        :param extra: fields every event of the trigger carries.
        :param message: what the event says.
        """
        if self.deadline is None or self.deadline - time.time() > 0:
            return None
        return timeout_payload(message, **extra)

    def deadline_scope(self) -> asyncio.Timeout:
        """The scope of the trigger's work: a timeout at the deadline (none without one)."""
        return asyncio.timeout(None if self.deadline is None else self.deadline - time.time())

    def timed_out(
        self,
        extra: dict[str, Any],
        message: str,
        source: StateSource | None = None,
        last_decision: str | None = None,
        *,
        more_time: str = "give the task more time",
        decision_seconds: list[float] | None = None,
    ) -> dict[str, Any]:
        """The ``timeout`` payload of a deadline reached, with what the wait may have been stuck
        on: the source's condition (a file that never appeared), why the last decision did not
        meet the condition, a decision the gateway was still making, and the stream's last error.

        :param extra: fields every event of the trigger carries.
        :param message: what the event says.
        :param source: the trigger's source, if it has one.
        :param last_decision: why the newest decision did not end the wait, if there was one.
        :param more_time: the fix when the gateway was still deciding (which argument to raise).
        :param decision_seconds: how long the wait's last decisions took (oldest first).
        """
        stream = self.stream
        causes = [source.waiting_on() if source is not None else None, last_decision]
        deciding = stream.deciding_for if stream is not None else None
        if deciding is not None:
            causes.append(
                f"{STILL_DECIDING} (for {deciding:.1f} s): {more_time}, or find out "
                "why its decisions take this long"
            )
        last = stream.last_error_text if stream is not None else None  # why the wait had no decision
        causes.append(f"last error: {last}" if last else None)
        return timeout_payload(
            "; ".join([message, *(cause for cause in causes if cause)]),
            **extra,
            decision_seconds=list(decision_seconds or ()),
            deciding_for=None if deciding is None else round(deciding, 3),
        )
