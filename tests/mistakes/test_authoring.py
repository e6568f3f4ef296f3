"""Mistakes in what a DAG author writes: literal arguments that can never work (an import error
when the DAG is parsed), empty and static states, a missing source file, poke mode by accident,
a state too large for the decide body. Each runs the way the author meets it."""

from __future__ import annotations

import logging
import re
import socket
import textwrap
from datetime import date, datetime
from pathlib import Path
from typing import Any

import pytest
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG, task

from airflow_provider_systemzero.decorators.systemzero import systemzero_task
from airflow_provider_systemzero.exceptions import SystemZeroArgumentError
from airflow_provider_systemzero.operators.branch import (
    SystemZeroBranchOperator,
    SystemZeroShortCircuitOperator,
)
from airflow_provider_systemzero.operators.decide import SystemZeroDecideOperator
from airflow_provider_systemzero.sensors.decision import SystemZeroDecisionSensor
from airflow_provider_systemzero.sources import FileSource
from tests.helpers import dagbag_module, run_dag, task_states, xcoms_of
from tests.helpers.mistakes import CONN, START

READY = "Is the job ready?"


def _state() -> str:
    return "Job is ready."


def _sensor(**kwargs: Any) -> SystemZeroDecisionSensor:
    base: dict[str, Any] = {
        "task_id": "wait",
        "systemzero_conn_id": CONN,
        "question": "ready",
        "instructions": READY,
        "timeout": 600,
        "lease_after": 0.2,
    }
    return SystemZeroDecisionSensor(**{**base, **kwargs})


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: _sensor(question="1ready", questions={"1ready": READY}), "must start with a letter"),
        (lambda: _sensor(min_confidence=80), "min_confidence 80 must be a number from 0 to 1"),
        (lambda: _sensor(expect="yes"), "must be true or false for boolean question"),
        (lambda: _sensor(questions=["ready"]), "questions must be a non-empty mapping"),
        (lambda: _sensor(consecutive=0), "consecutive 0 must be a whole number"),
        (lambda: _sensor(policy={"act_above": 2}), "act_above"),
        (lambda: _sensor(max_decisions=-1), "max_decisions"),
        (lambda: _sensor(state="s", consecutive=3), "consecutive=3 needs successive states"),
        (lambda: SystemZeroDecideOperator(task_id="d", questions=[READY], state="s"), "non-empty mapping"),
        (
            lambda: SystemZeroBranchOperator(task_id="b", state="s", instructions=" ", branches=["a", "b"]),
            "instructions must say what to decide",
        ),
        (
            lambda: SystemZeroBranchOperator(
                task_id="b", state="s", instructions="Which?", branches=["a", "b"], policy={"default": "c"}
            ),
            "default 'c' is not an option",
        ),
        (
            lambda: SystemZeroBranchOperator(
                task_id="b", state="s", instructions="Which?", branches=["a", "b"], descriptions={"c": "?"}
            ),
            r"b: descriptions names no branch: 'c' \(branches: \['a', 'b'\]\)",
        ),
        (lambda: systemzero_task(questions=[READY])(_state)(), "questions must be a non-empty mapping"),
        (
            lambda: SystemZeroDecideOperator(task_id="d", questions={"q": READY}, upstream_task_ids=5),
            "d: upstream_task_ids must be a task ID, a list of task IDs or .output XComArgs, got int 5",
        ),
        (
            lambda: SystemZeroDecideOperator(task_id="d", questions={"q": READY}, upstream_task_ids={"a": 1}),
            "got dict",
        ),
        (
            lambda: SystemZeroDecideOperator(
                task_id="d", questions={"q": READY}, state="s", instructions="x"
            ),
            "d: instructions must map question names to their text, got str 'x'",
        ),
        (lambda: SystemZeroDecideOperator(task_id="d", questions={"q": READY}, state={1, 2}), "got set"),
        (
            lambda: _sensor(source={"type": "callable", "path": "nomodule"}),
            "wait: source.path 'nomodule' is not a dotted path 'package.module.function'",
        ),
        (
            lambda: SystemZeroDecideOperator(task_id="d", questions={"q": READY}, state=date(2026, 1, 1)),
            "d: state must be a string, an array or an object, got date",
        ),
        (
            lambda: SystemZeroDecideOperator(task_id="d", questions={"q": READY}, state=[]),
            r"d: state is empty \(\[\]\)",
        ),
        (  # the path to the value and what to give instead, not only "Object of type datetime ..."
            lambda: SystemZeroDecideOperator(
                task_id="d", questions={"q": READY}, state={"deploy": {"started": datetime(2026, 1, 1)}}
            ),
            r"^d: state\['deploy'\]\['started'\] is a datetime\.datetime, which JSON cannot carry: give its "
            r"text: str\(value\), or value\.isoformat\(\) — or a template that renders it as text, e\.g\. "
            r"'\{\{ ts \}\}'; nothing was sent$",
        ),
        (
            lambda: SystemZeroDecideOperator(
                task_id="d", questions={"q": READY}, state="s", decision_timeout=0
            ),
            "decision_timeout 0 must be a positive number",
        ),
        (  # timedelta(seconds=inf) would crash when the task defers
            lambda: SystemZeroDecideOperator(
                task_id="d", questions={"q": READY}, state="s", decision_timeout=float("inf")
            ),
            "decision_timeout inf must be a positive number",
        ),
    ],
)
def test_literal_mistakes_fail_when_the_dag_is_parsed(build: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()


def test_an_operator_with_neither_state_nor_upstream_task_ids_fails_when_the_dag_is_parsed() -> None:
    with DAG("mistake_no_state", schedule=None, start_date=START), pytest.raises(ValueError) as raised:
        SystemZeroDecideOperator(task_id="d", questions={"ready": READY})
    assert str(raised.value) == (
        "d: state is required unless upstream_task_ids is given: pass state=... (a string, an array "
        "or an object, a template, or an upstream task's .output), or upstream_task_ids=[...] to "
        "decide about upstream tasks' outputs"
    )
    with DAG("mistake_no_state_branch", schedule=None, start_date=START), pytest.raises(ValueError) as raised:
        SystemZeroBranchOperator(task_id="b", instructions="Which?", branches=["a", "b"])
    assert str(raised.value).startswith("b: state is required unless upstream_task_ids is given")
    with (
        DAG("mistake_both_states_branch", schedule=None, start_date=START),
        pytest.raises(ValueError) as raised,
    ):
        SystemZeroBranchOperator(
            task_id="b", instructions="Which?", branches=["a", "b"], state="s", upstream_task_ids=["a"]
        )
    assert str(raised.value) == "b: give either state or upstream_task_ids, not both"
    # what fills the state when the task runs is accepted: a template, an XComArg, upstream
    # outputs, or the decorated function's return value
    with DAG("mistake_state_later", schedule=None, start_date=START):

        @task
        def extract() -> str:
            return "Job is ready."

        output = extract()
        SystemZeroDecideOperator(task_id="templated", questions={"ready": READY}, state="{{ params.s }}")
        SystemZeroDecideOperator(task_id="xcomarg", questions={"ready": READY}, state=output)
        SystemZeroDecideOperator(task_id="replayed", questions={"ready": READY}, upstream_task_ids=[output])
        systemzero_task(questions={"ready": READY})(_state)()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"allow_empty": "no"}, "allow_empty must be True or False, got str 'no': True means decide about"),
        ({"deferrable": "yes"}, "deferrable must be True or False, got str 'yes'"),
        ({"key_salt": 5}, "key_salt must be a string or None, got int 5: pass e.g. key_salt='5'"),
        ({"systemzero_conn_id": 5}, "systemzero_conn_id must be the ID of a System Zero connection"),
        ({"review_assigned_users": 5}, "review_assigned_users must be a user"),
        ({"review_subject": 5}, "review_subject must be a string or None, got int 5"),
    ],
)
def test_an_operator_argument_of_the_wrong_type_fails_when_the_dag_is_parsed(
    kwargs: dict[str, Any], message: str
) -> None:
    # a truthy string such as "no" would silently mean True: refused, naming the task
    with pytest.raises(ValueError, match="^decide: " + message):
        SystemZeroDecideOperator(task_id="decide", questions={"ready": READY}, state="s", **kwargs)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: SystemZeroShortCircuitOperator(
                task_id="gate", instructions=READY, state="s", proceed_when="yes"
            ),
            "gate: proceed_when must be True or False, got str 'yes': True means downstream tasks run on "
            "a yes (False: on a no)",
        ),
        (
            lambda: SystemZeroShortCircuitOperator(
                task_id="gate", instructions=READY, state="s", ignore_downstream_trigger_rules="no"
            ),
            "gate: ignore_downstream_trigger_rules must be True or False, got str 'no': True means a "
            "closed gate skips every downstream task (False: only the direct ones)",
        ),
        (
            lambda: SystemZeroBranchOperator(
                task_id="route", instructions="Which?", state="s", branches=["a", "b"], multiple="no"
            ),
            "route: multiple must be True or False, got str 'no': True means several branches may be chosen",
        ),
    ],
)
def test_a_gate_flag_that_is_not_a_bool_fails_naming_the_task(build: Any, message: str) -> None:
    # a truthy string such as "no" would silently mean True
    with pytest.raises(SystemZeroArgumentError) as raised:
        build()
    assert str(raised.value) == message
    assert raised.value.field == message.split(" ")[1]


