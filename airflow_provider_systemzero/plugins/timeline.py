"""The "Decision timeline" view, registered as an Airflow plugin.

Airflow 3.1 and later show a plugin's *external views* inside the UI; this plugin adds one to
every task instance page (a "Decision timeline" tab) and one to every Dag run page, each showing
a page of the plugin's FastAPI app (:mod:`~airflow_provider_systemzero.plugins.timeline_app`),
which Airflow's API server serves under ``/systemzero``. The provider's package registers the
plugin with the ``airflow.plugins`` entry point, so installing the provider is enough: no file
in the plugins folder, no ``[core] lazy_discover_providers`` setting.

Every Airflow process loads plugins (a task's worker too), so this module imports neither
FastAPI nor the app: the app is built on the first request the API server hands it.
"""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

__all__ = ["RUN_VIEW", "TASK_VIEW", "URL_PREFIX", "SystemZeroTimelinePlugin"]

#: Where Airflow's API server mounts the view's app.
URL_PREFIX = "/systemzero"
#: The task instance tab. Airflow's UI fills the placeholders; the address is relative to the UI's
#: base URL, so it works behind a path prefix too.
TASK_VIEW: dict[str, str] = {
    "name": "Decision timeline",
    "href": "systemzero/timeline/dags/{DAG_ID}/runs/{RUN_ID}/tasks/{TASK_ID}?map_index={MAP_INDEX}",
    "destination": "task_instance",
    "url_route": "systemzero_decision_timeline",
}
#: The Dag run tab (the runs an asset watcher started).
RUN_VIEW: dict[str, str] = {
    "name": "Decision timeline",
    "href": "systemzero/timeline/dags/{DAG_ID}/runs/{RUN_ID}",
    "destination": "dag_run",
    "url_route": "systemzero_run_decision_timeline",
}


class _AppOnFirstRequest:
    """An ASGI app that builds the view's FastAPI app when the API server first hands it a request."""

    def __init__(self) -> None:
        self._app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self._app is None:
            from airflow_provider_systemzero.plugins.timeline_app import create_app

            self._app = create_app()
        await self._app(scope, receive, send)


class SystemZeroTimelinePlugin(AirflowPlugin):
    """The "Decision timeline" tab of task instances and Dag runs, and the app that draws it."""

    name = "systemzero_decision_timeline"
    fastapi_apps = [
        {"app": _AppOnFirstRequest(), "url_prefix": URL_PREFIX, "name": "System Zero decision timeline"}
    ]
    external_views = [TASK_VIEW, RUN_VIEW]
