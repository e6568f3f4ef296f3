"""What an asset watcher's trigger checks of its kwargs when it is built: in the Dag file.

A :class:`~airflow_provider_systemzero.triggers.decision.SystemZeroDecisionEventTrigger` is built
by the Dag author, not by one of the provider's tasks, so nothing else checks its kwargs before
the triggerer runs it; there a mistake would restart the trigger every few seconds, or be billed
on every change and never fire, with the cause only in the triggerer's log. Built in the Dag
file, the same mistake is an import error that names the argument and the fix, before anything
is sent or billed.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Collection, Iterator, Mapping
from typing import Any

from airflow_provider_systemzero.decisions.conditions import DecisionCondition
from airflow_provider_systemzero.exceptions import ARGUMENT_ERRORS, SystemZeroArgumentError
from airflow_provider_systemzero.protocol.body import JSONValue
from airflow_provider_systemzero.protocol.validation import validate_decision_mode
from airflow_provider_systemzero.questions import validate_state_for_request
from airflow_provider_systemzero.sources.spec import (
    check_changes_possible,
    plain_source,
    validate_source_spec,
)
from airflow_provider_systemzero.tasks.checks import check_conn_id, check_flag, check_lease_after

__all__ = ["check_watch_id", "checked_watch", "condition_dict", "naming_the_watch"]


def condition_dict(condition: Any) -> tuple[dict[str, Any], DecisionCondition]:
    """The condition as the trigger keeps it (plain JSON), and as it is checked: from a
    :class:`~airflow_provider_systemzero.decisions.conditions.DecisionCondition` or its
    :meth:`~airflow_provider_systemzero.decisions.conditions.DecisionCondition.to_dict`.

    :raises SystemZeroArgumentError: anything else, or a dict that is not a condition.
    """
    if isinstance(condition, DecisionCondition):
        return condition.to_dict(), condition
    if not isinstance(condition, Mapping):
        raise SystemZeroArgumentError(
            f"condition must be a DecisionCondition or its to_dict(), got {type(condition).__name__}: "
            "pass e.g. condition=DecisionCondition('ready', True, min_confidence=0.8)",
            code="invalid_condition",
            field="condition",
        )
    try:
        built = DecisionCondition.from_dict(condition)
    except TypeError as exc:  # an unknown or a missing key
        raise SystemZeroArgumentError(
            f"condition {dict(condition)!r} is not a condition ({exc}): build it with "
            "DecisionCondition(question, expect, ...).to_dict()",
            code="invalid_condition",
            field="condition",
        ) from None
    return dict(condition), built


def check_watch_id(watch_id: Any) -> None:
    """An asset watcher trigger's ``watch_id`` is a non-empty string (checked first: the other
    errors name the watch by it).

    :raises SystemZeroArgumentError: naming the argument and the fix.
    """
    if not isinstance(watch_id, str) or not watch_id.strip():
        raise SystemZeroArgumentError(
            f"SystemZeroDecisionEventTrigger: watch_id must be a non-empty string, got {watch_id!r}: a "
            "stable name for this watch (its keys and cache key derive from it), e.g. watch_id='nightly-job'",
            code="invalid_watch_id",
            field="watch_id",
        )


@contextlib.contextmanager
def naming_the_watch(watch_id: str, arguments: Collection[str]) -> Iterator[None]:
    """Around an asset watcher trigger's checks: an argument error raised inside names the watch,
    and the argument a field belongs to (the traceback of an import error shows only the
    provider's frames: the message says where).

    :param watch_id: the watch's name (checked: :func:`check_watch_id`).
    :param arguments: the trigger's argument names (a field that is none of them is inside the
        ``condition`` or the ``request``).
    :raises SystemZeroArgumentError: naming the watch, the argument, the problem and the fix.
    """
    try:
        yield
    except ARGUMENT_ERRORS as exc:
        field = exc.field or ""
        argument = field.split(".")[0]
        if argument and argument not in arguments:  # a field inside an argument: name the argument
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


#: The fields of the ``condition`` argument (any other field named inside an argument is the request's).
_CONDITION_FIELDS = frozenset(field.name for field in dataclasses.fields(DecisionCondition))


def checked_watch(
    *,
    systemzero_conn_id: str,
    request: dict[str, Any],
    condition: dict[str, Any] | DecisionCondition,
    state: JSONValue,
    source: dict[str, Any] | None,
    decision_mode: str,
    lease: bool,
    lease_after: float,
    decide_initial: bool,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Check an asset watcher trigger's kwargs, as the author gave them (the ``decide_when``
    filter and ``max_staleness`` check themselves:
    :class:`~airflow_provider_systemzero.triggers.watching.WatchingTrigger`).

    :return: the condition in its plain-JSON form (:func:`condition_dict`) and the plain source.
    :raises SystemZeroArgumentError: naming the argument, the problem and the fix.
    """
    kept, built = condition_dict(condition)
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
    return kept, source
