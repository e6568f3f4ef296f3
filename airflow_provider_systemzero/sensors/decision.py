"""A deferrable sensor that waits for a System Zero decision about a changing state.

The sensor is its arguments and the Airflow paths (defer, poke, resume); what it builds from its
arguments is in :mod:`~airflow_provider_systemzero.sensors.inputs`, its poke path in
:mod:`~airflow_provider_systemzero.sensors.poking`, and how a wait ends in
:mod:`~airflow_provider_systemzero.sensors.outcomes`. What "this decision ends the wait" means is
:class:`~airflow_provider_systemzero.decisions.watch.DecisionWatch`, the same for the trigger and
the poke; acting on a decision is :class:`~airflow_provider_systemzero.utils.review.PolicyGateMixin`,
the same for the operators.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.configuration import conf
from airflow.sdk import BaseSensorOperator, PokeReturnValue

from airflow_provider_systemzero.decisions.source_watch import DEFAULT_MAX_STALENESS
from airflow_provider_systemzero.decisions.watch import WatchEvent
from airflow_provider_systemzero.hooks.systemzero import check_connection_before_deferring
from airflow_provider_systemzero.identity import context_namespace
from airflow_provider_systemzero.sensors import inputs as sz_inputs
from airflow_provider_systemzero.sensors.inputs import START_FROM_TRIGGER_NAMESPACE, Inputs
from airflow_provider_systemzero.sensors.outcomes import (
    decided,
    end_without_decision,
    fired_summary,
    gate_of,
    outcome_of,
)
from airflow_provider_systemzero.sensors.poking import PokeWatch
from airflow_provider_systemzero.sources.spec import plain_source
from airflow_provider_systemzero.triggers.decision import SystemZeroDecisionTrigger, owned_event
from airflow_provider_systemzero.utils.checks import (
    parse_time,
)
from airflow_provider_systemzero.utils.deadlines import defer_timeout
from airflow_provider_systemzero.utils.review import Gate, PolicyGateMixin
from airflow_provider_systemzero.utils.usage import UsageBudgetMixin

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["START_FROM_TRIGGER_NAMESPACE", "SystemZeroDecisionSensor"]


class SystemZeroDecisionSensor(UsageBudgetMixin, PolicyGateMixin, BaseSensorOperator):
    """Waits until System Zero decides a question as expected about a state that keeps changing.

    In deferrable mode (``deferrable=True``; left out, ``[operators] default_deferrable`` decides,
    and Airflow's own default for it is ``False``) the task defers at once and a :class:`~airflow_provider_systemzero.triggers.decision.SystemZeroDecisionTrigger`
    holds the stream in the triggerer, so waiting costs no worker slot. Otherwise it pokes: each
    poke reads the source and asks one on_request decision.

    ::

        SystemZeroDecisionSensor(
            task_id="wait_until_ready",
            question="ready",
            instructions="Is the job ready?",
            source={"type": "file", "path": "/data/job.log"},
            min_confidence=0.8,
            deferrable=True,
        )

    :param question: the question to watch.
    :param instructions: the watched (boolean) question's instructions, when ``questions`` is not given.
    :param questions: every question to ask (full or shorthand form); must include ``question``.
    :param state: the initial state (string, array or object); a file source appends to it.
    :param source: where the state comes from: ``None`` (static), ``{"type": "file", "path": …}`` or
        ``{"type": "callable", "path": "pkg.mod.func", "poll_interval": …}``.
    :param expect: the answer that satisfies the sensor (``True`` by default).
    :param min_confidence: the answer's confidence bar (a missing confidence never passes).
    :param min_probability: the answer's probability bar.
    :param decision_mode: ``on_change`` (every change is decided) or ``on_request``.
    :param model: the model (default: the connection's ``model`` extra).
    :param route: ``direct`` or ``committee``.
    :param request_mode: System Zero's ``fast`` or ``deliberate`` (named so because ``mode`` is the
        sensor's own ``poke``/``reschedule``).
    :param prompt_cache_key: a stable cache key (default: derived from the task instance).
    :param systemzero_conn_id: the System Zero connection.
    :param deferrable: wait in the triggerer.
    :param lease: let the trigger give its stream back between decisions.
    :param lease_after: seconds (0 or more) without a change before the trigger gives its stream back.
    :param min_interval_ms: minimum milliseconds between decisions the gateway starts (0 … 60000):
        on a source that changes often, fewer decisions are billed, each covering more changes,
        at the cost of latency.
    :param max_staleness: seconds (0 … 3600, default 30) the source's newer state may wait while a
        decision is in flight, once decisions keep coming back about an outdated state (a source that
        changes faster than a decision takes); ``0`` never holds a change (such a source is then never
        decided about). See :mod:`~airflow_provider_systemzero.decisions.source_watch`.
    :param decide_when: deferrable only (a poking sensor refuses it when the Dag is parsed): start a
        decision only for a change that can matter — a regular
        expression searched in what changed (the appended text, the appended items as JSON, or the new
        state of a replace) or ``{"callable": "pkg.mod.func"}`` taking (previous, new) and returning a
        bool. Other changes are streamed but start no decision. See
        :mod:`~airflow_provider_systemzero.decisions.relevance`.
    :param debounce_ms: deferrable only: decide once the source has been quiet this many milliseconds
        (a burst of changes is one decision).
    :param decide_initial: decide the state the wait starts with (default ``True``); ``False`` waits
        for the first change matching ``decide_when`` (deferrable only).
    :param key_salt: mixed into the task's key namespace (e.g. to force fresh decisions).
    :param policy: a :class:`~airflow_provider_systemzero.decisions.policy.DecisionPolicy` (or its dict form)
        for an expected answer: act (fire), ask a person (``review``: the task waits in
        ``awaiting_input``; "yes" fires, "no" keeps waiting for a new state), ``fail``, ``skip``,
        ``wait`` (keep waiting for more state) or ``default``.
    :param consecutive: hysteresis: fire only after this many successive qualifying decisions,
        each about a different state.
    :param min_true_for: hysteresis: fire only once the decisions have qualified for this long
        (seconds or a ``timedelta``), so a flapping answer does not fire the sensor.
    :param review_assigned_users: who may answer a review (``{"id", "name"}`` or a list of them).
    :param review_notifiers: notifiers called when a review is requested.
    :param review_subject: the review request's subject.
    :param wait_on_static_state: with no source the state never changes, so when its decision does
        not meet the condition no later one can: the sensor fails at once (skips with
        ``soft_fail``). ``True`` waits anyway, until the timeout.
    :param allow_empty: accept an empty state (``""``, ``[]``, ``{}``) when there is no source
        (refused by default: the decision about nothing is billed).
    :param max_decisions: billed decisions allowed for this task across all its tries, checked
        before each dispatch (``None``: no cap); see :mod:`~airflow_provider_systemzero.utils.usage`.
    :param max_input_tokens: input tokens allowed for this task across all its tries (``None``: no cap).
    :param start_from_trigger: start in the triggerer: the scheduler creates the trigger from
        ``start_trigger_args`` and no worker runs until the decision arrives. ``state`` and ``source``
        may be templated (the triggerer renders them, with undefined variables rendering as ``""``,
        and refuses what it rendered as the worker would: an empty or ``'None'`` static state, a
        ``'None'`` before a source's content); the questions, ``model`` and ``prompt_cache_key``
        must be plain values. The key namespace is :data:`START_FROM_TRIGGER_NAMESPACE` and the
        deadline is Airflow's trigger timeout (the sensor's ``timeout``). A mapped sensor
        (``.partial(...).expand(...)``) defers from a worker as usual.

    Literal (non-templated) arguments are checked when the DAG is parsed, so a sensor that can
    never work is an import error (a ``ValueError`` starting ``<task_id>: ``); templated ones when
    the task runs.

    Every decision that ends the wait pushes the ``decision`` audit record to XCom, and beside it the
    ``decisions`` history its event carries: each decision the wait saw and what it did with it (the
    UI's "Decision timeline", see :mod:`~airflow_provider_systemzero.utils.history`).
    """

    template_fields: Sequence[str] = sz_inputs.TEMPLATE_FIELDS
    ui_color = "#e8f0ff"

    def __init__(
        self,
        *,
        question: str = "ready",
        instructions: str | None = None,
        questions: dict[str, Any] | None = None,
        state: Any = "",
        source: dict[str, Any] | None = None,
        expect: Any = True,
        min_confidence: float | None = None,
        min_probability: float | None = None,
        decision_mode: str = "on_change",
        model: str | None = None,
        route: str | None = None,
        request_mode: str | None = None,
        prompt_cache_key: str | None = None,
        systemzero_conn_id: str = "systemzero_default",
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=True),
        lease: bool = True,
        lease_after: float = 5.0,
        min_interval_ms: int | None = None,
        max_staleness: float = DEFAULT_MAX_STALENESS,
        decide_when: str | dict[str, str] | None = None,
        debounce_ms: int | None = None,
        decide_initial: bool = True,
        key_salt: str | None = None,
        max_decisions: int | None = None,
        max_input_tokens: int | None = None,
        start_from_trigger: bool = False,
        policy: Any = None,
        consecutive: int = 1,
        min_true_for: float | timedelta = 0.0,
        review_assigned_users: Any = None,
        review_notifiers: Any = None,
        review_subject: str | None = None,
        wait_on_static_state: bool = False,
        allow_empty: bool = False,
        **kwargs: Any,
    ) -> None:
        with parse_time(kwargs.get("task_id")):
            super().__init__(max_decisions=max_decisions, max_input_tokens=max_input_tokens, **kwargs)
            self.question, self.instructions, self.questions = question, instructions, questions
            self.state, self.source, self.allow_empty = state, plain_source(source), allow_empty
            self.expect, self.min_confidence, self.min_probability = expect, min_confidence, min_probability
            self.consecutive, self.min_true_for = consecutive, sz_inputs.min_true_for_seconds(min_true_for)
            self.model, self.route, self.request_mode = model, route, request_mode
            self.decision_mode, self.prompt_cache_key = decision_mode, prompt_cache_key
            self.systemzero_conn_id, self.deferrable, self.key_salt = systemzero_conn_id, deferrable, key_salt
            self.lease, self.lease_after, self.wait_on_static_state = lease, lease_after, wait_on_static_state
            sz_inputs.check_plain(self)
            self._init_review(policy, review_assigned_users, review_notifiers, review_subject)
            self.min_interval_ms, self.max_staleness = sz_inputs.pacing(min_interval_ms, max_staleness)
            self.decision_filter = sz_inputs.decision_filter(self, decide_when, debounce_ms, decide_initial)
            self.key_namespace: str | None = None  # the start-from-trigger namespace (a template)
            self._templates, self._poke_watch = sz_inputs.templates_of(self), PokeWatch()
            sz_inputs.check_literals(self)
            sz_inputs.start_in_triggerer(self, start_from_trigger)

    def _trigger_kwargs(
        self, inputs: Inputs, namespace: str, deadline: float | None, budget: dict[str, Any], skip: list[str]
    ) -> dict[str, Any]:
        """The trigger's kwargs: the one place the sensor builds its trigger (defer, start, wait again)."""
        request, condition, source = inputs
        return {
            "systemzero_conn_id": self.systemzero_conn_id,
            "request": request,
            "condition": condition.to_dict(),
            "state": self.state,
            "source": source,
            "key_namespace": namespace,
            "decision_mode": self.decision_mode,
            "deadline": deadline,
            "lease": self.lease,
            "lease_after": self.lease_after,
            "budget": budget,
            "min_interval_ms": self.min_interval_ms,
            "max_staleness": self.max_staleness,
            **self.decision_filter.to_kwargs(),
            **({"skip_states": skip} if skip else {}),
            **sz_inputs.static_state_kwargs(self, source),
        }

    def _defer(self, context: Context, inputs: Inputs, deadline: float | None, skip: list[str]) -> None:
        """Defer to the trigger until ``deadline`` (``None``: the timeout from now), skipping ``skip``."""
        deadline = deadline or sz_inputs.deadline_of(self)
        namespace, budget = context_namespace(context, salt=self.key_salt), self.trigger_budget(context)
        kwargs = self._trigger_kwargs(inputs, namespace, deadline, budget, skip)
        timeout = defer_timeout(deadline)
        self.defer(
            trigger=SystemZeroDecisionTrigger(**kwargs), method_name="execute_complete", timeout=timeout
        )

    def execute(self, context: Context) -> Any:
        """Defer at once (deferrable) or poke."""
        inputs = sz_inputs.build_inputs(self, running=True)
        check_connection_before_deferring(self.task_id, self.systemzero_conn_id, inputs[0].get("model"))
        if not self.deferrable:
            with self._poke_watch.explaining_timeout():
                return super().execute(context)
        self._defer(context, inputs, None, [])

    def poke(self, context: Context) -> PokeReturnValue:
        """One on_request decision about the source's current state."""
        event = self._poke_watch.poke(self, context, sz_inputs.build_inputs(self))
        if event is None:
            return PokeReturnValue(is_done=False)
        result = self._finish(context, event)
        return result if event.status == "policy" else PokeReturnValue(is_done=True, xcom_value=result)

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> dict[str, Any]:
        """Resume after the trigger fired; idempotent (an event may be delivered more than once).

        :param event: the trigger's payload.
        :return: the decision summary (pushed to XCom as ``return_value``).
        """
        own = sz_inputs.own_namespaces(self, context)
        ended = WatchEvent.from_payload(owned_event(self.task_id, event, own))
        self.usage_from_event(context, ended)  # the usage XCom; fails the task when the budget stopped it
        if ended.status not in ("success", "policy"):
            end_without_decision(self, context, ended)
        return self._finish(context, ended)

    def _finish(self, context: Context, event: WatchEvent) -> Any:
        """Act on a decision that ended the wait (or wants a person) under the policy."""
        decided(self, context, event)
        return self._gate(context, gate_of(self, event), outcome_of(event))

    def _apply(self, context: Context, gate: Gate, record: dict[str, Any]) -> Any:
        """Fire with the decision that took effect, or — when a person said no — keep waiting."""
        if not sz_inputs.is_expected(self, record["decision"]):
            return self._wait_again(context, gate, record)
        record["effect"] = {"fired": True}
        self._push_record(context, record)
        return fired_summary(gate, record, with_policy=self.policy is not None)

    def _wait_again(self, context: Context, gate: Gate, record: dict[str, Any]) -> Any:
        """Push ``record`` (not fired) and keep waiting, ignoring the states a person answered about."""
        self.resume_try(gate.extra.get("this_try"))  # after a review: a process that counted nothing yet
        self._push_record(context, {**record, "effect": {"fired": False, "waiting": True}})
        skip = [*gate.extra.get("skip_states", []), *([gate.state_hash] if gate.state_hash else [])]
        self.log.info("keep waiting for a new state (%d state(s) already answered)", len(skip))
        if not self.deferrable:
            self._poke_watch = PokeWatch(skip)
            return BaseSensorOperator.execute(self, context)
        self._defer(context, sz_inputs.build_inputs(self), gate.extra.get("deadline"), skip)
