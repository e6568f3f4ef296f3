"""What each supported Airflow release gets, checked on the Airflow this suite runs against.

The matrix (``make test-matrix``) runs this file on Airflow 3.1, 3.2 and 3.3: every test states
what its release should do, so a fallback that stops working fails on the corner that needs it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_provider_systemzero import compat
from airflow_provider_systemzero.provider_info import get_provider_info
from tests.helpers import ResumedTaskInstance, TaskStateStore

CONNECTION = get_provider_info()["connection-types"][0]


def _installed_airflow() -> tuple[int, int]:
    major, minor = metadata.version("apache-airflow-core").split(".")[:2]
    return int(major), int(minor)


def test_version_detection_matches_the_installed_airflow() -> None:
    import airflow

    assert ".".join(map(str, compat.airflow_version())) == airflow.__version__.split("+")[0]
    assert compat.has_conn_fields() is (_installed_airflow() >= (3, 2))
    assert compat.has_awaiting_input() is (_installed_airflow() >= (3, 3))
    assert compat.has_shared_streams() is (_installed_airflow() >= (3, 3))


@pytest.fixture
def fresh_providers_manager() -> Iterator[None]:
    """The providers manager as a freshly started api-server has it, and as it was afterwards.

    Airflow 3.1 asks a hook for its form only the first time it imports the hook, and only the
    api-server's form request imports it with the stand-ins for WTForms that make the widgets
    work; a hook imported earlier in the process (a connection's ``get_hook()``, as other tests
    do) keeps an empty form. The form a user sees is the one a fresh api-server builds.

    Airflow 3.1's form request also puts stand-ins into ``sys.modules`` for WTForms and
    Flask-AppBuilder where they are not installed, and leaves them there: afterwards, hooks read
    again outside the request would build their widgets from those stand-ins, which Airflow then
    refuses (``hooks[...]`` reads ``None``). They are taken out with the rest of the state.
    """
    import sys

    from airflow.api_fastapi.core_api.services.ui.connections import HookMetaService
    from airflow.providers_manager import ProvidersManager

    modules = dict(sys.modules)
    ProvidersManager()._cleanup()
    HookMetaService.hook_meta_data.cache_clear()
    yield
    for name in [name for name in sys.modules if name not in modules]:
        if name.startswith(("wtforms", "flask_babel", "flask_appbuilder")):
            del sys.modules[name]
    ProvidersManager()._cleanup()
    HookMetaService.hook_meta_data.cache_clear()


@pytest.mark.usefixtures("fresh_providers_manager")
def test_the_connection_form_is_complete_on_this_airflow() -> None:
    """The React UI's form (``/ui/connections/hook_meta``) on every release: from ``conn-fields``
    on 3.2+, from the hook's two methods on 3.1 — the same fields, labels and behaviour."""
    from airflow.api_fastapi.core_api.services.ui.connections import HookMetaService

    (meta,) = [m for m in HookMetaService.hook_meta_data() if m.connection_type == "systemzero"]
    shown = meta.model_dump()
    extra = shown["extra_fields"] or {}
    assert set(extra) == set(CONNECTION["conn-fields"])
    for name, field in CONNECTION["conn-fields"].items():
        assert extra[name]["schema"]["title"] == field["label"], name
    assert extra["open_timeout"]["value"] == 10
    # Only the declarative path carries the schema's bounds: 3.2+ must not fall back to the hook.
    declared = CONNECTION["conn-fields"]["open_timeout"]["schema"]["exclusiveMinimum"]
    shown_bound = extra["open_timeout"]["schema"].get("exclusiveMinimum")
    assert (shown_bound == declared) is compat.has_conn_fields()
    behaviour = CONNECTION["ui-field-behaviour"]
    standard = shown["standard_fields"]
    assert standard["host"]["title"] == behaviour["relabeling"]["host"]
    assert standard["password"]["title"] == behaviour["relabeling"]["password"]
    assert standard["host"]["placeholder"] == behaviour["placeholders"]["host"]
    assert standard["login"]["hidden"]
    assert not standard["port"]["hidden"] and standard["port"]["title"] == behaviour["relabeling"]["port"]
    assert standard["url_schema"]["hidden"]


def test_the_hook_methods_mirror_the_provider_info() -> None:
    from airflow_provider_systemzero.hooks.systemzero import SystemZeroHook

    behaviour = SystemZeroHook.get_ui_field_behaviour()
    assert behaviour["hidden_fields"] == CONNECTION["ui-field-behaviour"]["hidden-fields"]
    assert behaviour["relabeling"] == CONNECTION["ui-field-behaviour"]["relabeling"]
    assert behaviour["placeholders"] == CONNECTION["ui-field-behaviour"]["placeholders"]


