"""The Airflow UI as a person uses it, in Debian's Chromium driven by Playwright, against real
Airflow components and the emulator (see ``conftest.py``).

1. Adding a System Zero connection: the type is offered, the fields carry the provider's labels
   and placeholders (the port's saying why it is stored), the unused ones are hidden, the key is a
   password input; saving stores it; the Test button reports success for it and for a connection
   made the README's way, and a wrong key and a stopped gateway by their cause.
2. A sensor whose policy asks a person: the task stays deferred, watching its source, and its
   Required Actions page shows the question, the state it asks about and the model's probability
   and confidence; "No" keeps the sensor waiting for a new state, "Yes" lets it succeed, and a
   decisive newer state lets it succeed with nobody answering and takes the request out of
   Required Actions.
3. The ``decision`` and ``usage`` XComs in the XCom view.
4. The "Decision timeline" tab of a sensor that saw three states: its chart's points and its table
   match the ``decisions`` XCom.

Each step's screenshot is written to ``docs/images/ui-*.png`` (the pictures of docs/connection.md,
docs/policies.md and docs/sensor.md). ``make test-ui`` runs it on the installed Airflow (3.3 in
``.venv``); ``make test-matrix MATRIX=3.1:3.11 PYTEST_ARGS="-m ui tests/ui"`` runs it on the
oldest corner, where 1 and 4 run as on 3.3 and 2 and 3 are skipped (Airflow 3.1's Required
Actions pages differ).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from airflow_provider_systemzero.compat import has_awaiting_input
from airflow_provider_systemzero.provider_info import PORT_LABEL, PORT_PLACEHOLDER
from tests.helpers import EmulatorThread
from tests.helpers.deployment.harness import REPO, RESULTS, Deployment, wait_for
from tests.helpers.ui import TIMELINE_DAG_ID, UI_DAG_ID

pytestmark = [pytest.mark.ui, pytest.mark.timeout(900)]

IMAGES = REPO / "docs" / "images"
TASK = "wait_until_ready"
TIMELINE_TASK = "wait_for_build"
#: Seconds between the build log's lines in the timeline scenario (nothing waits on it).
PACE = 3.0
PERSON_KEY = "sz-ui-person-key"
#: What Airflow 3.3.2's Test button gets for a connection that stores no port (apache/airflow#73298).
PORT_BUG = "host or port to test differs from the stored connection"


def _shot(page: Any, name: str, **kwargs: Any) -> Path:
    IMAGES.mkdir(parents=True, exist_ok=True)
    path = IMAGES / f"ui-{name}.png"
    page.screenshot(path=str(path), **kwargs)
    return path


def _test_button(page: Any, deployment: Deployment, conn_id: str) -> tuple[str, str, Any]:
    """Click the connection's Test button on the list; return the toast's title and text, and the
    API's answer to the request the button made."""
    page.goto(deployment.api + "/connections")
    row = page.get_by_role("row").filter(has_text=conn_id)
    with page.expect_response(
        lambda r: r.url.endswith("/api/v2/connections/test"), timeout=120_000
    ) as answer:
        row.get_by_role("button", name="Test Connection").click()
    toast = (
        page.locator("[data-scope=toast][data-part=root]")
        .filter(has_text=re.compile("Test Connection (Successful|Failed)"))
        .last
    )
    toast.wait_for(state="visible", timeout=90_000)
    # the notice slides in from the bottom: wait until all of it is in view (for the screenshot)
    height = page.viewport_size["height"]
    wait_for(
        lambda: (box := toast.bounding_box()) is not None and box["y"] + box["height"] <= height,
        10,
        "the notice to be in view",
        interval=0.1,
    )
    text = toast.inner_text()
    title = "Test Connection Successful" if "Successful" in text else "Test Connection Failed"
    return title, text, answer.value.json()


# ---------------------------------------------------------------------------------------- 1


