"""The API key never leaves the connection's password field: not in a trigger's ``serialize()``
output, a ``repr``, a log line (every record of full runs at DEBUG, websockets' header logging
included, plus whatever reached stdout/stderr), an exception, a trigger event, or XCom."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import pickle
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_systemzero.decisions.conditions import DecisionCondition
from airflow_provider_systemzero.emulator import Emulator
from airflow_provider_systemzero.hooks.systemzero import SystemZeroHook
from airflow_provider_systemzero.identity import task_namespace
from airflow_provider_systemzero.stream import (
    AuthenticationFailed,
    DeadlineExceeded,
    DecisionStream,
    StreamSettings,
    SystemZeroValidationError,
)
from airflow_provider_systemzero.triggers.decision import (
    SystemZeroDecideTrigger,
    SystemZeroDecisionEventTrigger,
    SystemZeroDecisionTrigger,
)
from tests.helpers import EmulatorThread, first_event, rebuilt, systemzero_connection
from tests.helpers.faults import ReadyDecider

KEY = "sz-live-SECRET-4f9a0c2e7b1d"
WRONG = "sz-live-WRONG-77aa0c2e7b1d"
CONN_ID = "systemzero_secrets"
REQUEST = {
    "model": "sz-test",
    "questions": {"ready": {"type": "boolean", "instructions": "Is the job ready?"}},
}
CONDITION = DecisionCondition("ready", True).to_dict()


def leaks(text: str, *secrets: str) -> list[str]:
    """The secrets (or their distinctive halves) found in ``text``."""
    found = []
    for secret in secrets or (KEY, WRONG):
        if secret in text or secret[8:] in text:
            found.append(secret)
    return found


def record_texts(records: list[logging.LogRecord]) -> Iterator[str]:
    """Everything a log record can put on a screen: message, raw args, traceback, stack."""
    for record in records:
        yield record.getMessage()
        yield repr(record.args)
        if record.exc_info:
            yield "".join(traceback.format_exception(*record.exc_info))
        if record.exc_text:
            yield record.exc_text
        if record.stack_info:
            yield record.stack_info


@pytest.fixture
def debug_everything(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """Every logger at DEBUG, websockets' client and server loggers included."""
    caplog.set_level(logging.DEBUG)
    for name in ("websockets", "websockets.client", "websockets.server", "airflow_provider_systemzero"):
        caplog.set_level(logging.DEBUG, logger=name)
    return caplog


def sensor_trigger(**overrides: Any) -> SystemZeroDecisionTrigger:
    kwargs: dict[str, Any] = {
        "systemzero_conn_id": CONN_ID,
        "request": REQUEST,
        "condition": CONDITION,
        "state": "build started\n",
        "key_namespace": task_namespace("sec", "wait", "r", -1),
        "lease": False,
    }
    kwargs.update(overrides)
    return SystemZeroDecisionTrigger(**kwargs)


def operator_trigger(**overrides: Any) -> SystemZeroDecideTrigger:
    kwargs: dict[str, Any] = {
        "systemzero_conn_id": CONN_ID,
        "request": REQUEST,
        "state": "READY\n",
        "key_namespace": task_namespace("sec", "decide", "r", -1),
    }
    kwargs.update(overrides)
    return SystemZeroDecideTrigger(**kwargs)


def test_no_key_in_serialized_triggers_or_any_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{CONN_ID.upper()}",
        json.dumps({"conn_type": "systemzero", "host": "wss://api.example.com", "password": KEY}),
    )
    event_trigger = SystemZeroDecisionEventTrigger(
        systemzero_conn_id=CONN_ID, request=REQUEST, condition=CONDITION, state="", watch_id="nightly"
    )
    for trigger in (sensor_trigger(), operator_trigger(), event_trigger):
        classpath, kwargs = trigger.serialize()
        assert not leaks(json.dumps(kwargs) + classpath + repr(trigger) + str(trigger))
    hook = SystemZeroHook(CONN_ID)
    settings = hook.get_settings()
    assert settings.api_key == KEY  # the key is there …
    stream = hook.stream(REQUEST, settings=settings)
    for shown in (repr(hook), str(hook), repr(settings), str(settings), repr(stream), str(stream)):
        assert not leaks(shown), shown  # … and shown nowhere
    with pytest.raises(TypeError, match="cannot be serialised"):
        pickle.dumps(settings)


@pytest.mark.parametrize("key", [f"{KEY} extra", f"{KEY}\x00", f"{KEY}é"])
def test_a_malformed_key_is_refused_without_echoing_it(key: str) -> None:
    with pytest.raises(SystemZeroValidationError) as info:
        StreamSettings("wss://api.example.com", key)
    assert info.value.field == "password" and not leaks(str(info.value) + repr(info.value))


