"""The "Decision timeline" view's web app, served by Airflow's API server under ``/systemzero``.

Two pages (HTML, drawn by :mod:`~airflow_provider_systemzero.plugins.timeline_page`):

* ``GET /systemzero/timeline/dags/{dag_id}/runs/{run_id}/tasks/{task_id}?map_index=N`` — a task
  instance: a System Zero sensor, or the decide, branch or short-circuit operator. It draws the
  ``decisions`` XCom of the task's current try, with its ``decision`` record and ``usage``.
* ``GET /systemzero/timeline/dags/{dag_id}/runs/{run_id}`` — a Dag run an asset watcher
  (``SystemZeroDecisionEventTrigger``) started: the history each asset event that started it carries.

It reads only what Airflow already stores (XCom rows and asset events, from Airflow's metadata
database, as Airflow's own API reads them) and asks Airflow's auth manager first, as Airflow's own
routes do: the task page needs ``GET`` on the Dag's XComs, the run page ``GET`` on the Dag's runs
and on assets. Without a login Airflow answers 401; without the permission, 403.

Every answer carries a restrictive Content-Security-Policy (:data:`CONTENT_SECURITY_POLICY`: no
script, no image, nothing loaded from anywhere), and a page draws whatever the XCom holds
(:mod:`~airflow_provider_systemzero.plugins.timeline_rows`), saying what it could not draw.

Built on the first request (:mod:`~airflow_provider_systemzero.plugins.timeline` registers it), so
no other Airflow process imports FastAPI for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import HTMLResponse, Response
from sqlalchemy import select

from airflow_provider_systemzero.plugins.timeline_page import Story, render_page
from airflow_provider_systemzero.plugins.timeline_rows import plain
from airflow_provider_systemzero.tasks.history import DECISIONS_XCOM_KEY

__all__ = ["CONTENT_SECURITY_POLICY", "create_app"]

#: What a page of the view may load and do: nothing but its own inline style — no script, no image
#: (the charts are inline SVG), no font, no frame, no form, no connection — and only Airflow's UI,
#: on the same origin, may show it in a frame.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src 'none'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'self'"
)
#: The headers every answer of the view carries.
_SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

#: The XComs the task page reads.
_KEYS = (DECISIONS_XCOM_KEY, "decision", "usage")
#: What ``{MAP_INDEX}`` stays as when the UI has no map index to put there (an unmapped task).
_NO_MAP_INDEX = ("", "{MAP_INDEX}")


def _run_id_note(found: bool) -> list[str]:
    """On Airflow 3.1 the UI puts the run id into this page's address as it is."""
    from airflow_provider_systemzero.compat import airflow_version

    if found or airflow_version()[:2] >= (3, 2):
        return []
    return [
        "Airflow 3.1's UI puts the run id into this page's address without encoding it, so a run id "
        "with '#', '?' or '%' (which only a changed [scheduler] allowed_run_id_pattern allows) reaches "
        "this page changed. This view opens such runs from Airflow 3.2 on; on 3.1, read the task's "
        "'decisions' XCom in the XCom view."
    ]


def _map_index(value: str) -> int | None:
    """``map_index`` as given by the UI (``None``: not a map index)."""
    if value.strip() in _NO_MAP_INDEX:
        return -1
    try:
        index = int(value)
    except ValueError:
        return None
    return index if index >= -1 else None


