"""Templates that render a missing value as the text ``'None'`` outside a static ``state``: a
question's text and a file source's initial state. Each is refused when the task runs, naming
the argument, the template and the fix, before anything is sent or billed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG

from airflow_provider_systemzero.operators.branch import (
    SystemZeroBranchOperator,
    SystemZeroShortCircuitOperator,
)
from airflow_provider_systemzero.operators.decide import SystemZeroDecideOperator
from airflow_provider_systemzero.sensors.decision import SystemZeroDecisionSensor
from tests.helpers import run_dag, task_states
from tests.helpers.mistakes import CONN, START

MISSING = "{{ dag_run.conf.get('q') }}"  # no conf: Jinja renders None as the text 'None'


def _rendered_none(field: str) -> str:
    return f"{field} rendered to 'None' from the template {MISSING!r}: the value it reads is missing"


def _refused_before_anything_is_sent(
    emulator: Any, dag: DAG, capsys: pytest.CaptureFixture[str], fields: dict[str, str]
) -> None:
    """Run ``dag``: each task of ``fields`` fails, naming the field that rendered to 'None', and
    no stream was opened nor decision billed."""
    before = emulator.stats
    states = task_states(run_dag(dag))
    assert {task_id: states[task_id] for task_id in fields} == dict.fromkeys(fields, "failed")
    printed = capsys.readouterr().out
    for task_id, field in fields.items():
        assert f"{task_id}: {_rendered_none(field)}" in printed, task_id
    after = emulator.stats
    assert after.streams_total == before.streams_total and after.decisions_billed == before.decisions_billed


def test_a_question_text_that_renders_to_none_is_refused_before_anything_is_sent(
    emulator: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "job.log"
    log.write_text("Job is ready.\n")
    common: dict[str, Any] = {"systemzero_conn_id": CONN, "deferrable": True}
    with DAG("mistake_none_question_text", schedule=None, start_date=START) as dag:
        SystemZeroDecideOperator(task_id="short", questions={"urgent": MISSING}, state="down", **common)
        SystemZeroDecideOperator(
            task_id="long",
            questions={"urgent": {"type": "boolean", "instructions": MISSING}},
            state="down",
            **common,
        )
        SystemZeroDecideOperator(
            task_id="override",
            questions={"urgent": "Is it urgent?"},
            instructions={"urgent": MISSING},
            state="down",
            **common,
        )
        SystemZeroShortCircuitOperator(task_id="gate", instructions=MISSING, state="down", **common)
        SystemZeroBranchOperator(
            task_id="route", instructions=MISSING, state="down", branches=["a", "b"], **common
        ) >> [EmptyOperator(task_id="a"), EmptyOperator(task_id="b")]
        SystemZeroDecisionSensor(
            task_id="wait", instructions=MISSING, state="Job is ready.", timeout=60, **common
        )
        SystemZeroDecisionSensor(
            task_id="prefixed",
            instructions="Is the job ready?",
            state=MISSING,
            source={"type": "file", "path": str(log)},
            timeout=60,
            **common,
        )
    _refused_before_anything_is_sent(
        emulator,
        dag,
        capsys,
        {
            "short": "questions.urgent",
            "long": "questions.urgent.instructions",
            "override": "instructions.urgent",
            "gate": "instructions",
            "route": "instructions",
            "wait": "instructions",
            "prefixed": "state",
        },
    )


def test_a_question_name_or_an_option_that_renders_to_none_is_refused_before_anything_is_sent(
    emulator: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    common: dict[str, Any] = {"systemzero_conn_id": CONN, "deferrable": True}
    tier = {"type": "choice", "instructions": "Which tier?", "options": ["gold", MISSING]}
    with DAG("mistake_none_question_name", schedule=None, start_date=START) as dag:
        # with no questions=, the watched name is the question asked: it would be asked as 'None'
        SystemZeroDecisionSensor(
            task_id="named",
            question=MISSING,
            instructions="Is the job ready?",
            state="up",
            timeout=60,
            **common,
        )
        SystemZeroDecisionSensor(
            task_id="watched",
            question=MISSING,
            questions={"ready": "Is the job ready?"},
            state="up",
            timeout=60,
            **common,
        )
        SystemZeroDecideOperator(task_id="choice", questions={"tier": tier}, state="down", **common)
        SystemZeroDecisionSensor(
            task_id="option",
            question="tier",
            questions={"tier": {**tier, "options": (MISSING, "gold")}},
            expect="gold",
            state="up",
            timeout=60,
            **common,
        )
    _refused_before_anything_is_sent(
        emulator,
        dag,
        capsys,
        {
            "named": "question",
            "watched": "question",
            "choice": "questions.tier.options[1]",
            "option": "questions.tier.options[0]",
        },
    )
