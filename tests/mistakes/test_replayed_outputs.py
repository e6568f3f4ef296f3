"""Mistakes in naming the upstream tasks whose outputs an operator replays as state: each is
refused before anything is sent or billed, naming the task and the fix (the literal ones when the
Dag is parsed, the rest when the task runs, the Dag's other tasks being known only then)."""

from __future__ import annotations

from typing import Any

import pytest
from airflow.sdk import DAG, task
from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

from airflow_provider_systemzero.operators.decide import SystemZeroDecideOperator
from tests.helpers import run_dag, task_states
from tests.helpers.mistakes import CONN, START

READY = "Is the job ready?"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"upstream_task_ids": [5]}, r"upstream_task_ids\[0\] is 5: name each task by its task ID"),
        ({"upstream_task_ids": ["fetch", ""]}, r"upstream_task_ids\[1\] is '': name each task"),
        ({"upstream_task_ids": []}, "upstream_task_ids is empty: name at least one task"),
        ({"upstream_task_ids": ["fetch"], "state": "s"}, "give either state or upstream_task_ids, not both"),
    ],
)
def test_literal_mistakes_fail_when_the_dag_is_parsed(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match="^decide: " + message):
        SystemZeroDecideOperator(
            task_id="decide", systemzero_conn_id=CONN, questions={"ready": READY}, **kwargs
        )


def test_one_task_id_is_one_task_not_its_characters(emulator: Any) -> None:
    with DAG("replay_one_id", schedule=None, start_date=START) as dag:

        @task(task_id="fetch")
        def fetch() -> str:
            return "Job is ready."

        decide = SystemZeroDecideOperator(
            task_id="decide",
            systemzero_conn_id=CONN,
            questions={"ready": READY},
            upstream_task_ids="fetch",
            prompt_cache_key="replay-one-id",
        )
        fetch() >> decide
    assert decide.replay_task_ids == ["fetch"]
    assert task_states(run_dag(dag)) == {"fetch": "success", "decide": "success"}
    accepted = emulator.latest_state("replay-one-id")
    assert accepted is not None and accepted.state == [{"task_id": "fetch", "output": "Job is ready."}]


def _returns(value: Any) -> Any:
    @task(task_id="fetch")
    def fetch() -> Any:
        return value

    return fetch()


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda decide: _returns("Job is ready.") >> decide(["fecth"]),
            "upstream_task_ids names 'fecth', which is not a task of Dag 'replay_mistake'; did you "
            "mean 'fetch'?: check the spelling (its tasks: ['decide', 'fetch'])",
        ),
        (
            lambda decide: (_returns("Job is ready."), decide(["fetch"])),
            "upstream task 'fetch' does not run before 'decide', so its output may not exist yet: "
            "set fetch >> decide",
        ),
        (
            lambda decide: _returns(None) >> decide(["fetch"]),
            "upstream task 'fetch' left no output to replay (it returned None",
        ),
    ],
    ids=["misspelled", "not-upstream", "no-output"],
)
def test_a_task_that_cannot_give_its_output_is_refused_before_connecting(
    emulator: Any, capsys: pytest.CaptureFixture[str], build: Any, message: str
) -> None:
    before = emulator.stats

    def decide(ids: list[str]) -> SystemZeroDecideOperator:
        return SystemZeroDecideOperator(
            task_id="decide", systemzero_conn_id=CONN, questions={"ready": READY}, upstream_task_ids=ids
        )

    with DAG("replay_mistake", schedule=None, start_date=START) as dag:
        build(decide)
    states = task_states(run_dag(dag))
    assert states["decide"] == "failed" and states["fetch"] == "success"
    assert f"decide: {message}" in capsys.readouterr().out
    assert emulator.stats.streams_total == before.streams_total  # refused before any connection


@pytest.mark.skipif(
    not hasattr(RuntimeTaskInstance, "get_ti_count"),
    reason="this Airflow's task instances cannot count a mapped task's instances",
)
@pytest.mark.parametrize("none_at", [None, 1])
def test_a_mapped_upstream_is_replayed_by_map_index_and_a_missing_output_refused(
    emulator: Any, capsys: pytest.CaptureFixture[str], none_at: int | None
) -> None:
    """Pulled without map indexes, a mapped task's outputs leave out each instance that returned
    None: the state would silently lack it. Each index is pulled instead."""
    key = f"replay-mapped-{none_at}"
    with DAG(f"replay_mapped_{none_at}", schedule=None, start_date=START) as dag:

        @task(task_id="check")
        def check(index: int) -> str | None:
            return None if index == none_at else f"check {index}: passed"

        decide = SystemZeroDecideOperator(
            task_id="decide",
            systemzero_conn_id=CONN,
            questions={"ready": READY},
            upstream_task_ids=["check"],
            prompt_cache_key=key,
        )
        check.expand(index=[0, 1, 2]) >> decide
    before = emulator.stats
    dag_run = run_dag(dag)
    if none_at is None:
        assert task_states(dag_run)["decide"] == "success"
        accepted = emulator.latest_state(key)
        outputs = [f"check {index}: passed" for index in range(3)]
        assert accepted is not None and accepted.state == [{"task_id": "check", "output": outputs}]
        return
    assert task_states(dag_run) == {
        "check[0]": "success",
        "check[1]": "success",
        "check[2]": "success",
        "decide": "failed",
    }
    assert (
        "upstream task 'check' is mapped, and its instance(s) at map index [1] left no output to replay"
        in capsys.readouterr().out
    )
    assert emulator.stats.streams_total == before.streams_total  # refused before connecting