def test_a_broken_dag_file_is_an_import_error(airflow_db: None, tmp_path: Path) -> None:
    DagBag = dagbag_module().DagBag

    (tmp_path / "broken_dag.py").write_text(
        textwrap.dedent("""
        import pendulum
        from airflow.sdk import DAG
        from airflow_provider_systemzero.sensors.decision import SystemZeroDecisionSensor

        with DAG("broken", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")):
            SystemZeroDecisionSensor(task_id="wait", question="ready", instructions="Ready?", min_confidence=80)
    """)
    )
    bag = DagBag(dag_folder=str(tmp_path))
    [error] = bag.import_errors.values()
    assert "wait: min_confidence 80 must be a number from 0 to 1" in error


@pytest.mark.parametrize(
    ("argument", "message"),
    [
        # a policy built on its own line names the task it is given to
        ("policy=DecisionPolicy(act_above=1.5)", "wait: act_above 1.5 must be a number from 0 to 1"),
        # a word of a closed set says which word was meant
        ("source={'type': 'files', 'path': '/tmp/x.log'}", "; did you mean 'file'?"),
        (
            "policy={'act_above': 0.8, 'below': 'wiat'}",
            "wait: below must be one of fail, skip, wait, default",
        ),
    ],
)
def test_an_import_error_ends_at_the_dag_files_line_and_names_the_task(
    airflow_db: None, tmp_path: Path, argument: str, message: str
) -> None:
    """Airflow shows the last two lines of an import error's traceback: they are the Dag file's
    line that built the task, not the provider's code."""
    DagBag = dagbag_module().DagBag

    dag_file = tmp_path / "mistaken_dag.py"
    dag_file.write_text(
        textwrap.dedent(f"""
        import pendulum
        from airflow.sdk import DAG
        from airflow_provider_systemzero.decisions.policy import DecisionPolicy
        from airflow_provider_systemzero.sensors.decision import SystemZeroDecisionSensor

        with DAG("mistaken", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")):
            SystemZeroDecisionSensor(task_id="wait", instructions="Ready?", {argument})
    """)
    )
    bag = DagBag(dag_folder=str(tmp_path))
    [error] = bag.import_errors.values()
    assert message in error and error.rstrip().splitlines()[-1].startswith(
        ("airflow_provider_systemzero", "ValueError")
    ), error
    frames = [line.strip() for line in error.splitlines() if line.strip().startswith("File ")]
    assert frames[-1].startswith(f'File "{dag_file}", line 8'), error