def test_add_and_test_a_connection(page: Any, ui_deployment: Deployment) -> None:
    """(1) The connection form as a person fills it, and the Test button's answers: a connection
    made in the form, one made the README's way (the CLI, port stored), one that stores no port,
    a wrong key and a stopped gateway."""
    deployment = ui_deployment
    started = time.monotonic()
    with EmulatorThread(api_keys={PERSON_KEY: 8}) as gateway:
        port = int(gateway.origin.rsplit(":", 1)[1])
        page.goto(deployment.api + "/connections")
        page.get_by_role("button", name="Add Connection").click()
        dialog = page.get_by_role("dialog")
        dialog.get_by_label("Connection ID").fill("systemzero_ui")
        combo = dialog.get_by_role("combobox")
        combo.click()
        combo.fill("System")
        option = page.get_by_role("option", name="System Zero")
        option.wait_for()
        _shot(page, "connection-type")
        option.click()

        origin = dialog.get_by_label("API origin")
        key = dialog.get_by_label("API key")
        # the port is shown, and its label says why it is stored (Airflow 3.3.2's Test button)
        port_field = dialog.get_by_label(PORT_LABEL)
        assert origin.get_attribute("placeholder") == "wss://api.example.com or https://api.example.com"
        assert port_field.get_attribute("placeholder") == PORT_PLACEHOLDER
        assert key.get_attribute("type") == "password"
        for hidden in ("Port", "Login", "Schema", "Host", "Password"):
            assert dialog.get_by_label(hidden, exact=True).count() == 0, f"{hidden} is shown"
        origin.fill(gateway.origin)
        port_field.fill(str(port))
        key.fill(PERSON_KEY)
        assert PERSON_KEY not in dialog.inner_text()
        _shot(page, "connection-form")
        dialog.get_by_role("button", name="Extra Fields", exact=True).click()
        # the extras are inputs named element_<field>, each under its label and help text
        for name, label, help_text in (
            ("model", "Default model", "Model ID used when a task does not name one."),
            ("open_timeout", "Open timeout (s)", "Seconds allowed for the TCP, TLS and WebSocket"),
            ("proxy", "Proxy URL", "Proxies from environment variables are not used unless set here."),
            ("budget_decisions_per_hour", "Decisions per hour (cap)", "Billed decisions allowed per hour"),
        ):
            dialog.locator(f"input[name=element_{name}]").wait_for()
            assert label in dialog.inner_text() and help_text in dialog.inner_text()
        assert dialog.locator("input[name=element_open_timeout]").input_value() == "10"
        dialog.locator("input[name=element_model]").fill("sz-ui")
        dialog.locator("input[name=element_budget_decisions_per_hour]").fill("500")
        _shot(page, "connection-extras")
        dialog.get_by_role("button", name="Save").click()
        dialog.wait_for(state="hidden")

        stored = deployment.rest("GET", "/api/v2/connections/systemzero_ui")
        assert stored["conn_type"] == "systemzero" and stored["host"] == gateway.origin, stored
        assert stored["password"] == "***" and '"model": "sz-ui"' in stored["extra"], stored
        assert json.loads(stored["extra"])["budget_decisions_per_hour"] == 500, stored
        assert stored["port"] == port and stored["login"] is None, stored

        # the form's connection, its port stored: the Test button succeeds on every Airflow
        title, text, answer = _test_button(page, deployment, "systemzero_ui")
        assert title == "Test Connection Successful", text
        assert f"connected to {gateway.origin}" in text and "max_streams_per_process" in text, text
        assert "stores no port" not in text, text
        _shot(page, "connection-test-ok")

        # the README's way: `airflow connections add ... --conn-port`, then the Test button
        deployment.cli(
            "connections", "add", "systemzero_readme", "--conn-type", "systemzero",
            "--conn-host", gateway.origin, "--conn-port", str(port),
            "--conn-password", PERSON_KEY, "--conn-extra", json.dumps({"model": "sz-ui"}),
        )  # fmt: skip
        title, text, answer = _test_button(page, deployment, "systemzero_readme")
        assert title == "Test Connection Successful", text
        assert f"connected to {gateway.origin}" in text and "stores no port" not in text, text

        # a connection that stores no port: Airflow 3.3.2 refuses it before the provider is asked
        # (apache/airflow#73298); where the provider is asked, it names the connection and the fix
        deployment.cli(
            "connections", "add", "systemzero_noport", "--conn-type", "systemzero",
            "--conn-host", gateway.origin, "--conn-password", PERSON_KEY,
        )  # fmt: skip
        title, text, answer = _test_button(page, deployment, "systemzero_noport")
        airflow_bug = title == "Test Connection Failed" and PORT_BUG in str(answer.get("detail"))
        if airflow_bug:
            _shot(page, "connection-test-port-bug")
        else:
            assert title == "Test Connection Successful", text
            assert (
                "connection 'systemzero_noport' stores no port" in text and f"--conn-port {port}" in text
            ), text

        # a wrong key, typed into the edit form
        page.get_by_role("row").filter(has_text="systemzero_ui").get_by_role(
            "button", name="Edit Connection"
        ).click()
        dialog = page.get_by_role("dialog")
        dialog.get_by_label("API key").fill("not-the-key")
        dialog.get_by_role("button", name="Save").click()
        dialog.wait_for(state="hidden")
        title, text, answer = _test_button(page, deployment, "systemzero_ui")
        assert title == "Test Connection Failed", text
        assert "HTTP 401" in text and "set a valid API key in the connection's password field" in text, text
        assert "Traceback" not in text and "not-the-key" not in text, text
        _shot(page, "connection-test-wrong-key")

        page.get_by_role("row").filter(has_text="systemzero_ui").get_by_role(
            "button", name="Edit Connection"
        ).click()
        dialog = page.get_by_role("dialog")
        dialog.get_by_label("API key").fill(PERSON_KEY)
        dialog.get_by_role("button", name="Save").click()
        dialog.wait_for(state="hidden")
    # the gateway is stopped now
    title, text, answer = _test_button(page, deployment, "systemzero_ui")
    assert title == "Test Connection Failed", text
    assert gateway.origin.split("//", 1)[1] in text or "refused" in text.lower(), text
    assert "Traceback" not in text, text
    _shot(page, "connection-test-gateway-down")
    RESULTS.append(
        f"(ui 1) connection form and Test button checked in {time.monotonic() - started:.0f} s: the "
        "form's and the README's connections (port stored) succeed"
        + ("; one without a port gets Airflow's port-0 refusal (apache/airflow#73298)" if airflow_bug else "")
    )


