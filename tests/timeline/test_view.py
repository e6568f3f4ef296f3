"""The "Decision timeline" view served by Airflow's own API app (its plugins mounted, as the API
server mounts them): it draws a sensor's ``decisions`` XCom and an asset watcher's events, asks
Airflow's auth manager who may read them, and says why when it has nothing to draw."""

from __future__ import annotations

from typing import Any

import pytest
from airflow.sdk import DAG

from airflow_provider_systemzero.compat import airflow_version
from airflow_provider_systemzero.operators.decide import SystemZeroDecideOperator
from tests.helpers import decision_result, run_dag
from tests.helpers.timeline import CONN_ID, START
from tests.helpers.timeline import decisions_of as _decisions
from tests.helpers.timeline_page import PageParts, check_chart_against

pytestmark = pytest.mark.filterwarnings("ignore:The HMAC key is:Warning")


@pytest.fixture(scope="module")
def api(airflow_db: None) -> Any:
    """Airflow's own API app in this process (its plugins mounted, as the API server mounts them)."""
    from airflow.api_fastapi.app import create_app
    from fastapi.testclient import TestClient

    return TestClient(create_app(apps="core"))


def _token(role: str | None) -> str:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    return get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="reader", role=role))


def _text(response: Any) -> str:
    return " ".join(PageParts(response.text).text)


def _get(api: Any, path: str, role: str | None = "viewer") -> Any:
    headers = {} if role == "nobody" else {"Authorization": f"Bearer {_token(role)}"}
    return api.get(path, headers=headers)


def test_the_view_draws_the_sensors_xcom_from_airflows_own_api_app(api: Any, sensor_run: Any) -> None:
    dag_id, run_id, xcoms = sensor_run
    # the address the UI's tab opens for an unmapped task instance (the map index left as it is)
    response = _get(
        api, f"/systemzero/timeline/dags/{dag_id}/runs/{run_id}/tasks/wait?map_index={{MAP_INDEX}}"
    )
    assert response.status_code == 200, response.text
    page = PageParts(response.text)
    assert check_chart_against(page, xcoms[("wait", "decisions", -1)]) == 3
    (bar,) = page.having("line", "bar")
    assert (bar["data-bar"], bar["data-value"]) == ("min_confidence", "0.8")
    (ring,) = page.having("circle", "ending")
    assert ring["data-disposition"] == "fired"
    text = _text(response)
    assert "decided by model" in text and "3 decisions (3 billed, 0 replayed)" in text


def test_the_view_asks_airflow_who_may_read_the_dags_xcoms(api: Any, sensor_run: Any) -> None:
    dag_id, run_id, _ = sensor_run
    path = f"/systemzero/timeline/dags/{dag_id}/runs/{run_id}/tasks/wait"
    assert _get(api, path, role="nobody").status_code == 401  # not logged in
    assert _get(api, path, role=None).status_code == 403  # a user with no role may read no Dag
    refused = _get(api, path, role=None)
    assert "tick" not in refused.text and "szd_" not in refused.text
    assert _get(api, f"/systemzero/timeline/dags/{dag_id}/runs/{run_id}", role=None).status_code == 403


def test_the_view_says_why_it_has_nothing_to_draw(api: Any, sensor_run: Any) -> None:
    dag_id, run_id, _ = sensor_run
    missing = _get(api, f"/systemzero/timeline/dags/{dag_id}/runs/{run_id}/tasks/nope")
    assert missing.status_code == 404 and "There is no task instance 'nope'" in _text(missing)
    # Airflow 3.1's UI does not encode the run id in the view's address: the page says so there
    assert ("Airflow 3.1's UI puts the run id" in _text(missing)) == (airflow_version()[:2] < (3, 2))
    wrong = _get(api, f"/systemzero/timeline/dags/{dag_id}/runs/{run_id}/tasks/wait?map_index=first")
    assert wrong.status_code == 400 and "map_index must be a map index" in _text(wrong)
    no_watch = _get(api, f"/systemzero/timeline/dags/{dag_id}/runs/{run_id}")
    assert no_watch.status_code == 200 and "No System Zero asset watcher started this run" in _text(no_watch)


def _watch_payloads() -> list[dict[str, Any]]:
    """Two asset events of a watch (the payloads the watcher trigger fires, built by its watch)."""
    from airflow_provider_systemzero.decisions.conditions import DecisionCondition
    from airflow_provider_systemzero.decisions.watch import VerdictRules

    clock = iter(range(1_790_000_000, 1_790_000_100, 5))
    watch = VerdictRules(
        DecisionCondition("ready", min_confidence=0.5), reviews=False, clock=lambda: next(clock)
    )
    payloads = []
    for version, ready in enumerate([False, True, False, False, True], start=1):
        decision = decision_result(version, ready=(ready, 0.9, 0.9))
        verdict = watch.observe(decision, f"s{version}", f"s{version}", float(version))
        if verdict is not None:
            payloads.append(watch.event(verdict, extra={"watch_id": "release"}).to_payload())
    return payloads


