"""Every example Dag runs end to end with ``dag.test()`` against the emulator, with the
connection stored in the metadata DB (not an env var)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from airflow_provider_systemzero.protocol.limits import Limits
from tests.helpers import (
    REPO,
    EmulatorThread,
    dagbag_module,
    systemzero_connection,
    task_states,
    wait_until,
    xcoms_of,
)

RULES = REPO / "example_dags" / "emulator_rules.json"


@pytest.fixture(scope="module")
def emulator(airflow_db: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    os.environ["SYSTEMZERO_EXAMPLE_DIR"] = str(tmp_path_factory.mktemp("examples"))
    os.environ["SYSTEMZERO_EXAMPLE_STEP_SECONDS"] = "0.15"
    limits = Limits(account_decision_burst=1000, account_decision_ceiling_per_minute=100_000)
    with (
        EmulatorThread(api_keys={"demo-key": 8}, decider=f"rules:{RULES}", limits=limits) as emu,
        systemzero_connection("systemzero_default", emu.origin, "demo-key", model="sz-demo"),
    ):
        yield emu


def _left_behind(command_part: str, zombies_before: set[int]) -> list[str]:
    """This process's children that run ``command_part`` or are new zombies (ended, never reaped)."""
    found = []
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.NoSuchProcess):
            if child.status() == psutil.STATUS_ZOMBIE:
                if child.pid not in zombies_before:
                    found.append(f"zombie {child.pid}")
            elif command_part in " ".join(child.cmdline()):
                found.append(f"running {child.pid}")
    return found


def _dag(dag_id: str) -> Any:
    DagBag = dagbag_module().DagBag

    bag = DagBag(dag_folder=str(REPO / "example_dags"))
    assert not bag.import_errors, bag.import_errors
    return bag.get_dag(dag_id)


#: Run with ``[operators] default_deferrable = False`` (Airflow's own default, which the test suite
#: and a deployment may not share): every System Zero task of every example Dag, mapped ones
#: included, reports whether it defers.
_DEFERRABLE_PROBE = """
import json
try:
    from airflow.dag_processing.dagbag import DagBag
except ImportError:  # Airflow 3.1
    from airflow.models.dagbag import DagBag
bag = DagBag(dag_folder=EXAMPLES)
assert not bag.import_errors, bag.import_errors
found = {}
for dag_id, dag in bag.dags.items():
    for task in dag.tasks:
        mapped = hasattr(task, "partial_kwargs")
        operator_class = task.operator_class if mapped else type(task)
        if operator_class.__module__.startswith("airflow_provider_systemzero"):
            value = task.partial_kwargs.get("deferrable") if mapped else task.deferrable
            found[f"{dag_id}.{task.task_id}"] = value
print(json.dumps(found))
"""


def test_every_example_defers_without_the_default_deferrable_setting() -> None:
    # Copied into an Airflow with the stock configuration, an example must still wait in the
    # triggerer: each System Zero task passes deferrable=True itself.
    env = {**os.environ, "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": "False"}
    script = f"EXAMPLES = {str(REPO / 'example_dags')!r}\n{_DEFERRABLE_PROBE}"
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert {
        "systemzero_wait_for_ready.wait_until_ready",
        "systemzero_replay_and_branch.decide",
        "systemzero_mapped.triage",
        "systemzero_ticket_policy.triage",
        "systemzero_ticket_policy.route",
        "systemzero_ticket_policy.auto_reply_ok",
    } <= set(found), found
    assert {task: value for task, value in found.items() if value is not True} == {}


def test_sensor_waits_for_the_growing_log(emulator: Any) -> None:
    zombies_before = {
        child.pid for child in psutil.Process().children() if child.status() == psutil.STATUS_ZOMBIE
    }
    dag_run = _dag("systemzero_wait_for_ready").test()
    assert dag_run.state == "success", task_states(dag_run)
    xcoms = xcoms_of("systemzero_wait_for_ready", dag_run.run_id)
    decision = xcoms[("wait_until_ready", "return_value", -1)]
    assert decision["decision"] is True and decision["confidence"] >= 0.8
    log_path = xcoms[("start_job", "return_value", -1)]
    assert "Job is ready." in Path(log_path).read_text()
    assert xcoms[("report", "return_value", -1)].startswith("ready=True")
    # the job started in the background ends on its own and is reaped, not left a zombie
    wait_until(
        lambda: not _left_behind(log_path, zombies_before),
        timeout=30,
        what=f"the job writing {log_path} to end and be reaped (neither running nor a zombie)",
    )


