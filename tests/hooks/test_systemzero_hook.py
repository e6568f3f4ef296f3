"""SystemZeroHook: the connection form, async connection lookup from the metadata DB, the
stream API against the emulator, the sync helpers and the secrecy of the key."""

from __future__ import annotations

import asyncio
import json
import logging
import pickle
from typing import Any

import pytest

from airflow_provider_systemzero.compat import airflow_version
from airflow_provider_systemzero.emulator import Emulator
from airflow_provider_systemzero.hooks.systemzero import SystemZeroHook
from airflow_provider_systemzero.protocol import DecisionResult
from airflow_provider_systemzero.provider_info import get_provider_info
from airflow_provider_systemzero.stream import (
    AuthenticationFailed,
    Backoff,
    DeadlineExceeded,
    SystemZeroValidationError,
    default_capacity,
    derive_prompt_cache_key,
)
from tests.helpers import EmulatorThread
from tests.helpers.hooks import CONN_ID, EXTRA, store_connection
from tests.helpers.stream import QUESTIONS, SECRET_KEY

REQUEST = {"questions": QUESTIONS}  # the model comes from the connection's extra


def sdk_connection(**kwargs: Any) -> Any:
    from airflow.sdk import Connection

    values: dict[str, Any] = {
        "conn_id": "sz",
        "conn_type": "systemzero",
        "host": "api.example.com",
        "password": SECRET_KEY,
    }
    values.update(kwargs)
    return Connection(**values)


class SyncAccess:
    """Sync connection calls seen: ``on_loop`` (they raised) and ``off_loop`` (on other threads)."""

    def __init__(self) -> None:
        self.on_loop: list[str] = []
        self.off_loop: list[str] = []


@pytest.fixture
def no_sync_connection_access(monkeypatch: pytest.MonkeyPatch) -> SyncAccess:
    """Make every sync connection lookup and sync extra parsing raise when called on an event
    loop's thread; calls on other threads (Airflow's own ``sync_to_async`` helpers) pass and are
    recorded."""
    from airflow.models.connection import Connection as OrmConnection
    from airflow.sdk import BaseHook
    from airflow.sdk.definitions.connection import Connection as SdkConnection

    seen = SyncAccess()

    def guard(name: str, original: Any) -> Any:
        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                seen.off_loop.append(name)
                return original(*args, **kwargs)
            seen.on_loop.append(name)
            raise AssertionError(f"sync {name} called on the event loop's thread")

        return guarded

    get_connection = BaseHook.__dict__["get_connection"].__func__
    monkeypatch.setattr(
        BaseHook, "get_connection", classmethod(guard("BaseHook.get_connection", get_connection))
    )
    sdk_get = SdkConnection.__dict__["get"].__func__
    monkeypatch.setattr(SdkConnection, "get", classmethod(guard("Connection.get", sdk_get)))
    from_secrets = OrmConnection.__dict__["get_connection_from_secrets"].__func__
    monkeypatch.setattr(
        OrmConnection,
        "get_connection_from_secrets",
        classmethod(guard("Connection.get_connection_from_secrets", from_secrets)),
    )
    for cls, label in ((SdkConnection, "sdk"), (OrmConnection, "ORM")):
        fget = cls.__dict__["extra_dejson"].fget
        monkeypatch.setattr(cls, "extra_dejson", property(guard(f"{label} Connection.extra_dejson", fget)))
    return seen


def assert_no_sync_lookup(seen: SyncAccess) -> None:
    """Nothing sync ran on the loop, and the sync lookups were not used at all (on any thread)."""
    assert seen.on_loop == []
    assert not {"BaseHook.get_connection", "Connection.get", "Connection.get_connection_from_secrets"} & set(
        seen.off_loop
    )


def test_the_sync_access_guard_trips_on_the_event_loop(no_sync_connection_access: SyncAccess) -> None:
    from airflow.sdk import BaseHook

    async def sync_lookup_from_async_code() -> None:
        BaseHook.get_connection("anything")

    with pytest.raises(AssertionError, match="called on the event loop's thread"):
        asyncio.run(sync_lookup_from_async_code())
    assert no_sync_connection_access.on_loop == ["BaseHook.get_connection"]