def test_the_run_an_asset_watcher_started_shows_the_story_of_each_event(api: Any, gateway: Any) -> None:
    """Airflow stores an asset watcher's event payload in the asset event's ``extra``; the run it
    started links to the event: the run's page draws each event's history."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with DAG("timeline_asset_run", schedule=None, start_date=START) as dag:
        SystemZeroDecideOperator(
            task_id="decide",
            questions={"ready": "Is the job ready?"},
            state="Job is ready.",
            systemzero_conn_id=CONN_ID,
        )
    run_id = run_dag(dag).run_id
    with create_session() as session:
        asset = session.query(AssetModel).filter(AssetModel.name == "release").one_or_none()
        if asset is None:
            asset = AssetModel(name="release", uri="release", group="asset")
            session.add(asset)
            session.flush()
        run = session.query(DagRun).filter(DagRun.dag_id == dag.dag_id, DagRun.run_id == run_id).one()
        for payload in _watch_payloads():
            event = AssetEvent(asset_id=asset.id, extra={"from_trigger": True, "payload": payload})
            session.add(event)
            run.consumed_asset_events.append(event)
    response = _get(api, f"/systemzero/timeline/dags/{dag.dag_id}/runs/{run_id}")
    assert response.status_code == 200, response.text
    page = PageParts(response.text)
    charts = page.having("svg", "chart")
    assert len(charts) == 2 and len(page.having("circle", "ending")) == 2
    drawn = len(page.having("g", "decision"))
    assert drawn == sum(len(_decisions(payload["decisions"])) for payload in _watch_payloads()) == 5
    assert "Asset event of release" in _text(response)


def test_every_answer_of_the_view_forbids_scripts_and_remote_content(api: Any, sensor_run: Any) -> None:
    """The page, a refusal, a page about nothing: each with a Content-Security-Policy that lets
    nothing run or load (issue 54 item 2)."""
    dag_id, run_id, _ = sensor_run
    page = f"/systemzero/timeline/dags/{dag_id}/runs/{run_id}/tasks/wait"
    for path, role, status in (
        (page, "viewer", 200),
        (page, "nobody", 401),
        (f"/systemzero/timeline/dags/{dag_id}/runs/{run_id}/tasks/nope", "viewer", 404),
        (f"/systemzero/timeline/dags/{dag_id}/runs/{run_id}", "viewer", 200),
    ):
        response = _get(api, path, role=role)
        assert response.status_code == status, (path, response.text)
        policy = dict(
            directive.strip().split(" ", 1)
            for directive in response.headers["content-security-policy"].split(";")
        )
        assert policy["default-src"] == "'none'" and policy["img-src"] == "'none'"
        assert "script-src" not in policy  # default-src 'none' forbids every script
        assert policy["frame-ancestors"] == "'self'" and policy["form-action"] == "'none'"
        assert response.headers["x-content-type-options"] == "nosniff"


def test_a_stored_history_no_version_writes_is_drawn_as_far_as_it_can_be(api: Any, gateway: Any) -> None:
    """A ``decisions`` XCom holding a billed start in year 1 (what a gateway's ``queue_ms`` of
    6.4e13 stored before), numbers and text no page can hold, and rows that are no rows: the page
    answers 200 and says what it did not draw (issue 54 item 2)."""
    from airflow.models.xcom import XComModel
    from airflow.providers.standard.operators.empty import EmptyOperator

    with DAG("timeline_stored", schedule=None, start_date=START) as dag:
        EmptyOperator(task_id="wait")
    run_id = run_dag(dag).run_id
    at = "2026-09-21T14:13:20.000Z"
    stored = [
        {"kind": "condition", "question": "ready", "expect": True, "min_confidence": 10**400},
        {"kind": "billed_start", "at": "0001-01-01T00:00:00.000Z", "state_version": 1},
        {
            "kind": "decision",
            "at": at,
            "question": "ready\ud800",
            "answer": True,
            "probability": float("nan"),
            "confidence": 0.9,
            "state_version": 1,
            "disposition": "fired",
            "billed": {"x": 1},
        },
        "not a row",
    ]
    XComModel.set("decisions", stored, dag_id=dag.dag_id, task_id="wait", run_id=run_id)
    response = _get(api, f"/systemzero/timeline/dags/{dag.dag_id}/runs/{run_id}/tasks/wait")
    assert response.status_code == 200, response.text
    page = PageParts(response.text)
    (point,) = page.having("g", "decision")
    assert (point["data-at"], point["data-confidence"], point["data-probability"]) == (at, "0.9", "")
    text = _text(response)
    assert (
        "1 row not drawn: no time from 1970 to 9999 in 'at' (the first: '0001-01-01T00:00:00.000Z')" in text
    )
    assert "1 row not drawn: not an object with a text 'kind' (the first: 'not a row')" in text
    assert "2 numbers shown as none" in text and "ready\\ud800" in text