def test_templated_values_are_checked_when_the_task_runs(
    emulator: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    before = emulator.stats
    with DAG("mistake_empty_template", schedule=None, start_date=START, params={"log": ""}) as dag:
        SystemZeroDecideOperator(
            task_id="decide", systemzero_conn_id=CONN, questions={"ready": READY}, state="{{ params.log }}"
        )  # renders empty: parses fine
    dag_run = run_dag(dag)
    assert task_states(dag_run) == {"decide": "failed"}
    assert "decide: state is empty ('')" in capsys.readouterr().out
    assert emulator.stats.streams_total == before.streams_total  # refused before any connection


@pytest.mark.parametrize("kind", ["operator", "sensor"])
def test_a_template_that_renders_a_missing_value_as_none_is_refused(
    emulator: Any, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    before = emulator.stats
    template = "{{ dag_run.conf.get('ticket') }}"  # no conf: Jinja renders None as the text 'None'
    with DAG(f"mistake_none_template_{kind}", schedule=None, start_date=START) as dag:
        if kind == "operator":
            SystemZeroDecideOperator(
                task_id="decide", systemzero_conn_id=CONN, questions={"ready": READY}, state=template
            )
        else:
            _sensor(task_id="decide", state=template, deferrable=True)
    dag_run = run_dag(dag)
    assert task_states(dag_run) == {"decide": "failed"}
    assert f"decide: state rendered to 'None' from the template {template!r}" in capsys.readouterr().out
    assert emulator.stats.streams_total == before.streams_total  # refused before any connection


def test_a_source_path_that_renders_a_missing_value_as_none_is_refused(
    emulator: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    before = emulator.stats
    template = "{{ ti.xcom_pull(task_ids='start_job') }}"  # no such task: None, rendered as 'None'
    with DAG("mistake_none_template_path", schedule=None, start_date=START) as dag:
        _sensor(source={"type": "file", "path": template}, deferrable=True)
    dag_run = run_dag(dag)
    assert task_states(dag_run) == {"wait": "failed"}
    printed = capsys.readouterr().out
    assert f"wait: source.path rendered to 'None' from the template {template!r}" in printed
    assert "is relative" not in printed  # not the rule a path that rendered fine would break
    assert emulator.stats.streams_total == before.streams_total


def test_a_description_of_no_downstream_branch_fails_the_task_before_any_connection(
    emulator: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    before = emulator.stats
    with DAG("mistake_branch_description", schedule=None, start_date=START) as dag:
        route = SystemZeroBranchOperator(
            task_id="route",
            systemzero_conn_id=CONN,
            state="a ticket about an invoice",
            instructions="Which team?",
            descriptions={"billing": "payments, invoices"},  # the downstream task is "billing_team"
        )
        route >> [EmptyOperator(task_id="billing_team"), EmptyOperator(task_id="support")]
    dag_run = run_dag(dag)
    assert task_states(dag_run)["route"] == "failed"
    assert "route: descriptions names no branch: 'billing' (branches: ['billing_team', 'support'])" in (
        capsys.readouterr().out
    )
    assert emulator.stats.streams_total == before.streams_total


def test_a_literal_none_text_is_still_decided() -> None:
    from airflow_provider_systemzero.tasks.checks import refuse_empty_state

    refuse_empty_state("None", allow_empty=False)  # written by the author, not rendered: meant
    refuse_empty_state("None", allow_empty=True, template="{{ x }}")


def test_templated_questions_rendered_to_text_say_how_to_render_them_as_a_mapping(
    emulator: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    before = emulator.stats
    with DAG(
        "mistake_templated_questions", schedule=None, start_date=START, params={"qs": {"ready": READY}}
    ) as dag:
        SystemZeroDecideOperator(
            task_id="decide", systemzero_conn_id=CONN, questions="{{ params.qs }}", state="Job is ready."
        )  # the template renders to the text of the dict, not the dict
    assert task_states(run_dag(dag)) == {"decide": "failed"}
    assert (
        "questions must be a non-empty mapping of question names to questions, e.g. {'ready': 'Is the "
        "job ready?'}; got the string \"{'ready': 'Is the job ready?'}\": a template renders to a string "
        "unless the Dag sets render_template_as_native_obj=True"
    ) in capsys.readouterr().out
    assert emulator.stats.streams_total == before.streams_total
    # what the message says works
    with DAG(
        "templated_questions_native",
        schedule=None,
        start_date=START,
        params={"qs": {"ready": READY}},
        render_template_as_native_obj=True,
    ) as dag:
        SystemZeroDecideOperator(
            task_id="decide", systemzero_conn_id=CONN, questions="{{ params.qs }}", state="Job is ready."
        )
    assert task_states(run_dag(dag)) == {"decide": "success"}


def test_a_sensor_with_an_empty_static_state_is_refused_before_connecting(
    emulator: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ValueError, match=r"^wait: state is empty \(\[\]\)"):
        _sensor(state=[])  # literal, and no source either: refused when the Dag is parsed
    before = emulator.stats
    with DAG("mistake_empty_sensor", schedule=None, start_date=START, params={"log": ""}) as dag:
        _sensor(state="{{ params.log }}")  # rendered empty: refused when the task runs
    assert task_states(run_dag(dag)) == {"wait": "failed"}
    assert "wait: state is empty ('')" in capsys.readouterr().out
    assert emulator.stats.streams_total == before.streams_total


def test_an_empty_state_is_decided_when_allowed(emulator: Any) -> None:
    before = emulator.stats
    with DAG("mistake_allow_empty", schedule=None, start_date=START) as dag:
        SystemZeroDecideOperator(
            task_id="decide", systemzero_conn_id=CONN, questions={"ready": READY}, state=[], allow_empty=True
        )
    assert task_states(run_dag(dag)) == {"decide": "success"}
    assert emulator.stats.decisions_billed == before.decisions_billed + 1


@pytest.mark.parametrize(("soft_fail", "state"), [(False, "failed"), (True, "skipped")])
def test_a_static_state_that_does_not_meet_the_condition_ends_at_once(
    emulator: Any, capsys: pytest.CaptureFixture[str], soft_fail: bool, state: str
) -> None:
    before = emulator.stats
    with DAG(f"mistake_static_{state}", schedule=None, start_date=START) as dag:
        _sensor(state="Job is starting.", soft_fail=soft_fail)  # no source: nothing will ever change
    dag_run = run_dag(dag)
    assert task_states(dag_run) == {"wait": state}  # not after the 600 s timeout
    printed = capsys.readouterr().out
    if not soft_fail:
        assert (
            "the state has no source, so it never changes" in printed
            and "wait_on_static_state=True" in printed
        )
    assert emulator.stats.decisions_billed == before.decisions_billed + 1  # the one decision it needed


def test_a_static_state_in_poke_mode_ends_at_once_and_says_it_holds_a_slot(
    emulator: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    with DAG("mistake_static_poke", schedule=None, start_date=START) as dag:
        _sensor(state="Job is starting.", deferrable=False, mode="poke", poke_interval=0.1)
    dag_run = run_dag(dag)
    assert task_states(dag_run) == {"wait": "failed"}
    printed = capsys.readouterr().out
    assert "the state has no source, so it never changes" in printed
    assert printed.count("poke mode: this sensor holds a worker slot") == 1
    assert "pass deferrable=True" in printed


def test_a_missing_source_file_with_must_exist_fails_before_connecting(
    emulator: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "jbo.log"  # a typo
    before = emulator.stats
    with DAG("mistake_missing_file", schedule=None, start_date=START) as dag:
        _sensor(source={"type": "file", "path": str(missing), "must_exist": True})
    dag_run = run_dag(dag)
    assert task_states(dag_run) == {"wait": "failed"}
    assert (
        f"source file {str(missing)!r} does not exist on host {socket.gethostname()!r}"
        in capsys.readouterr().out
    )
    assert emulator.stats.streams_total == before.streams_total


async def test_a_missing_source_file_is_read_as_empty_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # polled: every read looks at the path again
    source = FileSource(str(tmp_path / "not-yet.log"), poll_interval=0.01, notifications="poll")
    try:
        with caplog.at_level(logging.WARNING):
            assert await source.read() == "" and await source.read() == ""
        [warning] = [r.getMessage() for r in caplog.records if "does not exist" in r.getMessage()]
        assert str(tmp_path / "not-yet.log") in warning and socket.gethostname() in warning
        assert '"must_exist": True' in warning
        # still missing: a wait that times out names it; once the file is there, nothing is said
        assert "does not exist" in (source.waiting_on() or "")
        (tmp_path / "not-yet.log").write_text("Job is ready.\n")
        assert await source.read() == "Job is ready.\n" and source.waiting_on() is None
    finally:
        await source.aclose()


def _poking_until_timeout(dag_id: str, log: Path, **arguments: Any) -> DAG:
    """A Dag of one poking sensor on the file ``log`` with a 1.5 s timeout."""
    with DAG(dag_id, schedule=None, start_date=START) as dag:
        _sensor(
            source={"type": "file", "path": str(log)},
            timeout=1.5,
            poke_interval=0.2,
            mode="poke",
            deferrable=False,
            **arguments,
        )
    return dag


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (
            "",
            "; the last poke: the file {log!r} on host {host!r} is empty (nothing is decided until it has "
            'content): if an empty file is itself the answer, set "decide_empty": True in the source',
        ),
        ("still working\n", "; the last decision (state version 1): ready = False, waiting for True"),
    ],
)
def test_a_poking_sensor_that_times_out_says_why_the_wait_did_not_end(
    emulator: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, why: str
) -> None:
    log = tmp_path / "job.log"
    log.write_text(content)
    dag_run = run_dag(_poking_until_timeout(f"mistake_poke_timeout_{len(content)}", log))
    assert task_states(dag_run) == {"wait": "failed"}
    printed = capsys.readouterr().out
    # Airflow's check between pokes, or the deadline of a poke's decide that started late
    assert "Sensor has timed out" in printed or "the sensor's timeout (1.5 s) passed during a poke" in printed
    assert why.format(log=str(log), host=socket.gethostname()) in printed


def test_a_soft_failing_poking_sensor_says_why_it_skipped(
    emulator: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "job.log"
    log.write_text("still working\n")
    dag_run = run_dag(_poking_until_timeout("mistake_poke_soft_fail", log, soft_fail=True))
    assert task_states(dag_run) == {"wait": "skipped"}
    printed = capsys.readouterr().out
    # not Airflow's bare "Skipping due to soft_fail is set to True.": the timeout and its cause
    assert "; the last decision (state version 1): ready = False, waiting for True" in printed
    assert "Sensor has timed out" in printed or "the sensor's timeout (1.5 s) passed during a poke" in printed


def test_a_sensor_that_times_out_on_a_missing_file_says_so(
    emulator: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    missing = tmp_path / "jbo.log"  # a typo: the file the job writes is job.log
    with DAG("mistake_missing_file_timeout", schedule=None, start_date=START) as dag:
        _sensor(
            source={"type": "file", "path": str(missing), "poll_interval": 0.05}, timeout=2, deferrable=True
        )
    with caplog.at_level(logging.INFO):
        dag_run = run_dag(dag)
    # the wait says from its start what it waits for, which file it reads, where, and until when
    said = f"waiting until ready = True; the state comes from the file {str(missing)!r} on host {socket.gethostname()!r}"
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith(said)]
    assert re.search(r"; the task's deadline is \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(in \d+ s\)$", line), line
    assert task_states(dag_run) == {"wait": "failed"}
    printed = capsys.readouterr().out
    assert (
        f"no decision met the condition before the deadline; the file {str(missing)!r} on host "
        f"{socket.gethostname()!r} does not exist (nothing is decided until it has content): check the path"
    ) in printed


def test_a_decorated_state_that_is_not_json_names_the_value_and_sends_nothing(
    emulator: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    before = emulator.stats
    with DAG("mistake_state_not_json", schedule=None, start_date=START) as dag:

        @task.systemzero(systemzero_conn_id=CONN, questions={"ready": READY})
        def deploy_state() -> dict[str, Any]:
            return {"deploy": {"steps": ["build", {"started": datetime(2026, 1, 1, 12)}]}}

        deploy_state()
    dag_run = run_dag(dag)
    assert task_states(dag_run) == {"deploy_state": "failed"}
    # the function's return value is no template: the fix is the value's text
    assert (
        "deploy_state: state['deploy']['steps'][1]['started'] is a datetime.datetime, which JSON cannot "
        "carry: give its text: str(value), or value.isoformat(); nothing was sent"
    ) in capsys.readouterr().out
    assert emulator.stats.streams_total == before.streams_total


def test_a_timeout_shorter_than_the_job_names_the_deadline_and_how_long_decisions_took(
    emulator: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The job is still running when the sensor's own timeout passes: the message names that
    timeout and its length, what the model said about the state so far, how long its decisions
    took, and what to raise — not only that no decision met the condition."""
    log = tmp_path / "job.log"
    log.write_text("Job started\n")  # the job never gets to "ready" before the timeout
    with DAG("mistake_timeout_shorter_than_the_job", schedule=None, start_date=START) as dag:
        # long enough for the first decision: under dag.test() on Airflow 3.1 the trigger's
        # connection lookup alone takes 2-5 s
        _sensor(source={"type": "file", "path": str(log), "poll_interval": 0.05}, timeout=8, deferrable=True)
    dag_run = run_dag(dag)
    assert task_states(dag_run) == {"wait": "failed"}
    reason = (
        r"the task's timeout of 8 s passed: no decision met the condition before the deadline; the last "
        r"decision \(state version 1\): ready = False, waiting for True; the last decision took "
        r"(\d+ ms|\d(\.\d\d?)? s): raise timeout \(now 8 s\) to cover the time the state takes to meet "
        r"the condition, and a decision after that"
    )
    assert re.search(f"wait: {reason}", capsys.readouterr().out)
    record = xcoms_of(dag.dag_id, dag_run.run_id)[("wait", "decision", -1)]
    assert re.fullmatch(reason, record["reason"]), record["reason"]


def test_a_state_too_large_names_the_upstream_task_and_the_fix(
    emulator: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    before = emulator.stats
    with DAG("mistake_too_large", schedule=None, start_date=START) as dag:

        @task(task_id="fetch_log")
        def fetch_log() -> str:
            return "x" * 3_700_000

        SystemZeroDecideOperator(
            task_id="decide",
            systemzero_conn_id=CONN,
            questions={"ready": READY},
            upstream_task_ids=[fetch_log()],
        )
    dag_run = run_dag(dag)
    assert task_states(dag_run) == {"fetch_log": "success", "decide": "failed"}
    printed = capsys.readouterr().out
    assert "the state built from the outputs of upstream tasks ['fetch_log'] makes the decide body" in printed
    assert "return less from those tasks" in printed
    assert emulator.stats.streams_total == before.streams_total


def test_a_source_file_too_large_names_the_file_and_the_fix(
    emulator: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    big = tmp_path / "huge.log"
    big.write_text("x" * 3_700_000)
    before = emulator.stats
    with DAG("mistake_file_too_large", schedule=None, start_date=START) as dag:
        _sensor(source={"type": "file", "path": str(big)})
    dag_run = run_dag(dag)
    assert task_states(dag_run) == {"wait": "failed"}
    printed = capsys.readouterr().out
    assert "max_decide_body_bytes" in printed
    assert f"the state comes from the file source {str(big)!r}: send less" in printed
    assert emulator.stats.decisions_billed == before.decisions_billed


def test_a_static_state_waits_until_the_timeout_when_the_author_opts_in(
    emulator: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    before = emulator.stats
    with DAG("mistake_static_opt_in", schedule=None, start_date=START) as dag:
        # long enough for the first decision: under dag.test() on Airflow 3.1 the trigger's
        # connection lookup alone takes 2-5 s
        _sensor(state="Job is starting.", wait_on_static_state=True, timeout=8)
    dag_run = run_dag(dag)
    assert task_states(dag_run) == {"wait": "failed"}
    printed = capsys.readouterr().out
    # the timeout says why the decision it had did not do: the cause, not only the deadline
    assert (
        "no decision met the condition before the deadline; the last decision (state version 1): "
        "ready = False, waiting for True"
    ) in printed
    assert "the state has no source, so it never changes" not in printed
    assert emulator.stats.decisions_billed == before.decisions_billed + 1
