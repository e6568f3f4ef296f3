"""Triggers that hold a System Zero stream in the triggerer.

* :class:`SystemZeroDecisionTrigger` — the deferrable sensor's trigger: streams a changing state
  and fires once, when a decision about the *current* state meets the condition.
* :class:`SystemZeroDecideTrigger` — the deferrable operator's trigger: one on_request decision
  about a fixed state, with every answer.
* :class:`SystemZeroDecisionEventTrigger` — an :class:`~airflow.triggers.base.BaseEventTrigger`
  for an ``AssetWatcher``: an asset event each time the condition becomes true. On Airflow 3.3 the
  watches of one source share one stream (:mod:`~airflow_provider_systemzero.triggers.shared`).

The rules they follow (the triggerer runs hundreds of them in one event loop):

* ``run()`` never blocks the loop (files are read in a thread, connections are looked up with
  ``aget_connection``) and lets :class:`asyncio.CancelledError` propagate; ``cleanup()`` closes the
  socket on every exit.
* Kwargs are plain JSON with no secret: a connection ID, the request, the state and its source,
  the condition, an absolute ``deadline`` (epoch seconds, so a rebuilt trigger keeps it) and a
  ``key_namespace`` derived from the task instance. The same namespace gives the same
  ``prompt_cache_key`` and the same per-state idempotency keys in every process, so a triggerer
  restart or two copies running at once (HA) replay byte-identically and are billed once.
* One watch per run (:class:`~airflow_provider_systemzero.decisions.source_watch.SourceWatch`, run
  by :class:`~airflow_provider_systemzero.triggers.driver.WatchDriver`, which say when a stream
  is opened and given back) decides which decision is about the state the source holds now: only
  such a decision fires. The rules that end a wait are
  :class:`~airflow_provider_systemzero.decisions.watch.VerdictRules`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import logging
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from airflow_provider_systemzero.compat import has_shared_streams
from airflow_provider_systemzero.decisions.conditions import DecisionCondition
from airflow_provider_systemzero.decisions.source_watch import (
    DEFAULT_MAX_STALENESS,
    EveryDecision,
    FirstDecision,
    Rules,
    SourceWatch,
)
from airflow_provider_systemzero.decisions.watch import VerdictRules, answers_payload
from airflow_provider_systemzero.exceptions import ARGUMENT_ERRORS, SystemZeroArgumentError
from airflow_provider_systemzero.protocol.body import JSONValue
from airflow_provider_systemzero.protocol.validation import validate_decision_mode
from airflow_provider_systemzero.questions import validate_state_for_request
from airflow_provider_systemzero.sources.base import StaticSource
from airflow_provider_systemzero.sources.spec import (
    check_changes_possible,
    plain_source,
    refuse_rendered_state,
    state_templates,
    validate_source_spec,
)
from airflow_provider_systemzero.tasks.checks import check_conn_id, check_flag, check_lease_after
from airflow_provider_systemzero.tasks.payloads import error_payload, owned_event
from airflow_provider_systemzero.triggers.driver import WatchDriver
from airflow_provider_systemzero.triggers.kwargs import TriggerKwargs
from airflow_provider_systemzero.triggers.review import ReviewWatch
from airflow_provider_systemzero.triggers.shared import (
    DecisionBoard,
    SharedDecision,
    group_watch_id,
    posted,
    shared_digest,
    shared_key,
    shared_verdicts,
)
from airflow_provider_systemzero.triggers.watch_memory import WatchMemory, kwargs_identity
from airflow_provider_systemzero.triggers.watching import (
    StreamTrigger,
    WatchingTrigger,
    failures_in_a_row,
    new_timeline,
    wait_to_watch_again,
)

__all__ = [
    "SystemZeroDecideTrigger",
    "SystemZeroDecisionEventTrigger",
    "SystemZeroDecisionTrigger",
    "error_payload",
    "owned_event",
]

log = logging.getLogger(__name__)


class SystemZeroDecisionTrigger(WatchingTrigger):
    """Waits until System Zero decides the watched question as expected about a changing state.

    Fires once: a ``success`` event with the watched answer, or an ``error``/``timeout`` event
    whose ``message`` names the cause.

    :param systemzero_conn_id: the System Zero connection (origin and key are read in the triggerer).
    :param request: ``{"model", "questions", "route", "mode", "prompt_cache_key"}`` (plain JSON).
    :param condition: a :class:`DecisionCondition` or its :meth:`DecisionCondition.to_dict` — question,
        expect, min_confidence, min_probability, and optionally a policy and hysteresis
        (``consecutive``, ``min_true_for``); kept parsed, and serialized in its ``to_dict()`` form.
    :param state: the initial state (string, array or object).
    :param source: where the state comes from (see :mod:`~airflow_provider_systemzero.sources.spec`).
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
    :param review: this try's review request (:mod:`~airflow_provider_systemzero.triggers.review`):
        ``ti_id``, the reviewed ``gate`` and the policy's ``outcome``, ``defaults``, ``timeout_at``
        (epoch seconds), whether it is still ``open``, and an ``answer`` to judge. While it is open
        the wait goes on: a person's answer about the state the source still holds ends it with a
        ``review`` event, a newer state decided ends it as usual and closes the request.

    Under a policy the ``success`` event carries ``action``: ``act``/``default`` (fire), or
    ``review`` (the sensor asks a person); a ``fail``/``skip`` verdict is a ``policy`` event.
    """

    _kwargs = TriggerKwargs(
        "systemzero_conn_id request condition state source key_namespace decision_mode budget deadline "
        "lease lease_after skip_states end_when_unmet min_interval_ms max_staleness allow_empty review",
        when_set=frozenset({"budget", "skip_states", "end_when_unmet", "allow_empty", "review"}),
    )

    def __init__(
        self,
        *,
        systemzero_conn_id: str,
        request: dict[str, Any],
        condition: dict[str, Any] | DecisionCondition,
        state: JSONValue,
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
        review: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(
            systemzero_conn_id=systemzero_conn_id,
            request=request,
            key_namespace=key_namespace,
            deadline=deadline,
            budget=budget,
            decide_when=decide_when,
            debounce_ms=debounce_ms,
            decide_initial=decide_initial,
            max_staleness=max_staleness,
        )
        #: the condition, parsed once: what the run's rules use, and what ``condition`` gives back
        _, self.decision_condition = self._parsed_condition(condition)
        self.state, self.source = state, source
        self.decision_mode, self.budget = decision_mode, budget
        self.lease, self.lease_after, self.min_interval_ms = lease, lease_after, min_interval_ms
        self.end_when_unmet, self.allow_empty = bool(end_when_unmet), allow_empty
        self.skip_states = tuple(skip_states or ())  # a tuple: no object for the collector to track
        self.review = review
        #: started in the triggerer, state and source are templates it renders: checked once rendered
        self._templates = state_templates(state, source)

    @property
    def condition(self) -> dict[str, Any]:
        """The ``condition`` kwarg: :meth:`DecisionCondition.to_dict` of :attr:`decision_condition`
        (the sensor defers with that form; the trigger keeps only the parsed condition, not a second
        copy of it for every waiting sensor)."""
        return self.decision_condition.to_dict()

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Class path and plain-JSON kwargs (no secret)."""
        path, kwargs = super().serialize()
        if "skip_states" in kwargs:
            kwargs["skip_states"] = list(self.skip_states)  # plain JSON
        return path, kwargs

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Watch the source and yield one event: the verdict of a current decision, a timeout, or
        an error (the event goes out before the stream's close handshake)."""
        rules: VerdictRules | None = None
        payload = self._stream.late(self._extra(), "the sensor's deadline passed before the trigger started")
        if payload is None:
            scope = self._stream.deadline_scope()
            try:
                async with scope:
                    if self._templates is not None:  # as the worker checks what it rendered
                        refuse_rendered_state(
                            self.state, self.source, self._templates, allow_empty=self.allow_empty
                        )
                    source = self._open_source()
                    rules = self._rules()
                    asked = ReviewWatch.of(self.review, rules, source)
                    driver = self._start_watch(
                        rules, once=asked is None, min_interval_ms=self.min_interval_ms
                    )
                    if asked is not None:
                        payload = await asked.next_event(driver, self._extra(), deadline=self.deadline)
                    else:
                        verdict = await driver.next_verdict()
                        event = rules.sensor_event(
                            verdict, key_namespace=self.key_namespace, deadline=self.deadline
                        )
                        payload = event.to_payload()
                        if self.review:  # this try's review request, already answered or closed
                            payload["review"] = self.review
            except BaseException as exc:
                payload = await self._ended_early(exc, scope)
            if payload.get("status") in ("timeout", "error") and rules is not None:
                payload["decisions"] = rules.timeline.to_list()  # what the wait saw, up to its end
        yield TriggerEvent(self._stream.with_usage(payload))  # before the close handshake
        await self.cleanup()

    def _rules(self) -> VerdictRules:
        """What ends this wait: the condition, its policy and hysteresis, the skip states; with the
        run's one history (what the wait saw, pushed as the ``decisions`` XCom)."""
        return VerdictRules(
            self.decision_condition,
            reviews=True,
            skip_states=self.skip_states,
            reviewing=ReviewWatch.reviewed_state(self.review),
            end_when_unmet=self.end_when_unmet,
            timeline=new_timeline(),
        )

    def _timed_out(self) -> dict[str, Any]:
        """The event of the deadline: what the wait was stuck on, and how long decisions took."""
        more_time = "raise the sensor's timeout (or its execution_timeout, if shorter)"
        driver = self._driver
        rules = driver.watch.rules if driver is not None else None
        now = asyncio.get_running_loop().time()
        # a met decision that a hold rule (consecutive, min_true_for) kept from ending the wait
        held = None if rules is None else rules.held_back(now, more_time=more_time)
        return self._stream.timed_out(
            self._extra(),
            "no decision met the condition before the deadline"
            if held is None
            else "a decision met the condition, but a hold rule kept it from ending the wait before the deadline",
            self._source,
            "; ".join(filter(None, [rules.last_reason if rules is not None else None, held])),
            more_time=more_time,
            decision_seconds=None if driver is None else list(driver.decision_seconds),
        )


class SystemZeroDecideTrigger(StreamTrigger):
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
        state: JSONValue,
        key_namespace: str,
        idempotency_key: str | None = None,
        attachments: list[dict[str, str]] | None = None,
        deadline: float | None = None,
        budget: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(
            systemzero_conn_id=systemzero_conn_id,
            request=request,
            key_namespace=key_namespace,
            deadline=deadline,
            budget=budget,
        )
        self.state, self.idempotency_key, self.budget = state, idempotency_key, budget
        self.attachments = attachments or []

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Decide once and yield one event (before the stream's close handshake)."""
        from airflow_provider_systemzero.protocol.messages import Attachment
        from airflow_provider_systemzero.tasks.observability import capture_content_enabled

        payload = self._stream.late(self._extra(), "the task's deadline passed before the trigger started")
        if payload is None:
            scope = self._stream.deadline_scope()
            try:
                async with scope:
                    # the same watch as a sensor's, about a state that never changes: its first
                    # decision is the answer
                    watch = SourceWatch(FirstDecision(), decision_mode="on_request", lease=False)
                    self._driver = driver = WatchDriver(
                        watch,
                        StaticSource(self.state),
                        self._stream,
                        stream_kwargs={
                            "attachments": [Attachment(**a) for a in self.attachments],
                            "idempotency_key": self.idempotency_key,
                        },
                    )
                    decision = await driver.next_verdict()
                    payload = answers_payload(
                        decision,
                        self.state,
                        key_namespace=self.key_namespace,
                        at=time.time(),
                        capture_content=capture_content_enabled(),
                    )
            except BaseException as exc:
                payload = await self._ended_early(exc, scope)
        yield TriggerEvent(self._stream.with_usage(payload))  # before the close handshake
        await self.cleanup()

    def _timed_out(self) -> dict[str, Any]:
        """The event of the deadline: no decision came, and how long decisions took."""
        return self._stream.timed_out(
            self._extra(),
            "no decision before the task's deadline",
            more_time="raise the operator's decision_timeout (or its execution_timeout, if shorter)",
            decision_seconds=list(self._driver.decision_seconds) if self._driver else None,
        )


class SystemZeroDecisionEventTrigger(WatchingTrigger, BaseEventTrigger):
    """Schedules Dags on a decision: an asset event each time the condition becomes true.

    Use it in an ``AssetWatcher``. Its kwargs are its identity, so ``watch_id`` names the
    watch (and its keys) across triggerer restarts. An event is produced on each transition
    from "not met" to "met" (the first decision counts as a transition); a decision that
    stays true does not fire again, also after a triggerer restart where Airflow keeps the
    watch's memory (3.3: :mod:`~airflow_provider_systemzero.triggers.watch_memory`).

    On Airflow 3.3, watches whose kwargs are equal but for ``condition`` and ``watch_id`` share one
    stream: each change is decided once for all of them, and each judges the decision by its own
    condition (:meth:`shared_stream_key`, :mod:`~airflow_provider_systemzero.triggers.shared`).

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
        state: JSONValue,
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
        from airflow_provider_systemzero.identity import task_namespace

        # checked in the Dag file: a mistake is an import error there, naming the watch (by its
        # watch_id, checked first) and the argument, before anything is sent or billed; in the
        # triggerer it would restart the trigger every few seconds, or be billed and never fire
        if not isinstance(watch_id, str) or not watch_id.strip():
            raise SystemZeroArgumentError(
                f"SystemZeroDecisionEventTrigger: watch_id must be a non-empty string, got {watch_id!r}: a "
                "stable name for this watch (its keys and cache key derive from it), e.g. watch_id='nightly-job'",
                code="invalid_watch_id",
                field="watch_id",
            )
        key_namespace = task_namespace("asset-watch", watch_id, "", -1)
        with self._naming_the_watch(watch_id):
            condition, built = self._parsed_condition(condition)
            source = plain_source(source)
            check_conn_id(systemzero_conn_id)
            if not isinstance(request, Mapping) or not isinstance(request.get("questions"), Mapping):
                raise SystemZeroArgumentError(
                    "request must be a dict with 'questions' ({name: {'type': ..., 'instructions': ...}}) and "
                    "optionally 'model', 'route', 'mode' and 'prompt_cache_key'",
                    code="invalid_request",
                    field="request",
                )
            built.check_questions(request["questions"], reviews=False)  # nobody reviews an asset event
            validate_decision_mode(decision_mode)
            check_flag("lease", lease, "give the stream back while the source is quiet")
            check_lease_after(lease_after)
            validate_source_spec(source, state)
            check_changes_possible(source, consecutive=built.consecutive, decide_initial=decide_initial)
            validate_state_for_request(request, state)
            # the decide_when filter and max_staleness check themselves (WatchingTrigger)
            super().__init__(
                systemzero_conn_id=systemzero_conn_id,
                request=request,
                key_namespace=key_namespace,
                decide_when=decide_when,
                debounce_ms=debounce_ms,
                decide_initial=decide_initial,
                max_staleness=max_staleness,
            )
        self.condition, self.state, self.watch_id, self.source = condition, state, watch_id, source
        self.decision_mode, self.lease, self.lease_after = decision_mode, lease, lease_after
        #: the condition, parsed once: what the rules of each run use (``condition`` is the kwarg as
        #: given, part of the watch's identity)
        self.decision_condition = built

    @staticmethod
    @contextlib.contextmanager
    def _naming_the_watch(watch_id: str) -> Iterator[None]:
        """Around the checks of the kwargs: an argument error raised inside names the watch, and
        the argument a field belongs to (the traceback of an import error shows only the
        provider's frames: the message says where)."""
        try:
            yield
        except ARGUMENT_ERRORS as exc:
            field = exc.field or ""
            argument = field.split(".")[0]
            if argument and argument not in _EVENT_TRIGGER_ARGUMENTS:  # a field inside an argument
                where = "condition" if argument in _CONDITION_FIELDS else "request"
                # and the field, unless the message starts with it
                where += ": " if exc.message.startswith(field) else f": {field}: "
            elif not field or exc.message.startswith(field):
                where = ""  # the message names it
            else:
                where = f"{field}: "
            raise SystemZeroArgumentError(
                f"SystemZeroDecisionEventTrigger(watch_id={watch_id!r}): {where}{exc.message}",
                code=exc.code,
                field=exc.field,
            ) from None

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Yield an event each time the condition becomes true; runs until cancelled. After an
        event it goes on with what its watch was doing (a newer state held behind the decision
        that fired is sent at once). A failure is said, waited out and tried again (a watch has no
        task to fail): what was under way is undone and asked again — a decision that failed, a
        ``decide_when`` call that raised or hung — while the watch's source, what it read and
        whether the current run of met decisions fired are kept across tries."""
        memory = self._memory()
        try:
            rules = await self._rules(memory)
            self._open_source()
            async for verdict in self._verdicts(rules):
                yield TriggerEvent(self._event(rules, verdict))
                memory.handed_over()
        finally:
            with contextlib.suppress(Exception):
                await memory.aclose()
            await self.cleanup()

    # ------------------------------------------------------------------ shared streams (Airflow 3.3)

    def shared_stream_key(self) -> tuple[str, str] | None:
        """The stream this watch shares with the other asset watches of its source (Airflow 3.3):
        equal for watches whose kwargs differ only in ``condition`` and ``watch_id``
        (:func:`~airflow_provider_systemzero.triggers.shared.shared_key`, a digest: no secret);
        ``None`` where the triggerer cannot share (the watch runs alone, as on 3.1 and 3.2)."""
        return shared_key(self.serialize()[1]) if has_shared_streams() else None

    @classmethod
    async def open_shared_stream(cls, kwargs: dict[str, Any]) -> AsyncIterator[SharedDecision]:
        """The shared stream of a group of asset watches: one watch of their source, which decides
        every change once, yielding each current decision (:class:`SharedDecision`). It never
        raises: a failure is said, waited out and tried again, as a watch running alone does, so no
        subscriber fails with it; it ends (its stream closed) when the last watch leaves.

        :param kwargs: one member's serialized kwargs (only the shared ones are used).
        """
        digest = shared_digest(kwargs)
        group = cls(**{**kwargs, "watch_id": group_watch_id(digest)})
        log.info(
            "asset watches of %s share one stream (group %s): each change is decided once for all",
            group.source.get("type") if isinstance(group.source, dict) else "a static state",
            digest,
        )
        board = DecisionBoard(group._current)
        try:
            with posted(shared_key(kwargs), board):
                group._open_source(announce=False)
                async for judged in group._verdicts(EveryDecision()):
                    yield board.publish(judged)
        finally:
            await group.cleanup()

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        """This watch's events from its group's decisions (Airflow 3.3): its own condition, policy,
        hysteresis and memory judge each decision, as in :meth:`run`; a watch that joins a running
        group starts from the group's newest decision.

        :param shared_stream: the group's decisions (from :meth:`open_shared_stream`).
        """
        memory = self._memory()
        try:
            rules = await self._rules(memory)
            self.log.info(
                "asset watch %r judges the decisions of a stream it shares: waiting until %s = %r",
                self.watch_id,
                rules.condition.question,
                rules.condition.expect,
            )
            async for verdict in shared_verdicts(rules, shared_key(self.serialize()[1]), shared_stream):
                yield TriggerEvent(self._event(rules, verdict))
                memory.handed_over()
        finally:
            with contextlib.suppress(Exception):
                await memory.aclose()

    # ------------------------------------------------------------------ the parts of both

    def _memory(self) -> WatchMemory:
        """Whether the current run of met decisions already fired, kept where Airflow keeps it (3.3:
        the asset's state store), so it outlives a triggerer restart."""
        return WatchMemory(
            getattr(self, "asset_state_store", None),
            watch_id=self.watch_id,
            identity=kwargs_identity(self.serialize()[1]),
            stores_given=hasattr(self, "asset_state_store"),  # 3.3: None until a triggerer sets it
        )

    async def _rules(self, memory: WatchMemory) -> VerdictRules:
        """What fires this watch: on each transition to "met" (after hysteresis, when the condition
        has it); nobody can review an asset event, so only a met decision counts; whether the
        current run already fired is recalled from ``memory``, which hears each change of it."""
        return VerdictRules(
            self.decision_condition,
            reviews=False,
            fired=await memory.recall(),
            on_fired=memory.note,
            timeline=new_timeline(),
        )

    async def _verdicts(self, rules: Rules) -> AsyncIterator[Any]:
        """The verdicts of this trigger's watch over its source (built: :meth:`_open_source`),
        forever. A failure is said, waited out and tried again (:func:`wait_to_watch_again`): the
        stream goes, the watch and the source stay."""
        streams = self._stream
        failures = 0
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                # the connection is looked up now: a missing one is reported at the start, not
                # when the source first has something to decide
                await streams.resolve_settings()
                driver = self._driver or self._start_watch(rules, once=False)
                while True:
                    yield await driver.next_verdict()
                    failures = 0  # it worked
            except Exception as exc:  # a watch has no task to fail: it says why, waits, goes on
                failures = failures_in_a_row(failures, loop.time() - started)
                streams.forget_settings()  # a connection fixed meanwhile is used
                if self._driver is not None:
                    await self._driver.reset()  # the stream goes; the watch and the source stay
                await wait_to_watch_again(self.watch_id, failures, exc)

    def _current(self, generation: int) -> bool:
        """Whether a decision about the state of ``generation`` is about what the source holds now."""
        driver = self._driver
        return driver is not None and driver.watch.current(generation, asyncio.get_running_loop().time())

    def _event(self, watch: VerdictRules, verdict: Any) -> dict[str, Any]:
        """The asset event payload of a verdict (with the verdict's fields under a policy or
        hysteresis)."""
        condition = watch.condition
        policy_fields = condition.policy is not None or condition.has_hysteresis
        return watch.event(
            verdict, policy_fields=policy_fields, extra={"watch_id": self.watch_id}
        ).to_payload()


#: The event trigger's arguments: an error about a field inside one of them names the argument.
_EVENT_TRIGGER_ARGUMENTS = frozenset(inspect.signature(SystemZeroDecisionEventTrigger.__init__).parameters)
#: The fields of the ``condition`` argument (any other field named inside an argument is the request's).
_CONDITION_FIELDS = frozenset(field.name for field in dataclasses.fields(DecisionCondition))
