"""What a :class:`~airflow_provider_systemzero.sensors.decision.SystemZeroDecisionSensor`'s
arguments become, and the checks on them.

The sensor keeps its arguments; these functions read them (as rendered when the task runs, or as
written in the DAG file at parse time) and build the request, the condition and the source, or
say which argument is wrong and how to fix it. Nothing here talks to System Zero.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import StartTriggerArgs

from airflow_provider_systemzero.compat import AirflowFailException, has_trigger_templates
from airflow_provider_systemzero.decisions.conditions import DecisionCondition
from airflow_provider_systemzero.decisions.relevance import DecisionFilter
from airflow_provider_systemzero.decisions.source_watch import validate_max_staleness
from airflow_provider_systemzero.durations import is_seconds, readable
from airflow_provider_systemzero.exceptions import ARGUMENT_ERRORS, SystemZeroArgumentError
from airflow_provider_systemzero.identity import context_namespace
from airflow_provider_systemzero.protocol.desired import MAX_KEY_NAMESPACE_LENGTH
from airflow_provider_systemzero.protocol.validation import (
    validate_decision_mode,
    validate_min_interval_ms,
    validate_route_and_mode,
)
from airflow_provider_systemzero.questions import build_request_dict, validate_state_for_request
from airflow_provider_systemzero.sources.spec import (
    check_changes_possible,
    is_static,
    refuse_rendered_state,
    state_templates,
    validate_source_spec,
)
from airflow_provider_systemzero.triggers.decision import SystemZeroDecisionTrigger
from airflow_provider_systemzero.utils.checks import (
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
from airflow_provider_systemzero.utils.deadlines import deadline_in, in_seconds, wait_bound

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_systemzero.sensors.task import DecisionSensorTask

__all__ = [
    "START_FROM_TRIGGER_NAMESPACE",
    "TEMPLATE_FIELDS",
    "Inputs",
    "build_inputs",
    "can_start_from_trigger",
    "check_literals",
    "check_plain",
    "deadline_of",
    "ends_when_unmet",
    "is_expected",
    "min_true_for_seconds",
    "own_namespaces",
    "pacing",
    "source_name",
    "start_in_triggerer",
    "start_trigger_args",
    "static_state_kwargs",
]

#: The sensor's templated arguments.
TEMPLATE_FIELDS = (
    "question",
    "instructions",
    "questions",
    "state",
    "source",
    "model",
    "prompt_cache_key",
    "key_namespace",
)

#: The key namespace of a sensor that starts from the triggerer. The scheduler creates that trigger
#: before any worker runs, so the namespace cannot be derived from the task instance up front: it is
#: a template, rendered by the triggerer and rendered again (to the same value) on the worker that
#: resumes the task. Deterministic like :func:`~airflow_provider_systemzero.identity.task_namespace`.
START_FROM_TRIGGER_NAMESPACE = "sz-sft-{{ ti.dag_id }}.{{ ti.task_id }}.{{ ti.run_id }}.{{ ti.map_index }}"
#: The room kept for the run ID and map index in a key namespace (at most MAX_KEY_NAMESPACE_LENGTH).
_RUN_ID_ROOM = 64
#: The arguments that make up the request (the triggerer cannot render them).
_REQUEST_FIELDS = ("question", "instructions", "questions", "model", "prompt_cache_key")
#: The watched question's stand-in at parse time while a template still fills ``question``: the
#: rest of the condition (the expected answer, the bars, the policy, the hysteresis) is checked.
_TEMPLATED_QUESTION = "templated_question"
#: The sensor's on/off arguments (``start_from_trigger`` aside), and what ``True`` means.
_FLAGS = {
    "deferrable": "wait in the triggerer (False: poke from a worker)",
    "lease": "let the trigger give its stream back between decisions",
    "wait_on_static_state": "keep waiting, until the timeout, on a state that never changes",
    "allow_empty": "decide about an empty state",
}

#: ``(request, condition, source)``: what the sensor's trigger and its poke are built from.
Inputs = tuple[dict[str, Any], DecisionCondition, dict[str, Any] | None]


def request_of(sensor: DecisionSensorTask) -> dict[str, Any]:
    """The decide request (questions, model, route, mode, cache key).

    :raises SystemZeroArgumentError: naming the field.
    """
    questions = sensor.questions
    if questions is None:
        if not sensor.instructions:
            raise SystemZeroArgumentError(
                "instructions is required when questions is not given: say what to "
                "decide, e.g. 'Is the job ready?'",
                code="invalid_question",
                field="instructions",
            )
        questions = {sensor.question: {"type": "boolean", "instructions": sensor.instructions}}
    return build_request_dict(
        questions=questions,
        model=sensor.model,
        route=sensor.route,
        mode=sensor.request_mode,
        prompt_cache_key=sensor.prompt_cache_key,
    )


def condition_of(sensor: DecisionSensorTask, question: str | None = None) -> DecisionCondition:
    """The condition: the expected answer, its bars, the policy and the hysteresis.

    :param question: the watched question in place of ``sensor.question`` (``None``: that one).
    """
    return DecisionCondition(
        sensor.question if question is None else question,
        sensor.expect,
        sensor.min_confidence,
        sensor.min_probability,
        policy=sensor.policy.to_dict() if sensor.policy is not None else None,
        consecutive=sensor.consecutive,
        min_true_for=sensor.min_true_for,
    )


def ends_when_unmet(sensor: DecisionSensorTask, source: dict[str, Any] | None) -> bool:
    """Whether a decision that does not meet the condition ends the wait (a static state)."""
    return is_static(source) and not sensor.wait_on_static_state


def static_state_kwargs(sensor: DecisionSensorTask, source: dict[str, Any] | None) -> dict[str, bool]:
    """The trigger's kwargs about a static state, set only when they apply: ``end_when_unmet``
    (:func:`ends_when_unmet`) and ``allow_empty`` (a state the triggerer renders, when the sensor
    starts there, may be empty or ``'None'``)."""
    return {
        **({"end_when_unmet": True} if ends_when_unmet(sensor, source) else {}),
        **({"allow_empty": True} if sensor.allow_empty and is_static(source) else {}),
    }


def checked_source(sensor: DecisionSensorTask, request: dict[str, Any] | None) -> dict[str, Any]:
    """The normalised source, once the state and source are known to be usable.

    :param request: the request, to check the state against (``None``: not known yet).
    """
    source = validate_source_spec(sensor.source, sensor.state)
    if request is not None:
        validate_state_for_request(request, sensor.state, templated="state" in sensor.template_fields)
    if not sensor.wait_on_static_state:  # the author asked to wait until the timeout
        check_changes_possible(source, consecutive=sensor.consecutive)
    return source


def build_inputs(sensor: DecisionSensorTask, *, running: bool = False) -> Inputs:
    """The request, the condition and the source; fails the task (no retry) on bad input.

    :param running: the task starts: a static state must not be empty (a template may fill it,
        so this is checked only now).
    """
    try:
        if running:  # the watched question's name, asked as 'None' with no questions=
            refuse_rendered_none(
                sensor.question, sensor._templates["question"], field="question", code="invalid_question"
            )
        request = request_of(sensor)
        if running:
            refuse_rendered_none_instructions(request["questions"], sensor._templates["questions"])
            refuse_rendered_none_options(request["questions"], sensor._templates["options"])
        condition = condition_of(sensor)
        condition.check_questions(request["questions"])
        validate_decision_mode(sensor.decision_mode)
        if running:  # before checked_source: a path rendered as 'None' is named so, not as relative
            refuse_rendered_state(
                sensor.state, sensor.source, sensor._templates["state"], allow_empty=sensor.allow_empty
            )
        source = checked_source(sensor, request)
    except ARGUMENT_ERRORS as exc:
        raise AirflowFailException(f"{sensor.task_id}: {exc}") from None
    return request, condition, source


def check_plain(sensor: DecisionSensorTask) -> None:
    """Parse time: check the arguments that are not templated (so always plain values) and that
    nothing else checks before the task runs: the flags, ``lease_after``, ``key_salt``, the
    connection, ``route`` and ``request_mode`` (the review settings: ``_init_review``).

    :raises SystemZeroArgumentError: naming the argument, the problem and the fix (a
        :class:`~airflow_provider_systemzero.protocol.errors.LocalProtocolError` for the route and mode).
    """
    for name, meaning in _FLAGS.items():
        check_flag(name, getattr(sensor, name), meaning)
    check_lease_after(sensor.lease_after)
    check_key_salt(sensor.key_salt)
    check_conn_id(sensor.systemzero_conn_id)
    validate_route_and_mode(sensor.route, sensor.request_mode, route_field="route", mode_field="request_mode")


def pacing(min_interval_ms: Any, max_staleness: Any) -> tuple[int | None, float]:
    """Parse time: ``min_interval_ms`` and ``max_staleness`` (how often decisions start, how long a
    newer state may wait for one), checked and normalised."""
    return validate_min_interval_ms(min_interval_ms), validate_max_staleness(max_staleness)


def check_literals(sensor: DecisionSensorTask) -> None:
    """Parse time: check every argument that no template or XComArg can still change.

    A templated ``question`` is checked when the task runs (:func:`build_inputs`); until then the
    rest of the condition is checked about a stand-in question.
    """
    check_hysteresis(sensor)
    if not sensor.deferrable and in_seconds(sensor.poke_interval) == 0:
        # each poke opens a stream and asks a decision: no pause between them hammers the gateway
        raise ValueError(
            f"{sensor.task_id}: poke_interval=0 would open a stream and ask a decision in a tight "
            "loop: pass the seconds between pokes (e.g. poke_interval=60), or deferrable=True to be "
            "told of each change as it happens"
        )
    if sensor.deferrable and in_seconds(sensor.timeout) == 0:
        raise ValueError(
            f"{sensor.task_id}: timeout=0 leaves a deferred sensor no time to decide (its deadline "
            "passes before the trigger starts): pass the seconds the wait may take, e.g. timeout=3600"
        )
    literal = {name: is_literal(getattr(sensor, name)) for name in sensor.template_fields}
    with parse_time(sensor.task_id):
        condition = condition_of(sensor, None if literal["question"] else _TEMPLATED_QUESTION)
        check_min_true_for(
            condition.min_true_for, in_seconds(sensor.timeout), in_seconds(sensor.execution_timeout)
        )
        validate_decision_mode(sensor.decision_mode)
        request = None
        if all(literal[name] for name in _REQUEST_FIELDS):
            request = request_of(sensor)
            condition.check_questions(request["questions"])
        if literal["state"] and literal["source"] and is_static(checked_source(sensor, request)):
            refuse_empty_state(sensor.state, allow_empty=sensor.allow_empty)


def check_hysteresis(sensor: DecisionSensorTask) -> None:
    """A rescheduled poke forgets the run of decisions that hysteresis counts: refuse it."""
    if (
        (sensor.consecutive != 1 or sensor.min_true_for)
        and not sensor.deferrable
        and sensor.mode == "reschedule"
    ):
        raise ValueError(
            f"{sensor.task_id}: consecutive/min_true_for need a deferrable sensor or mode='poke' "
            "(a rescheduled poke forgets the run of decisions)"
        )


def min_true_for_seconds(value: Any) -> float:
    """Parse time: ``min_true_for`` in seconds, from a number of seconds or a ``timedelta``.

    :param value: the sensor's ``min_true_for`` as given.
    :raises SystemZeroArgumentError: naming the argument, the forms it takes and the fix.
    """
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if not is_seconds(seconds):  # a bool, a string such as "30s", a negative or endless time
        raise SystemZeroArgumentError(
            f"min_true_for must be a number of seconds (0 or more) or a timedelta, got "
            f"{type(value).__name__} {value!r}: pass e.g. min_true_for=30 or "
            "min_true_for=timedelta(seconds=30)",
            code="invalid_hysteresis",
            field="min_true_for",
        )
    return float(seconds)


def check_min_true_for(
    min_true_for: float, timeout: float | None, execution_timeout: float | None = None
) -> None:
    """A ``min_true_for`` not shorter than the bound of the sensor's wait can never be satisfied:
    the first qualifying decision comes after the wait starts, and the bound ends the wait first.
    The bound is ``timeout``, or ``execution_timeout`` when that is shorter
    (:func:`~airflow_provider_systemzero.utils.deadlines.wait_bound`).

    :param min_true_for: the condition's ``min_true_for`` (seconds, already checked).
    :param timeout: the sensor's ``timeout`` in seconds.
    :param execution_timeout: the task's ``execution_timeout`` in seconds (``None``: none).
    :raises SystemZeroArgumentError: naming both fields and the fix.
    """
    bound, name, first = timeout, "timeout", ""
    if execution_timeout is not None and (timeout is None or execution_timeout < timeout):
        bound, name = execution_timeout, "execution_timeout"
        first = "" if timeout is None else f", which ends the wait before timeout ({readable(timeout)}) does"
    if bound is not None and min_true_for > 0 and min_true_for >= bound:
        raise SystemZeroArgumentError(
            f"min_true_for ({readable(min_true_for)}) is not shorter than {name} ({readable(bound)}){first}: the "
            f"decisions must keep meeting the condition for min_true_for before the {name} ends "
            f"the wait, so the sensor could never succeed: shorten min_true_for, or raise {name} above it",
            code="invalid_hysteresis",
            field="min_true_for",
        )


def start_in_triggerer(sensor: DecisionSensorTask, start_from_trigger: Any) -> None:
    """Parse time: set ``start_from_trigger`` (and the ``start_trigger_args`` it needs) when this
    Airflow can start the sensor in the triggerer."""
    check_flag("start_from_trigger", start_from_trigger, "start the wait in the triggerer")
    sensor.start_from_trigger = start_from_trigger and can_start_from_trigger(sensor)
    if sensor.start_from_trigger:
        sensor.start_trigger_args = start_trigger_args(sensor)


def start_trigger_args(sensor: DecisionSensorTask) -> StartTriggerArgs:
    """Parse time: the ``start_trigger_args`` of a sensor that starts in the triggerer.

    :raises ValueError: what the triggerer could not render, or IDs too long for the key namespace.
    """
    if not sensor.deferrable:
        raise ValueError(f"{sensor.task_id}: start_from_trigger=True needs deferrable=True")
    templated = [name for name in _REQUEST_FIELDS if has_template(repr(getattr(sensor, name)))]
    if templated:
        raise ValueError(
            f"{sensor.task_id}: with start_from_trigger=True the triggerer renders only state and "
            f"source; {', '.join(templated)} must not be templated"
        )
    namespace = START_FROM_TRIGGER_NAMESPACE
    if sensor.key_salt is not None:
        if has_template(sensor.key_salt):
            raise ValueError(f"{sensor.task_id}: key_salt must not be templated with start_from_trigger=True")
        namespace += f".{sensor.key_salt}"
    if sensor.has_dag():
        fixed = len(namespace.split("{{", 1)[0]) + len(sensor.dag_id) + len(sensor.task_id) + len("...-1")
        if fixed + _RUN_ID_ROOM > MAX_KEY_NAMESPACE_LENGTH:
            raise ValueError(
                f"{sensor.task_id}: the Dag and task IDs (and key_salt) are too long for a "
                f"start_from_trigger key namespace (at most {MAX_KEY_NAMESPACE_LENGTH} characters with "
                f"the run ID); use shorter IDs or start_from_trigger=False"
            )
    try:
        inputs = build_inputs(sensor)
    except AirflowFailException as exc:
        raise ValueError(str(exc)) from None
    sensor.key_namespace = namespace
    kwargs = sensor._trigger_kwargs(
        inputs, namespace=namespace, deadline=None, budget=sensor.start_trigger_budget(), skip=[]
    )
    return StartTriggerArgs(
        trigger_cls=f"{SystemZeroDecisionTrigger.__module__}.{SystemZeroDecisionTrigger.__qualname__}",
        trigger_kwargs=kwargs,
        next_method="execute_complete",
        next_kwargs=None,
        timeout=timeout_of(sensor),
    )


def can_start_from_trigger(sensor: DecisionSensorTask) -> bool:
    """Whether this Airflow can start the sensor in the triggerer (a warning says why not)."""
    if not has_trigger_templates():
        sensor.log.warning(
            "%s: start_from_trigger needs Airflow 3.3, whose triggerer renders trigger templates; "
            "this Airflow starts the task on a worker, which defers at once",
            sensor.task_id,
        )
    return has_trigger_templates()


def own_namespaces(sensor: DecisionSensorTask, context: Context) -> set[str]:
    """The key namespaces a resumed sensor accepts an event for.

    Started from the triggerer, the trigger's namespace is the template rendered there; the task's
    own copy was rendered the same way before the resume. A mapped sensor still defers from a
    worker with the derived namespace.
    """
    accepted = {context_namespace(context, salt=sensor.key_salt)}
    if sensor.start_from_trigger and sensor.key_namespace:
        accepted.add(sensor.key_namespace)
    return accepted


def is_expected(sensor: DecisionSensorTask, decision: Any) -> bool:
    """Whether ``decision`` is the answer the sensor waits for (``True`` is not ``1``)."""
    wanted = sensor.expect if isinstance(sensor.expect, list) else [sensor.expect]
    return decision in wanted and isinstance(decision, bool) == isinstance(wanted[0], bool)


def templates_of(sensor: DecisionSensorTask) -> dict[str, Any]:
    """The templates the sensor's arguments are rendered from, as written (``None``: a literal),
    kept so that a value rendered as the text ``'None'`` is named with its template when the task
    runs: ``state`` and the source's path (``"state"``:
    :func:`~airflow_provider_systemzero.sources.spec.state_templates`), the watched
    ``question``'s name, the asked questions' texts
    (``"questions"``: :func:`~airflow_provider_systemzero.utils.checks.instruction_templates`, or
    that of ``instructions`` when it is the one question's text) and their options (``"options"``:
    :func:`~airflow_provider_systemzero.utils.checks.option_templates`)."""
    if sensor.questions is not None:
        questions = instruction_templates(sensor.questions)
    else:
        template = template_of(sensor.instructions)
        questions = {} if template is None else {sensor.question: ("instructions", template)}
    return {
        "state": state_templates(sensor.state, sensor.source),
        "question": template_of(sensor.question),
        "questions": questions,
        "options": option_templates(sensor.questions),
    }


def timeout_of(sensor: DecisionSensorTask) -> timedelta:
    """The wait's bound as a ``timedelta``: the sensor's ``timeout``, or its ``execution_timeout``
    when that is shorter (Airflow applies it only to the time on a worker)."""
    bound = wait_bound(sensor, sensor.timeout)
    assert bound is not None  # a sensor always has a timeout (Airflow's default: 7 days)
    return timedelta(seconds=bound)


def deadline_of(sensor: DecisionSensorTask) -> float | None:
    """The absolute deadline (epoch seconds) of a wait that starts now: the sensor's ``timeout``,
    or its ``execution_timeout`` when that is shorter (:func:`~airflow_provider_systemzero.utils.deadlines.deadline_in`)."""
    return deadline_in(sensor, sensor.timeout)


def source_name(source: object) -> str:
    """The state's origin, for messages: the file, the callable, or the ``state`` argument."""
    if isinstance(source, dict) and source.get("type") in ("file", "callable"):
        return f"the {source['type']} source {source.get('path')!r}"
    return "state"


def decision_filter(
    sensor: DecisionSensorTask,
    decide_when: str | dict[str, str] | None,
    debounce_ms: int | None,
    decide_initial: bool,
) -> DecisionFilter:
    """The sensor's ``decide_when`` / ``debounce_ms`` / ``decide_initial``, checked at parse time.

    A bad regular expression, callable path or debounce is an import error naming the field, and
    so is any of them in a sensor that pokes, where nothing would apply them.
    """
    check_changes_possible(sensor.source, decide_initial=decide_initial)
    decision_filter = DecisionFilter(
        decide_when=decide_when, debounce_ms=debounce_ms, decide_initial=decide_initial
    )
    if decision_filter.active and not sensor.deferrable:
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
