"""SystemZeroDecisionSensor(start_from_trigger=True): what the scheduler, the triggerer and the
resuming worker each see. The real run (scheduler + triggerer, no worker before the resume) is
scenario 3 of ``tests/deployment``; here Airflow's own rendering code is driven directly."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pendulum
import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowException

from airflow_provider_systemzero.compat import AirflowFailException, has_trigger_templates
from airflow_provider_systemzero.identity import task_namespace
from airflow_provider_systemzero.sensors.decision import (
    START_FROM_TRIGGER_NAMESPACE,
    SystemZeroDecisionSensor,
)
from airflow_provider_systemzero.triggers.decision import SystemZeroDecisionTrigger

START = pendulum.datetime(2026, 1, 1, tz="UTC")
#: start_from_trigger renders its key namespace in the triggerer: Airflow 3.3 (tests/test_compat.py checks the fallback).
needs_trigger_templates = pytest.mark.skipif(
    not has_trigger_templates(),
    reason="start_from_trigger needs Airflow 3.3's triggerer template rendering; older releases defer from a worker",
)
RUN_ID = "manual__2026-01-02T03:04:05.678901+00:00"


def _sensor(**kwargs: Any) -> SystemZeroDecisionSensor:
    base: dict[str, Any] = {
        "task_id": "wait",
        "question": "ready",
        "instructions": "Is the job ready?",
        "model": "sz-test",
        "source": {"type": "file", "path": "{{ params.dir }}/job.log", "poll_interval": 0.5},
        "state": "run {{ ti.run_id }}: ",
        "timeout": 90,
        "start_from_trigger": True,
    }
    base.update(kwargs)
    return SystemZeroDecisionSensor(**base)


def _context(sensor: SystemZeroDecisionSensor) -> dict[str, Any]:
    ti = SimpleNamespace(
        dag_id=sensor.dag_id,
        task_id=sensor.task_id,
        run_id=RUN_ID,
        map_index=-1,
        xcom_push=lambda key, value: None,
    )  # the sensor pushes its ``decision`` record
    return {"ti": ti, "task_instance": ti, "params": {"dir": "/data/jobs"}, "run_id": RUN_ID}


def _in_triggerer(sensor: SystemZeroDecisionSensor) -> SystemZeroDecisionTrigger:
    """What the triggerer does for a start-from-trigger task: build the trigger from the scheduler's
    kwargs, attach the task instance, render the templated attributes, then run it."""
    args = sensor.start_trigger_args
    assert args is not None and args.trigger_kwargs is not None
    trigger = SystemZeroDecisionTrigger(**args.trigger_kwargs)
    trigger.task_instance = SimpleNamespace(task=sensor, task_id=sensor.task_id)
    trigger.render_template_fields(context=_context(sensor))
    return trigger


@needs_trigger_templates
def test_start_trigger_args_are_built_at_parse_time() -> None:
    with DAG("sft_dag", schedule=None, start_date=START):
        sensor = _sensor()
    args = sensor.start_trigger_args
    assert sensor.start_from_trigger is True and args is not None
    assert args.trigger_cls == "airflow_provider_systemzero.triggers.decision.SystemZeroDecisionTrigger"
    assert args.next_method == "execute_complete" and args.next_kwargs is None
    assert args.timeout == timedelta(seconds=90)  # the deadline is Airflow's trigger timeout
    kwargs = args.trigger_kwargs
    assert kwargs is not None
    assert kwargs["key_namespace"] == START_FROM_TRIGGER_NAMESPACE and kwargs["deadline"] is None
    assert kwargs["request"]["questions"] == {
        "ready": {"type": "boolean", "instructions": "Is the job ready?"}
    }
    # the kwargs are what the trigger itself serializes: the scheduler's trigger row is a normal one
    assert SystemZeroDecisionTrigger(**kwargs).serialize()[1] == kwargs


@needs_trigger_templates
def test_a_shorter_execution_timeout_bounds_the_trigger_too() -> None:
    # Airflow applies execution_timeout only to the time on a worker; a sensor started in the
    # triggerer has no worker time at all until the decision
    with DAG("sft_exec_timeout", schedule=None, start_date=START):
        sensor = _sensor(execution_timeout=timedelta(seconds=30))
    assert sensor.start_trigger_args is not None
    assert sensor.start_trigger_args.timeout == timedelta(seconds=30)


@needs_trigger_templates
def test_serialized_dag_keeps_start_from_trigger() -> None:
    from airflow.serialization.serialized_objects import BaseSerialization

    try:
        from airflow.serialization.serialized_objects import DagSerialization
    except ImportError:  # Airflow 3.1
        from airflow.serialization.serialized_objects import SerializedDAG as DagSerialization

    with DAG("sft_serialized", schedule=None, start_date=START) as dag:
        _sensor()
    task = DagSerialization.from_dict(DagSerialization.to_dict(dag)).get_task("wait")
    assert task.start_from_trigger is True
    kwargs = BaseSerialization.deserialize(task.start_trigger_args.trigger_kwargs)  # kept encoded
    assert kwargs["key_namespace"] == START_FROM_TRIGGER_NAMESPACE and kwargs["deadline"] is None
    assert task.start_trigger_args.timeout == timedelta(seconds=90)


@needs_trigger_templates
def test_triggerer_and_worker_render_the_same_namespace() -> None:
    with DAG("sft_render", schedule=None, start_date=START):
        sensor = _sensor()
    trigger = _in_triggerer(sensor)
    assert set(trigger.template_fields) == {"state", "source", "key_namespace"}
    assert trigger.key_namespace == f"sz-sft-sft_render.wait.{RUN_ID}.-1"
    assert trigger.source["path"] == "/data/jobs/job.log"
    assert trigger.state == f"run {RUN_ID}: "
    # the resuming worker renders the sensor's template fields (strictly) before execute_complete
    sensor.render_template_fields(_context(sensor))
    assert sensor.key_namespace == trigger.key_namespace
    event = {
        "status": "success",
        "key_namespace": trigger.key_namespace,
        "question": "ready",
        "decision": True,
        "probability": 0.9,
        "confidence": 0.9,
        "state_version": 3,
    }
    assert sensor.execute_complete(_context(sensor), event=event)["decision"] is True


@needs_trigger_templates
def test_start_from_trigger_still_accepts_the_worker_namespace_and_nothing_else() -> None:
    with DAG("sft_accept", schedule=None, start_date=START):
        sensor = _sensor()
    sensor.render_template_fields(_context(sensor))
    derived = task_namespace(
        "sft_accept", "wait", RUN_ID, -1
    )  # dag.test() and mapped sensors defer from a worker
    event = {"status": "success", "key_namespace": derived, "question": "ready", "decision": True}
    assert sensor.execute_complete(_context(sensor), event=event)["decision"] is True
    other = {**event, "key_namespace": f"sz-sft-sft_accept.other.{RUN_ID}.-1"}
    with pytest.raises(AirflowException, match="belongs to another task instance"):
        sensor.execute_complete(_context(sensor), event=other)


@needs_trigger_templates
def test_key_salt_is_part_of_the_namespace() -> None:
    with DAG("sft_salt", schedule=None, start_date=START):
        sensor = _sensor(key_salt="v2")
    assert _in_triggerer(sensor).key_namespace == f"sz-sft-sft_salt.wait.{RUN_ID}.-1.v2"


def test_default_path_has_no_start_trigger_args() -> None:
    with DAG("sft_off", schedule=None, start_date=START):
        sensor = _sensor(start_from_trigger=False)
    assert sensor.start_from_trigger is False and sensor.start_trigger_args is None
    assert sensor.key_namespace is None
    other = {"status": "success", "key_namespace": f"sz-sft-sft_off.wait.{RUN_ID}.-1"}
    sensor.render_template_fields(_context(sensor))
    with pytest.raises(AirflowException, match="belongs to another task instance"):
        sensor.execute_complete(_context(sensor), event=other)


@needs_trigger_templates
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"instructions": "Is {{ params.job }} ready?"}, "instructions must not be templated"),
        ({"model": "{{ var.value.model }}"}, "model must not be templated"),
        ({"deferrable": False}, "needs deferrable=True"),
        ({"key_salt": "{{ ds }}"}, "key_salt must not be templated"),
        ({"task_id": "t" * 120}, "too long"),
        ({"instructions": None}, "instructions is required"),
    ],
)
def test_refuses_what_the_triggerer_cannot_render(kwargs: dict[str, Any], message: str) -> None:
    with DAG("sft_refused", schedule=None, start_date=START), pytest.raises(ValueError, match=message):
        _sensor(**kwargs)


async def _first_event(trigger: SystemZeroDecisionTrigger) -> dict[str, Any]:
    events = trigger.run()
    try:
        event = await asyncio.wait_for(anext(events), timeout=30)
    finally:
        await events.aclose()
    return dict(event.payload)


#: a value the run does not have: Jinja renders the missing value as the text 'None'
MISSING = "{{ params.get('ticket') }}"


@needs_trigger_templates
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"state": MISSING, "source": None},
            f"state rendered to 'None' from the template {MISSING!r}: the value it reads is missing (a "
            "dag_run.conf key, a param, an XCom that was not pushed); check it, give it a default (e.g. "
            "dag_run.conf.get('key', 'text')), or pass allow_empty=True if 'None' is meant",
        ),
        ({"state": MISSING}, f"state rendered to 'None' from the template {MISSING!r}: the value it reads"),
        (
            {"state": "", "source": {"type": "file", "path": MISSING}},
            f"source.path rendered to 'None' from the template {MISSING!r}: the value it reads",
        ),
        (
            {"state": "{{ params.get('ticket', '') }}", "source": None},
            "state is empty (''): nothing would be decided but the decision is billed",
        ),
    ],
)
def test_a_state_the_triggerer_renders_to_none_fails_the_task_before_anything_is_sent(
    kwargs: dict[str, Any], message: str
) -> None:
    with DAG("sft_rendered_none", schedule=None, start_date=START):
        sensor = _sensor(**kwargs)
    event = asyncio.run(_first_event(_in_triggerer(sensor)))  # no connection is looked up
    assert event["status"] == "error" and event["error_type"] == "validation", event
    sensor.render_template_fields(_context(sensor))  # the resuming worker
    with pytest.raises(AirflowFailException) as failed:  # no retry: the same template renders the same
        sensor.execute_complete(_context(sensor), event=event)
    assert str(failed.value).startswith(f"wait: {message}")


@needs_trigger_templates
def test_allow_empty_lets_the_triggerer_decide_a_static_state_rendered_to_none() -> None:
    with DAG("sft_rendered_none_meant", schedule=None, start_date=START):
        refused = _sensor(task_id="refused", state=MISSING, source=None)
        meant = _sensor(task_id="meant", state=MISSING, source=None, allow_empty=True)
    event = asyncio.run(_first_event(_in_triggerer(refused)))
    assert event["message"].endswith("or pass allow_empty=True if 'None' is meant"), event
    event = asyncio.run(_first_event(_in_triggerer(meant)))
    # on to the connection (none here), as the sensor's allow_empty says
    assert event["message"].startswith("connection 'systemzero_default' is not defined"), event