# ------------------------------------------------------------------ the connection form


def test_the_hook_matches_the_declared_connection_form() -> None:
    [conn_type] = get_provider_info()["connection-types"]
    assert conn_type["connection-type"] == SystemZeroHook.conn_type == "systemzero"
    assert conn_type["hook-name"] == SystemZeroHook.hook_name == "System Zero"
    module, _, name = conn_type["hook-class-name"].rpartition(".")
    assert getattr(__import__(module, fromlist=[name]), name) is SystemZeroHook
    assert SystemZeroHook.conn_name_attr == "systemzero_conn_id"
    assert SystemZeroHook.default_conn_name == "systemzero_default"
    behaviour = conn_type["ui-field-behaviour"]
    assert behaviour["relabeling"]["password"] == "API key" and "password" not in behaviour["hidden-fields"]
    assert {"login", "schema"} <= set(behaviour["hidden-fields"]) and "host" not in behaviour["hidden-fields"]
    # the port is shown, its label saying why it is stored (Airflow 3.3.2's Test button needs it)
    assert "port" not in behaviour["hidden-fields"] and "Test button" in behaviour["relabeling"]["port"]
    # the fields themselves: tests/test_packaging.py::test_connection_type_declaration


def test_airflow_discovers_a_testable_hook() -> None:
    try:
        from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime as Manager
    except ImportError:  # Airflow 3.1: the task runtime reads hooks through the core manager
        from airflow.providers_manager import ProvidersManager as Manager

    info = Manager().hooks["systemzero"]
    assert info is not None and info.hook_class_name.endswith("SystemZeroHook")
    assert info.connection_id_attribute_name == "systemzero_conn_id" and info.connection_testable


def test_settings_come_from_the_connection_fields() -> None:
    conn = sdk_connection(host="api.example.com", port=8443, password=f" {SECRET_KEY} ")
    extra = {
        "model": "m-1",
        "prompt_cache_key_prefix": "team",
        "open_timeout": "7.5",
        "ca_bundle": "/etc/ca.pem",
        "proxy": "http://proxy:3128",
    }
    settings = SystemZeroHook.settings_from_connection(conn, extra)
    assert settings.url == "wss://api.example.com:8443/v1/system-zero/stream"
    assert settings.api_key == SECRET_KEY and settings.open_timeout == 7.5
    assert (settings.default_model, settings.prompt_cache_key_prefix) == ("m-1", "team")
    assert (settings.ca_bundle, settings.proxy) == ("/etc/ca.pem", "http://proxy:3128")
    bare = SystemZeroHook.settings_from_connection(sdk_connection(host="https://api.example.com"), {})
    assert bare.url == "wss://api.example.com/v1/system-zero/stream" and bare.proxy is None


@pytest.mark.parametrize(
    ("fields", "extra", "message", "field"),
    [
        (
            {"password": None},
            {},
            "connection 'sz' has no API key: set it in the connection's password field",
            "password",
        ),
        ({"host": None}, {}, "connection 'sz' has no host", "host"),
        ({"host": "wss://me:pw@api.example.com"}, {}, "must not contain credentials", "host"),
        ({"host": "ws://api.example.com"}, {}, "only to a loopback host", "host"),
        ({}, {"open_timeout": "soon"}, "extra 'open_timeout' must be a positive number", "open_timeout"),
        # an opening that never times out: a gateway that never answers the upgrade holds it forever
        ({}, {"open_timeout": "inf"}, "extra 'open_timeout' must be a positive number", "open_timeout"),
        ({}, {"open_timeout": 0}, "extra 'open_timeout' must be a positive number", "open_timeout"),
        ({}, {"model": 5}, "extra 'model' must be a string", "model"),
        # a cap spelt wrong would mean no cap at all
        (
            {},
            {"budget_decision_per_hour": 2},
            "extra 'budget_decision_per_hour' is not a field of a systemzero connection; did you mean "
            "'budget_decisions_per_hour'",
            "budget_decision_per_hour",
        ),
        ({}, {"modle": "m-1"}, "did you mean 'model'", "modle"),
    ],
)
def test_incomplete_connections_are_refused_naming_the_field(
    fields: dict[str, Any], extra: dict[str, Any], message: str, field: str
) -> None:
    with pytest.raises(SystemZeroValidationError, match=message) as info:
        SystemZeroHook.settings_from_connection(sdk_connection(**fields), extra)
    assert info.value.field == field and SECRET_KEY not in str(info.value)


