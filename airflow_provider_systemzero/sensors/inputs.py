"""What a :class:`~airflow_provider_systemzero.sensors.decision.SystemZeroDecisionSensor`'s
arguments become: :class:`SensorInputs`, the request, the condition and the source its trigger and
its poke are built from, and the checks on arguments that need nothing of the sensor.

The sensor parses its arguments (as rendered when the task runs, or as written in the DAG file at
parse time) with its own methods; what is here is plain. Nothing here talks to System Zero.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

from airflow_provider_systemzero.decisions.conditions import DecisionCondition
from airflow_provider_systemzero.durations import is_seconds, readable
from airflow_provider_systemzero.exceptions import SystemZeroArgumentError

__all__ = [
    "FLAGS",
    "REQUEST_FIELDS",
    "RUN_ID_ROOM",
    "START_FROM_TRIGGER_NAMESPACE",
    "TEMPLATED_QUESTION",
    "TEMPLATE_FIELDS",
    "SensorInputs",
    "check_min_true_for",
    "min_true_for_seconds",
    "source_name",
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
RUN_ID_ROOM = 64
#: The arguments that make up the request (the triggerer cannot render them).
REQUEST_FIELDS = ("question", "instructions", "questions", "model", "prompt_cache_key")
#: The watched question's stand-in at parse time while a template still fills ``question``: the
#: rest of the condition (the expected answer, the bars, the policy, the hysteresis) is checked.
TEMPLATED_QUESTION = "templated_question"
#: The sensor's on/off arguments (``start_from_trigger`` aside), and what ``True`` means.
FLAGS = {
    "deferrable": "wait in the triggerer (False: poke from a worker)",
    "lease": "let the trigger give its stream back between decisions",
    "wait_on_static_state": "keep waiting, until the timeout, on a state that never changes",
    "allow_empty": "decide about an empty state",
}


@dataclasses.dataclass(frozen=True)
class SensorInputs:
    """What the sensor's trigger and its poke are built from, parsed once from its arguments.

    :param request: the decide request (questions, model, route, mode, cache key).
    :param condition: the expected answer, its bars, the policy and the hysteresis.
    :param source: the normalised source (``None``: the state is static).
    """

    request: dict[str, Any]
    condition: DecisionCondition
    source: dict[str, Any] | None


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
    (:func:`~airflow_provider_systemzero.tasks.deadlines.wait_bound`).

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


def source_name(source: object) -> str:
    """The state's origin, for messages: the file, the callable, or the ``state`` argument."""
    if isinstance(source, dict) and source.get("type") in ("file", "callable"):
        return f"the {source['type']} source {source.get('path')!r}"
    return "state"
