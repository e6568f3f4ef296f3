"""Mistakes about the environment, met the way a DAG author meets them: a Dag run through
``dag.test()`` (deferrable, the mode the docs recommend) or the hook, against the emulator or
against nothing. Each test checks the time to a clear failure, the message (cause and fix) and
that nothing was billed."""

from __future__ import annotations

import logging
import socketserver
import threading
import time
import traceback
from typing import Any

import pytest
from airflow.sdk import DAG

from airflow_provider_systemzero.hooks.systemzero import SystemZeroHook
from airflow_provider_systemzero.operators.decide import SystemZeroDecideOperator
from airflow_provider_systemzero.stream.diagnosis import LOOPBACK_GIVE_UP_SECONDS
from airflow_provider_systemzero.stream.exceptions import GatewayUnreachable
from tests.helpers import run_dag, systemzero_connection, task_states
from tests.helpers.mistakes import CONN, START, emulator_port, env_connection

REFUSED = "is the gateway (or `systemzero-emulator`) running on port"
QUESTIONS = {"ready": "Is the job ready?"}
WIRE_QUESTIONS = {"ready": {"type": "boolean", "instructions": "Is the job ready?"}}


def _decide_dag(dag_id: str, conn_id: str, **kwargs: Any) -> DAG:
    with DAG(dag_id, schedule=None, start_date=START) as dag:
        SystemZeroDecideOperator(
            task_id="decide",
            systemzero_conn_id=conn_id,
            questions=QUESTIONS,
            state=kwargs.pop("state", "Job is ready."),
            **kwargs,
        )
    return dag


def _provider_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name.startswith("airflow_provider_systemzero.stream")
        or r.name.startswith("airflow_provider_systemzero.triggers")
    ]