def test_operator_replays_outputs_and_branches(emulator: Any) -> None:
    dag_run = _dag("systemzero_replay_and_branch").test()
    states = task_states(dag_run)
    assert dag_run.state == "success", states
    assert states["publish"] == "success" and states["quarantine"] == "skipped"
    xcoms = xcoms_of("systemzero_replay_and_branch", dag_run.run_id)
    assert xcoms[("decide", "return_value", -1)] == {"publish": True, "tier": "gold"}
    answers = xcoms[("decide", "answers", -1)]
    assert answers["publish"]["probability"] == pytest.approx(0.91)
    reply = xcoms[("decide", "reply", -1)]
    assert reply["id"] == xcoms[("decide", "decision_id", -1)] and reply["id"].startswith("szd_")
    # the gateway's state: one item per upstream output, in order
    replayed = [
        s.state
        for s in emulator.final_states.values()
        if isinstance(s.state, list) and s.state and isinstance(s.state[0], dict) and "task_id" in s.state[0]
    ]
    assert replayed == [
        [
            {"task_id": "extract", "output": {"rows": 1200, "source": "orders"}},
            {"task_id": "validate", "output": {"checks": "all passed", "null_rate": 0.001}},
            {"task_id": "measure_freshness", "output": {"age_minutes": 12}},
        ]
    ]


def test_mapped_operator_decides_each_input(emulator: Any) -> None:
    dag_run = _dag("systemzero_mapped").test()
    assert dag_run.state == "success", task_states(dag_run)
    xcoms = xcoms_of("systemzero_mapped", dag_run.run_id)
    assert [xcoms[("triage", "return_value", i)]["urgent"] for i in range(3)] == [True, False, True]
    assert xcoms[("summarise", "return_value", -1)] == {"urgent": 2, "total": 3}


def test_asset_watcher_dag_is_event_scheduled(emulator: Any) -> None:
    dag = _dag("systemzero_on_release_approved")
    try:
        from airflow.serialization.serialized_objects import DagSerialization
    except ImportError:  # Airflow 3.1
        from airflow.serialization.serialized_objects import SerializedDAG as DagSerialization

    text = json.dumps(DagSerialization.to_dict(dag), default=str)
    assert "SystemZeroDecisionEventTrigger" in text and "demo-key" not in text
    dag_run = dag.test()
    assert dag_run.state == "success", task_states(dag_run)


#: ``airflow dags test`` of each Dag named on the command line, in one process (Airflow's CLI, its
#: logging set up as for a person), each run's state printed after it.
_DAGS_TEST = """
import json, sys
from airflow.cli import cli_parser
from airflow.models.dagrun import DagRun
from airflow.utils.session import create_session

parser = cli_parser.get_parser()
for dag_id in sys.argv[1:]:
    args = parser.parse_args(["dags", "test", dag_id])
    args.func(args)
    with create_session() as session:
        run = session.query(DagRun).filter(DagRun.dag_id == dag_id).order_by(DagRun.id.desc()).first()
        print("RUN " + json.dumps({"dag_id": dag_id, "state": str(run.state)}), flush=True)
"""
#: What Airflow itself logs at WARNING in any ``dags test``, whatever the Dag and the providers: no
#: provider can cause or avoid these, so they are the only lines the quiet-run test lets through.
AIRFLOWS_OWN_WARNINGS = (
    # ``dags test`` can render the Dag's graph, which needs the graphviz package (not installed here)
    "Could not import graphviz. Rendering graph to the graphical format will not be possible.",
    # the in-process execution API of ``dags test`` is built on starlette's TestClient
    "Using `httpx` with `starlette.testclient` is deprecated",
)


def test_a_successful_dags_test_of_each_example_logs_no_error_or_warning(
    emulator: Any, tmp_path: Path
) -> None:
    """``airflow dags test`` of every example Dag, as a person runs it, succeeds and logs no ERROR
    or WARNING line: a deployment that alerts on such lines stays quiet when nothing went wrong."""
    from cryptography.fernet import Fernet

    bag = dagbag_module().DagBag(dag_folder=str(REPO / "example_dags"))
    dag_ids = sorted(bag.dag_ids)
    assert len(dag_ids) == 5, dag_ids
    # as in a person's Airflow: a Fernet key (a fresh home's airflow.cfg has one; the test home's
    # does not), and run from a directory of theirs, not this checkout (whose build metadata would
    # offer the package's plugin a second time)
    env = {
        **os.environ,
        "SYSTEMZERO_EXAMPLE_STEP_SECONDS": "0.15",
        "AIRFLOW__CORE__FERNET_KEY": Fernet.generate_key().decode(),
    }
    result = subprocess.run(
        [sys.executable, "-c", _DAGS_TEST, *dag_ids],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    runs = [json.loads(line[4:]) for line in result.stdout.splitlines() if line.startswith("RUN ")]
    assert runs == [{"dag_id": dag_id, "state": "success"} for dag_id in dag_ids], output[-5000:]
    loud = [
        line
        for line in output.splitlines()
        if ("[error" in line or "[warning" in line or "ERROR" in line or "WARNING" in line)
        and not any(known in line for known in AIRFLOWS_OWN_WARNINGS)
    ]
    assert loud == [], "\n".join(loud)