def test_an_unknown_extra_that_is_no_misspelt_field_is_ignored_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="airflow_provider_systemzero.hooks.systemzero"):
        settings = SystemZeroHook.settings_from_connection(
            sdk_connection(), {"team": "billing", "model": "m"}
        )
    assert settings.default_model == "m"
    [record] = caplog.records
    assert "extra 'team' is not a field of a systemzero connection and is ignored" in record.getMessage()
    assert "budget_decisions_per_hour" in record.getMessage()  # the fields are listed


# ------------------------------------------------------------------ async lookup, never the sync one


async def test_the_example_exchange_through_the_hook(
    emu: Emulator, fast_backoff: Backoff, no_sync_connection_access: SyncAccess
) -> None:
    hook = SystemZeroHook(CONN_ID, backoff=fast_backoff)
    async with hook.stream(
        REQUEST,
        decision_mode="on_request",
        state="Initial log\n",
        idempotency_key="example-state-1",
        identity="example",
    ) as stream:
        await stream.append_text("Job is ready.\n", idempotency_key="example-state-2")
        decision = await stream.decide(timeout=10)
        assert isinstance(decision, DecisionResult)
        assert decision.answer("ready").decision is True and decision.answer("ready").probability is not None
        assert decision.state_version == 2 and decision.covered_event_ids == ("evt_1", "evt_2")
        assert decision.request_id and decision.reply["model"] == "MODEL_ID"  # the connection's model extra
        assert stream.request.prompt_cache_key == derive_prompt_cache_key("hook-tests", "example")

        await emu.restart(retry_after_ms=500)
        # decided: nothing to send or wait for, so no connection until the next decide asked for
        await emu.wait_for(lambda e: stream.dormant and not stream.connected, timeout=10)
        assert not stream.reconnects
        replayed = await stream.decide(timeout=10)
        assert stream.reconnects[0].close_code == 1012 and stream.reconnects[0].waited >= 0.5
    assert replayed.decisions() == {"ready": True}
    assert emu.stats.decisions_billed == 1 and emu.stats.decisions_replayed == 1
    assert_no_sync_lookup(no_sync_connection_access)
    [handshake, *_] = emu.handshakes
    assert handshake["Authorization"] == "Bearer ***"  # the emulator saw a bearer key


async def test_on_change_through_the_hook(
    emu: Emulator, fast_backoff: Backoff, no_sync_connection_access: SyncAccess
) -> None:
    hook = SystemZeroHook(CONN_ID, backoff=fast_backoff)
    async with hook.stream(REQUEST, decision_mode="on_change", state=["boot"], identity="items") as stream:
        await stream.append_items(["Job is ready."])
        async for decision in stream.decisions():
            if stream.in_sync and decision.state_version == stream.state_version:
                break
        assert stream.state == ["boot", "Job is ready."] and stream.last_decision is decision
    assert_no_sync_lookup(no_sync_connection_access)


async def test_async_settings_register_the_key_with_airflow_masking(
    emu: Emulator, no_sync_connection_access: SyncAccess
) -> None:
    try:
        from airflow.sdk.log import _secrets_masker
    except ImportError:  # Airflow 3.1
        from airflow.sdk._shared.secrets_masker import _secrets_masker

    settings = await SystemZeroHook(CONN_ID).aget_settings()
    assert settings.api_key == SECRET_KEY and settings.default_model == "MODEL_ID"
    assert SECRET_KEY not in str(_secrets_masker().redact(f"key={SECRET_KEY}"))
    assert_no_sync_lookup(no_sync_connection_access)


