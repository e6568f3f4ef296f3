"""SystemZeroDecideOperator end to end: static state, deferrable and not, retries billed once,
and bad input refused before any connection."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pendulum
import pytest
from airflow.sdk import DAG

from airflow_provider_systemzero.compat import AirflowException, AirflowFailException
from airflow_provider_systemzero.operators.decide import SystemZeroDecideOperator, file_attachment
from tests.helpers import (
    rules_emulator,
    run_dag,
    run_dag_while,
    task_states,
    task_tries,
    wait_until,
    xcoms_of,
)

RULES = {
    "rules": [
        {"question": "ready", "pattern": "(?i)ready", "answer": True, "probability": 0.9, "confidence": 0.8}
    ],
    "default": {"answer": False, "probability": 0.3, "confidence": 0.6},
}
START = pendulum.datetime(2026, 1, 1, tz="UTC")


@pytest.fixture(scope="module")
def emulator(airflow_db: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with rules_emulator(
        RULES, tmp_path_factory.mktemp("rules"), "op-key", "systemzero_op", model="sz-test"
    ) as emu:
        yield emu


@pytest.mark.parametrize("deferrable", [True, False])
def test_static_state_deferrable_and_not(emulator: Any, deferrable: bool) -> None:
    with DAG(f"op_static_{deferrable}", schedule=None, start_date=START) as dag:
        SystemZeroDecideOperator(
            task_id="decide",
            systemzero_conn_id="systemzero_op",
            deferrable=deferrable,
            state="The export is ready.",
            questions={"ready": "Is the export ready?"},
        )
    before = emulator.stats.decisions_billed
    dag_run = run_dag(dag)
    assert dag_run.state == "success", task_states(dag_run)
    xcoms = xcoms_of(dag.dag_id, dag_run.run_id)
    assert xcoms[("decide", "return_value", -1)] == {"ready": True}
    assert xcoms[("decide", "answers", -1)]["ready"]["confidence"] == pytest.approx(0.8)
    assert xcoms[("decide", "decision_id", -1)] == xcoms[("decide", "reply", -1)]["id"]
    assert emulator.stats.decisions_billed == before + 1


def test_retry_replays_the_same_keys_and_is_billed_once(
    emulator: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first try times out while the gateway is still deciding; the retry replays the same
    state with the same key and gets the original reply, unbilled."""
    # The connection is an environment variable: under dag.test() on Airflow 3.1 and 3.2 the
    # trigger looks a metadata-DB connection up on a worker thread, which takes seconds there and
    # would use up this test's 2 s deadline before either try dispatched.
    monkeypatch.setenv(
        "AIRFLOW_CONN_SYSTEMZERO_OP_ENV",
        json.dumps(
            {
                "conn_type": "systemzero",
                "host": emulator.origin,
                "password": "op-key",
                "extra": {"model": "sz-test"},
            }
        ),
    )
    with DAG("op_retry", schedule=None, start_date=START) as dag:
        SystemZeroDecideOperator(
            task_id="decide",
            systemzero_conn_id="systemzero_op_env",
            decision_timeout=2.0,
            state="ready to retry",
            questions={"ready": "Is it ready?"},
            retries=1,
            retry_delay=timedelta(seconds=0),
        )
    before = emulator.stats
    emulator.call(lambda emu: setattr(emu.faults, "delay_decisions_ms", 2500))

    def slow_first_decide_only() -> None:
        # once the first decide is running (slowly), later calls are answered at once
        wait_until(lambda: emulator.stats.decisions_dispatched > before.decisions_dispatched, timeout=60)
        emulator.call(lambda emu: setattr(emu.faults, "delay_decisions_ms", 0))

    try:
        dag_run = run_dag_while(dag, slow_first_decide_only)
    finally:
        emulator.call(lambda emu: setattr(emu.faults, "delay_decisions_ms", 0))
    assert dag_run.state == "success", task_states(dag_run)
    assert task_tries(dag_run)["decide"] == 2
    after = emulator.stats
    assert after.decisions_billed - before.decisions_billed == 1
    assert xcoms_of(dag.dag_id, dag_run.run_id)[("decide", "return_value", -1)] == {"ready": True}