def test_gateway_not_running_fails_the_deferred_task_fast_with_the_cause(
    airflow_db: None, closed_port: int, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"ws://127.0.0.1:{closed_port}/v1/system-zero/stream"
    with (
        systemzero_connection("sz_down", f"ws://127.0.0.1:{closed_port}", model="sz-test"),
        caplog.at_level(logging.INFO),
    ):
        dag_run = run_dag(_decide_dag("mistake_gateway_down", "sz_down"))  # default decision_timeout: 600 s
    assert task_states(dag_run) == {"decide": "failed"}
    printed = capsys.readouterr().out
    assert f"connection to {url} refused: {REFUSED} {closed_port}?" in printed  # the task's own error
    records = _provider_records(caplog)
    warning = next(r for r in records if r.levelno == logging.WARNING)
    assert url in warning.getMessage() and REFUSED in warning.getMessage()  # said at the first failure
    # from the trigger's first attempt to its error event: the gateway's absence, not the deadline
    assert records[-1].created - records[0].created < 30


def test_gateway_not_running_through_the_hook_fails_fast_without_a_chain(
    closed_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    env_connection(monkeypatch, "sz_down_hook", f"ws://127.0.0.1:{closed_port}", model="sz-test")
    started = time.monotonic()
    with pytest.raises(GatewayUnreachable) as info:
        SystemZeroHook("sz_down_hook").decide({"questions": WIRE_QUESTIONS}, "Job is ready.")  # no timeout
    elapsed = time.monotonic() - started
    assert elapsed < 30
    assert f"{REFUSED} {closed_port}?" in str(info.value)
    assert "nothing listens there, so the stream stops retrying" in str(info.value)  # no task's deadline
    # one error: no "no running event loop" from the sync bridge, no "During handling of …"
    assert info.value.__context__ is None and info.value.__cause__ is None
    assert "no running event loop" not in "".join(traceback.format_exception(info.value))


def test_bare_host_against_the_plaintext_emulator_says_use_ws(
    emulator: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    port = emulator_port(emulator)
    before = emulator.stats
    with systemzero_connection("sz_bare", f"127.0.0.1:{port}", "mistakes-key", model="sz-test"):
        dag_run = run_dag(_decide_dag("mistake_bare_host", "sz_bare"))
    assert task_states(dag_run) == {"decide": "failed"}
    printed = capsys.readouterr().out
    assert (
        f"port {port} speaks plaintext" in printed
        and f"set the connection's host to ws://127.0.0.1:{port}" in printed
    )
    after = emulator.stats
    assert after.streams_total == before.streams_total and after.decisions_billed == before.decisions_billed


def test_a_timeout_carries_the_last_error(
    airflow_db: None, closed_port: int, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # a deadline shorter than the time the stream gives a local gateway to come up, and long
    # enough for the trigger's first attempt. The connection is an environment variable: under
    # dag.test() on Airflow 3.1 the trigger looks a connection of the metadata DB up on a worker
    # thread, which took 2-15 s on a loaded machine and could use up the whole deadline.
    timeout = 7
    assert timeout < LOOPBACK_GIVE_UP_SECONDS
    env_connection(monkeypatch, "sz_down_short", f"ws://127.0.0.1:{closed_port}", model="sz-test")
    dag_run = run_dag(_decide_dag("mistake_timeout_last_error", "sz_down_short", decision_timeout=timeout))
    assert task_states(dag_run) == {"decide": "failed"}
    printed = capsys.readouterr().out
    assert (
        f"no decision before the task's deadline; last error: connection to ws://127.0.0.1:{closed_port}"
        in printed
        and REFUSED in printed
    )


def test_test_connection_names_the_cause_and_the_url(
    emulator: Any, closed_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    env_connection(monkeypatch, "sz_test_down", f"ws://127.0.0.1:{closed_port}")
    ok, message = SystemZeroHook("sz_test_down").test_connection()
    assert not ok and message == (
        f"connection to ws://127.0.0.1:{closed_port}/v1/system-zero/stream refused: {REFUSED} {closed_port}?"
    )
    port = emulator_port(emulator)
    env_connection(monkeypatch, "sz_test_tls", f"wss://127.0.0.1:{port}")
    ok, message = SystemZeroHook("sz_test_tls").test_connection()
    assert not ok and f"wss://127.0.0.1:{port}/v1/system-zero/stream failed" in message
    assert f"set the connection's host to ws://127.0.0.1:{port}" in message


def test_test_connection_says_when_the_port_is_no_websocket_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that answers the upgrade with something other than HTTP: websockets' InvalidMessage,
    described by the hook's Test button as a wrong origin."""
    answered = threading.Event()

    class NotHTTP(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            self.request.recv(65536)
            self.request.sendall(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
            answered.set()

    with socketserver.TCPServer(("127.0.0.1", 0), NotHTTP) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            port = server.server_address[1]
            env_connection(monkeypatch, "sz_not_ws", f"ws://127.0.0.1:{port}")
            ok, message = SystemZeroHook("sz_not_ws").test_connection()
        finally:
            server.shutdown()
            thread.join(timeout=10)
    assert answered.is_set()
    assert not ok and message.startswith(
        f"ws://127.0.0.1:{port}/v1/system-zero/stream did not answer as a WebSocket server ("
    ), message
    assert message.endswith("check that the connection's host and port are a System Zero API origin")


@pytest.mark.parametrize("deferrable", [True, False])
def test_a_wrong_api_key_is_said_once(
    emulator: Any, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str], deferrable: bool
) -> None:
    before = emulator.stats
    with (
        systemzero_connection("sz_wrong_key", emulator.origin, "not-the-key", model="sz-test"),
        caplog.at_level(logging.INFO),
    ):
        dag_run = run_dag(
            _decide_dag(f"mistake_wrong_key_{deferrable}", "sz_wrong_key", deferrable=deferrable)
        )
    assert task_states(dag_run) == {"decide": "failed"}
    printed = capsys.readouterr().out
    said = "refused the stream upgrade with HTTP 401"
    assert printed.count(said) == 1, printed
    assert "set a valid API key in the connection's password field" in printed
    assert not [
        r for r in _provider_records(caplog) if said in r.getMessage() or "HTTP 401" in r.getMessage()
    ]
    # the sync bridge (deferrable=False) adds no chain of its own
    assert "no running event loop" not in printed and "During handling of the above exception" not in printed
    assert emulator.stats.decisions_billed == before.decisions_billed


@pytest.mark.parametrize(
    ("conn_id", "extra", "conn_type", "message"),
    [
        ("sz_does_not_exist", None, None, "connection 'sz_does_not_exist' is not defined"),
        ("sz_no_model", {}, "systemzero", "no model: pass model= to the task or set the 'model' extra"),
        ("sz_http", {"model": "sz-test"}, "http", "has conn_type 'http', not 'systemzero'"),
    ],
)
def test_connection_mistakes_fail_on_the_worker_before_deferring(
    emulator: Any,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    conn_id: str,
    extra: dict[str, Any] | None,
    conn_type: str | None,
    message: str,
) -> None:
    from contextlib import nullcontext

    before = emulator.stats
    stored = (
        nullcontext()
        if extra is None
        else systemzero_connection(conn_id, emulator.origin, "mistakes-key", **extra)
    )
    with stored, caplog.at_level(logging.INFO):
        if conn_type not in (None, "systemzero"):
            _retype(conn_id, conn_type)
        dag_run = run_dag(_decide_dag(f"mistake_{conn_id}", conn_id))
    assert task_states(dag_run) == {"decide": "failed"}
    assert message in capsys.readouterr().out
    assert not [
        r for r in caplog.records if r.name.startswith("airflow_provider_systemzero.triggers")
    ]  # no trigger
    assert emulator.stats.streams_total == before.streams_total


def _retype(conn_id: str, conn_type: str) -> None:
    from airflow.models import Connection
    from airflow.utils.session import create_session

    with create_session() as session:
        session.query(Connection).filter(Connection.conn_id == conn_id).update({"conn_type": conn_type})


def test_a_working_connection_is_untouched_by_the_checks(emulator: Any) -> None:
    dag_run = run_dag(_decide_dag("mistake_none", CONN))
    assert task_states(dag_run) == {"decide": "success"}


def test_gateway_not_running_fails_the_deferred_sensor_fast(
    airflow_db: None, closed_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    from airflow_provider_systemzero.sensors.decision import SystemZeroDecisionSensor

    with systemzero_connection("sz_down_sensor", f"ws://127.0.0.1:{closed_port}", model="sz-test"):
        with DAG("mistake_gateway_down_sensor", schedule=None, start_date=START) as dag:
            SystemZeroDecisionSensor(
                task_id="wait",
                systemzero_conn_id="sz_down_sensor",
                question="ready",
                instructions="Is the job ready?",
                state="Job is ready.",
            )  # timeout: 7 days
        started = time.monotonic()
        dag_run = run_dag(dag)
    assert task_states(dag_run) == {"wait": "failed"}
    assert time.monotonic() - started < 120  # the whole dag.test(), not the sensor's 7-day timeout
    assert f"{REFUSED} {closed_port}?" in capsys.readouterr().out


def test_a_missing_connection_in_a_server_process_says_create_it(
    airflow_db: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("_AIRFLOW_PROCESS_CONTEXT", "server")  # the API server: it reads the metadata DB
    ok, message = SystemZeroHook("sz_nowhere").test_connection()
    assert not ok and "connection 'sz_nowhere' is not defined: create it (conn_type 'systemzero'" in message


def test_a_short_deadline_without_deferring_carries_the_last_error(
    closed_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    env_connection(monkeypatch, "sz_down_short_hook", f"ws://127.0.0.1:{closed_port}", model="sz-test")
    with pytest.raises(TimeoutError) as info:
        SystemZeroHook("sz_down_short_hook").decide({"questions": WIRE_QUESTIONS}, "Job is ready.", timeout=2)
    assert f"did not open within 2 s; last error: connection to ws://127.0.0.1:{closed_port}" in str(
        info.value
    )
    assert f"{REFUSED} {closed_port}?" in str(info.value)


@pytest.mark.parametrize(
    ("conn_type", "code", "said"),
    [
        # outside a task, Airflow 3 does not read the metadata DB's connections: say where it looks
        (
            None,
            "missing_connection",
            "connection 'sz_hook_mistake' is not defined where this process looks: outside a task, "
            "Airflow 3 reads connections from AIRFLOW_CONN_* environment variables and a configured "
            "secrets backend only, not from the metadata DB (one created in the UI or with `airflow "
            "connections add` is not seen here): set AIRFLOW_CONN_SZ_HOOK_MISTAKE or define it in the "
            "secrets backend, or run this in a task",
        ),
        ("http", "invalid_connection", "has conn_type 'http', not 'systemzero'"),
    ],
)
def test_the_hook_refuses_a_missing_or_foreign_connection_with_its_own_error(
    emulator: Any, monkeypatch: pytest.MonkeyPatch, conn_type: str | None, code: str, said: str
) -> None:
    import asyncio
    import json

    from airflow_provider_systemzero.stream.exceptions import SystemZeroError

    if conn_type is not None:
        monkeypatch.setenv(
            "AIRFLOW_CONN_SZ_HOOK_MISTAKE",
            json.dumps({"conn_type": conn_type, "host": emulator.origin, "password": "k", "extra": {}}),
        )
    before = emulator.stats
    hook = SystemZeroHook("sz_hook_mistake")
    # the documented `except SystemZeroError` catches it, on the worker and in a trigger alike
    with pytest.raises(SystemZeroError) as sync_error:
        hook.decide({"questions": WIRE_QUESTIONS, "model": "sz-test"}, "Job is ready.")
    with pytest.raises(SystemZeroError) as async_error:
        asyncio.run(hook.aget_settings())
    for error in (sync_error.value, async_error.value):
        assert error.code == code and said in str(error)
    assert emulator.stats.streams_total == before.streams_total


def test_a_rules_file_mistake_fails_the_decision_naming_the_rule(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import json

    from airflow_provider_systemzero.stream.exceptions import DecisionFailed
    from tests.helpers import EmulatorThread

    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"rules": [{"question": "ready", "pattern": "(?i)ready", "answer": "yes"}]}))
    with EmulatorThread(api_keys={"rules-key": 4}, decider=f"rules:{rules}") as emu:
        env_connection(monkeypatch, "sz_rules_mistake", emu.origin, "rules-key", model="sz-test")
        with pytest.raises(DecisionFailed) as info:
            SystemZeroHook("sz_rules_mistake").decide({"questions": WIRE_QUESTIONS}, "Job is ready.")
        billed = emu.stats.decisions_billed
    said = str(info.value)
    # the rule, never the opposite answer; the advice fits a local gateway too
    assert f"{rules}: rules[0] matched, but its answer 'yes' does not fit boolean question 'ready'" in said
    assert "for the emulator, its log and its decider" in said
    # the gateway's words reach the task bounded; the emulator's log has them whole, fix included
    logged = [
        r.getMessage() for r in caplog.records if r.name.startswith("airflow_provider_systemzero.emulator")
    ]
    assert any(line.endswith("'ready': make it true or false") for line in logged)
    assert billed == 0
