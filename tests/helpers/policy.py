"""Fixtures of the policy tests: an emulator whose rules let each test choose the answer and its
numbers through the state's text, and a reviewer who answers Human-in-the-loop requests through
Airflow's own Core API (``PATCH .../hitlDetails``, as the Required Actions page does)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import pendulum
import pytest

from airflow_provider_systemzero.emulator.deciders import RulesDecider
from airflow_provider_systemzero.protocol.limits import Limits
from tests.helpers import EmulatorThread, systemzero_connection
from tests.helpers import policy_sources as sources

CONN_ID = "systemzero_policy"
START = pendulum.datetime(2026, 1, 1, tz="UTC")


def _rule(question: str, pattern: str, answer: Any, probability: float, confidence: float) -> dict[str, Any]:
    return {
        "question": question,
        "pattern": pattern,
        "answer": answer,
        "probability": probability,
        "confidence": confidence,
    }


#: The state's text picks the answer and its numbers (first match per question wins).
RULES = {
    "rules": [
        # boolean "publish": one state per band
        _rule("publish", "publish:act", True, 0.93, 0.9),
        _rule("publish", "publish:review", True, 0.66, 0.62),
        _rule("publish", "publish:low", True, 0.55, 0.2),
        # choice "branch" over billing / sales / support
        _rule("branch", "route:billing", "billing", 0.9, 0.88),
        _rule("branch", "route:support-unsure", "support", 0.6, 0.55),
        _rule("branch", "ticket:1", "billing", 0.9, 0.9),
        _rule("branch", "ticket:2", "support", 0.9, 0.9),
        # multi-select: one boolean per option (branch__0 = billing, __1 = sales, __2 = support)
        _rule("branch__0", "multi:billing\\+support", True, 0.9, 0.9),
        _rule("branch__1", "multi:billing\\+support", False, 0.92, 0.9),
        _rule("branch__2", "multi:billing\\+support", True, 0.85, 0.85),
        _rule("branch", "incident:sev1", "escalate", 0.95, 0.9),
        # short-circuit "proceed"
        _rule("proceed", "gate:yes", True, 0.95, 0.9),
        _rule("proceed", "gate:no", False, 0.95, 0.9),
        _rule("proceed", "gate:unsure", True, 0.6, 0.55),
        # sensor "ready": the newest line decides
        _rule("ready", "unsure ready$", True, 0.7, 0.6),
        _rule("ready", "ready$", True, 0.96, 0.92),
        # decorator "urgent"
        _rule("urgent", "(?i)outage", True, 0.91, 0.88),
    ],
    "default": {"answer": False, "probability": 0.85, "confidence": 0.8},
}


class RecordingDecider(RulesDecider):
    """The rules decider, keeping every decide body it answered (to check what was asked)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.requests: list[dict[str, Any]] = []

    def decide(self, request: Any, *, now: float) -> dict[str, Any]:
        self.requests.append(dict(request))
        return super().decide(request, now=now)


@pytest.fixture(scope="session")
def emulator(airflow_db: None) -> Iterator[Any]:
    limits = Limits(account_decision_burst=1000, account_decision_ceiling_per_minute=100_000)
    decider = RecordingDecider.from_dict(RULES)
    with (
        EmulatorThread(api_keys={"policy-key": 16}, decider=decider, limits=limits) as emu,
        systemzero_connection(CONN_ID, emu.origin, "policy-key", model="sz-policy"),
    ):
        sources.GATEWAY = emu  # what the paced sources wait on
        try:
            yield emu
        finally:
            sources.GATEWAY = None


def connection_from_the_environment(monkeypatch: pytest.MonkeyPatch, emulator: Any) -> None:
    """The :func:`emulator`'s connection, read from the environment too (``AIRFLOW_CONN_*``): what a
    sensor run outside a task sees, and a faster lookup than the metadata DB's under
    ``dag.test()`` on Airflow 3.1, where the trigger looks a connection up on a worker thread
    (11 s on a loaded machine, 0.75 s from the environment: a 10 s timeout was used up before the
    first decision)."""
    connection = {"conn_type": "systemzero", "host": emulator.origin, "password": "policy-key"}
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps({**connection, "extra": {"model": "sz-policy"}})
    )


# ------------------------------------------------------------------------------ people


