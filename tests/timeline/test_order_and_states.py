"""What makes the decision timeline explain itself: a state number a person can follow across the
streams of a wait, why each decision did what it did, the order things happened in (kept through
JSON), and an operator's policy drawn across its chart."""

from __future__ import annotations

import json
from typing import Any

from airflow.sdk import DAG

from airflow_provider_systemzero.decisions.timeline import DecisionTimeline, merge_histories
from airflow_provider_systemzero.emulator.server import Emulator
from airflow_provider_systemzero.operators.decide import SystemZeroDecideOperator
from airflow_provider_systemzero.plugins.timeline_page import Story, render_page
from tests import helpers
from tests.helpers import (
    channel_trigger,
    channels,
    decision_result,
    run_dag,
    running_trigger,
    task_states,
    xcoms_of,
)
from tests.helpers.timeline import CONN_ID, START
from tests.helpers.timeline_page import PageParts

emulator = helpers.emulator  # the fixture
rules_file = helpers.rules_file  # … and the one it takes

#: 2026-09-21T14:13:20Z
T0 = 1_790_000_000.0


def _kinds(rows: list[dict[str, Any]]) -> list[str]:
    return [row["kind"] for row in rows]


def test_rows_of_one_millisecond_keep_the_order_they_happened_in_through_json() -> None:
    timeline = DecisionTimeline()
    timeline.mark("stream_opened", T0)
    timeline.mark("billed_start", T0 + 0.0002, state_version=1)
    timeline.decision(
        decision_result(1, ready=(True, 0.9, 0.9)), question="ready", at=T0 + 0.0004, disposition="fired"
    )
    rows = timeline.to_list()
    assert _kinds(rows) == ["stream_opened", "billed_start", "decision"]
    assert len({row["at"] for row in rows}) == 1  # one millisecond, once written out
    again = json.loads(json.dumps(rows))
    assert DecisionTimeline.from_list(again).to_list() == rows
    assert merge_histories([], again) == rows and merge_histories(again, again) == rows


def test_a_billed_start_is_never_placed_before_the_stream_it_started_on() -> None:
    # the gateway's own figures back-date a start; a clock read apart must not put it before its stream
    timeline = DecisionTimeline()
    timeline.mark("stream_opened", T0)
    timeline.mark("billed_start", T0 - 0.004, state_version=1)
    rows = timeline.to_list()
    assert _kinds(rows) == ["stream_opened", "billed_start"]
    assert rows[1]["at"] == rows[0]["at"]


async def test_the_state_number_goes_on_across_streams_while_the_stream_version_starts_again(
    emulator: Emulator,
) -> None:
    trigger = channel_trigger("numbers", "numbers")
    async with running_trigger(trigger) as task:
        decided = "waiting\n"
        for state in ("waiting\nstep 1\n", "waiting\nstep 1\nJob is ready.\n"):
            # each state once the one before was decided and the stream given back: a new stream each
            await emulator.wait_for(
                lambda _, d=decided: trigger.progress.dormant and trigger.progress.decided_state == d,
                timeout=20,
            )
            channels.publish("numbers", state)
            decided = state
        event = await task
    rows = event.payload["decisions"]
    decisions = [row for row in rows if row["kind"] == "decision"]
    assert [(row["state_version"], row["generation"]) for row in decisions] == [(1, 1), (1, 2), (1, 3)]
    assert [row["generation"] for row in rows if row["kind"] == "state_change"] == [1, 2, 3]
    # the page: the state's number on each decision row, and on each billed start (its decision's)
    page = PageParts(render_page(heading="h", subtitle="s", stories=[Story(None, rows)]))
    assert [r["data-generation"] for r in page.having("tr", "decision")] == ["1", "2", "3"]
    starts = [r for r in page.having("tr", "mark") if r["data-kind"] == "billed_start"]
    assert [r["data-generation"] for r in starts] == ["1", "2", "3"]
    text = " ".join(page.text)
    assert "ready = False, waiting for True" in text  # why, in the words of the log
    assert "State #" in text and "Stream version" in text


def test_an_operators_timeline_draws_its_policy(gateway: Any) -> None:
    with DAG("timeline_operator_policy", schedule=None, start_date=START) as dag:
        SystemZeroDecideOperator(
            task_id="decide",
            questions={"ready": "Is the job ready?"},
            state="Job is ready.",
            systemzero_conn_id=CONN_ID,
            policy={"act_above": 0.9, "review_above": 0.5},
            deferrable=False,
        )
    dag_run = run_dag(dag)
    assert task_states(dag_run) == {"decide": "success"}
    rows = xcoms_of(dag.dag_id, dag_run.run_id)[("decide", "decisions", -1)]
    assert rows[0]["kind"] == "condition" and rows[0]["question"] == "ready"
    page = PageParts(render_page(heading="h", subtitle="s", stories=[Story(None, rows)]))
    bars = {(bar["data-bar"], bar["data-value"]) for bar in page.having("line", "bar")}
    assert bars == {("act_above", "0.9"), ("review_above", "0.5")}
    (point,) = page.having("g", "decision")
    assert "other" not in point["class"].split()  # an operator waits for no one answer