async def test_sdk_connections_are_read_with_aextra_dejson(
    monkeypatch: pytest.MonkeyPatch, no_sync_connection_access: SyncAccess
) -> None:
    conn = sdk_connection(extra=json.dumps({"model": "from-extra"}))

    async def aget_connection(cls: Any, conn_id: str) -> Any:
        assert conn_id == "sz"
        return conn

    monkeypatch.setattr(SystemZeroHook, "aget_connection", classmethod(aget_connection))
    settings = await SystemZeroHook("sz").aget_settings()
    assert settings.default_model == "from-extra"
    assert_no_sync_lookup(no_sync_connection_access)


@pytest.mark.skipif(
    airflow_version()[:2] < (3, 3),
    reason="Airflow 3.1's and 3.2's own async lookup calls sync-only "
    "in-process comms itself and finds the connection, so the hook's off-loop fallback is not reached "
    "(dag.test() only)",
)
async def test_in_process_comms_without_async_send_are_used_off_the_loop(
    no_sync_connection_access: SyncAccess,
) -> None:
    """``dag.test()`` runs triggers with supervisor comms that only have a sync ``send`` (Airflow
    3.3.2): the async lookup cannot reach the DB there, so the hook looks up on a worker thread."""
    import threading

    from airflow.sdk.execution_time.comms import ConnectionResult, GetConnection
    from airflow.sdk.execution_time.supervisor import set_supervisor_comms

    loop_thread = threading.get_ident()
    threads: list[int] = []

    class SyncOnlyComms:
        def send(self, msg: Any) -> Any:
            threads.append(threading.get_ident())
            assert isinstance(msg, GetConnection) and msg.conn_id == "sz_inproc"
            return ConnectionResult(
                conn_id="sz_inproc",
                conn_type="systemzero",
                host="wss://api.example.com",
                login=None,
                schema=None,
                port=None,
                password=SECRET_KEY,
                extra=json.dumps({"model": "m-inproc"}),
            )

    with set_supervisor_comms(SyncOnlyComms()):
        settings = await SystemZeroHook("sz_inproc").aget_settings()
    assert settings.default_model == "m-inproc" and settings.api_key == SECRET_KEY
    assert threads and loop_thread not in threads  # the sync send ran on a worker thread
    assert no_sync_connection_access.on_loop == []
    assert "BaseHook.get_connection" in no_sync_connection_access.off_loop  # the fallback, off the loop


async def test_ten_streams_from_ten_hooks_share_the_process_cap(emu: Emulator, fast_backoff: Backoff) -> None:
    async def one(n: int) -> bool:
        hook = SystemZeroHook(CONN_ID, backoff=fast_backoff)  # a hook per stream, like one per trigger
        async with hook.stream(
            REQUEST, decision_mode="on_request", state=f"{n}: Job is ready.\n", identity=f"cap-{n}"
        ) as stream:
            return (await stream.decide(timeout=30)).decisions()["ready"]

    emu.backend.decide_latency_ms = 50
    assert await asyncio.gather(*(one(n) for n in range(10))) == [True] * 10
    assert emu.stats.max_streams_open <= 4 and default_capacity().max_in_use <= 4
    assert emu.stats.streams_total == 10 and emu.stats.upgrade_refusals == {}