# ---------------------------------------------------------------------------------------- 2, 3


def _task_state(deployment: Deployment, run_id: str) -> str | None:
    return deployment.task_instances(UI_DAG_ID, run_id).get(TASK, {}).get("state")


def _wait_state(deployment: Deployment, run_id: str, states: set[str], timeout: float, what: str) -> str:
    def reached() -> str | None:
        deployment.check_alive()
        state = _task_state(deployment, run_id)
        return state if state in states else None

    try:
        return wait_for(reached, timeout, what, interval=0.5)
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}; the task is {_task_state(deployment, run_id)!r}") from None


def _pause_seen_by_scheduler(deployment: Deployment, run_id: str) -> bool:
    """Whether the scheduler has processed the exit of every worker that ran ``run_id``'s sensor,
    the last of them while the task was deferred with a person asked. An answer resumed before that makes
    the scheduler fail the resumed try on the stale exit event (apache/airflow#71580), and the
    next try asks again: a person takes seconds to answer; a browser, less than the scheduler's
    next loop. One exit seen deferred is not enough: the worker that deferred before the decision
    can exit after the next worker deferred the task with the review open, and that worker's exit
    is then still to come."""
    log = (deployment.logs / "scheduler.log").read_text(errors="replace")
    mine = re.compile(rf"\brun_id={re.escape(run_id)}\b")
    lines = [line for line in log.splitlines() if mine.search(line)]
    workers = sum("Worker startup parse complete" in line for line in lines)
    exits = [line for line in lines if "TaskInstance Finished:" in line]
    return workers > 0 and len(exits) >= workers and "state=deferred," in exits[-1]


def _wait_pause_seen(deployment: Deployment, run_id: str) -> None:
    """Wait (bounded) until :func:`_pause_seen_by_scheduler`: what an answer, or a newer state
    that supersedes the review, must wait for."""
    wait_for(
        lambda: _pause_seen_by_scheduler(deployment, run_id),
        60,
        f"the scheduler to process the exit of {run_id}'s paused worker",
    )


def _answer(page: Any, answer: str) -> None:
    """Click ``answer`` on the open review page and wait until Airflow says it received it."""
    page.get_by_role("button", name=answer, exact=True).click()
    page.get_by_text(re.compile("Response received at")).wait_for()


def _open_reviews(deployment: Deployment, run_id: str) -> list[dict[str, Any]]:
    """The run's review requests nobody answered yet (what Required Actions lists)."""
    path = f"/api/v2/dags/{UI_DAG_ID}/dagRuns/{quote(run_id, safe='')}/hitlDetails?response_received=false"
    return list(deployment.rest("GET", path).get("hitl_details") or [])