def _budget_warnings(caplog: pytest.LogCaptureFixture, context: dict[str, Any]) -> list[str]:
    from airflow_provider_systemzero.tasks.usage import TaskUsageLedger

    logger = logging.getLogger("tests.compat.budget")
    with caplog.at_level(logging.WARNING, logger=logger.name):
        TaskUsageLedger(context, max_decisions=2, task_label="'d.t'", logger=logger)
    return [r.getMessage() for r in caplog.records if r.name == logger.name]


def test_a_budget_without_a_task_state_store_says_it_covers_one_try(caplog: pytest.LogCaptureFixture) -> None:
    messages = _budget_warnings(caplog, {"ti": None})
    if compat.airflow_version()[:2] >= compat.AIRFLOW_TASK_STATE_STORE:
        # Airflow 3.3 hands every task a store; a bare context is a test double, not a notice-worthy release.
        assert messages == []
    else:
        (message,) = messages
        assert "no task state store" in message and "cover this try only" in message and "'d.t'" in message


def test_a_budget_with_a_task_state_store_gives_no_notice(caplog: pytest.LogCaptureFixture) -> None:
    assert _budget_warnings(caplog, {"ti": None, "task_state_store": TaskStateStore()}) == []


def test_has_task_state_store_reads_the_context() -> None:
    assert compat.has_task_state_store({"task_state_store": TaskStateStore()})
    assert not compat.has_task_state_store({"task_state_store": None})
    assert not compat.has_task_state_store({})
    assert not compat.has_task_state_store(None)


def test_a_review_waits_the_way_this_airflow_can(monkeypatch: pytest.MonkeyPatch) -> None:
    """A decision in the review band, resumed from the operator's trigger: 3.3 parks the task in
    ``awaiting_input``; 3.1 / 3.2 defer it to ``HITLTrigger`` with the same request, and it
    resumes in the same method with the same gate."""
    from datetime import timedelta

    from airflow.sdk.execution_time import hitl

    from airflow_provider_systemzero.decisions.policy import DecisionPolicy
    from airflow_provider_systemzero.identity import task_namespace
    from airflow_provider_systemzero.operators.decide import SystemZeroDecideOperator

    written: list[dict[str, Any]] = []
    monkeypatch.setattr(hitl, "upsert_hitl_detail", lambda **kwargs: written.append(kwargs))
    policy = DecisionPolicy(act_above=0.8, review_above=0.5, below="skip", default=False, review_timeout=60)
    operator = SystemZeroDecideOperator(
        task_id="decide", questions={"publish": "Publish it?"}, state="x", policy=policy
    )
    answer = {"decision": True, "probability": 0.6, "confidence": 0.6}
    event = {
        "status": "success",
        "key_namespace": task_namespace("d", "decide", "r", -1),
        "question": "publish",
        "decision": True,
        "reply_id": "szd_review",
        "state_version": 1,
        "state_hash": "abc",
        "answers": {"publish": answer},
    }
    ti = ResumedTaskInstance()
    with pytest.raises(BaseException) as raised:
        operator.execute_complete({"task_instance": ti, "ti": ti}, event=event)
    (request,) = written
    assert request["ti_id"] == ti.id and request["options"] == ["Yes", "No"] and request["defaults"] == ["No"]
    assert ti.xcoms["decision"]["status"] == "pending_review"
    resume = raised.value.kwargs
    assert resume["gate"]["question"] == "publish" and resume["gate"]["answer"] == answer
    assert resume["gate"]["state_hash"] == "abc" and resume["outcome"]["action"] == "review"
    if compat.has_awaiting_input():
        assert type(raised.value).__name__ == "TaskAwaitingInput"
        assert raised.value.method_name == "execute_review_complete"
        assert raised.value.timeout == timedelta(seconds=60)
    else:
        from airflow.providers.standard.triggers.hitl import HITLTrigger

        assert type(raised.value).__name__ == "TaskDeferred"
        deferred = raised.value
        assert deferred.method_name == "execute_review_complete"
        assert isinstance(deferred.trigger, HITLTrigger)
        classpath, kwargs = deferred.trigger.serialize()
        assert classpath == "airflow_provider_systemzero.tasks.review_wait.ReviewTrigger"
        assert (kwargs["ti_id"], kwargs["options"], kwargs["defaults"]) == (ti.id, ["Yes", "No"], ["No"])
        assert kwargs["timeout_datetime"] is not None
        # what the task resumes with travels in the trigger too: dag.test() resumes with the event alone
        assert kwargs["resume"] == resume