async def test_a_wrong_key_fails_at_once_without_showing_it(
    emu: Emulator, fast_backoff: Backoff, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = "sz-wrong-key-9876543210"
    store_connection(host=emu.origin, password=wrong)
    hook = SystemZeroHook(CONN_ID, backoff=Backoff(base=5, cap=5))
    with caplog.at_level(logging.DEBUG), pytest.raises(AuthenticationFailed, match="password field") as info:
        async with hook.stream(REQUEST, decision_mode="on_request"):
            pass
    assert info.value.status == 401 and emu.stats.upgrade_refusals == {401: 1}
    texts = [str(info.value), repr(info.value), repr(hook)]
    texts += [
        r.getMessage()
        for r in caplog.records
        if not r.name.startswith("airflow_provider_systemzero.emulator")
    ]
    assert all(wrong not in text for text in texts)


# ------------------------------------------------------------------ sync helpers (workers, the UI)


def test_sync_decide_runs_one_on_request_decision(threaded_emu: EmulatorThread) -> None:
    hook = SystemZeroHook(CONN_ID, backoff=Backoff(base=0.02, cap=0.1))
    decision = hook.decide(REQUEST, "Initial log\nJob is ready.\n", timeout=20, identity="sync")
    assert decision.decisions() == {"ready": True} and decision.covered_event_ids == ("evt_1",)
    threaded_emu.call(lambda e: e.wait_for(lambda emu: emu.stats.streams_open == 0, timeout=5))
    stats = threaded_emu.call(lambda e: e.stats)
    assert stats.decisions_billed == 1 and stats.closes_by_code == {1000: 1}


async def test_sync_decide_from_a_running_loop_uses_a_helper_thread(threaded_emu: EmulatorThread) -> None:
    hook = SystemZeroHook(CONN_ID, backoff=Backoff(base=0.02, cap=0.1))
    decision = hook.decide(REQUEST, "Initial log\n", timeout=20)  # blocks this loop; runs on its own
    assert decision.decisions() == {"ready": False}


def test_a_short_form_question_is_refused_with_the_wire_form_to_write(threaded_emu: EmulatorThread) -> None:
    hook = SystemZeroHook(CONN_ID, backoff=Backoff(base=0.02, cap=0.1))
    with pytest.raises(ValueError) as raised:
        hook.decide({"questions": {"ready": "Is it ready?"}}, "Initial log\n", timeout=20)
    assert str(raised.value) == (
        "questions.ready must be an object {type, instructions[, options]}: write each question as "
        "{'type': 'boolean', 'instructions': 'Is it ready?'} (or 'choice' with 'options'), or turn "
        "the shorthand into that form with airflow_provider_systemzero.questions.normalise_questions"
    )
    assert threaded_emu.call(lambda e: e.stats).streams_total == 0  # refused before connecting


def test_sync_decide_honours_its_timeout(threaded_emu: EmulatorThread) -> None:
    threaded_emu.emulator.faults.delay_decisions_ms = 10_000
    hook = SystemZeroHook(CONN_ID, backoff=Backoff(base=0.02, cap=0.1))
    with pytest.raises(DeadlineExceeded, match=r"no decision within"):
        hook.decide(REQUEST, "Initial log\n", timeout=1)
    threaded_emu.call(lambda e: e.wait_for(lambda emu: emu.stats.streams_open == 0, timeout=5))


def test_test_connection_reads_hello_and_closes_normally(threaded_emu: EmulatorThread) -> None:
    ok, message = SystemZeroHook(CONN_ID).test_connection()
    assert ok, message
    assert "system-zero.stream.v1" in message and "max_streams_per_process=4" in message
    assert "default model 'MODEL_ID'" in message
    threaded_emu.call(lambda e: e.wait_for(lambda emu: emu.stats.closes_by_code == {1000: 1}, timeout=5))


def test_test_connection_says_when_no_default_model_is_set(threaded_emu: EmulatorThread) -> None:
    # the connection works, but a task that names no model would fail: the Test button says so
    store_connection(host=threaded_emu.emulator.origin, extra={"open_timeout": "5"})
    ok, message = SystemZeroHook(CONN_ID).test_connection()
    assert ok, message
    assert "no default model: every task must pass model=, or set the 'model' extra" in message


def test_test_connection_reports_a_wrong_key_without_showing_it(threaded_emu: EmulatorThread) -> None:
    wrong = "sz-wrong-key-9876543210"
    store_connection(host=threaded_emu.emulator.origin, password=wrong)
    ok, message = SystemZeroHook(CONN_ID).test_connection()
    assert not ok and "HTTP 401" in message and "password field" in message and wrong not in message


def test_test_connection_reports_an_unreachable_gateway(server_context: None) -> None:
    with EmulatorThread(api_keys={SECRET_KEY: 8}) as gone:
        origin = gone.emulator.origin
    store_connection(host=origin)
    ok, message = SystemZeroHook(CONN_ID).test_connection()
    assert not ok and message


def test_a_connection_that_stores_no_port_is_named_as_the_test_buttons_cause(
    sync_threaded_emu: EmulatorThread, caplog: pytest.LogCaptureFixture
) -> None:
    # Airflow 3.3.2's Test button refuses such a connection before the hook is asked
    # (apache/airflow#73298): where the hook is asked (the CLI, another Airflow) it says so
    origin = sync_threaded_emu.emulator.origin
    port = int(origin.rsplit(":", 1)[1])
    with caplog.at_level(logging.WARNING, logger="airflow_provider_systemzero.hooks.systemzero"):
        ok, message = SystemZeroHook(CONN_ID).test_connection()
    assert ok, message
    note = f"connection {CONN_ID!r} stores no port: Airflow 3.3.2's Test button refuses such a connection"
    assert note in message and f"--conn-port {port}" in message
    assert [r.getMessage() for r in caplog.records if note in r.getMessage()], caplog.text

    caplog.clear()
    store_connection(host=origin, port=port)  # as the README creates it
    with caplog.at_level(logging.WARNING, logger="airflow_provider_systemzero.hooks.systemzero"):
        ok, message = SystemZeroHook(CONN_ID).test_connection()
    assert ok and "stores no port" not in message and "stores no port" not in caplog.text, message


@pytest.mark.parametrize(
    ("host", "port"),
    [
        ("wss://api.example.com", 443),
        ("api.example.com", 443),
        ("https://gw.example:8443", 8443),
        ("ws://127.0.0.1:8765", 8765),
        ("ws://localhost", 80),
    ],
)
def test_the_port_to_store_is_the_origins(host: str, port: int) -> None:
    from airflow_provider_systemzero.hooks.systemzero import stored_port

    assert stored_port(host) == port


def test_a_stored_port_that_contradicts_the_origins_is_refused() -> None:
    # both would be a guess: the message shows the two, and the fix
    conn = sdk_connection(host="wss://api.example.com:8443", port=443)
    with pytest.raises(
        SystemZeroValidationError, match=r"its port 443 differs from the port of its API origin"
    ) as info:
        SystemZeroHook.settings_from_connection(conn, {})
    assert info.value.field == "port" and "store 8443 as the port" in str(info.value)
    same = SystemZeroHook.settings_from_connection(
        sdk_connection(host="wss://api.example.com:8443", port=8443), {}
    )
    assert same.url == "wss://api.example.com:8443/v1/system-zero/stream"


@pytest.mark.filterwarnings("ignore:The HMAC key is:Warning", "ignore:ProvidersManager.hooks is deprecated")
def test_the_test_button_names_the_persons_connection_not_airflows_temporary_one(
    sync_threaded_emu: EmulatorThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Airflow's own API route (the Test button's request) tests a copy stored under a random ID
    from airflow.api_fastapi.app import create_app, get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from fastapi.testclient import TestClient

    monkeypatch.setenv("AIRFLOW__CORE__TEST_CONNECTION", "Enabled")
    api = TestClient(create_app(apps="core"))
    token = get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="admin", role="admin"))

    def press(conn_id: str) -> dict[str, Any]:
        response = api.post(
            "/api/v2/connections/test",
            json={"connection_id": conn_id, "conn_type": "systemzero"},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert response.status_code == 200, response.text
        return response.json()

    origin = sync_threaded_emu.emulator.origin
    store_connection("systemzero_named", host=origin, extra={"modle": "m-1"})  # a misspelt extra
    answer = press("systemzero_named")
    assert answer["status"] is False
    assert "connection 'systemzero_named': extra 'modle'" in answer["message"], answer
    store_connection("systemzero_named", host=origin)  # and without a port
    answer = press("systemzero_named")
    assert answer["status"] is True, answer
    assert "connection 'systemzero_named' stores no port" in answer["message"], answer


# ------------------------------------------------------------------ secrecy


def test_the_key_is_in_no_repr_or_serialized_object(server_context: None) -> None:
    store_connection(host="wss://api.example.com", extra=EXTRA)
    hook = SystemZeroHook(CONN_ID)
    settings = hook.get_settings()
    stream = hook.stream(REQUEST, settings=settings)
    for text in (repr(hook), str(hook), repr(settings), repr(stream)):
        assert SECRET_KEY not in text
    assert SECRET_KEY.encode() not in pickle.dumps(hook)
    with pytest.raises(TypeError, match="cannot be serialised"):
        pickle.dumps(settings)