def _wait_review(deployment: Deployment, run_id: str) -> None:
    """Wait until ``run_id``'s sensor asks a person: deferred (it watches on) with a request open."""

    def asked() -> bool:
        deployment.check_alive()
        return _task_state(deployment, run_id) == "deferred" and bool(_open_reviews(deployment, run_id))

    wait_for(asked, 420, f"{run_id} to ask a person", interval=0.5)


def _review_page(page: Any, deployment: Deployment, run_id: str) -> Any:
    page.goto(f"{deployment.api}/dags/{UI_DAG_ID}/runs/{run_id}/tasks/{TASK}/required_actions")
    page.get_by_text("Deferred").first.wait_for()
    page.get_by_role("button", name="Yes").wait_for()
    return page


@pytest.mark.skipif(
    not has_awaiting_input(),
    reason="on Airflow 3.1 and 3.2 a review waits deferred, in Airflow's HITLTrigger: these steps "
    "follow Airflow 3.3's awaiting_input state (3.1's review is tested through its REST API: "
    "tests/test_release.py, tests/policy)",
)
def _answered(deployment: Deployment, run_id: str, done: Any, what: str) -> None:
    """Wait (bounded) until ``done()`` after a person answered ``run_id``'s review. The answer
    resumes the task, which defers once more for its trigger to judge the answer; the trigger may
    fire before the scheduler has processed that worker's exit, and the scheduler then fails the
    try on the stale exit event (apache/airflow#71580). The task kept the answer when it resumed,
    so such a retry takes it: a retry that asks a person again fails the test."""

    def settled() -> bool:
        deployment.check_alive()
        if done():
            return True
        try_number = deployment.task_instances(UI_DAG_ID, run_id).get(TASK, {}).get("try_number", 1)
        assert try_number == 1 or not _open_reviews(deployment, run_id), (
            f"{run_id}'s try {try_number} asked a person again: the answer given on try 1 was lost"
        )
        return False

    wait_for(settled, 300, what, interval=0.5)


