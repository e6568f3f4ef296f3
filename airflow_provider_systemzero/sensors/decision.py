"""A deferrable sensor that waits for a System Zero decision about a changing state.

The sensor is one class: its arguments, parsed into
:class:`~airflow_provider_systemzero.sensors.inputs.SensorInputs` and checked (at parse time where
they are literal, else when the task runs), and the Airflow paths (defer, poke, resume) and how a
wait ends, as its methods. What "this decision ends the wait" means is
:class:`~airflow_provider_systemzero.decisions.watch.VerdictRules`, the same for the trigger and
the poke (whose state across pokes is :class:`~airflow_provider_systemzero.sensors.poking.PokeWatch`);
acting on a decision is :class:`~airflow_provider_systemzero.tasks.review.PolicyGateMixin`, the same
for the operators.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn

from airflow.configuration import conf
from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.triggers.base import StartTriggerArgs

from airflow_provider_systemzero.compat import (
    AirflowFailException,
    AirflowSensorTimeout,
    AirflowSkipException,
    AirflowTaskTimeout,
    has_trigger_templates,
)
from airflow_provider_systemzero.decisions.conditions import DecisionCondition
from airflow_provider_systemzero.decisions.policy import PolicyOutcome, decision_record
from airflow_provider_systemzero.decisions.relevance import DecisionFilter
from airflow_provider_systemzero.decisions.source_watch import DEFAULT_MAX_STALENESS, validate_max_staleness
from airflow_provider_systemzero.decisions.watch import WatchEvent
from airflow_provider_systemzero.exceptions import ARGUMENT_ERRORS, SystemZeroArgumentError
from airflow_provider_systemzero.hooks.systemzero import (
    DEFAULT_DECIDE_TIMEOUT,
    SystemZeroHook,
    check_connection_before_deferring,
)
from airflow_provider_systemzero.identity import context_namespace
from airflow_provider_systemzero.protocol.desired import MAX_KEY_NAMESPACE_LENGTH
from airflow_provider_systemzero.protocol.validation import (
    validate_decision_mode,
    validate_min_interval_ms,
    validate_route_and_mode,
)
from airflow_provider_systemzero.questions import build_request_dict, validate_state_for_request
from airflow_provider_systemzero.sensors.inputs import (
    FLAGS,
    REQUEST_FIELDS,
    RUN_ID_ROOM,
    START_FROM_TRIGGER_NAMESPACE,
    TEMPLATE_FIELDS,
    TEMPLATED_QUESTION,
    SensorInputs,
    check_min_true_for,
    min_true_for_seconds,
    source_name,
)
from airflow_provider_systemzero.sensors.poking import PokeWatch
from airflow_provider_systemzero.sources.spec import (
    check_changes_possible,
    is_static,
    plain_source,
    refuse_rendered_state,
    state_templates,
    validate_source_spec,
)
from airflow_provider_systemzero.stream.exceptions import DeadlineExceeded
from airflow_provider_systemzero.tasks.checks import (
    check_conn_id,
    check_flag,
    check_key_salt,
    check_lease_after,
    has_template,
    instruction_templates,
    is_literal,
    option_templates,
    parse_time,
    refuse_empty_state,
    refuse_rendered_none,
    refuse_rendered_none_instructions,
    refuse_rendered_none_options,
    template_of,
)
from airflow_provider_systemzero.tasks.deadlines import (
    bound_by_execution_timeout,
    deadline_in,
    defer_timeout,
    in_seconds,
    timeout_reason,
    wait_bound,
)
from airflow_provider_systemzero.tasks.payloads import task_failure
from airflow_provider_systemzero.tasks.review import Gate, PolicyGateMixin, answer_record
from airflow_provider_systemzero.tasks.usage import UsageBudgetMixin
from airflow_provider_systemzero.triggers.decision import SystemZeroDecisionTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_systemzero.protocol.body import JSONValue
    from airflow_provider_systemzero.protocol.reply import DecisionResult

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
        before each dispatch (``None``: no cap); see :mod:`~airflow_provider_systemzero.tasks.usage`.
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
    UI's "Decision timeline", see :mod:`~airflow_provider_systemzero.tasks.history`).
    """

    template_fields: Sequence[str] = TEMPLATE_FIELDS
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
            self.consecutive, self.min_true_for = consecutive, min_true_for_seconds(min_true_for)
            self.model, self.route, self.request_mode = model, route, request_mode
            self.decision_mode, self.prompt_cache_key = decision_mode, prompt_cache_key
            self.systemzero_conn_id, self.deferrable, self.key_salt = systemzero_conn_id, deferrable, key_salt
            self.lease, self.lease_after, self.wait_on_static_state = lease, lease_after, wait_on_static_state
            self._check_plain()
            self._init_review(policy, review_assigned_users, review_notifiers, review_subject)
            self.min_interval_ms = validate_min_interval_ms(min_interval_ms)
            self.max_staleness = validate_max_staleness(max_staleness)
            self.decision_filter = self._decision_filter(decide_when, debounce_ms, decide_initial)
            self.key_namespace: str | None = None  # the start-from-trigger namespace (a template)
            self._templates = self._templates_of()
            #: the poke's watch, kept across the pokes of one process (a poking sensor's)
            self.poke_watch = PokeWatch()
            #: the inputs as parsed from the rendered arguments, once per process (``None``: not yet)
            self._inputs: SensorInputs | None = None
            self._check_literals()
            self._start_in_triggerer(start_from_trigger)

    # -- the inputs: the arguments parsed and checked -------------------------------------------

    def parse_inputs(self, *, running: bool = False) -> SensorInputs:
        """The request, the condition and the source, parsed from the arguments as they stand
        (rendered, once the task runs); fails the task (no retry) on bad input.

        :param running: the task starts: a static state must not be empty, nor a value rendered
            as ``'None'`` (a template may fill them, so this is checked only now).
        :raises AirflowFailException: naming the argument, the problem and the fix.
        """
        try:
            if running:  # the watched question's name, asked as 'None' with no questions=
                refuse_rendered_none(
                    self.question, self._templates["question"], field="question", code="invalid_question"
                )
            request = self._request()
            if running:
                refuse_rendered_none_instructions(request["questions"], self._templates["questions"])
                refuse_rendered_none_options(request["questions"], self._templates["options"])
            condition = self._condition()
            condition.check_questions(request["questions"])
            validate_decision_mode(self.decision_mode)
            if running:  # before _checked_source: a path rendered as 'None' is named so, not as relative
                refuse_rendered_state(
                    self.state, self.source, self._templates["state"], allow_empty=self.allow_empty
                )
            source = self._checked_source(request)
        except ARGUMENT_ERRORS as exc:
            raise AirflowFailException(f"{self.task_id}: {exc}") from None
        return SensorInputs(request, condition, source)

    @property
    def inputs(self) -> SensorInputs:
        """The inputs, parsed once per process from the rendered arguments (:meth:`parse_inputs`)."""
        if self._inputs is None:
            self._inputs = self.parse_inputs()
        return self._inputs

    def _request(self) -> dict[str, Any]:
        """The decide request (questions, model, route, mode, cache key).

        :raises SystemZeroArgumentError: naming the field.
        """
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

    def _condition(self, question: str | None = None) -> DecisionCondition:
        """The condition: the expected answer, its bars, the policy and the hysteresis.

        :param question: the watched question in place of ``self.question`` (``None``: that one).
        """
        return DecisionCondition(
            self.question if question is None else question,
            self.expect,
            self.min_confidence,
            self.min_probability,
            policy=self.policy.to_dict() if self.policy is not None else None,
            consecutive=self.consecutive,
            min_true_for=self.min_true_for,
        )

    def _checked_source(self, request: dict[str, Any] | None) -> dict[str, Any]:
        """The normalised source, once the state and source are known to be usable.

        :param request: the request, to check the state against (``None``: not known yet).
        """
        source = validate_source_spec(self.source, self.state)
        if request is not None:
            validate_state_for_request(request, self.state, templated="state" in self.template_fields)
        if not self.wait_on_static_state:  # the author asked to wait until the timeout
            check_changes_possible(source, consecutive=self.consecutive)
        return source

    def _ends_when_unmet(self, source: dict[str, Any] | None) -> bool:
        """Whether a decision that does not meet the condition ends the wait (a static state)."""
        return is_static(source) and not self.wait_on_static_state

    def _check_plain(self) -> None:
        """Parse time: check the arguments that are not templated (so always plain values) and that
        nothing else checks before the task runs."""
        for name, meaning in FLAGS.items():
            check_flag(name, getattr(self, name), meaning)
        check_lease_after(self.lease_after)
        check_key_salt(self.key_salt)
        check_conn_id(self.systemzero_conn_id)
        validate_route_and_mode(self.route, self.request_mode, route_field="route", mode_field="request_mode")

    def _check_literals(self) -> None:
        """Parse time: check every argument that no template or XComArg can still change.

        A templated ``question`` is checked when the task runs (:meth:`parse_inputs`); until then the
        rest of the condition is checked about a stand-in question.
        """
        self._check_hysteresis()
        if not self.deferrable and in_seconds(self.poke_interval) == 0:
            # each poke opens a stream and asks a decision: no pause between them hammers the gateway
            raise ValueError(
                f"{self.task_id}: poke_interval=0 would open a stream and ask a decision in a tight "
                "loop: pass the seconds between pokes (e.g. poke_interval=60), or deferrable=True to be "
                "told of each change as it happens"
            )
        if self.deferrable and in_seconds(self.timeout) == 0:
            raise ValueError(
                f"{self.task_id}: timeout=0 leaves a deferred sensor no time to decide (its deadline "
                "passes before the trigger starts): pass the seconds the wait may take, e.g. timeout=3600"
            )
        literal = {name: is_literal(getattr(self, name)) for name in self.template_fields}
        with parse_time(self.task_id):
            condition = self._condition(None if literal["question"] else TEMPLATED_QUESTION)
            check_min_true_for(
                condition.min_true_for, in_seconds(self.timeout), in_seconds(self.execution_timeout)
            )
            validate_decision_mode(self.decision_mode)
            request = None
            if all(literal[name] for name in REQUEST_FIELDS):
                request = self._request()
                condition.check_questions(request["questions"])
            if literal["state"] and literal["source"] and is_static(self._checked_source(request)):
                refuse_empty_state(self.state, allow_empty=self.allow_empty)

    def _check_hysteresis(self) -> None:
        """A rescheduled poke forgets the run of decisions that hysteresis counts: refuse it."""
        if (self.consecutive != 1 or self.min_true_for) and not self.deferrable and self.mode == "reschedule":
            raise ValueError(
                f"{self.task_id}: consecutive/min_true_for need a deferrable sensor or mode='poke' "
                "(a rescheduled poke forgets the run of decisions)"
            )

    def _decision_filter(
        self, decide_when: str | dict[str, str] | None, debounce_ms: int | None, decide_initial: bool
    ) -> DecisionFilter:
        """The sensor's ``decide_when`` / ``debounce_ms`` / ``decide_initial``, checked at parse time.

        A bad regular expression, callable path or debounce is an import error naming the field, and
        so is any of them in a sensor that pokes, where nothing would apply them.
        """
        check_changes_possible(self.source, decide_initial=decide_initial)
        decision_filter = DecisionFilter(
            decide_when=decide_when, debounce_ms=debounce_ms, decide_initial=decide_initial
        )
        if decision_filter.active and not self.deferrable:
            # the arguments that made the filter active (DecisionFilter.active), as the author wrote them
            given = [
                name
                for name, makes_active in (
                    ("decide_when", decide_when is not None),
                    ("debounce_ms", bool(debounce_ms)),
                    ("decide_initial=False", not decide_initial),
                )
                if makes_active
            ]
            raise SystemZeroArgumentError(
                f"{', '.join(given)} take{'s' if len(given) == 1 else ''} effect only while the sensor waits "
                "in the triggerer, and this one pokes (deferrable=False, or [operators] default_deferrable "
                "off): pass deferrable=True, or drop "
                f"{'it' if len(given) == 1 else 'them'}",
                code="invalid_decision_filter",
                field=given[0].split("=")[0],
            )
        return decision_filter

    def _templates_of(self) -> dict[str, Any]:
        """The templates the sensor's arguments are rendered from, as written (``None``: a literal),
        kept so that a value rendered as the text ``'None'`` is named with its template when the task
        runs."""
        if self.questions is not None:
            questions = instruction_templates(self.questions)
        else:
            template = template_of(self.instructions)
            questions = {} if template is None else {self.question: ("instructions", template)}
        return {
            "state": state_templates(self.state, self.source),
            "question": template_of(self.question),
            "questions": questions,
            "options": option_templates(self.questions),
        }

    # -- the wait's bounds and the trigger ------------------------------------------------------

    def _start_in_triggerer(self, start_from_trigger: Any) -> None:
        """Parse time: set ``start_from_trigger`` (and the ``start_trigger_args`` it needs) when this
        Airflow can start the sensor in the triggerer."""
        check_flag("start_from_trigger", start_from_trigger, "start the wait in the triggerer")
        if start_from_trigger and not has_trigger_templates():
            self.log.warning(
                "%s: start_from_trigger needs Airflow 3.3, whose triggerer renders trigger templates; "
                "this Airflow starts the task on a worker, which defers at once",
                self.task_id,
            )
        self.start_from_trigger = start_from_trigger and has_trigger_templates()
        if self.start_from_trigger:
            self.start_trigger_args = self._start_trigger_args()

    def _start_trigger_args(self) -> StartTriggerArgs:
        """Parse time: the ``start_trigger_args`` of a sensor that starts in the triggerer.

        :raises ValueError: what the triggerer could not render, or IDs too long for the key namespace.
        """
        if not self.deferrable:
            raise ValueError(f"{self.task_id}: start_from_trigger=True needs deferrable=True")
        templated = [name for name in REQUEST_FIELDS if has_template(repr(getattr(self, name)))]
        if templated:
            raise ValueError(
                f"{self.task_id}: with start_from_trigger=True the triggerer renders only state and "
                f"source; {', '.join(templated)} must not be templated"
            )
        namespace = START_FROM_TRIGGER_NAMESPACE
        if self.key_salt is not None:
            if has_template(self.key_salt):
                raise ValueError(
                    f"{self.task_id}: key_salt must not be templated with start_from_trigger=True"
                )
            namespace += f".{self.key_salt}"
        if self.has_dag():
            fixed = len(namespace.split("{{", 1)[0]) + len(self.dag_id) + len(self.task_id) + len("...-1")
            if fixed + RUN_ID_ROOM > MAX_KEY_NAMESPACE_LENGTH:
                raise ValueError(
                    f"{self.task_id}: the Dag and task IDs (and key_salt) are too long for a "
                    f"start_from_trigger key namespace (at most {MAX_KEY_NAMESPACE_LENGTH} characters with "
                    f"the run ID); use shorter IDs or start_from_trigger=False"
                )
        try:
            inputs = self.parse_inputs()
        except AirflowFailException as exc:
            raise ValueError(str(exc)) from None
        self.key_namespace = namespace
        kwargs = self.trigger_kwargs(
            inputs, namespace=namespace, deadline=None, budget=self.start_trigger_budget(), skip=[]
        )
        return StartTriggerArgs(
            trigger_cls=f"{SystemZeroDecisionTrigger.__module__}.{SystemZeroDecisionTrigger.__qualname__}",
            trigger_kwargs=kwargs,
            next_method="execute_complete",
            next_kwargs=None,
            # the sensor's timeout, or its execution_timeout when shorter (Airflow applies that only
            # to the time on a worker); a sensor always has a timeout (Airflow's default: 7 days)
            timeout=timedelta(seconds=wait_bound(self, self.timeout) or 0),
        )

    def _own_namespaces(self, context: Context) -> set[str]:
        """The key namespaces a resumed sensor accepts an event for.

        Started from the triggerer, the trigger's namespace is the template rendered there; the task's
        own copy was rendered the same way before the resume. A mapped sensor still defers from a
        worker with the derived namespace.
        """
        accepted = {context_namespace(context, salt=self.key_salt)}
        if self.start_from_trigger and self.key_namespace:
            accepted.add(self.key_namespace)
        return accepted

    def trigger_kwargs(
        self,
        inputs: SensorInputs,
        namespace: str,
        deadline: float | None,
        budget: dict[str, Any],
        skip: list[str],
        review: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The trigger's kwargs: the one place the sensor builds its trigger (defer, start, wait again).

        A static state adds ``end_when_unmet`` (a decision that does not meet the condition ends the
        wait) and ``allow_empty`` (a state the triggerer renders may be empty or ``'None'``), each
        only when it applies.

        :param inputs: the sensor's parsed inputs (:meth:`parse_inputs`).
        :param namespace: the task instance's key namespace.
        :param deadline: the wait's absolute deadline (epoch seconds), ``None`` for none.
        :param budget: the task's spend caps and what the try spent so far.
        :param skip: hashes of the states a person said "no" about.
        :param review: this try's review request (:mod:`~airflow_provider_systemzero.triggers.review`).
        """
        source = inputs.source
        return {
            "systemzero_conn_id": self.systemzero_conn_id,
            "request": inputs.request,
            "condition": inputs.condition.to_dict(),
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
            **({"end_when_unmet": True} if self._ends_when_unmet(source) else {}),
            **({"allow_empty": True} if self.allow_empty and is_static(source) else {}),
            **({"review": review} if review else {}),
        }

    def _defer(
        self,
        context: Context,
        deadline: float | None,
        skip: list[str],
        review: dict[str, Any] | None = None,
    ) -> None:
        """Defer to the trigger (built from :attr:`inputs`) until ``deadline`` (``None``: the timeout from now), skipping ``skip``.

        :param review: this try's review request (open while a person is asked): the trigger
            watches on and follows it; an open one also goes to ``execute_complete``, which Airflow
            3.3 resumes with the person's answer directly.
        """
        deadline = deadline or deadline_in(self, self.timeout)  # execution_timeout, if shorter
        namespace, budget = context_namespace(context, salt=self.key_salt), self.trigger_budget(context)
        kwargs = self.trigger_kwargs(self.inputs, namespace, deadline, budget, skip, review)
        timeout = defer_timeout(deadline)
        self.defer(
            trigger=SystemZeroDecisionTrigger(**kwargs),
            method_name="execute_complete",
            kwargs={"review": review} if review and review.get("open") else None,
            timeout=timeout,
        )

    # -- the Airflow paths ----------------------------------------------------------------------

    def execute(self, context: Context) -> Any:
        """Defer at once (deferrable) or poke."""
        self._inputs = inputs = self.parse_inputs(running=True)
        check_connection_before_deferring(self.task_id, self.systemzero_conn_id, inputs.request.get("model"))
        if not self.deferrable:
            with self.poke_watch.explaining_timeout():
                return super().execute(context)
        self._defer(context, None, [])

    def poke(self, context: Context) -> PokeReturnValue:
        """One on_request decision about the source's current state."""
        event = self.poke_event(context)
        if event is None:
            return PokeReturnValue(is_done=False)
        if event.status == "unmet":
            self._static_unmet(str(event.reason))
        result = self._finish(context, event)
        return result if event.status == "policy" else PokeReturnValue(is_done=True, xcom_value=result)

    def poke_event(self, context: Context) -> WatchEvent | None:
        """One poke's read of the source, and its decision when the watch wants one
        (:class:`~airflow_provider_systemzero.sensors.poking.PokeWatch`).

        :return: the event that ends the wait (or asks a person), else ``None``.
        :raises AirflowFailException: the source's state cannot be sent.
        """
        if self.mode == "poke" and not self.poke_watch.started:
            self.log.warning(
                "poke mode: this sensor holds a worker slot for its whole wait (timeout %s s); pass "
                "deferrable=True (or set [operators] default_deferrable = True) to wait in the "
                "triggerer instead",
                self.timeout,
            )
        inputs = self.inputs
        namespace = context_namespace(context, salt=self.key_salt)
        return self.poke_watch.poke(
            inputs,
            state=self.state,
            end_when_unmet=self._ends_when_unmet(inputs.source),
            max_staleness=self.max_staleness,
            namespace=namespace,
            decide=lambda state: self._decide_poke(context, state, namespace),
            task_id=self.task_id,
            log=self.log,
        )

    def _decide_poke(self, context: Context, state: JSONValue, namespace: str) -> DecisionResult:
        """One on_request decision about ``state`` (the request of :attr:`inputs`), under the task's
        spending cap, ended by the sensor's timeout at the latest.

        :raises AirflowFailException: the state cannot be sent.
        :raises AirflowSensorTimeout: the sensor's timeout passed during the decision.
        """
        request = self.inputs.request
        try:
            body_bytes = validate_state_for_request(request, state, field=source_name(self.source))
        except ARGUMENT_ERRORS as exc:
            raise AirflowFailException(f"{self.task_id}: {exc}") from None
        hook = SystemZeroHook(systemzero_conn_id=self.systemzero_conn_id)
        # a poke's decide ends by the sensor's timeout (Airflow checks it only between pokes)
        time_left = self.poke_watch.time_left(self.timeout)
        limit = min(DEFAULT_DECIDE_TIMEOUT, time_left)
        try:
            return self.decide_with_budget(
                context,
                lambda budget: hook.decide(
                    request,
                    state=state,
                    key_namespace=namespace,
                    identity=namespace,
                    budget=budget,
                    timeout=limit,
                ),
                body_bytes,
            )
        except DeadlineExceeded as exc:
            if limit < time_left:
                raise  # the decide's own limit, not the sensor's timeout: Airflow's retries apply
            raise AirflowSensorTimeout(
                f"{self.task_id}: the sensor's timeout ({self.timeout} s) passed during a poke's "
                f"decision ({exc})"
            ) from None

    def execute_complete(
        self, context: Context, event: dict[str, Any] | None = None, review: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Resume after the trigger fired; idempotent (an event may be delivered more than once).

        :param event: the trigger's payload, or — on Airflow 3.3, whose API resumes a deferred task
            when a person answers its review — the person's answer.
        :param review: the review request open when the task deferred.
        :return: the decision summary (pushed to XCom as ``return_value``).
        """
        if review is not None and isinstance(event, Mapping) and "status" not in event:
            # a person's answer, which only the trigger can judge against the state the source holds
            # now: it watches on with the answer to judge. The answer is kept first, keyed by the
            # state it is about: a try that fails before the trigger fires (a worker lost, or
            # apache/airflow#71580's stale exit event) leaves a retry that takes it, not a person
            # asked again
            answer = {**event, "responded_at": _iso(event.get("responded_at"))}
            self._answer_kept(
                context, Gate.from_dict(review["gate"]), PolicyOutcome(**review["outcome"]), answer
            )
            self._defer_reviewing(context, {**review, "answer": answer})
        ended = self.resumed_event(context, event, self._own_namespaces(context))
        if ended.status == "review":
            return self._reviewed(context, ended)
        if ended.status not in ("success", "policy"):
            self._end_without_decision(context, ended)
        return self._finish(context, ended)

    # -- how a wait ends ------------------------------------------------------------------------

    def _finish(self, context: Context, event: WatchEvent) -> Any:
        """Act on a decision that ended the wait (or wants a person) under the policy: push the
        wait's ``decisions`` history, log the decision, and gate it."""
        self.push_history(context, event)
        self.log.info(
            "System Zero decided %s = %r (probability %s, confidence %s) at state version %s",
            event.question,
            event.decision,
            event.probability,
            event.confidence,
            event.state_version,
        )
        return self._gate(context, self._gate_of(event), _outcome_of(event))

    def _reviewed(self, context: Context, event: WatchEvent) -> Any:
        """A person answered the review while the sensor watched, or it timed out: an answer about
        the state the source still holds is taken ("Yes" fires, "No" waits again); one about a
        state since replaced is recorded and decides nothing."""
        self.push_history(context, event)
        review = dict(event.extra["review"])
        resume = event.extra["resume"]
        answer = review.pop("answer")
        gate = dict(resume["gate"])
        # the try so far, this wait included: without a task state store (3.1, 3.2) it travels here
        gate["extra"] = {**(gate.get("extra") or {}), "review": review, "this_try": self.this_try}
        if review.get("counted"):
            return self.execute_review_complete(context, event=answer, gate=gate, outcome=resume["outcome"])
        the_gate = Gate.from_dict(gate)
        outcome = PolicyOutcome(**resume["outcome"])
        self._answer_kept(context, the_gate, outcome, answer)  # for a retry that meets that state
        kept = answer_record(answer)
        about = f"about state version {the_gate.state_version} after the source moved on"
        if kept["timedout"]:
            what = f"the review timed out {about}: the policy's default is recorded"
        else:
            who = (kept["responded_by"] or {}).get("name") or "a person"
            what = f"{who} answered {kept['chosen_options']} {about}: the answer is recorded"
        reason = f"{what} and decides nothing about the newer state"
        self.log.info("%s", reason)
        record = self._record(the_gate, outcome, decision=None, decided_by=None, reason=reason, review=kept)
        return self._wait_again(context, the_gate, record)

    def _watches_while_asked(self) -> bool:
        """A deferrable sensor goes on watching its source while a person decides."""
        return bool(self.deferrable)

    def _watch_while_asked(
        self, context: Context, gate: Gate, outcome: PolicyOutcome, defaults: list[str] | None
    ) -> None:
        """Defer to the sensor's own trigger with the review open: it watches on, and follows the
        review (:mod:`~airflow_provider_systemzero.triggers.review`)."""
        timeout = self.policy.review_timedelta if self.policy is not None else None
        review = {
            "ti_id": str(context["task_instance"].id),
            "gate": gate.to_dict(),
            "outcome": outcome.to_dict(),
            "defaults": defaults,
            "timeout_at": None if timeout is None else time.time() + timeout.total_seconds(),
            "open": True,
        }
        self._defer_reviewing(context, review)

    def _defer_reviewing(self, context: Context, review: dict[str, Any]) -> None:
        """Defer to the trigger with ``review`` (open, or with an answer to judge), until the
        reviewed wait's deadline and skipping the states it skipped."""
        extra = review["gate"].get("extra") or {}
        self._defer(context, extra.get("deadline"), list(extra.get("skip_states") or []), review)

    def _gate_of(self, event: WatchEvent) -> Gate:
        """The gate of the watched question, carrying what the sensor needs after a review: the
        summary it returns, and the deadline, the skip states and the run of decisions to wait again.

        :param event: the event that ended the wait.
        """
        question = self.question
        answer = {
            "decision": event.decision,
            "probability": event.probability,
            "confidence": event.confidence,
            "alternatives": event.verdict.get("alternatives") or [],
        }
        extra = {
            "summary": event.summary(),
            "deadline": event.extra.get("deadline"),
            "skip_states": list(event.extra.get("skip_states") or []),
            "streak": event.verdict.get("streak"),
            # what the try spent so far: a wait after a person's "no" goes on counting from it
            "this_try": self.this_try,
            # this try's review request, once it was used (one per try)
            **({"review": event.extra["review"]} if event.extra.get("review") else {}),
        }
        spec = self.inputs.request["questions"].get(question, {})
        return Gate.of_event(question, spec, event, answer=answer, extra=extra)

    def _apply(self, context: Context, gate: Gate, record: dict[str, Any]) -> Any:
        """Fire with the decision that took effect, or — when a person said no — keep waiting.

        A sensor that fired returns (its ``return_value`` XCom) the decision's summary, with the
        decision that took effect, who decided and the policy's action when there is a policy.
        """
        if not self.inputs.condition.expects(record["decision"]):
            return self._wait_again(context, gate, record)
        record["effect"] = {"fired": True}
        self._push_record(context, record)
        summary = dict(gate.extra.get("summary") or {})
        if self.policy is not None:
            summary.update(
                decision=record["decision"], decided_by=record["decided_by"], action=record["action"]
            )
        return summary

    def _wait_again(self, context: Context, gate: Gate, record: dict[str, Any]) -> Any:
        """Push ``record`` (not fired) and keep waiting, ignoring the states a person answered about."""
        self.resume_try(gate.extra.get("this_try"))  # after a review: a process that counted nothing yet
        self._push_record(context, {**record, "effect": {"fired": False, "waiting": True}})
        skip = [*gate.extra.get("skip_states", []), *([gate.state_hash] if gate.state_hash else [])]
        self.log.info("keep waiting for a new state (%d state(s) already answered)", len(skip))
        if not self.deferrable:
            self.poke_watch = PokeWatch(skip)
            return BaseSensorOperator.execute(self, context)
        self._defer(context, gate.extra.get("deadline"), skip, gate.extra.get("review"))

    def _static_unmet(self, reason: str) -> NoReturn:
        """A static state was decided and did not meet the condition: nothing can change that."""
        message = (
            f"{self.task_id}: the state has no source, so it never changes and no later decision can "
            f"differ, and this one did not meet the condition ({reason}): give a source that changes "
            "(source={'type': 'file', ...}), or pass wait_on_static_state=True to wait until the timeout"
        )
        if self.soft_fail:
            raise AirflowSkipException(message)
        raise AirflowFailException(message)

    def _end_without_decision(self, context: Context, event: WatchEvent) -> NoReturn:
        """End a wait that no decision ended: a static state unmet, the deadline, or an error.

        :raises AirflowSensorTimeout: the deadline passed (``AirflowSkipException`` with ``soft_fail``).
        :raises AirflowFailException: retrying cannot help (:func:`~airflow_provider_systemzero.tasks.payloads.task_failure`).
        :raises AirflowException: Airflow's retries may.
        """
        self.push_history(context, event)  # why nothing fired, when the event tells it
        if event.status == "unmet":
            self._static_unmet(str(event.reason))
        fix = ""
        if event.error_code == "decide_body_too_large":
            fix = (
                f" (the state comes from {source_name(self.source)}: send less, e.g. a callable "
                "source that returns the last part of the log, or a summary)"
            )
        if event.status == "timeout":
            reason = timeout_reason(
                self,
                "timeout",
                self.timeout,
                {
                    **event.extra,
                    "message": event.message or "no decision met the condition before the deadline",
                },
                needs="the time the state takes to meet the condition, and a decision after that",
            )
            message = f"{self.task_id}: {reason}"
            effect = {"fired": False, "timed_out": True, "soft_fail": bool(self.soft_fail)}
            record = decision_record(
                question=self.question,
                answer=None,
                decision=None,
                action="wait",
                decided_by=None,
                reason=reason,
                policy=self.policy,
                effect=effect,
            )
            self._push_record(context, record)
            if self.soft_fail:
                raise AirflowSkipException(message)
            if bound_by_execution_timeout(self, self.timeout):
                # the wait was cut by execution_timeout, as Airflow would cut a running task: retried
                raise AirflowTaskTimeout(message)
            raise AirflowSensorTimeout(message)
        raise task_failure(self.task_id, event, fix=fix)


def _iso(value: Any) -> Any:
    """A time Airflow resumed a task with (a ``datetime``) as ISO 8601, for the trigger's kwargs."""
    return value.isoformat() if hasattr(value, "isoformat") else value


def _outcome_of(event: WatchEvent) -> PolicyOutcome:
    """The policy's outcome the watch reached, with the watch's reason (it names the answer)."""
    outcome = event.verdict.get("outcome")
    if not isinstance(outcome, Mapping):
        return PolicyOutcome(event.action, event.reason or "", "no_bar")
    return dataclasses.replace(PolicyOutcome(**outcome), action=event.action, reason=event.reason or "")
