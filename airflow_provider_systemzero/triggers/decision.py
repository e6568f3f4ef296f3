"""Triggers that hold a System Zero stream in the triggerer.

* :class:`SystemZeroDecisionTrigger` — the deferrable sensor's trigger: streams a changing state
  and fires once, when a decision about the *current* state meets the condition.
* :class:`SystemZeroDecideTrigger` — the deferrable operator's trigger: one on_request decision
  about a fixed state, with every answer.
* :class:`SystemZeroDecisionEventTrigger` — an :class:`~airflow.triggers.base.BaseEventTrigger`
  for an ``AssetWatcher``: an asset event each time the condition becomes true.

The rules they follow (the triggerer runs hundreds of them in one event loop):

* ``run()`` never blocks the loop (files are read in a thread, connections are looked up with
  ``aget_connection``) and lets :class:`asyncio.CancelledError` propagate; ``cleanup()`` closes the
  socket on every exit.
* Kwargs are plain JSON with no secret: a connection ID, the request, the state and its source,
  the condition, an absolute ``deadline`` (epoch seconds, so a rebuilt trigger keeps it) and a
  ``key_namespace`` derived from the task instance. The same namespace gives the same
  ``prompt_cache_key`` and the same per-state idempotency keys in every process, so a triggerer
  restart or two copies running at once (HA) replay byte-identically and are billed once.
* A decision only counts when it covers the complete desired state (never a stale one). When a
  source changes faster than a decision takes (decisions keep coming back stale), newer source
  content is held back while a decision is in flight, for up to ``max_staleness`` seconds, so the
  source is still decided about (see :class:`~airflow_provider_systemzero.triggers.currency.Currency`).
* What a trigger shares with the others it *holds*
  (:mod:`~airflow_provider_systemzero.triggers.streaming`): its stream, the lease on it and the source
  feeder; what ends a wait is the pure :class:`~airflow_provider_systemzero.decisions.watch.DecisionWatch`.
* **Stream leasing**: once a decision about the current state settled and the source has nothing
  new, the trigger gives its stream back (close 1000) and reconnects — with a byte-identical
  replay — only when the source changes, so a triggerer holds many waiting sensors within
  ``max_streams_per_process``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseEventTrigger, BaseTrigger, TriggerEvent

from airflow_provider_systemzero.decisions.conditions import DecisionCondition
from airflow_provider_systemzero.decisions.relevance import DecisionGate
from airflow_provider_systemzero.decisions.watch import DecisionWatch, answers_payload
from airflow_provider_systemzero.triggers.currency import DEFAULT_MAX_STALENESS
from airflow_provider_systemzero.triggers.feeder import SourceFeeder
from airflow_provider_systemzero.triggers.kwargs import TriggerKwargs
from airflow_provider_systemzero.triggers.payloads import error_payload, owned_event
from airflow_provider_systemzero.triggers.sources import (
    StateSource,
    build_source,
    refuse_rendered_state,
    state_templates,
)
from airflow_provider_systemzero.triggers.state_source import NO_CHANGE
from airflow_provider_systemzero.triggers.streaming import TriggerStream
from airflow_provider_systemzero.triggers.watch_checks import checked_watch
from airflow_provider_systemzero.triggers.watch_memory import WatchMemory, kwargs_identity
from airflow_provider_systemzero.triggers.watching import (
    announce_wait,
    close_watching,
    end_lease,
    failures_in_a_row,
    new_feeder,
    new_lease,
    wait_to_watch_again,
    watch_source,
)

__all__ = [
    "SystemZeroDecideTrigger",
    "SystemZeroDecisionEventTrigger",
    "SystemZeroDecisionTrigger",
    "error_payload",
    "owned_event",
]


class SystemZeroDecisionTrigger(BaseTrigger):
    """Waits until System Zero decides the watched question as expected about a changing state.

    Fires once: a ``success`` event with the watched answer, or an ``error``/``timeout`` event
    whose ``message`` names the cause.

    :param systemzero_conn_id: the System Zero connection (origin and key are read in the triggerer).
    :param request: ``{"model", "questions", "route", "mode", "prompt_cache_key"}`` (plain JSON).
    :param condition: :meth:`DecisionCondition.to_dict` — question, expect, min_confidence, min_probability,
        and optionally a policy and hysteresis (``consecutive``, ``min_true_for``).
    :param state: the initial state (string, array or object).
    :param source: where the state comes from (see :mod:`~airflow_provider_systemzero.triggers.sources`).
    :param key_namespace: deterministic namespace of this task instance's keys and cache key.
    :param decision_mode: ``on_change`` (every change is decided) or ``on_request`` (decide after changes).
    :param deadline: absolute deadline in epoch seconds, or ``None``.
    :param lease: give the stream back between decisions when nothing changes.
    :param lease_after: seconds without a change before the stream is given back.
    :param budget: the task's spend caps and what it spent so far
        (:meth:`~airflow_provider_systemzero.decisions.budget.DecisionBudget.to_kwargs`); the event reports the usage.
    :param skip_states: hashes of states a person already answered "no" about: decisions about them
        do not fire the trigger again.
    :param min_interval_ms: minimum milliseconds between dispatch starts: on a busy source, fewer
        decisions are billed (each one covers more changes) at the cost of latency.
    :param max_staleness: when the source changes faster than a decision takes (decisions keep
        coming back about an outdated state), seconds its newer state may be held back while a
        decision is in flight, so that decision is current when it returns (``0``: never hold; such a
        source is then never decided about).
    :param end_when_unmet: a static state: a decision that does not meet the condition ends the wait
        with an ``unmet`` event (no later decision could differ).
    :param decide_when: start a decision only for a change that matches: a regular expression searched
        in what changed, or ``{"callable": "pkg.mod.func"}`` taking (previous, new) and returning a
        bool; other changes are streamed but start no decision (see
        :mod:`~airflow_provider_systemzero.decisions.relevance`).
    :param debounce_ms: decide once the source has been quiet this many milliseconds (a burst of
        changes is one decision).
    :param decide_initial: decide the initial state (``False``: wait for the first relevant change).
    :param allow_empty: the sensor's ``allow_empty``: a static state a template rendered here (a
        sensor started in the triggerer) may be empty or ``'None'``.

    Under a policy the ``success`` event carries ``action``: ``act``/``default`` (fire), or
    ``review`` (the sensor asks a person); a ``fail``/``skip`` verdict is a ``policy`` event.
    """

    _kwargs = TriggerKwargs(
        "systemzero_conn_id request condition state source key_namespace decision_mode budget deadline "
        "lease lease_after skip_states end_when_unmet min_interval_ms max_staleness allow_empty",
        when_set=frozenset({"budget", "skip_states", "end_when_unmet", "allow_empty"}),
    )

    def __init__(
        self,
        *,
        systemzero_conn_id: str,
        request: dict[str, Any],
        condition: dict[str, Any],
        state: Any,
        key_namespace: str,
        source: dict[str, Any] | None = None,
        decision_mode: str = "on_change",
        deadline: float | None = None,
        lease: bool = True,
        budget: dict[str, Any] | None = None,
        lease_after: float = 5.0,
        skip_states: list[str] | None = None,
        min_interval_ms: int | None = None,
        max_staleness: float = DEFAULT_MAX_STALENESS,
        end_when_unmet: bool = False,
        decide_when: str | dict[str, str] | None = None,
        debounce_ms: int | None = None,
        decide_initial: bool = True,
        allow_empty: bool = False,
    ) -> None:
        super().__init__()
        self._kwargs.keep(self, locals())
        watch_source(self, locals())
        #: started in the triggerer, state and source are templates it renders: checked once rendered
        self._templates = state_templates(state, source)
        self.end_when_unmet = bool(end_when_unmet)
        self.skip_states = tuple(skip_states or ())  # a tuple: no object for the collector to track
        self._stream = TriggerStream(
            systemzero_conn_id, request, key_namespace=key_namespace, deadline=deadline, budget=budget
        )

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Class path and plain-JSON kwargs (no secret)."""
        path, kwargs = self._kwargs.serialized(self, self.decision_filter.to_kwargs())
        if "skip_states" in kwargs:
            kwargs["skip_states"] = list(self.skip_states)  # plain JSON
        return path, kwargs

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Stream the state and yield one event: a stream while the state changes (:meth:`_hold`),
        none while it does not, when this generator itself awaits the source's next change (the
        source's own awaitable: a dormant trigger keeps no other coroutine of the provider's)."""
        stream = self._stream
        payload = stream.late(self._extra(), "the sensor's deadline passed before the trigger started")
        watch: DecisionWatch | None = None
        said: str | None = None  # why the last decision did not end the wait, once its watch is gone
        try:
            deadline = None if payload is not None else stream.deadline_scope()
            if deadline is not None:
                await deadline.__aenter__()
            try:
                if payload is None:
                    if self._templates is not None:  # as the worker checks what it rendered
                        refuse_rendered_state(
                            self.state, self.source, self._templates, allow_empty=self.allow_empty
                        )
                    self._source = source = build_source(self.source, self.state)
                    announce_wait(self.condition, source, stream.deadline)
                    # a callable that cannot be imported ends the wait here
                    relevance = self.decision_filter.relevance()
                    # kept across streams: a reopened stream does not decide its opening state
                    # unless a change since the last one matched decide_when
                    gate = self.decision_filter.gate(asyncio.get_running_loop().time())
                    state = await stream.first_state(source, gate, relevance)
                    while payload is None:
                        if watch is None:
                            watch = self._watch()
                        payload = await self._hold(state, source, watch, gate)
                        if payload is not None:
                            break
                        # dormant: only a run of qualifying decisions (hysteresis) is worth keeping
                        if not watch.streak.count:
                            said, watch = watch.last_reason or said, None
                        stream.let_go(gate)
                        state = NO_CHANGE
                        while state is NO_CHANGE:
                            time_left = stream.time_left(watch)
                            stream.dormant = True
                            try:
                                if time_left is None:
                                    # TriggerStream.change, inline: no coroutine between this
                                    # generator and the source's own wait
                                    state = await source.current()
                                    while not stream.changed(state, source):
                                        try:
                                            state = await source.taken(await source.next_change())
                                        except Exception as exc:
                                            state = await source.failed(exc)
                                else:  # a qualifying run waits on time: bounded by one timer
                                    state = await stream.change_within(time_left, source)
                            finally:
                                stream.dormant = False
                            state, verdict = await stream.woken(
                                state,
                                watch,
                                gate=gate,
                                relevance=relevance,
                                min_interval=(self.min_interval_ms or 0) / 1000,
                            )
                            if verdict is not None:  # only time was missing, and it passed
                                payload = self._payload(watch, verdict)
                                break
            # what `async with deadline` does (which would keep a bound method all along the wait)
            except BaseException as exc:
                if deadline is not None:
                    await deadline.__aexit__(type(exc), exc, exc.__traceback__)  # the deadline: TimeoutError
                raise
            else:
                if deadline is not None:
                    await deadline.__aexit__(None, None, None)
        except TimeoutError:
            more_time = "raise the sensor's timeout (or its execution_timeout, if shorter)"
            # a met decision that a hold rule (consecutive, min_true_for) kept from ending the wait
            held = (
                None
                if watch is None
                else watch.held_back(asyncio.get_running_loop().time(), more_time=more_time)
            )
            payload = stream.timed_out(
                self._extra(),
                "no decision met the condition before the deadline"
                if held is None
                else "a decision met the condition, but a hold rule kept it from ending the wait before the deadline",
                self._source,
                "; ".join(filter(None, [(watch.last_reason if watch is not None else None) or said, held])),
                more_time=more_time,
            )
        except Exception as exc:
            payload = stream.failure(self, exc, self._extra())
        except BaseException:  # cancelled: no event
            await self.cleanup()
            raise
        # the event goes out first, a timeout's and an error's too: none waits for the close
        # handshake, which a gateway that does not answer it holds for its timeout
        yield TriggerEvent(stream.with_usage(payload))
        await self.cleanup()

    def _extra(self) -> dict[str, Any]:
        """The fields every event of this trigger carries."""
        return {"key_namespace": self.key_namespace}

    def _watch(self) -> DecisionWatch:
        """A new watch of the condition (the trigger keeps one only while it matters)."""
        return DecisionWatch(
            DecisionCondition.from_dict(self.condition),
            reviews=True,
            skip_states=self.skip_states,
            end_when_unmet=self.end_when_unmet,
        )

    async def _hold(
        self, state: Any, source: StateSource, watch: DecisionWatch, gate: DecisionGate | None
    ) -> dict[str, Any] | None:
        """One stream about ``state``: the event payload, or ``None`` once the stream went quiet (it
        is closed on return, and nothing of it outlives this call)."""
        mode = self.decision_filter.stream_mode(self.decision_mode)
        try:
            # held, not closed on return: an event goes out before the close handshake (cleanup()
            # closes the stream after the trigger yielded it); a quiet stream is closed here
            async with self._stream.held(
                state,
                follow=source if gate is None else None,  # it opens with the newest state
                decision_mode=mode,
                min_interval_ms=self.min_interval_ms,
            ) as stream:
                lease = new_lease(self)
                feeder = new_feeder(self, stream, source, mode, gate)
                if feeder.direct:  # decisions straight from the stream's reader to this task
                    verdict = await feeder.first_verdict(watch)
                    payload = None if verdict is None else self._payload(watch, verdict)
                else:
                    try:
                        payload = await self._stream.until_quiet(
                            lease, feeder, feeder.race(functools.partial(self._consume, feeder, watch))
                        )
                    finally:
                        await feeder.aclose()  # the source's reading, even if the race never ran
                if payload is None:
                    await stream.aclose()  # quiet: dormant, and nothing of the stream outlives this call
                return payload
        finally:
            end_lease(self)

    async def _consume(self, feeder: SourceFeeder, watch: DecisionWatch) -> dict[str, Any]:
        """The payload of the first verdict that ends the wait."""
        async with contextlib.aclosing(feeder.verdicts(watch)) as verdicts:
            async for verdict in verdicts:
                return self._payload(watch, verdict)
        raise RuntimeError("the stream ended without a decision")

    def _payload(self, watch: DecisionWatch, verdict: Any) -> dict[str, Any]:
        """The event payload of a verdict that ends the wait."""
        return watch.sensor_event(
            verdict, key_namespace=self.key_namespace, deadline=self.deadline
        ).to_payload()

    async def cleanup(self) -> None:
        """Close the stream and the source (runs on every exit; exceptions are ignored by Airflow)."""
        await close_watching(self)


class SystemZeroDecideTrigger(BaseTrigger):
    """One on_request decision about a fixed state, with every answer (the deferrable operator).

    :param systemzero_conn_id: the System Zero connection.
    :param request: ``{"model", "questions", "route", "mode", "prompt_cache_key"}``.
    :param state: the complete state.
    :param key_namespace: deterministic namespace (task instance + state hash).
    :param idempotency_key: the state's key (derived from the namespace when ``None``).
    :param attachments: inline attachments ``[{"name", "data"}]``.
    :param deadline: absolute deadline in epoch seconds, or ``None``.
    :param budget: the task's spend caps and what it spent so far; the event reports the usage.
    """

    _kwargs = TriggerKwargs(
        "systemzero_conn_id request state key_namespace idempotency_key attachments deadline budget",
        when_set=frozenset({"budget"}),
    )

    def __init__(
        self,
        *,
        systemzero_conn_id: str,
        request: dict[str, Any],
        state: Any,
        key_namespace: str,
        idempotency_key: str | None = None,
        attachments: list[dict[str, str]] | None = None,
        deadline: float | None = None,
        budget: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self._kwargs.keep(self, locals())
        self.attachments = attachments or []
        self._stream = TriggerStream(
            systemzero_conn_id, request, key_namespace=key_namespace, deadline=deadline, budget=budget
        )

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Class path and plain-JSON kwargs (no secret)."""
        return self._kwargs.serialized(self)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Decide once and yield one event."""
        from airflow_provider_systemzero.protocol.messages import Attachment

        extra = {"key_namespace": self.key_namespace}

        async def decide() -> dict[str, Any]:
            attachments = [Attachment(**a) for a in self.attachments]
            stream = self._stream.open(
                self.state,
                decision_mode="on_request",
                attachments=attachments,
                idempotency_key=self.idempotency_key,
            )
            # entered, not closed here: the decision (or the failure) goes out as the event first,
            # and cleanup() closes the stream after it. A close inside the deadline's scope could
            # outlast the deadline (a gateway that does not answer the close frame holds it for
            # the close handshake timeout) and turn a decision in hand into a timeout.
            await stream.__aenter__()
            decision = await stream.decide()
            return answers_payload(decision, self.state, key_namespace=self.key_namespace)

        try:
            payload = await self._stream.within_deadline(
                self,
                decide(),
                extra,
                late="the task's deadline passed before the trigger started",
                timed_out="no decision before the task's deadline",
                more_time="raise the operator's decision_timeout (or its execution_timeout, if shorter)",
            )
            yield TriggerEvent(self._stream.with_usage(payload))
        finally:
            await self.cleanup()

    async def cleanup(self) -> None:
        """Close the stream (runs on every exit; exceptions are ignored by Airflow)."""
        await self._stream.aclose()


class SystemZeroDecisionEventTrigger(BaseEventTrigger):
    """Schedules Dags on a decision: an asset event each time the condition becomes true.

    Use it in an ``AssetWatcher``. Its kwargs are its identity, so ``watch_id`` names the
    watch (and its keys) across triggerer restarts. An event is produced on each transition
    from "not met" to "met" (the first decision counts as a transition); a decision that
    stays true does not fire again, also after a triggerer restart where Airflow keeps the
    watch's memory (3.3: :mod:`~airflow_provider_systemzero.triggers.watch_memory`).

    :param systemzero_conn_id: the System Zero connection.
    :param request: ``{"model", "questions", "route", "mode", "prompt_cache_key"}``.
    :param condition: :meth:`DecisionCondition.to_dict`.
    :param state: the initial state.
    :param watch_id: a stable name for this watch (namespace of its keys and cache key).
    :param source: where the state comes from.
    :param decision_mode: ``on_change`` or ``on_request``.
    :param lease: give the stream back between decisions when nothing changes.
    :param lease_after: seconds without a change before the stream is given back.
    :param max_staleness: seconds the source's newer state may be held back while a decision is in flight.
    :param decide_when: start a decision only for a change that matches (as on
        :class:`SystemZeroDecisionTrigger`).
    :param debounce_ms: decide once the source has been quiet this many milliseconds.
    :param decide_initial: decide the initial state (``False``: wait for the first relevant change).
    """

    _kwargs = TriggerKwargs(
        "systemzero_conn_id request condition state watch_id source decision_mode lease lease_after max_staleness",
        unless={"max_staleness": DEFAULT_MAX_STALENESS},
    )

    def __init__(
        self,
        *,
        systemzero_conn_id: str,
        request: dict[str, Any],
        condition: dict[str, Any] | DecisionCondition,
        state: Any,
        watch_id: str,
        source: dict[str, Any] | None = None,
        decision_mode: str = "on_change",
        lease: bool = True,
        lease_after: float = 5.0,
        max_staleness: float = DEFAULT_MAX_STALENESS,
        decide_when: str | dict[str, str] | None = None,
        debounce_ms: int | None = None,
        decide_initial: bool = True,
    ) -> None:
        super().__init__()
        from airflow_provider_systemzero.identity import task_namespace

        given = checked_watch(self, locals())  # in the Dag file: a mistake is an import error there
        self._kwargs.keep(self, given)
        self.key_namespace = task_namespace("asset-watch", watch_id, "", -1)
        self._stream = TriggerStream(systemzero_conn_id, request, key_namespace=self.key_namespace)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Class path and plain-JSON kwargs (no secret); they are the watcher's identity."""
        return self._kwargs.serialized(self, self.decision_filter.to_kwargs())

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Yield an event each time the condition becomes true; runs until cancelled (dormant, it
        awaits the source's next change itself, as :meth:`SystemZeroDecisionTrigger.run` does)."""
        stream_of = self._stream
        condition = DecisionCondition.from_dict(self.condition)
        self._source = source = build_source(self.source, self.state)
        announce_wait(self.condition, source)
        # fires on each transition to "met" (after hysteresis, when the condition has it); nobody
        # can review an asset event, so only a met decision counts; whether the current run of met
        # decisions already fired outlives a triggerer restart where Airflow keeps it (3.3)
        memory = WatchMemory(
            getattr(self, "asset_state_store", None),
            watch_id=self.watch_id,
            identity=kwargs_identity(self.serialize()[1]),
            stores_given=hasattr(self, "asset_state_store"),  # 3.3: None until a triggerer sets it
        )
        watch = DecisionWatch(condition, reviews=False, fired=await memory.recall(), on_fired=memory.note)
        policy_fields = condition.policy is not None or condition.has_hysteresis
        gate = self.decision_filter.gate(asyncio.get_running_loop().time())  # kept across streams
        failures = 0
        loop = asyncio.get_running_loop()
        try:
            while True:
                started = loop.time()
                try:
                    # the connection is looked up now: a missing one is reported at the start, not
                    # when the source first has something to decide
                    await stream_of.resolve_settings()
                    watching = self._watching(watch, source, gate, policy_fields)
                    async with contextlib.aclosing(watching) as payloads:
                        async for payload in payloads:
                            yield TriggerEvent(payload)
                            memory.handed_over()
                            failures = 0  # it worked
                    return
                except Exception as exc:  # a watch has no task to fail: it says why, waits, goes on
                    failures = failures_in_a_row(failures, loop.time() - started)
                    stream_of.forget_settings()  # a connection fixed meanwhile is used
                    await wait_to_watch_again(self.watch_id, failures, exc)
        finally:
            await memory.aclose()
            await self.cleanup()

    async def _watching(
        self, watch: DecisionWatch, source: StateSource, gate: DecisionGate | None, policy_fields: bool
    ) -> AsyncIterator[dict[str, Any]]:
        """The watch itself: the payload of each event, until the source ends (or a failure)."""
        stream_of = self._stream
        mode = self.decision_filter.stream_mode(self.decision_mode)
        relevance = self.decision_filter.relevance()  # a callable that cannot be imported fails
        state = await stream_of.first_state(source, gate, relevance)
        while True:
            follow = source if gate is None else None  # it opens with the newest state
            # one queue per stream (it is drained before the trigger goes dormant: none is kept)
            queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
            async with self._stream.opened(state, follow=follow, decision_mode=mode) as stream:
                lease = new_lease(self)
                feeder = new_feeder(self, stream, source, mode, gate)
                quiet = lease.watch(feeder.currency)
                race = asyncio.ensure_future(
                    feeder.race(functools.partial(self._publish, feeder, watch, queue, policy_fields))
                )
                try:
                    while True:
                        getter = asyncio.ensure_future(queue.get())
                        await asyncio.wait({getter, race, quiet}, return_when=asyncio.FIRST_COMPLETED)
                        if getter.done():
                            yield getter.result()
                            continue
                        getter.cancel()
                        if race.done():
                            race.result()  # raises the failure
                            return
                        break  # quiet: give the stream back until the state changes
                finally:
                    quiet.cancel()
                    race.cancel()
                    await asyncio.gather(race, return_exceptions=True)
                    await feeder.aclose()  # the source's reading, even if the race never ran
                    end_lease(self)
            del stream, feeder, race, quiet, getter, lease  # nothing of the stream outlives it
            while not queue.empty():  # a transition seen as the stream went quiet
                yield queue.get_nowait()
            del queue
            # dormant: the watch is kept (whether the condition was met decides the next event)
            stream_of.let_go(gate)
            state = NO_CHANGE
            while state is NO_CHANGE:
                time_left = stream_of.time_left(watch)
                stream_of.dormant = True
                try:
                    if time_left is None:
                        # TriggerStream.change, inline (as in SystemZeroDecisionTrigger.run)
                        state = await source.current()
                        while not stream_of.changed(state, source):
                            try:
                                state = await source.taken(await source.next_change())
                            except Exception as exc:
                                state = await source.failed(exc)
                    else:  # a qualifying run waits on time: bounded by one timer
                        state = await stream_of.change_within(time_left, source)
                finally:
                    stream_of.dormant = False
                state, verdict = await stream_of.woken(state, watch, gate=gate, relevance=relevance)
                if verdict is not None:  # only time was missing, and it passed
                    yield self._event(watch, verdict, policy_fields)

    async def _publish(
        self,
        feeder: SourceFeeder,
        watch: DecisionWatch,
        queue: asyncio.Queue[dict[str, Any]],
        policy_fields: bool,
    ) -> None:
        """Put the event payload of each verdict about the stream's decisions on ``queue``."""
        async with contextlib.aclosing(feeder.verdicts(watch)) as verdicts:
            async for verdict in verdicts:
                await queue.put(self._event(watch, verdict, policy_fields))

    def _event(self, watch: DecisionWatch, verdict: Any, policy_fields: bool) -> dict[str, Any]:
        """The asset event payload of a verdict."""
        return watch.event(
            verdict, policy_fields=policy_fields, extra={"watch_id": self.watch_id}
        ).to_payload()

    async def cleanup(self) -> None:
        """Close the stream and the source (runs on every exit; exceptions are ignored by Airflow)."""
        await close_watching(self)