def test_a_person_answers_the_sensor(page: Any, ui_deployment: Deployment, tmp_path: Path) -> None:
    """(2) "No" keeps the sensor waiting for a new state; "Yes" lets it succeed. (3) The XComs."""
    deployment = ui_deployment
    started = time.monotonic()
    runs = {}
    # one run after the other: the machine this runs on may be busy, and each worker start is slow
    for answer in ("Yes", "No"):
        work = tmp_path / answer.lower()
        work.mkdir()
        (work / "build.log").write_text("compiling\nunit tests passed\nthe build looks ready\n")
        run_id = runs[answer] = deployment.trigger(
            UI_DAG_ID, {"dir": str(work)}, run_id=f"review_{answer.lower()}"
        )
        _wait_review(deployment, run_id)
        _review_page(page, deployment, run_id)
        body = page.locator("body").inner_text()
        for expected in (
            "Ship the nightly build?",
            "Is the nightly build ready to ship?",
            "probability 0.72, confidence 0.64",
            "the build looks ready",
            "unit tests passed",
            "below the act bar 0.85 and at or above the review bar 0.6",
        ):
            assert expected in body, f"{expected!r} not on the review page:\n{body[-3000:]}"
        _shot(page, f"review-{answer.lower()}-asked")
        _wait_pause_seen(deployment, run_id)
        _answer(page, answer)

    no_run, yes_run = runs["No"], runs["Yes"]
    _answered(
        deployment,
        yes_run,
        lambda: deployment.run_state(UI_DAG_ID, yes_run) in ("success", "failed"),
        f"{yes_run} to end after 'Yes'",
    )
    assert deployment.wait_run(UI_DAG_ID, yes_run, timeout=300) == "success"
    page.goto(f"{deployment.api}/dags/{UI_DAG_ID}/runs/{yes_run}/tasks/{TASK}/required_actions")
    page.get_by_text("Success").first.wait_for()
    page.get_by_text(re.compile("Response received at")).wait_for()
    _shot(page, "review-yes-succeeded")

    # "No": back to waiting in the triggerer, for a state it has not been asked about. The answer
    # resumes the task, which defers once more for its trigger to judge the answer against the
    # state the source holds, and then again to wait: it waits once the "No" is recorded.
    def waits_after_no() -> bool:
        deployment.check_alive()
        record = deployment.xcoms(UI_DAG_ID, no_run).get((TASK, "decision")) or {}
        waiting = (record.get("effect") or {}).get("waiting") and record.get("decided_by") == "human"
        return bool(waiting) and _task_state(deployment, no_run) == "deferred"

    _answered(deployment, no_run, waits_after_no, f"{no_run}'s sensor to wait again after 'No'")
    page.goto(f"{deployment.api}/dags/{UI_DAG_ID}/runs/{no_run}/tasks/{TASK}/required_actions")
    page.get_by_text("Deferred").first.wait_for()
    page.get_by_text(re.compile("Response received at")).wait_for()
    _shot(page, "review-no-waits-again")
    with (tmp_path / "no" / "build.log").open("a") as handle:
        handle.write("Job is ready.\n")
    assert deployment.wait_run(UI_DAG_ID, no_run, timeout=300) == "success"

    retries = 0
    for run_id in (yes_run, no_run):
        unexplained, mismatched = deployment.unexplained_retries(UI_DAG_ID, run_id)
        retries += len(mismatched)
        assert not unexplained, (
            f"{run_id} retried without the apache/airflow#71580 state mismatch: {unexplained}"
        )
    xcoms = deployment.xcoms(UI_DAG_ID, yes_run)
    assert xcoms[(TASK, "decision")]["decided_by"] == "human", xcoms
    assert xcoms[(TASK, "decision")]["decision"] is True
    assert xcoms[(TASK, "usage")]["total"]["billed"] >= 1, xcoms[(TASK, "usage")]
    no_xcoms = deployment.xcoms(UI_DAG_ID, no_run)
    assert no_xcoms[(TASK, "decision")]["decided_by"] == "model", no_xcoms

    # a decisive newer state while the person is asked: the sensor fires with nobody answering,
    # and the request leaves Required Actions
    work = tmp_path / "superseded"
    work.mkdir()
    (work / "build.log").write_text("compiling\nunit tests passed\nthe build looks ready\n")
    later = deployment.trigger(UI_DAG_ID, {"dir": str(work)}, run_id="review_superseded")
    _wait_review(deployment, later)
    _review_page(page, deployment, later)
    assert "While you decide" in page.locator("body").inner_text()
    # the newer state comes as a person's answer would, once the scheduler has seen the workers
    # exit: a trigger that fires before makes the scheduler fail the resumed try on a stale exit
    # event (apache/airflow#71580), and the next try decides the newer state with nobody asked
    _wait_pause_seen(deployment, later)
    with (work / "build.log").open("a") as handle:
        handle.write("Job is ready.\n")
    assert deployment.wait_run(UI_DAG_ID, later, timeout=300) == "success"
    assert _open_reviews(deployment, later) == []
    page.goto(f"{deployment.api}/dags/{UI_DAG_ID}/runs/{later}/tasks/{TASK}/required_actions")
    page.get_by_text("Success").first.wait_for()
    page.get_by_text(re.compile("Response received at")).wait_for()
    _shot(page, "review-superseded")
    record = deployment.xcoms(UI_DAG_ID, later)[(TASK, "decision")]
    ended = (record.get("review_request") or {}).get("ended")
    assert (record["decided_by"], ended) == ("model", "superseded"), (record, deployment.state_mismatches())

    # (3) the XCom view, values expanded
    page.set_viewport_size({"width": 1600, "height": 1100})
    page.goto(f"{deployment.api}/xcoms")
    page.get_by_role("cell", name="usage").first.wait_for()
    page.get_by_role("button", name="Expand all extra JSON").click()
    page.get_by_text('"decided_by"').first.wait_for()
    table = re.sub(r"\s+", "", page.locator("body").inner_text())
    for expected in (
        '"decided_by":"human"',
        '"action":"review"',
        '"decided_by":"model"',
        '"billed":',
        '"try_number":',
    ):
        assert expected in table, f"{expected!r} not in the XCom view:\n{table[:3000]}"
    # the rows of the run a person answered "Yes" to, from the top of the view
    yes_rows = page.get_by_role("row").filter(has_text=yes_run)
    assert yes_rows.count() == 4, yes_rows.all_inner_texts()  # decision, decisions, return_value, usage
    yes_rows.first.evaluate("row => row.scrollIntoView({block: 'start'})")
    yes_rows.filter(has_text='"decided_by": "human"').first.wait_for()
    _shot(page, "xcom-decision-usage")
    RESULTS.append(
        f"(ui 2, 3) review answered 'Yes' then 'No' in the UI, XCom view checked, in "
        f"{time.monotonic() - started:.0f} s; #71580 retries: {retries}"
    )