def _task_xcoms(dag_id: str, run_id: str, task_id: str, map_index: int) -> tuple[bool, dict[str, Any]]:
    """Whether the task instance exists, and its ``decisions``, ``decision`` and ``usage`` XComs."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.scalars(
            select(XComModel).where(
                XComModel.dag_id == dag_id,
                XComModel.run_id == run_id,
                XComModel.task_id == task_id,
                XComModel.map_index == map_index,
                XComModel.key.in_(_KEYS),
            )
        ).all()
        values = {row.key: XComModel.deserialize_value(row) for row in rows}
        if values:
            return True, values
        exists = session.scalar(
            select(TaskInstance.task_id).where(
                TaskInstance.dag_id == dag_id,
                TaskInstance.run_id == run_id,
                TaskInstance.task_id == task_id,
                TaskInstance.map_index == map_index,
            )
        )
        return exists is not None, {}


def _parts(usage: Any) -> int:
    """How many parts of the try the ``usage`` XCom counts (each deferral's resume, or each poke)."""
    resumes = usage.get("resumes") if isinstance(usage, Mapping) else None
    return len(resumes) if isinstance(resumes, list) else 1


def _record_facts(record: Any, usage: Any, parts: int = 1) -> list[str]:
    """What the task's ``decision`` record and ``usage`` say, in a line each.

    :param parts: how many parts of the try ``usage`` counts (:func:`_parts` of the stored one).
    """
    facts = []
    if isinstance(record, Mapping):
        who = record.get("decided_by") or "nobody yet"
        status = "waiting for a person" if record.get("status") == "pending_review" else "final"
        facts.append(
            f"The task's decision record ({status}): {record.get('question')} = "
            f"{record.get('decision')!r}, action {record.get('action')}, decided by {who}: {record.get('reason')}"
        )
    if isinstance(usage, Mapping):  # the whole try: every part of it (each resume, each poke)
        facts.append(
            f"Usage of try {usage.get('try_number')}"
            + (f", all {parts} parts (each deferral's resume, or each poke)" if parts > 1 else "")
            + f": {usage.get('billed', 0)} decision(s) billed, {usage.get('replayed', 0)} replayed unbilled, "
            f"{usage.get('dispatched', 0)} dispatched."
        )
    return facts


def task_page(dag_id: str, run_id: str, task_id: str, map_index: str) -> HTMLResponse:
    """The task instance's page (see the module docstring)."""
    index = _map_index(map_index)
    heading = f"Dag {dag_id} · run {run_id} · task {task_id}"
    if index is None:
        note = f"map_index must be a map index (-1 or more), got {map_index!r}: open this view from the task instance"
        return HTMLResponse(
            render_page(heading=heading, subtitle="", stories=[], notes=[note]), status_code=400
        )
    heading += f" [{index}]" if index >= 0 else ""
    exists, values = _task_xcoms(dag_id, run_id, task_id, index)
    subtitle = "The decision history of the task's current try (its 'decisions' XCom)."
    if not exists:
        notes = [
            f"There is no task instance {task_id!r} in run {run_id!r} of Dag {dag_id!r}.",
            *_run_id_note(False),
        ]
        return HTMLResponse(
            render_page(heading=heading, subtitle=subtitle, stories=[], notes=notes), status_code=404
        )
    rows = values.get(DECISIONS_XCOM_KEY)
    if rows is None:
        note = (
            "This task instance has no decision history: it is not a System Zero sensor or operator, it "
            "has not decided yet, its try is still running, or it was run with do_xcom_push=False."
        )
        return HTMLResponse(render_page(heading=heading, subtitle=subtitle, stories=[], notes=[note]))
    if not isinstance(rows, list):
        note = (
            "The 'decisions' XCom is not a list of rows here: an XCom backend that keeps values elsewhere "
            "leaves only a reference in Airflow's database, which this view does not follow."
        )
        return HTMLResponse(render_page(heading=heading, subtitle=subtitle, stories=[], notes=[note]))
    usage = values.get("usage")
    story = Story(None, rows, _record_facts(plain(values.get("decision")), plain(usage), _parts(usage)))
    return HTMLResponse(render_page(heading=heading, subtitle=subtitle, stories=[story]))


def _watch_events(dag_id: str, run_id: str) -> tuple[bool, list[Story]]:
    """Whether the run exists, and the histories of the System Zero asset events that started it."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        run = session.scalar(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
        if run is None:
            return False, []
        stories = []
        for event in sorted(run.consumed_asset_events, key=lambda e: e.timestamp):
            extra = event.extra if isinstance(event.extra, Mapping) else {}
            payload = extra.get("payload")
            if not isinstance(payload, Mapping) or not isinstance(payload.get("decisions"), list):
                continue
            asset = getattr(event, "asset", None)
            name = getattr(asset, "name", None) or getattr(asset, "uri", None) or f"asset {event.asset_id}"
            title = f"Asset event of {name} at {event.timestamp.isoformat()} (watch {plain(payload.get('watch_id'))!r})"
            stories.append(Story(title, payload["decisions"]))
        return True, stories


def run_page(dag_id: str, run_id: str) -> HTMLResponse:
    """The Dag run's page (see the module docstring)."""
    heading = f"Dag {dag_id} · run {run_id}"
    subtitle = "The decision histories of the System Zero asset events that started this run."
    exists, stories = _watch_events(dag_id, run_id)
    if not exists:
        notes = [f"There is no run {run_id!r} of Dag {dag_id!r}.", *_run_id_note(False)]
        return HTMLResponse(
            render_page(heading=heading, subtitle=subtitle, stories=[], notes=notes), status_code=404
        )
    notes = (
        []
        if stories
        else [
            "No System Zero asset watcher started this run: the decision history of a sensor or an "
            "operator is on its task instance's page."
        ]
    )
    return HTMLResponse(render_page(heading=heading, subtitle=subtitle, stories=stories, notes=notes))


def create_app() -> FastAPI:
    """The view's FastAPI app, each route behind Airflow's own permission check."""
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.core_api.security import requires_access_asset, requires_access_dag

    app = FastAPI(title="System Zero decision timeline", docs_url=None, redoc_url=None, openapi_url=None)

    @app.middleware("http")
    async def security_headers(request: Request, call_next: Any) -> Response:
        response: Response = await call_next(request)
        response.headers.update(_SECURITY_HEADERS)
        return response

    @app.get(
        "/timeline/dags/{dag_id}/runs/{run_id}/tasks/{task_id}",
        response_class=HTMLResponse,
        dependencies=[Depends(requires_access_dag(method="GET", access_entity=DagAccessEntity.XCOM))],
    )
    def task_timeline(dag_id: str, run_id: str, task_id: str, map_index: str = Query("-1")) -> HTMLResponse:
        return task_page(dag_id, run_id, task_id, map_index)

    @app.get(
        "/timeline/dags/{dag_id}/runs/{run_id}",
        response_class=HTMLResponse,
        dependencies=[
            Depends(requires_access_dag(method="GET", access_entity=DagAccessEntity.RUN)),
            Depends(requires_access_asset(method="GET")),
        ],
    )
    def run_timeline(dag_id: str, run_id: str) -> HTMLResponse:
        return run_page(dag_id, run_id)

    return app
