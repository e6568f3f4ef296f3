"""How a :class:`~airflow_provider_systemzero.sensors.decision.SystemZeroDecisionSensor`'s wait
ends, given the :class:`~airflow_provider_systemzero.decisions.watch.WatchEvent` that ended it.

* A decision (``success``, or a ``policy`` verdict) pushes the wait's ``decisions`` history
  (:func:`decided`) and becomes a
  :class:`~airflow_provider_systemzero.utils.review.Gate` and the policy's outcome the watch
  reached (:func:`gate_of`, :func:`outcome_of`); the sensor acts on them through
  :class:`~airflow_provider_systemzero.utils.review.PolicyGateMixin`, like the operators.
* A static state whose decision did not meet the condition fails the task (:func:`static_unmet`).
* A deadline pushes the ``decision`` record saying nothing was decided; an error fails the task,
  with no retry when retrying cannot help (:func:`end_without_decision`). Either way the
  ``decisions`` history the event carries is pushed first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NoReturn

from airflow_provider_systemzero.compat import (
    AirflowFailException,
    AirflowSensorTimeout,
    AirflowSkipException,
    AirflowTaskTimeout,
)
from airflow_provider_systemzero.decisions.policy import PolicyOutcome, decision_record
from airflow_provider_systemzero.sensors.inputs import build_inputs, source_name
from airflow_provider_systemzero.triggers.payloads import task_failure
from airflow_provider_systemzero.utils.deadlines import bound_by_execution_timeout, timeout_reason
from airflow_provider_systemzero.utils.history import push_history
from airflow_provider_systemzero.utils.review import Gate

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_systemzero.decisions.watch import WatchEvent
    from airflow_provider_systemzero.sensors.task import DecisionSensorTask

__all__ = ["decided", "end_without_decision", "fired_summary", "gate_of", "outcome_of", "static_unmet"]


def gate_of(sensor: DecisionSensorTask, event: WatchEvent) -> Gate:
    """The gate of the watched question, carrying what the sensor needs after a review: the
    summary it returns, and the deadline, the skip states and the run of decisions to wait again.

    :param sensor: the sensor (its request is built again: the question's form).
    :param event: the event that ended the wait.
    """
    question = sensor.question
    request = build_inputs(sensor)[0]
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
        "this_try": sensor.this_try,
    }
    spec = request["questions"].get(question, {})
    return Gate.of_event(question, spec, event, answer=answer, extra=extra)


def fired_summary(gate: Gate, record: Mapping[str, Any], *, with_policy: bool) -> dict[str, Any]:
    """What a sensor that fired returns (its ``return_value`` XCom): the decision's summary, with
    the decision that took effect, who decided and the policy's action when there is a policy."""
    summary = dict(gate.extra.get("summary") or {})
    if with_policy:
        summary.update(decision=record["decision"], decided_by=record["decided_by"], action=record["action"])
    return summary


def outcome_of(event: WatchEvent) -> PolicyOutcome:
    """The policy's outcome the watch reached, with the watch's reason (it names the answer)."""
    outcome = event.verdict.get("outcome")
    if not isinstance(outcome, Mapping):
        return PolicyOutcome(event.action, event.reason or "", "no_bar")
    return dataclasses.replace(PolicyOutcome(**outcome), action=event.action, reason=event.reason or "")


def decided(sensor: DecisionSensorTask, context: Context, event: WatchEvent) -> None:
    """A decision ended the wait (or wants a person): push the wait's ``decisions`` history and log
    the decision."""
    push_history(sensor, context, event)
    sensor.log.info(
        "System Zero decided %s = %r (probability %s, confidence %s) at state version %s",
        event.question,
        event.decision,
        event.probability,
        event.confidence,
        event.state_version,
    )


def static_unmet(sensor: DecisionSensorTask, reason: str) -> NoReturn:
    """A static state was decided and did not meet the condition: nothing can change that."""
    message = (
        f"{sensor.task_id}: the state has no source, so it never changes and no later decision can "
        f"differ, and this one did not meet the condition ({reason}): give a source that changes "
        "(source={'type': 'file', ...}), or pass wait_on_static_state=True to wait until the timeout"
    )
    if sensor.soft_fail:
        raise AirflowSkipException(message)
    raise AirflowFailException(message)


def end_without_decision(sensor: DecisionSensorTask, context: Context, event: WatchEvent) -> NoReturn:
    """End a wait that no decision ended: a static state unmet, the deadline, or an error.

    :raises AirflowSensorTimeout: the deadline passed (``AirflowSkipException`` with ``soft_fail``).
    :raises AirflowFailException: retrying cannot help (:func:`~airflow_provider_systemzero.triggers.payloads.task_failure`).
    :raises AirflowException: Airflow's retries may.
    """
    push_history(sensor, context, event)  # why nothing fired, when the event tells it
    if event.status == "unmet":
        static_unmet(sensor, str(event.reason))
    fix = ""
    if event.error_code == "decide_body_too_large":
        fix = (
            f" (the state comes from {source_name(sensor.source)}: send less, e.g. a callable "
            "source that returns the last part of the log, or a summary)"
        )
    if event.status == "timeout":
        reason = timeout_reason(
            sensor,
            "timeout",
            sensor.timeout,
            {**event.extra, "message": event.message or "no decision met the condition before the deadline"},
            needs="the time the state takes to meet the condition, and a decision after that",
        )
        message = f"{sensor.task_id}: {reason}"
        effect = {"fired": False, "timed_out": True, "soft_fail": bool(sensor.soft_fail)}
        record = decision_record(
            question=sensor.question,
            answer=None,
            decision=None,
            action="wait",
            decided_by=None,
            reason=reason,
            policy=sensor.policy,
            effect=effect,
        )
        sensor._push_record(context, record)
        if sensor.soft_fail:
            raise AirflowSkipException(message)
        if bound_by_execution_timeout(sensor, sensor.timeout):
            # the wait was cut by execution_timeout, as Airflow would cut a running task: retried
            raise AirflowTaskTimeout(message)
        raise AirflowSensorTimeout(message)
    raise task_failure(sensor.task_id, event, fix=fix)