def test_a_review_trigger_is_hitl_trigger_with_what_the_task_resumes_with(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The trigger a review defers to on Airflow 3.1 / 3.2 rebuilds from its kwargs (as a triggerer
    does) and fires Airflow's own HITL events, each with ``resume`` added."""
    import asyncio
    import contextlib
    import uuid

    from airflow.triggers.base import TriggerEvent

    from airflow_provider_systemzero.tasks import review_wait

    resume = {"gate": {"question": "publish"}, "outcome": {"action": "review"}}
    trigger = review_wait.ReviewTrigger(
        ti_id=uuid.uuid4(), options=["Yes", "No"], params={}, timeout_datetime=None, resume=resume
    )
    classpath, kwargs = trigger.serialize()
    rebuilt = review_wait.ReviewTrigger(**kwargs)
    assert rebuilt.serialize() == (classpath, kwargs) and rebuilt.resume == resume

    answer = {"chosen_options": ["Yes"], "params_input": {}, "responded_at": None, "timedout": False}

    async def answered(self: Any) -> TriggerEvent:  # a person answered (HITLTrigger read it back)
        return TriggerEvent(answer)

    async def first_event() -> TriggerEvent:
        return await anext(rebuilt.run())

    monkeypatch.setattr(review_wait.HITLTrigger, "_handle_response", answered)
    event = asyncio.run(first_event())
    assert event.payload == {**answer, "resume": resume}
    assert rebuilt.poke_interval == 5.0  # HITLTrigger's own, outside dag.test()
    # under dag.test() (the shortcut applies), it checks every second
    monkeypatch.setattr(review_wait, "in_process_review_comms", lambda: contextlib.nullcontext(True))
    asyncio.run(first_event())
    assert rebuilt.poke_interval == review_wait.IN_PROCESS_POKE_INTERVAL == 1.0


def test_under_dag_test_the_review_requests_go_to_the_execution_api_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under ``dag.test()``'s in-process supervisor (which answers a task's requests only), the two
    review requests a trigger makes (``HITLTrigger``'s on 3.1 / 3.2, a watching sensor's on every
    release) go to the supervisor's Execution API client; any other request, and every request
    outside ``dag.test()``, is left as it was."""
    import uuid

    from airflow.sdk.execution_time import task_runner
    from airflow.sdk.execution_time.comms import GetConnection, GetHITLDetailResponse, UpdateHITLDetail
    from airflow.sdk.execution_time.supervisor import InProcessSupervisorComms

    from airflow_provider_systemzero.tasks import review_wait

    calls: list[tuple[str, Any]] = []

    class Hitl:
        def get_detail_response(self, ti_id: Any) -> str:
            calls.append(("get", ti_id))
            return "detail"

        def update_response(self, ti_id: Any, chosen_options: list[str], params_input: dict[str, Any]) -> str:
            calls.append(("update", (ti_id, chosen_options, params_input)))
            return "updated"

    class Comms(InProcessSupervisorComms):  # dag.test()'s comms, without its supervisor
        def send(self, msg: Any) -> str:
            calls.append(("comms", type(msg).__name__))
            return "from the supervisor"

    comms = Comms(supervisor=SimpleNamespace(client=SimpleNamespace(hitl=Hitl())))  # type: ignore[arg-type]
    ti_id = uuid.uuid4()
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", comms, raising=False)
    with review_wait.in_process_review_comms() as applied:
        assert applied
        served = task_runner.SUPERVISOR_COMMS
        assert served.send(GetHITLDetailResponse(ti_id=ti_id)) == "detail"
        assert served.send(UpdateHITLDetail(ti_id=ti_id, chosen_options=["No"], params_input={})) == "updated"
        assert served.send(GetConnection(conn_id="c")) == "from the supervisor"
    assert task_runner.SUPERVISOR_COMMS is comms
    assert calls == [("get", ti_id), ("update", (ti_id, ["No"], {})), ("comms", "GetConnection")]
    # a triggerer's comms are left alone
    other = SimpleNamespace(send=lambda msg: "triggerer")
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", other, raising=False)
    with review_wait.in_process_review_comms() as applied:
        assert not applied and task_runner.SUPERVISOR_COMMS is other


def test_a_review_answer_from_the_trigger_is_recorded_as_json() -> None:
    """``HITLTrigger``'s event (3.1 / 3.2) carries ``responded_at`` as a datetime; the record keeps text."""
    from datetime import datetime

    from airflow_provider_systemzero.decisions.policy import DecisionPolicy, PolicyOutcome
    from airflow_provider_systemzero.operators.decide import SystemZeroDecideOperator
    from airflow_provider_systemzero.tasks.review import Gate

    operator = SystemZeroDecideOperator(
        task_id="decide",
        questions={"publish": "Publish it?"},
        state="x",
        policy=DecisionPolicy(act_above=0.8, review_above=0.5, below="skip"),
    )
    gate = Gate(
        question="publish", kind="boolean", answer={"decision": True, "probability": 0.6, "confidence": 0.6}
    )
    outcome = PolicyOutcome("review", "in the band", "in_review_band", 0.6, 0.8, 0.5)
    ti = ResumedTaskInstance()
    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    event = {
        "chosen_options": ["No"],
        "params_input": {},
        "responded_by_user": {"id": "a", "name": "a"},
        "responded_at": at,
        "timedout": False,
    }
    operator.execute_review_complete(
        {"task_instance": ti, "ti": ti}, event=event, gate=gate.to_dict(), outcome=outcome.to_dict()
    )
    record = ti.xcoms["decision"]
    assert record["review"]["responded_at"] == at.isoformat() and record["decided_by"] == "human"


