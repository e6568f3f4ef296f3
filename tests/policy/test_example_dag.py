"""The policy example Dag end to end against the emulator with the examples' rules: a ticket the
model routes by itself, an ambiguous one a person routes, and a canned reply only when sure."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from airflow_provider_systemzero.protocol.limits import Limits
from tests.helpers import (
    REPO,
    EmulatorThread,
    dagbag_module,
    systemzero_connection,
    task_states,
    xcoms_of,
)
from tests.helpers.policy import Reviewer

pytestmark = pytest.mark.filterwarnings("ignore:The HMAC key is:Warning")

DAG_ID = "systemzero_ticket_policy"


@pytest.fixture(scope="module")
def example_emulator(airflow_db: None) -> Iterator[Any]:
    limits = Limits(account_decision_burst=1000, account_decision_ceiling_per_minute=100_000)
    rules = REPO / "example_dags" / "emulator_rules.json"
    with (
        EmulatorThread(api_keys={"demo-key": 8}, decider=f"rules:{rules}", limits=limits) as emu,
        systemzero_connection("systemzero_default", emu.origin, "demo-key", model="sz-demo"),
    ):
        yield emu


def _run(ticket: str) -> Any:
    DagBag = dagbag_module().DagBag

    bag = DagBag(dag_folder=str(REPO / "example_dags" / "systemzero_ticket_policy.py"))
    assert not bag.import_errors, bag.import_errors
    return bag.get_dag(DAG_ID).test(run_conf={"ticket": ticket})


def test_the_model_routes_a_clear_ticket(example_emulator: Any) -> None:
    dag_run = _run("T-1001")
    assert dag_run.state == "success", task_states(dag_run)
    states = task_states(dag_run)
    assert (states["billing"], states["engineering"], states["support"]) == ("success", "skipped", "skipped")
    assert states["send_canned_reply"] == "skipped"
    xcoms = xcoms_of(DAG_ID, dag_run.run_id)
    assert xcoms[("billing", "return_value", -1)] == "T-1001 queued for billing"
    route = xcoms[("route", "decision", -1)]
    assert (route["decision"], route["decided_by"], route["action"]) == ("billing", "model", "act")
    triage = xcoms[("triage", "decision", -1)]
    assert (triage["decision"], triage["decided_by"], triage["action"]) == (False, "policy", "default")
    assert xcoms[("auto_reply_ok", "decision", -1)]["effect"] == {
        "proceed": False,
        "skipped": ["send_canned_reply"],
    }


def test_a_person_routes_an_ambiguous_ticket(example_emulator: Any, core_api: Any) -> None:
    with Reviewer(core_api, DAG_ID, lambda request: ["billing"], username="carol") as reviewer:
        dag_run = _run("T-1003")
    assert dag_run.state == "success", task_states(dag_run)
    (request,) = reviewer.seen
    assert request["task_id"] == "route" and request["defaults"] == ["support"]
    assert "Something looks off" in request["body"]
    states = task_states(dag_run)
    assert (states["billing"], states["engineering"], states["support"]) == ("success", "skipped", "skipped")
    route = xcoms_of(DAG_ID, dag_run.run_id)[("route", "decision", -1)]
    assert (route["proposed"], route["decision"], route["decided_by"]) == ("support", "billing", "human")


def test_a_canned_reply_only_when_the_model_is_sure(example_emulator: Any) -> None:
    dag_run = _run("T-1004")
    assert dag_run.state == "success", task_states(dag_run)
    states = task_states(dag_run)
    assert states["send_canned_reply"] == "success" and states["support"] == "success"