async def test_full_runs_never_log_raise_or_emit_the_key(
    debug_everything: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AIRFLOW__SYSTEMZERO__RECONNECT_BACKOFF_BASE", "0.02")
    texts: list[str] = []
    async with Emulator(api_keys={KEY: 8}, decider=ReadyDecider()) as emu:
        good = json.dumps({"conn_type": "systemzero", "host": emu.origin, "password": KEY})
        monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", good)
        # the sensor: a decision, a gateway restart (goodbye, 1012, reconnect, replay), the firing decision
        from tests.helpers import fault_sources as sources

        sources.STATES["secret"] = "build started\n"
        trigger = rebuilt(
            sensor_trigger(
                source={
                    "type": "callable",
                    "path": "tests.helpers.fault_sources.state",
                    "kwargs": {"name": "secret"},
                    "poll_interval": 0.02,
                }
            )
        )
        task = asyncio.ensure_future(first_event(trigger))
        await emu.wait_for(lambda e: e.stats.decisions_delivered == 1)
        await emu.restart(retry_after_ms=50)
        sources.STATES["secret"] = "build started\nREADY\n"
        texts.append(json.dumps(await task))
        sources.STATES.clear()
        # the operator
        texts.append(json.dumps(await first_event(rebuilt(operator_trigger()))))
        # the connection test (the UI's Test button)
        ok, message = await asyncio.to_thread(SystemZeroHook(CONN_ID).test_connection)
        assert ok and (texts.append(message) or True)
        # the same with a wrong key: clear failures that name the fix, never the key
        monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", good.replace(KEY, WRONG))
        for failing in (sensor_trigger(), operator_trigger()):
            payload = await first_event(rebuilt(failing))
            assert payload["error_type"] == "authentication"
            texts.append(json.dumps(payload))
        with pytest.raises(AuthenticationFailed) as refused:
            async with DecisionStream(
                StreamSettings(emu.origin, WRONG), REQUEST, decision_mode="on_request", identity="secrets"
            ):
                pass
        ok, message = await asyncio.to_thread(SystemZeroHook(CONN_ID).test_connection)
        assert not ok and "HTTP 401" in message
        texts.append(message)
        with pytest.raises(DeadlineExceeded) as timed_out:  # a failure carrying its last error
            async with DecisionStream(
                StreamSettings("ws://127.0.0.1:9", KEY),
                REQUEST,
                identity="secrets",
                decision_mode="on_request",
                open_deadline=0.3,
            ):
                pass
    for exc in (refused.value, timed_out.value):
        texts.append("".join(traceback.format_exception(exc)) + repr(exc) + repr(exc.__dict__))
    texts.extend(record_texts(debug_everything.records))
    captured = capsys.readouterr()
    texts += [captured.out, captured.err]
    assert any("Authorization" in text for text in texts)  # the headers were logged at DEBUG …
    assert len(debug_everything.records) > 50
    assert not [text for text in texts if leaks(text)]  # … the key never


@pytest.mark.airflow
def test_a_dag_run_puts_no_key_in_xcom_or_task_logs(
    airflow_db: None,
    debug_everything: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    from tests.helpers import REPO, dagbag_module

    BundleDagBag = dagbag_module().BundleDagBag

    dags = Path(__file__).parent / "dags"
    local = "airflow.dag_processing.bundles.local.LocalDagBundle"
    monkeypatch.setenv(
        "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST",
        json.dumps(
            [  # ours first: found at once
                {"name": "systemzero-security", "classpath": local, "kwargs": {"path": str(dags)}},
                {"name": "dags-folder", "classpath": local, "kwargs": {"path": str(REPO / "example_dags")}},
            ]
        ),
    )
    # Airflow 3.2 added bundle_name (3.1's BundleDagBag takes the path alone)
    named = "bundle_name" in inspect.signature(BundleDagBag.__init__).parameters
    bag = BundleDagBag(
        dag_folder=str(dags), bundle_path=dags, **({"bundle_name": "systemzero-security"} if named else {})
    )
    assert not bag.import_errors, bag.import_errors
    dag = bag.get_dag("systemzero_secrets")
    with (
        EmulatorThread(api_keys={KEY: 8}, decider=ReadyDecider()) as emu,
        systemzero_connection(CONN_ID, emu.origin, KEY, model="sz-test"),
    ):
        run = dag.test()
        assert run.state == "success", {ti.task_id: ti.state for ti in run.get_task_instances()}
        assert emu.stats.decisions_billed == 2
        with create_session() as session:
            rows = (
                session.query(XComModel)
                .filter(XComModel.dag_id == dag.dag_id, XComModel.run_id == run.run_id)
                .all()
            )
            values = {(r.task_id, r.key): XComModel.deserialize_value(r) for r in rows}
    assert len(values) >= 4  # the sensor's summary, the operator's answers, reply, decision_id …
    assert values[("wait", "return_value")]["decision"] is True
    assert values[("decide", "return_value")] == {"ready": True}
    texts = [
        json.dumps({f"{task}.{key}": value for (task, key), value in values.items()}, default=str),
        *record_texts(debug_everything.records),
    ]
    captured = capsys.readouterr()
    texts += [captured.out, captured.err]
    assert not [text for text in texts if leaks(text, KEY)]