def _context(tmp: Path | None = None, outputs: dict[str, Any] | None = None) -> dict[str, Any]:
    outputs = outputs or {}
    ti = SimpleNamespace(
        dag_id="d",
        task_id="decide",
        run_id="r",
        map_index=-1,
        xcom_pull=lambda task_ids, key="return_value": outputs.get(task_ids),
    )
    return {"ti": ti}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"questions": {"1ready": "x"}, "state": "s"}, "question name '1ready' must start with a letter"),
        ({"questions": {}, "state": "s"}, "questions must be a non-empty mapping"),
        (
            {"questions": {"q": {"type": "choice", "instructions": "x", "options": []}}, "state": "s"},
            "options must list at least one option",
        ),
        (
            {"questions": {"q": "x"}, "state": "s", "route": "committee", "mode": "deliberate"},
            "cannot be combined with request.mode 'deliberate'",
        ),
        (
            {
                "questions": {"q": "x"},
                "state": "s",
                "attachments": [{"name": "9bad", "data": "data:text/plain;base64,eA=="}],
            },
            "must start with a letter",
        ),
        (
            {"questions": {"q": "x"}, "state": "s", "attachments": [{"name": "a", "data": "not a data url"}]},
            "does not start with 'data:'",
        ),
        ({"questions": {"q": "x"}, "state": "x" * 3_700_000}, "max_decide_body_bytes"),
        (
            {"questions": {"q": "x"}, "upstream_task_ids": ["up"]},
            r"output is a set, which JSON cannot carry \(the output of upstream task 'up', replayed as "
            r"state\): give a list: sorted\(value\)",
        ),
        ({"questions": {"q": "x"}}, "state is required"),
        ({"questions": {"q": "x"}, "state": 5}, "must be a string, an array or an object"),
    ],
)
def test_bad_input_fails_before_any_connection(emulator: Any, kwargs: dict[str, Any], message: str) -> None:
    streams_before = emulator.stats.streams_total
    # a literal mistake fails when the DAG is parsed (ValueError), others when the task runs
    with pytest.raises((ValueError, AirflowFailException), match=message):
        operator = SystemZeroDecideOperator(task_id="decide", systemzero_conn_id="systemzero_op", **kwargs)
        operator.execute(_context(outputs={"up": {1, 2}}))
    assert emulator.stats.streams_total == streams_before


def test_file_attachment_and_replayed_items(emulator: Any, tmp_path: Path) -> None:
    report = tmp_path / "report.txt"
    report.write_text("all green")
    with DAG("op_attach", schedule=None, start_date=START) as dag:
        SystemZeroDecideOperator(
            task_id="decide",
            systemzero_conn_id="systemzero_op",
            deferrable=True,
            state=["the job is ready"],
            questions={"ready": "Is it ready?"},
            attachments=[file_attachment("report", report)],
        )
    dag_run = run_dag(dag)
    assert dag_run.state == "success", task_states(dag_run)
    finals = [s for s in emulator.final_states.values() if s.attachments]
    assert finals and finals[-1].attachments[0]["name"] == "report"
    assert finals[-1].attachments[0]["data"] == "data:text/plain;base64,YWxsIGdyZWVu"


@pytest.mark.parametrize(
    ("failure", "error"),
    [
        ({"http_status": 422, "code": "idempotency_key_reused", "retryable": False}, AirflowFailException),
        ({"http_status": 400, "code": "invalid_request", "retryable": False}, AirflowFailException),
        ({"http_status": 500, "code": "internal", "retryable": False}, AirflowException),
        ({"http_status": 503, "code": "maintenance", "retryable": False}, AirflowException),
        ({"http_status": 429, "code": "rate_limited", "retryable": True}, AirflowException),
    ],
)
def test_decision_failures_fail_fast_only_on_client_errors(failure: dict[str, Any], error: type) -> None:
    from airflow_provider_systemzero.identity import task_namespace

    operator = SystemZeroDecideOperator(task_id="decide", questions={"q": "x"}, state="s")
    pushed: dict[str, Any] = {}
    ti = SimpleNamespace(
        dag_id="d",
        task_id="decide",
        run_id="r",
        map_index=-1,
        xcom_push=lambda key, value: pushed.__setitem__(key, value),
    )
    event = {
        "status": "error",
        "error_type": "decision_failed",
        "message": "the decision failed",
        "key_namespace": task_namespace("d", "decide", "r", -1),
        **failure,
    }
    with pytest.raises(error) as info:
        operator.execute_complete({"ti": ti}, event=event)
    assert type(info.value) is error  # AirflowFailException is an AirflowException: check exactly
    assert f"HTTP {failure['http_status']}" in str(info.value) and failure["code"] in str(info.value)