# ---------------------------------------------------------------------------------------- 4


def _decided(deployment: Deployment, count: int, what: str) -> None:
    """Wait (bounded) until the emulator answered ``count`` decide calls of this test."""
    wait_for(lambda: len(deployment.ledger()) >= count, 300, what, interval=0.5)


def test_the_decision_timeline_of_a_sensor_that_saw_three_states(
    page: Any, ui_deployment: Deployment, tmp_path: Path
) -> None:
    """(4) The "Decision timeline" tab of a sensor's task instance: one point per decision of its
    wait at the XCom's numbers, the condition's bar, the decision that fired, and the table."""
    deployment = ui_deployment
    started = time.monotonic()
    log = tmp_path / "build.log"
    log.write_text("compiling\n")
    before = len(deployment.ledger())
    run_id = deployment.trigger(TIMELINE_DAG_ID, {"dir": str(tmp_path)}, run_id="timeline")
    for decided, line in enumerate(
        ("unit tests passed, the build looks ready\n", "Job is ready.\n"), start=1
    ):
        _decided(deployment, before + decided, f"the decision about state {decided}")
        time.sleep(PACE)  # a build takes a while: the picture shows the wait spread over time
        with log.open("a") as handle:
            handle.write(line)
    assert deployment.wait_run(TIMELINE_DAG_ID, run_id, timeout=300) == "success"
    tries = deployment.task_instances(TIMELINE_DAG_ID, run_id)[TIMELINE_TASK]["try_number"]
    assert tries == 1, f"the sensor ran {tries} tries: {deployment.state_mismatches()}"
    rows = deployment.xcoms(TIMELINE_DAG_ID, run_id)[(TIMELINE_TASK, "decisions")]
    decisions = [row for row in rows if row["kind"] == "decision"]
    versions = [row["state_version"] for row in decisions]
    assert len(set(versions)) >= 3 and versions == sorted(versions), rows
    assert decisions[-1]["disposition"] == "fired" and decisions[-1]["answer"] is True

    # reached from the task instance: its "Decision timeline" tab
    page.set_viewport_size({"width": 1500, "height": 1250})
    page.goto(f"{deployment.api}/dags/{TIMELINE_DAG_ID}/runs/{run_id}/tasks/{TIMELINE_TASK}")
    page.get_by_role("tab", name="Decision timeline").or_(
        page.get_by_role("link", name="Decision timeline")
    ).first.click()
    frame = page.frame_locator("iframe[title='Decision timeline']")
    frame.locator("svg.chart").wait_for()
    points = frame.locator("g.decision").evaluate_all(
        "gs => gs.map(g => ({at: g.dataset.at, version: g.dataset.version, p: g.dataset.probability,"
        " c: g.dataset.confidence, did: g.dataset.disposition,"
        " cy: Number(g.querySelector('circle.probability').getAttribute('cy'))}))"
    )
    box = frame.locator("svg.chart").evaluate("s => ({y0: Number(s.dataset.y0), y1: Number(s.dataset.y1)})")
    assert [(p["at"], p["version"], p["did"]) for p in points] == [
        (row["at"], str(row["state_version"]), row["disposition"]) for row in decisions
    ]
    for point, row in zip(points, decisions, strict=True):
        assert (float(point["p"]), float(point["c"])) == (row["probability"], row["confidence"])
        assert abs(point["cy"] - (box["y1"] - row["probability"] * (box["y1"] - box["y0"]))) < 0.05
    assert frame.locator("line.bar[data-bar=min_confidence]").get_attribute("data-value") == "0.8"
    assert frame.locator("circle.ending").get_attribute("data-disposition") == "fired"
    table = frame.locator("table.rows tr.decision").evaluate_all(
        "rs => rs.map(r => [r.dataset.version, r.dataset.probability, r.dataset.confidence, r.dataset.disposition])"
    )
    assert table == [
        [str(row["state_version"]), f"{row['probability']:g}", f"{row['confidence']:g}", row["disposition"]]
        for row in decisions
    ]
    text = frame.locator("body").inner_text()
    assert "compiling" not in text and "looks ready" not in text  # no state content: capture is off
    _shot(page, "decision-timeline")
    RESULTS.append(
        f"(ui 4) the decision timeline of a sensor that saw {len(set(versions))} states checked against "
        f"its XCom in {time.monotonic() - started:.0f} s"
    )
