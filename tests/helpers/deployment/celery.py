"""The deployment on Airflow's distributed engine: the CeleryExecutor, as companies run it past one
machine.

:class:`CeleryDeployment` is :class:`~tests.helpers.deployment.harness.Deployment` on a PostgreSQL
cluster of its own with a Redis broker of its own (:class:`~tests.helpers.deployment.redis.RedisInstance`),
the scheduler handing tasks to **two Celery worker processes** (``airflow celery worker``, four
task slots each, each naming itself in the task instances it runs), the FAB auth manager in the
api-server (an ``admin`` user for the test's REST calls, a ``reader`` who may read one Dag and
not another), and the emulator at the **published account limits** (burst 5, 60 decision starts
a minute) with one account for every process. Its decider answers by the project's rules, and
holds any decide about a state that names :data:`HELD_MARK` until the test releases it (a
decision in the middle of being made).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from airflow_provider_systemzero.emulator.deciders import RulesDecider
from tests.helpers.deployment.harness import (
    MAIN_KEY,
    REPO,
    SMALL_KEY,
    SMALL_MAX_CONCURRENT,
    Deployment,
    free_port,
    wait_for,
)
from tests.helpers.deployment.redis import RedisInstance

CELERY_DAGS = REPO / "tests" / "deployment" / "celery_dags"
CELERY_DAG_IDS = ("sz_celery_decide", "sz_celery_held", "sz_celery_on_release")
#: The main account's max_concurrent: room for every process's four streams (2 triggerers and 8
#: worker slots, two streams of capacity per max_concurrent).
CELERY_MAX_CONCURRENT = 40
#: A state holding this is decided only once the test lets it (:attr:`HeldDecider.release`).
HELD_MARK = "held-decision"
#: The FAB users of the run: the test's own (Admin) and one who may read one Dag only.
ADMIN, READER = "admin", "reader"
#: The Dag the reader may read, and one it may not.
READABLE_DAG, UNREADABLE_DAG = "sz_celery_decide", "sz_celery_held"


class HeldDecider:
    """The rules decider of the project's emulator rules, except that a decide about a state naming
    :data:`HELD_MARK` waits (on the emulator's loop, without blocking it) until :attr:`release` is
    set. :attr:`started` is set when such a decide arrives."""

    def __init__(self, rules: Path) -> None:
        self.rules = RulesDecider.from_file(str(rules))
        self.started = threading.Event()
        self.release = threading.Event()

    def decide(self, request: Mapping[str, Any], *, now: float) -> Any:
        """Answer by the rules; hold a decide about a held state until released.

        :param request: the decide body.
        :param now: the backend's clock.
        """
        if HELD_MARK in str(request.get("state")) and not self.release.is_set():
            return self._held(request, now)
        return self.rules.decide(request, now=now)

    async def _held(self, request: Mapping[str, Any], now: float) -> Any:
        self.started.set()
        await asyncio.to_thread(self.release.wait, 600)  # a thread waits, the emulator's loop runs on
        return self.rules.decide(request, now=now)


class CeleryDeployment(Deployment):
    """The emulator plus Airflow with the CeleryExecutor on loopback (see the module docstring).

    :param home: the ``AIRFLOW_HOME`` (empty).
    :param workers: the names of the Celery workers to start.
    :param concurrency: task slots of each worker.
    """

    def __init__(
        self, home: Path, *, workers: Sequence[str] = ("worker-a", "worker-b"), concurrency: int = 4
    ) -> None:
        super().__init__(home, database="postgres", dags=CELERY_DAGS, dag_ids=CELERY_DAG_IDS)
        self.worker_names = tuple(workers)
        self.concurrency = concurrency
        self.decider = HeldDecider(self.rules)
        self.redis: RedisInstance | None = None
        self.passwords = {ADMIN: secrets.token_urlsafe(16), READER: secrets.token_urlsafe(16)}
        self._tokens: dict[str, str] = {}

    def env(self) -> dict[str, str]:
        """:meth:`Deployment.env` with the CeleryExecutor, its broker and result backend, and the
        FAB auth manager."""
        env = super().env()
        backend = f"db+{self.postgres.url}" if self.postgres else ""  # SQLAlchemy through psycopg2
        env.update(
            {
                "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
                "AIRFLOW__CELERY__BROKER_URL": self.redis.url if self.redis else "",
                "AIRFLOW__CELERY__RESULT_BACKEND": backend,
                "AIRFLOW__CELERY__WORKER_CONCURRENCY": str(self.concurrency),
                # the task instance names the worker that ran it (both run on this one host)
                "AIRFLOW__CORE__HOSTNAME_CALLABLE": "tests.deployment.worker_name.hostname",
                # a worker killed with its tasks: the scheduler fails them after this many seconds
                # without a heartbeat (300 by default), and their retries go to a live worker
                "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "30",
                "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
                "AIRFLOW__CORE__AUTH_MANAGER": "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
                # the Dags the test triggers are not paused, and only the test triggers them
                "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": "False",
            }
        )
        return env

    def emulator_options(self) -> dict[str, Any]:
        """One account for every process, at the published limits; the held decider."""
        from airflow_provider_systemzero.protocol.limits import Limits

        return {
            "api_keys": {MAIN_KEY: CELERY_MAX_CONCURRENT, SMALL_KEY: SMALL_MAX_CONCURRENT},
            "decider": self.decider,
            "limits": Limits(),
            "decide_latency_ms": 100,
        }

    def _start_services(self) -> None:
        self.redis = RedisInstance(free_port())
        self.redis.start()

    def _start_workers(self) -> None:
        for name in self.worker_names:
            self._start(
                name,
                [
                    "celery",
                    "worker",
                    "--celery-hostname",
                    f"{name}@%h",
                    "--concurrency",
                    str(self.concurrency),
                    "--skip-serve-logs",
                    "--without-mingle",
                    "--without-gossip",
                ],
                {"SZ_WORKER_NAME": name},
            )
        for name in self.worker_names:
            component = self.components[name]
            wait_for(
                lambda c=component: self._worker_ready(c),
                120,
                f"the Celery worker {component.name} to be ready",
            )

    def _worker_ready(self, component: Any) -> bool:
        if not component.running():
            raise RuntimeError(f"{component.name} exited ({component.process.returncode})")
        return " ready." in component.log_path.read_text(errors="replace")

    def store_connections_and_pool(self) -> None:
        """The connections and the pool, then the FAB users: ``admin`` (Admin) and ``reader``
        (no role of its own yet)."""
        super().store_connections_and_pool()
        for user, role in ((ADMIN, "Admin"), (READER, "Public")):
            self.cli(
                "users",
                "create",
                "--username",
                user,
                "--password",
                self.passwords[user],
                "--role",
                role,
                "--firstname",
                user,
                "--lastname",
                "deployment",
                "--email",
                f"{user}@example.invalid",
            )

    def _ready(self) -> None:
        """The reader's role: it may read the Dag :data:`READABLE_DAG` and its XComs, and nothing
        of :data:`UNREADABLE_DAG` (the Dags' own permissions exist once they are parsed)."""
        self.cli("sync-perm", "--include-dags", timeout=300)
        self.cli("roles", "create", "sz_reader")
        self.cli("roles", "add-perms", "sz_reader", "-r", f"DAG:{READABLE_DAG}", "XComs", "-a", "can_read")
        self.cli("users", "add-role", "--username", READER, "--role", "sz_reader")

    def token(self, user: str) -> str:
        """A JWT for ``user`` from the FAB auth manager's ``/auth/token`` (cached)."""
        if user not in self._tokens:
            import json
            import urllib.request

            request = urllib.request.Request(
                f"{self.api}/auth/token",
                data=json.dumps({"username": user, "password": self.passwords[user]}).encode(),
                method="POST",
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=30) as response:
                self._tokens[user] = json.loads(response.read())["access_token"]
        return self._tokens[user]

    def auth_headers(self, token: str | None = None) -> dict[str, str]:
        """As ``admin`` unless ``token`` says otherwise."""
        return {"Authorization": f"Bearer {token or self.token(ADMIN)}"}

    def stop(self) -> None:
        """Stop the components, then the broker."""
        self.decider.release.set()
        try:
            super().stop()
        finally:
            if self.redis is not None:
                with contextlib.suppress(Exception):
                    self.redis.stop()

    def diagnostics(self, lines: int = 40) -> str:
        """:meth:`Deployment.diagnostics` and the broker's log."""
        text = super().diagnostics(lines)
        if self.redis is not None and self.redis.directory is not None:
            text += f"\n----- redis -----\n{self.redis.log_path.read_text(errors='replace')[-2000:]}"
        return text


__all__ = ["CELERY_DAG_IDS", "HELD_MARK", "CeleryDeployment", "HeldDecider"]