class CoreApi:
    """Airflow's Core API app in this process (same metadata DB), called as a named user."""

    def __init__(self) -> None:
        from airflow.api_fastapi.app import create_app, get_auth_manager
        from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
        from fastapi.testclient import TestClient

        self.client = TestClient(create_app(apps="core"))
        self._auth = get_auth_manager()
        self._user_cls = SimpleAuthManagerUser

    def token(self, username: str) -> str:
        return self._auth.generate_jwt(self._user_cls(username=username, role="admin"))

    def respond(
        self, username: str, dag_id: str, run_id: str, task_id: str, map_index: int, chosen: list[str]
    ) -> Any:
        return self.client.patch(
            f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances/{task_id}/{map_index}/hitlDetails",
            json={"chosen_options": chosen, "params_input": {}},
            headers={"Authorization": f"Bearer {self.token(username)}"},
        )


@pytest.fixture(scope="session")
def core_api(airflow_db: None) -> CoreApi:
    return CoreApi()


def pending_reviews(dag_id: str) -> list[dict[str, Any]]:
    """Unanswered Human-in-the-loop requests of a Dag's tasks that wait for them: in
    ``awaiting_input``, or deferred (to ``HITLTrigger`` on Airflow 3.1 / 3.2, which have no such
    state; a deferrable sensor to its own trigger, which watches on)."""
    from airflow.models.hitl import HITLDetail
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    from airflow_provider_systemzero.compat import has_awaiting_input

    with create_session() as session:
        rows = (
            session.query(HITLDetail, TaskInstance)
            .join(TaskInstance, TaskInstance.id == HITLDetail.ti_id)
            .filter(
                TaskInstance.dag_id == dag_id,
                HITLDetail.responded_at.is_(None),
                TaskInstance.state.in_(WAITING if has_awaiting_input() else WATCHING),
            )
            .all()
        )
        return [
            {
                "run_id": ti.run_id,
                "task_id": ti.task_id,
                "map_index": ti.map_index,
                "try_number": ti.try_number,
                "subject": detail.subject,
                "body": detail.body,
                "options": list(detail.options),
                "defaults": detail.defaults,
                "multiple": detail.multiple,
                "assignees": detail.assignees,
            }
            for detail, ti in rows
        ]


#: Where a task waits for its review on Airflow 3.1 / 3.2, and a deferrable sensor on every
#: Airflow (it watches on meanwhile): deferred, and queued while ``dag.test()`` runs its trigger
#: in-process.
WATCHING = ("deferred", "queued")
#: Where a task waits for its review on Airflow 3.3: an operator in ``awaiting_input``, a
#: deferrable sensor deferred.
WAITING = ("awaiting_input", *WATCHING)


class Reviewer:
    """A person answering every review request of one Dag through the Core API, in a thread.

    :param answer: ``request → chosen options`` (the request as :func:`pending_reviews` gives it).
    """

    def __init__(
        self,
        api: CoreApi,
        dag_id: str,
        answer: Callable[[dict[str, Any]], list[str]],
        username: str = "alice",
    ) -> None:
        self.api, self.dag_id, self.answer, self.username = api, dag_id, answer, username
        self.seen: list[dict[str, Any]] = []
        self.responses: list[tuple[int, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reviewer", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for request in pending_reviews(self.dag_id):
                self.seen.append(request)
                response = self.api.respond(
                    self.username,
                    self.dag_id,
                    request["run_id"],
                    request["task_id"],
                    request["map_index"],
                    self.answer(request),
                )
                self.responses.append((response.status_code, response.json()))
            self._stop.wait(0.1)

    def __enter__(self) -> Reviewer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


class TimeoutSweep:
    """The scheduler's ``awaiting_input`` timeout sweep (``check_awaiting_input_timeouts``), run
    in a thread the way a scheduler loop would (``dag.test()`` runs no scheduler). On Airflow 3.1 /
    3.2 the review's ``HITLTrigger`` times out by itself, so there is nothing to sweep."""

    def __init__(self, interval: float = 0.2) -> None:
        from airflow_provider_systemzero.compat import has_awaiting_input

        self.enabled = has_awaiting_input()
        self._stop = threading.Event()
        if not self.enabled:
            return
        from airflow.jobs.job import Job
        from airflow.jobs.scheduler_job_runner import SchedulerJobRunner

        self.runner = SchedulerJobRunner(job=Job())
        self.interval = interval
        self._thread = threading.Thread(target=self._run, name="timeout-sweep", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.runner.check_awaiting_input_timeouts()
            self._stop.wait(self.interval)

    def __enter__(self) -> TimeoutSweep:
        if self.enabled:
            self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        if self.enabled:
            self._thread.join(timeout=10)


def billed(emulator: Any) -> int:
    return emulator.stats.decisions_billed