def test_start_from_trigger_falls_back_to_a_worker_where_the_triggerer_cannot_render(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    from airflow_provider_systemzero.sensors.decision import SystemZeroDecisionSensor

    with caplog.at_level(logging.WARNING):
        sensor = SystemZeroDecisionSensor(
            task_id="wait",
            question="ready",
            instructions="Is it ready?",
            model="m",
            state="log",
            start_from_trigger=True,
        )
    captured = capfd.readouterr()
    logged = (
        caplog.text + captured.out + captured.err
    )  # the task SDK's logger may write to the stream directly
    if compat.has_trigger_templates():
        assert sensor.start_from_trigger and sensor.start_trigger_args is not None
        assert "start_from_trigger needs Airflow 3.3" not in logged
    else:
        assert not sensor.start_from_trigger and sensor.start_trigger_args is None
        assert "start_from_trigger needs Airflow 3.3" in logged
    assert compat.has_trigger_templates() is (_installed_airflow() >= (3, 3))


def test_the_metrics_module_is_taken_from_its_current_home_without_a_deprecation() -> None:
    import importlib.util
    import subprocess
    import sys

    # a fresh process: whether ``airflow.stats`` (which warns on import) is loaded is per process
    script = (
        "import sys, warnings\n"
        "warnings.simplefilter('always')\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    from airflow_provider_systemzero.compat import stats\n"
        "    stats.incr('systemzero.test_metric', 1, tags={})\n"
        "print(getattr(stats, '__name__', type(stats).__name__))\n"
        "print('airflow.stats' in sys.modules)\n"
        "print(sum('airflow.stats' in str(w.message) for w in caught))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    home, old_loaded, warned = done.stdout.split()
    # an older Airflow (3.1 has no airflow.sdk.observability) has the one home, which incr() ran on
    try:
        current_home = importlib.util.find_spec("airflow.sdk.observability.stats") is not None
    except ModuleNotFoundError:
        current_home = False
    if current_home:
        assert home == "airflow.sdk.observability.stats"
        assert old_loaded == "False" and warned == "0"


def test_the_supervisor_comms_are_read_in_one_place(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.execution_time import task_runner

    from airflow_provider_systemzero.hooks.systemzero import _supervisor_comms_lack_async_send

    monkeypatch.delattr(task_runner, "SUPERVISOR_COMMS", raising=False)
    assert compat.supervisor_comms() is None and not _supervisor_comms_lack_async_send()
    in_process = object()  # dag.test()'s comms: no asend
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", in_process, raising=False)
    assert compat.supervisor_comms() is in_process and _supervisor_comms_lack_async_send()
    source = (Path(compat.__file__).parent).rglob("*.py")
    readers = sorted(
        str(path.relative_to(Path(compat.__file__).parent))
        for path in source
        if 'getattr(task_runner, "SUPERVISOR_COMMS"' in path.read_text(encoding="utf-8")
    )
    assert readers == ["compat.py"]


def test_outside_the_test_buttons_route_the_hooks_own_connection_is_named() -> None:
    # the CLI's test, a worker's test and a task build the hook on the ID the person gave
    assert compat.tested_connection_id("systemzero_default") is None
