"""A deferrable sensor that waits for a System Zero decision about a changing state."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.configuration import conf
from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.triggers.base import StartTriggerArgs

from airflow_provider_systemzero.budget import UsageBudgetMixin
from airflow_provider_systemzero.checks import (
    check_connection_before_deferring,
    is_literal,
    parse_time,
    refuse_empty_state,
)
from airflow_provider_systemzero.compat import (
    AirflowException,
    AirflowFailException,
    AirflowSkipException,
    has_trigger_templates,
)
from airflow_provider_systemzero.decisions.conditions import DecisionCondition
from airflow_provider_systemzero.decisions.relevance import DecisionFilter
from airflow_provider_systemzero.decisions.watch import DecisionWatch, WatchEvent
from airflow_provider_systemzero.exceptions import ARGUMENT_ERRORS, SystemZeroArgumentError
from airflow_provider_systemzero.identity import context_namespace
from airflow_provider_systemzero.protocol.validation import validate_decision_mode, validate_min_interval_ms
from airflow_provider_systemzero.questions import build_request_dict, validate_state_for_request
from airflow_provider_systemzero.triggers.currency import DEFAULT_MAX_STALENESS, validate_max_staleness
from airflow_provider_systemzero.triggers.decision import SystemZeroDecisionTrigger, owned_event
from airflow_provider_systemzero.triggers.sources import read_source_once, validate_source_spec
from airflow_provider_systemzero.utils.review import Gate, PolicyGateMixin

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["START_FROM_TRIGGER_NAMESPACE", "SystemZeroDecisionSensor"]

#: Extra time Airflow gives the trigger beyond the sensor's own deadline, so the trigger's
#: clearer timeout event wins.
_DEFER_GRACE = timedelta(seconds=60)
#: Error types that retrying cannot fix.
_FATAL_ERRORS = frozenset({"authentication", "validation", "configuration"})
#: The key namespace of a sensor that starts from the triggerer. The scheduler creates that trigger
#: before any worker runs, so the namespace cannot be derived from the task instance up front: it is
#: a template, rendered by the triggerer and rendered again (to the same value) on the worker that
#: resumes the task. Deterministic like :func:`~airflow_provider_systemzero.identity.task_namespace`.
START_FROM_TRIGGER_NAMESPACE = "sz-sft-{{ ti.dag_id }}.{{ ti.task_id }}.{{ ti.run_id }}.{{ ti.map_index }}"
#: Longest key namespace the stream accepts, and the room kept for the run ID and map index.
_MAX_NAMESPACE = 190
_RUN_ID_ROOM = 64
_JINJA_MARKERS = ("{{", "{%", "{#")


class SystemZeroDecisionSensor(UsageBudgetMixin, PolicyGateMixin, BaseSensorOperator):
    """Waits until System Zero decides a question as expected about a state that keeps changing.

    In deferrable mode (the default, from ``[operators] default_deferrable``) the task defers at
    once and a :class:`~airflow_provider_systemzero.triggers.decision.SystemZeroDecisionTrigger`
    holds the stream in the triggerer, so waiting costs no worker slot. Otherwise it pokes: each
    poke reads the source and asks one on_request decision.

    ::

        SystemZeroDecisionSensor(
            task_id="wait_until_ready",
            question="ready",
            instructions="Is the job ready?",
            source={"type": "file", "path": "/data/job.log"},
            min_confidence=0.8,
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
    :param lease_after: seconds without a change before the trigger gives its stream back.
    :param min_interval_ms: minimum milliseconds between decisions the gateway starts (0 … 60000):
        on a source that changes often, fewer decisions are billed, each covering more changes,
        at the cost of latency.
    :param max_staleness: seconds (0 … 3600, default 30) the source's newer state may wait while a
        decision is in flight, once decisions keep coming back about an outdated state (a source that
        changes faster than a decision takes); ``0`` never holds a change (such a source is then never
        decided about). See :mod:`~airflow_provider_systemzero.triggers.currency`.
    :param decide_when: deferrable only: start a decision only for a change that can matter — a regular
        expression searched in what changed (the appended text, the appended items as JSON, or the new
        state of a replace) or ``{"callable": "pkg.mod.func"}`` taking (previous, new) and returning a
        bool. Other changes are streamed but start no decision. See
        :mod:`~airflow_provider_systemzero.decisions.relevance`.
    :param debounce_ms: deferrable only: decide once the source has been quiet this many milliseconds
        (a burst of changes is one decision).
    :param decide_initial: decide the state the wait starts with (default ``True``); ``False`` waits
        for the first change matching ``decide_when``.
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

    Literal (non-templated) arguments are checked when the DAG is parsed, so a sensor that can
    never work is an import error; templated ones when the task runs.

    Every decision that ends the wait pushes the ``decision`` audit record to XCom.
    :param max_decisions: billed decisions allowed for this task across all its tries, checked
        before each dispatch (``None``: no cap); see :mod:`~airflow_provider_systemzero.budget`.
    :param max_input_tokens: input tokens allowed for this task across all its tries (``None``: no cap).
    :param start_from_trigger: start in the triggerer: the scheduler creates the trigger from
        ``start_trigger_args`` and no worker runs until the decision arrives. ``state`` and ``source``
        may be templated (the triggerer renders them, with undefined variables rendering as ``""``);
        the questions, ``model`` and ``prompt_cache_key`` must be plain values. The key namespace is
        :data:`START_FROM_TRIGGER_NAMESPACE` and the deadline is Airflow's trigger timeout (the sensor's
        ``timeout``). A mapped sensor (``.partial(...).expand(...)``) defers from a worker as usual.
    """

    template_fields: Sequence[str] = (
        "question",
        "instructions",
        "questions",
        "state",
        "source",
        "model",
        "prompt_cache_key",
        "key_namespace",
    )
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
        super().__init__(max_decisions=max_decisions, max_input_tokens=max_input_tokens, **kwargs)
        self._init_review(policy, review_assigned_users, review_notifiers, review_subject)
        self.wait_on_static_state = wait_on_static_state
        self.allow_empty = allow_empty
        self._slot_noted = False
        self.consecutive = consecutive
        self.min_true_for = (
            min_true_for.total_seconds() if isinstance(min_true_for, timedelta) else min_true_for
        )
        if (consecutive != 1 or self.min_true_for) and not deferrable and self.mode == "reschedule":
            raise ValueError(
                f"{self.task_id}: consecutive/min_true_for need a deferrable sensor or mode='poke' "
                "(a rescheduled poke forgets the run of decisions)"
            )
        #: states a person said "no" about (poke mode); and the poke-mode run of decisions
        self._skip_states: list[str] = []
        self._watch: DecisionWatch | None = None
        self.question = question
        self.instructions = instructions
        self.questions = questions
        self.state = state
        self.source = source
        self.expect = expect
        self.min_confidence = min_confidence
        self.min_probability = min_probability
        self.decision_mode = decision_mode
        self.model = model
        self.route = route
        self.request_mode = request_mode
        self.prompt_cache_key = prompt_cache_key
        self.systemzero_conn_id = systemzero_conn_id
        self.deferrable = deferrable
        self.lease = lease
        self.lease_after = lease_after
        self.min_interval_ms = validate_min_interval_ms(min_interval_ms)
        self.max_staleness = validate_max_staleness(max_staleness)
        # parse time: a bad regex, callable path or debounce is an import error naming the field
        self.decision_filter = DecisionFilter(
            decide_when=decide_when, debounce_ms=debounce_ms, decide_initial=decide_initial
        )
        if not decide_initial and source is None:
            raise SystemZeroArgumentError(
                "decide_initial=False with no source: the state never changes, so nothing would ever be "
                "decided; give a source, or drop decide_initial=False",
                code="invalid_decide_initial",
                field="decide_initial",
            )
        self.key_salt = key_salt
        #: the start-from-trigger key namespace (a template); ``None`` when the task defers from a worker
        self.key_namespace: str | None = None
        self.start_from_trigger = start_from_trigger
        self._check_literals()
        if start_from_trigger and not has_trigger_templates():
            self.log.warning(
                "%s: start_from_trigger needs Airflow 3.3, whose triggerer renders trigger templates; "
                "this Airflow starts the task on a worker, which defers at once",
                self.task_id,
            )
            self.start_from_trigger = False
        if self.start_from_trigger:
            self._prepare_start_from_trigger()

    def _check_literals(self) -> None:
        """Parse time: check every argument that no template or XComArg can still change."""
        literal = {name: is_literal(getattr(self, name)) for name in self.template_fields}
        with parse_time(self.task_id):
            condition = self._condition()
            validate_decision_mode(self.decision_mode)
            request = None
            if all(
                literal[name]
                for name in ("question", "instructions", "questions", "model", "prompt_cache_key")
            ):
                request = self._request()
                condition.check_questions(request["questions"])
            if literal["state"] and literal["source"]:
                self._check_state(request)

    def _prepare_start_from_trigger(self) -> None:
        """Build ``start_trigger_args`` at parse time; refuse what the triggerer could not render."""
        if not self.deferrable:
            raise ValueError(f"{self.task_id}: start_from_trigger=True needs deferrable=True")
        templated = [
            name
            for name in ("question", "instructions", "questions", "model", "prompt_cache_key")
            if any(marker in repr(getattr(self, name)) for marker in _JINJA_MARKERS)
        ]
        if templated:
            raise ValueError(
                f"{self.task_id}: with start_from_trigger=True the triggerer renders only state and "
                f"source; {', '.join(templated)} must not be templated"
            )
        namespace = START_FROM_TRIGGER_NAMESPACE
        if self.key_salt is not None:
            if any(marker in self.key_salt for marker in _JINJA_MARKERS):
                raise ValueError(
                    f"{self.task_id}: key_salt must not be templated with start_from_trigger=True"
                )
            namespace += f".{self.key_salt}"
        if self.has_dag():
            fixed = len(namespace.split("{{", 1)[0]) + len(self.dag_id) + len(self.task_id) + len("...-1")
            if fixed + _RUN_ID_ROOM > _MAX_NAMESPACE:
                raise ValueError(
                    f"{self.task_id}: the Dag and task IDs (and key_salt) are too long for a "
                    f"start_from_trigger key namespace (at most {_MAX_NAMESPACE} characters with "
                    f"the run ID); use shorter IDs or start_from_trigger=False"
                )
        try:
            request, condition, source = self._build()
        except AirflowFailException as exc:
            raise ValueError(str(exc)) from None
        self.key_namespace = namespace
        timeout = (
            self.timeout if isinstance(self.timeout, timedelta) else timedelta(seconds=float(self.timeout))
        )
        self.start_trigger_args = StartTriggerArgs(
            trigger_cls=f"{SystemZeroDecisionTrigger.__module__}.{SystemZeroDecisionTrigger.__qualname__}",
            trigger_kwargs=self._trigger_kwargs(
                request,
                condition,
                source,
                namespace=namespace,
                deadline=None,
                budget=self.start_trigger_budget(),
            ),
            next_method="execute_complete",
            next_kwargs=None,
            timeout=timeout,
        )

    # ------------------------------------------------------------------ building and checking

    def _trigger_kwargs(
        self,
        request: dict[str, Any],
        condition: Any,
        source: dict[str, Any] | None,
        *,
        namespace: str,
        deadline: float | None,
        budget: Any,
        skip_states: list[str] | None = None,
    ) -> dict[str, Any]:
        """The decision trigger's keyword arguments: the one place the sensor builds its trigger
        (first deferral, start from the triggerer, waiting again after a review)."""
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
            **({"skip_states": skip_states} if skip_states else {}),
            **({"end_when_unmet": True} if self._ends_when_unmet(source) else {}),
        }

    def _request(self) -> dict[str, Any]:
        questions = self.questions
        if questions is None:
            if not self.instructions:
                raise SystemZeroArgumentError(
                    "instructions is required when questions is not given: say what to "
                    "decide, e.g. 'Is the job ready?'",
                    code="invalid_question",
                    field="instructions",
                )
            questions = {self.question: {"type": "boolean", "instructions": self.instructions}}
        return build_request_dict(
            questions=questions,
            model=self.model,
            route=self.route,
            mode=self.request_mode,
            prompt_cache_key=self.prompt_cache_key,
        )

    def _condition(self) -> DecisionCondition:
        return DecisionCondition(
            self.question,
            self.expect,
            self.min_confidence,
            self.min_probability,
            policy=self.policy.to_dict() if self.policy is not None else None,
            consecutive=self.consecutive,
            min_true_for=self.min_true_for,
        )

    def _check_state(self, request: dict[str, Any] | None) -> dict[str, Any]:
        """The normalised source, once the state and source are known to be usable."""
        source = validate_source_spec(self.source, self.state)
        if request is not None:
            validate_state_for_request(request, self.state)
        if self._is_static(source) and self.consecutive != 1 and not self.wait_on_static_state:
            raise SystemZeroArgumentError(
                f"consecutive={self.consecutive} needs successive states, but with no "
                "source the state never changes: give a source, or drop consecutive",
                code="invalid_hysteresis",
                field="consecutive",
            )
        return source

    @staticmethod
    def _is_static(source: dict[str, Any] | None) -> bool:
        return source is None or source.get("type") == "static"

    def _ends_when_unmet(self, source: dict[str, Any] | None) -> bool:
        """Whether a decision that does not meet the condition ends the wait (a static state)."""
        return self._is_static(source) and not self.wait_on_static_state

    def _static_unmet(self, reason: str) -> None:
        """A static state was decided and did not meet the condition: nothing can change that."""
        message = (
            f"{self.task_id}: the state has no source, so it never changes and no later decision can "
            f"differ, and this one did not meet the condition ({reason}): give a source that changes "
            "(source={'type': 'file', ...}), or pass wait_on_static_state=True to wait until the timeout"
        )
        if self.soft_fail:
            raise AirflowSkipException(message)
        raise AirflowFailException(message)

    def _build(self) -> tuple[dict[str, Any], DecisionCondition, dict[str, Any] | None]:
        """The request, the condition and the source; fails the task (no retry) on bad input."""
        try:
            request = self._request()
            condition = self._condition()
            condition.check_questions(request["questions"])
            validate_decision_mode(self.decision_mode)
            source = self._check_state(request)
        except ARGUMENT_ERRORS as exc:
            raise AirflowFailException(f"{self.task_id}: {exc}") from None
        return request, condition, source

    def _deadline(self) -> float | None:
        timeout = self.timeout.total_seconds() if isinstance(self.timeout, timedelta) else self.timeout
        return None if timeout is None else time.time() + float(timeout)

    # ------------------------------------------------------------------ running

    def execute(self, context: Context) -> Any:
        """Defer at once (deferrable) or poke."""
        request, condition, source = self._build()
        if self._is_static(source):  # when it runs: a template may fill it
            try:
                refuse_empty_state(self.state, allow_empty=self.allow_empty)
            except ARGUMENT_ERRORS as exc:
                raise AirflowFailException(f"{self.task_id}: {exc}") from None
        check_connection_before_deferring(self.task_id, self.systemzero_conn_id, request.get("model"))
        if not self.deferrable:
            return super().execute(context)
        trigger = SystemZeroDecisionTrigger(
            **self._trigger_kwargs(
                request,
                condition,
                source,
                namespace=context_namespace(context, salt=self.key_salt),
                deadline=self._deadline(),
                budget=self.trigger_budget(context),
            )
        )
        timeout = (
            self.timeout if isinstance(self.timeout, timedelta) else timedelta(seconds=float(self.timeout))
        )
        self.defer(trigger=trigger, method_name="execute_complete", timeout=timeout + _DEFER_GRACE)

    def poke(self, context: Context) -> PokeReturnValue:
        """One on_request decision about the source's current state."""
        from airflow_provider_systemzero.hooks.systemzero import SystemZeroHook

        request, condition, source = self._build()
        if self.mode == "poke" and not self._slot_noted:
            self._slot_noted = True
            self.log.warning(
                "poke mode: this sensor holds a worker slot for its whole wait (timeout %s s); pass "
                "deferrable=True (or set [operators] default_deferrable = True) to wait in the "
                "triggerer instead",
                self.timeout,
            )
        try:
            state = read_source_once(source, self.state)
            validate_state_for_request(request, state, field=self._source_name(source))
        except ARGUMENT_ERRORS as exc:
            raise AirflowFailException(f"{self.task_id}: {exc}") from None
        namespace = context_namespace(context, salt=self.key_salt)
        decision = self.decide_with_budget(
            context,
            lambda budget: SystemZeroHook(systemzero_conn_id=self.systemzero_conn_id).decide(
                request, state=state, key_namespace=namespace, identity=namespace, budget=budget
            ),
        )
        from airflow_provider_systemzero.decisions.policy import state_info

        info = state_info(state)
        if self._watch is None:
            self._watch = DecisionWatch(
                condition, skip_states=self._skip_states, end_when_unmet=self._ends_when_unmet(source)
            )
        verdict = self._watch.observe(decision, info["state_hash"], state, time.monotonic())
        if verdict is None:
            return PokeReturnValue(is_done=False)
        event = self._watch.event(
            verdict,
            extra={
                "key_namespace": namespace,
                "state_info": info,
                "deadline": None,
                "skip_states": list(self._skip_states),
            },
        ).to_payload()
        if event["status"] == "unmet":
            self._static_unmet(str(event["reason"]))
        if event["status"] == "policy":
            return self._finish(context, event, request)
        return PokeReturnValue(is_done=True, xcom_value=self._finish(context, event, request))

    @staticmethod
    def _source_name(source: Any) -> str:
        """The state's origin, for messages: the file, the callable, or the ``state`` argument."""
        if isinstance(source, dict) and source.get("type") in ("file", "callable"):
            return f"the {source['type']} source {source.get('path')!r}"
        return "state"

    # ------------------------------------------------------------------ the policy and the record

    def _finish(self, context: Context, event: dict[str, Any], request: dict[str, Any] | None = None) -> Any:
        """Act on a decision that ended the wait (or wants a person): record it, then return the
        summary, ask a person, fail or skip."""
        if request is None:
            request, _, _ = self._build()
        spec = request["questions"].get(self.question, {})
        info = event.get("state_info") if isinstance(event.get("state_info"), dict) else {}
        answer = {
            "decision": event.get("decision"),
            "probability": event.get("probability"),
            "confidence": event.get("confidence"),
            "alternatives": event.get("alternatives") or [],
        }
        gate = Gate(
            question=self.question,
            kind=spec.get("type", "boolean"),
            instructions=spec.get("instructions"),
            options=list(spec["options"]) if spec.get("options") else None,
            answer=answer,
            model=event.get("model"),
            reply_id=event.get("reply_id"),
            request_id=event.get("request_id"),
            state_version=event.get("state_version"),
            state_hash=event.get("state_hash") or info.get("state_hash"),
            state_bytes=info.get("state_bytes"),
            preview=info.get("preview"),
            extra={
                "summary": WatchEvent.from_payload(event).summary(),
                "deadline": event.get("deadline"),
                "skip_states": list(event.get("skip_states") or []),
                "streak": event.get("streak"),
            },
        )
        from airflow_provider_systemzero.decisions.policy import PolicyOutcome

        action = event.get("action") or "act"
        outcome = (
            PolicyOutcome(**event["outcome"])
            if isinstance(event.get("outcome"), dict)
            else PolicyOutcome(action, event.get("reason") or "", "no_bar")
        )
        if action == "review":
            stored = self._stored_review(context, gate)
            if stored is None:
                self._request_review(context, gate, outcome)
            record = self._record(
                gate,
                outcome,
                decision=stored.get("decision"),
                decided_by=stored["decided_by"],
                reason=stored["reason"],
                review=stored.get("review"),
            )
            if stored.get("decision") is None:
                return self._fallback(
                    context, gate, {**record, "action": self.policy.below if self.policy else "wait"}
                )
            return self._apply(context, gate, record)
        if action in ("fail", "skip"):
            record = self._record(
                gate, outcome, decision=None, decided_by="policy", reason=event.get("reason") or ""
            )
            return self._fallback(context, gate, record)
        decided_by = "policy" if action == "default" else "model"
        decision = (
            self.policy.default if action == "default" and self.policy is not None else event.get("decision")
        )
        record = self._record(
            gate, outcome, decision=decision, decided_by=decided_by, reason=event.get("reason") or ""
        )
        return self._apply(context, gate, record)

    def _push_timeout_record(self, context: Context, event: dict[str, Any]) -> None:
        """The wait ended on the deadline: push the ``decision`` record saying so (nothing was decided)."""
        from airflow_provider_systemzero.decisions.policy import decision_record

        reason = str(event.get("message") or "no decision met the condition before the deadline")
        self._push_record(
            context,
            decision_record(
                question=self.question,
                answer=None,
                decision=None,
                action="wait",
                decided_by=None,
                reason=reason,
                policy=self.policy,
                effect={"fired": False, "timed_out": True, "soft_fail": bool(self.soft_fail)},
            ),
        )

    def _record(self, gate: Gate, outcome: Any, **kwargs: Any) -> dict[str, Any]:
        record = super()._record(gate, outcome, **kwargs)
        if gate.extra.get("streak"):
            record["streak"] = gate.extra["streak"]
        return record

    def _expected(self, decision: Any) -> bool:
        wanted = self.expect if isinstance(self.expect, list) else [self.expect]
        return decision in wanted and isinstance(decision, bool) == isinstance(wanted[0], bool)

    def _apply(self, context: Context, gate: Gate, record: dict[str, Any]) -> Any:
        """Fire with the decision that took effect, or — when a person said no — keep waiting."""
        if not self._expected(record["decision"]):
            record["effect"] = {"fired": False, "waiting": True}
            self._push_record(context, record)
            return self._wait_again(context, gate)
        record["effect"] = {"fired": True}
        self._push_record(context, record)
        summary = dict(gate.extra.get("summary") or {})
        if self.policy is not None:
            summary.update(
                decision=record["decision"], decided_by=record["decided_by"], action=record["action"]
            )
        return summary

    def _fallback(self, context: Context, gate: Gate, record: dict[str, Any]) -> Any:
        if record["action"] == "wait":
            record["effect"] = {"fired": False, "waiting": True}
            self._push_record(context, record)
            return self._wait_again(context, gate)
        return super()._fallback(context, gate, record)

    def _wait_again(self, context: Context, gate: Gate) -> Any:
        """Keep waiting, ignoring the state a person already answered about."""
        skip = [*gate.extra.get("skip_states", []), *([gate.state_hash] if gate.state_hash else [])]
        self.log.info("keep waiting for a new state (%d state(s) already answered)", len(skip))
        if not self.deferrable:
            self._skip_states = skip
            self._watch = None
            return BaseSensorOperator.execute(self, context)
        request, condition, source = self._build()
        deadline = gate.extra.get("deadline") or self._deadline()
        # the same trigger as the first deferral (the task's spending cap included), minus the
        # states a person already answered about
        trigger = SystemZeroDecisionTrigger(
            **self._trigger_kwargs(
                request,
                condition,
                source,
                namespace=context_namespace(context, salt=self.key_salt),
                deadline=deadline,
                budget=self.trigger_budget(context),
                skip_states=skip,
            )
        )
        remaining = timedelta(seconds=max(1.0, deadline - time.time())) if deadline else None
        self.defer(
            trigger=trigger,
            method_name="execute_complete",
            timeout=remaining + _DEFER_GRACE if remaining is not None else None,
        )

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> dict[str, Any]:
        """Resume after the trigger fired; idempotent (an event may be delivered more than once).

        :param event: the trigger's payload.
        :return: the decision summary (pushed to XCom as ``return_value``).
        """
        # Started from the triggerer, the trigger's namespace is the template rendered there; this
        # task's own copy was rendered the same way before the resume. A mapped sensor still defers
        # from a worker with the derived namespace.
        accepted = {context_namespace(context, salt=self.key_salt)}
        if self.start_from_trigger and self.key_namespace:
            accepted.add(self.key_namespace)
        event = owned_event(self.task_id, event, accepted)
        self.usage_from_event(context, event)  # the usage XCom; fails the task when the budget stopped it
        status = event["status"]
        if status in ("success", "policy"):
            summary = WatchEvent.from_payload(event).summary()
            self.log.info(
                "System Zero decided %s = %r (probability %s, confidence %s) at state version %s",
                summary["question"],
                summary["decision"],
                summary["probability"],
                summary["confidence"],
                summary["state_version"],
            )
            return self._finish(context, event)
        if status == "unmet":
            self._static_unmet(str(event.get("reason")))
        message = f"{self.task_id}: {event.get('message', 'the trigger failed')}"
        if event.get("code") == "decide_body_too_large":
            message += (
                f" (the state comes from {self._source_name(self.source)}: send less, e.g. a callable "
                "source that returns the last part of the log, or a summary)"
            )
        if status == "timeout":
            self._push_timeout_record(context, event)
            if self.soft_fail:
                raise AirflowSkipException(message)
            from airflow_provider_systemzero.compat import AirflowSensorTimeout

            raise AirflowSensorTimeout(message)
        if event.get("error_type") in _FATAL_ERRORS:
            raise AirflowFailException(message)
        raise AirflowException(message)
