"""A throwaway Airflow deployment on loopback, run as separate components, for the deployment test.

:class:`Deployment` starts, in this order:

1. the gateway emulator, in a thread of the test process (its ledger and stats are read directly);
2. ``airflow db migrate`` in a fresh ``AIRFLOW_HOME`` — on SQLite, or (``database="postgres"``)
   on a PostgreSQL cluster of the test's own (:class:`tests.helpers.deployment.postgres.PostgresInstance`) —
   then the System Zero connections
   and the test pool written to the metadata DB by a child process (the API keys travel in that
   child's environment, never on a command line);
3. the components, each its own process from the project's environment: ``api-server`` (the
   execution API the LocalExecutor's workers talk to, and the REST API the test triggers runs
   with), ``scheduler`` (LocalExecutor), ``dag-processor`` and two ``triggerer`` processes
   (:class:`tests.helpers.deployment.components.Component`).

Every component is stopped by its own PID — SIGTERM, a bounded wait, then SIGKILL for whatever
of its process tree is left — in :meth:`Deployment.stop`, which runs from the fixture's
``finally``, from ``atexit`` and from a SIGTERM handler. Each component is also started with
``PR_SET_PDEATHSIG`` (Linux), so it gets SIGTERM if the test process itself is killed.

State is read straight from the metadata DB (short read-only queries) and the REST API.
Component logs live in ``$AIRFLOW_HOME/components/``; :meth:`Deployment.diagnostics` returns
their tails for a failure message.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import secrets
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from tests.helpers import EmulatorThread, wait_until
from tests.helpers.deployment.components import Component, SocketSampler
from tests.helpers.deployment.postgres import PostgresInstance

_T = TypeVar("_T")

REPO = Path(__file__).resolve().parents[3]
DAGS = REPO / "tests" / "deployment" / "dags"
RULES = REPO / "example_dags" / "emulator_rules.json"

#: The emulator's accounts: the main one has room for every triggerer's streams; ``small`` is
#: max_concurrent 4, i.e. 2 streams — the capacity the pool of scenario 4 is sized to.
MAIN_KEY, MAIN_MAX_CONCURRENT = "deploy-" + secrets.token_hex(6), 64
SMALL_KEY, SMALL_MAX_CONCURRENT = "small-" + secrets.token_hex(6), 4
ACCOUNT_POOL = "systemzero_account"
ACCOUNT_POOL_SLOTS = max(1, SMALL_MAX_CONCURRENT // 2)
#: The Dags in ``dags/`` (the deployment waits until all of them are serialized).
DAG_IDS = (
    "sz_deploy_fanout",
    "sz_deploy_handover",
    "sz_deploy_pool",
    "sz_deploy_start_from_trigger",
    "sz_deploy_operator_xcom",
    "sz_deploy_failover",
)

#: The metadata databases the deployment runs on (``SZ_DEPLOYMENT_DB``; SQLite by default).
DATABASES = ("sqlite", "postgres")

#: One line per scenario: what it measured (printed in the terminal summary by the conftest).
RESULTS: list[str] = []

#: Seconds without a heartbeat after which a triggerer counts as dead (see :meth:`Deployment.env`).
TRIGGERER_HEALTH_THRESHOLD = 20


def _chosen(variable: str, choices: Sequence[str], unset: str) -> str:
    """The value of ``variable`` (``choices[0]`` when unset), refused unless one of ``choices``."""
    chosen = os.environ.get(variable, choices[0]) or choices[0]
    if chosen not in choices:
        raise ValueError(
            f"{variable}={chosen!r} is not one of {tuple(choices)}: unset it for {unset}, or set it to "
            + " or ".join(repr(c) for c in choices[1:])
        )
    return chosen


def database() -> str:
    """The metadata database chosen with ``SZ_DEPLOYMENT_DB`` (``sqlite`` when unset)."""
    return _chosen("SZ_DEPLOYMENT_DB", DATABASES, "SQLite")


#: The executors the deployment runs (``SZ_DEPLOYMENT_EXECUTOR``; the LocalExecutor by default).
EXECUTORS = ("local", "celery")


def executor() -> str:
    """The executor chosen with ``SZ_DEPLOYMENT_EXECUTOR`` (``local`` when unset; ``celery`` runs
    :mod:`tests.deployment.test_celery` on PostgreSQL and Redis)."""
    return _chosen("SZ_DEPLOYMENT_EXECUTOR", EXECUTORS, "the LocalExecutor")


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(predicate: Callable[[], _T], timeout: float, what: str, interval: float = 0.25) -> _T:
    """:func:`tests.helpers.wait_until`, polling less often (the components are slow to change)."""
    return wait_until(predicate, timeout, interval, what=what)


def _tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<{exc}>"
    return "\n".join(text.splitlines()[-lines:])


class Deployment:
    """The emulator plus real Airflow components in a throwaway home (see the module docstring)."""

    def __init__(
        self,
        home: Path,
        *,
        parallelism: int = 4,
        database: str = "sqlite",
        dags: Path = DAGS,
        dag_ids: Sequence[str] = DAG_IDS,
        rules: Path = RULES,
        triggerers: Sequence[str] = ("triggerer-a", "triggerer-b"),
        extra_env: Mapping[str, str] | None = None,
    ) -> None:
        """:param home: the ``AIRFLOW_HOME`` (empty).
        :param parallelism: LocalExecutor workers.
        :param database: ``sqlite`` or ``postgres``.
        :param dags: the Dags folder; :param dag_ids: the Dags to wait for.
        :param rules: the emulator's rules file.
        :param triggerers: the names of the triggerers to start.
        :param extra_env: Airflow settings on top of :meth:`env`'s."""
        if database not in DATABASES:
            raise ValueError(f"database={database!r} is not one of {DATABASES}")
        self.home = home
        self.parallelism = parallelism
        self.database = database
        self.dags = dags
        self.dag_ids = tuple(dag_ids)
        self.rules = rules
        self.triggerer_names = tuple(triggerers)
        self.extra_env = dict(extra_env or {})
        #: the PostgreSQL cluster (``database="postgres"``), started by :meth:`start`
        self.postgres: PostgresInstance | None = None
        self.logs = home / "components"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.db_path = home / "airflow.db"
        self.api_port = free_port()
        self.api = f"http://127.0.0.1:{self.api_port}"
        self.components: dict[str, Component] = {}
        #: triggerer component name -> its TriggererJob ID
        self.triggerer_jobs: dict[str, int] = {}
        self.emulator_thread: EmulatorThread | None = None
        self.emulator: Any = None
        self.sampler: SocketSampler | None = None
        self._stopped = False
        self._previous_sigterm: Any = None
        self._fernet_key = ""
        self._secret_key = ""
        self._jwt_secret = ""

    # ------------------------------------------------------------------ environment

    def env(self) -> dict[str, str]:
        """The environment of every Airflow process: nothing inherited from the test's own Airflow setup."""
        base = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "SYSTEMZERO"))}
        return {
            **base,
            "AIRFLOW_HOME": str(self.home),
            # the provider as checked out next to this test, whatever is installed
            "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [base.get("PYTHONPATH")])]),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": str(self.parallelism),
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__FERNET_KEY": self._fernet_key,
            # SQLite: a writer waits up to 30 s for the lock, not sqlite3's 5 s, so a REST call
            # made while the scheduler, a triggerer and a worker write is not answered with a 500
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": (
                self.postgres.url if self.postgres else f"sqlite:///{self.db_path}?timeout=30"
            ),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.api}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.api_port),
            "AIRFLOW__API__BASE_URL": self.api,
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__SECRET_KEY": self._secret_key,
            "AIRFLOW__API_AUTH__JWT_SECRET": self._jwt_secret,
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
            "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.5",
            "AIRFLOW__SCHEDULER__TRIGGER_TIMEOUT_CHECK_INTERVAL": "5",
            # HA: a triggerer whose heartbeat is older than the threshold is dead and its triggers
            # go to another one. Not lower than ~20 s: a triggerer's first trigger that reads a
            # connection builds its in-process execution API, which stalled its heartbeat for
            # 12-13 s on a busy 2-core machine (a shorter threshold hands live triggers over).
            "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "1",
            "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": str(TRIGGERER_HEALTH_THRESHOLD),
            # each triggerer loop takes at most 2 new triggers, so both triggerers get some
            "AIRFLOW__TRIGGERER__MAX_TRIGGER_TO_SELECT_PER_LOOP": "2",
            "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": "True",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            "AIRFLOW__LOGGING__COLORED_CONSOLE_LOG": "False",
            "PYTHONUNBUFFERED": "1",
            **self.extra_env,
        }

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start everything; on any failure, stop what was started and re-raise."""
        from cryptography.fernet import Fernet

        self._fernet_key = Fernet.generate_key().decode()
        self._secret_key = secrets.token_urlsafe(24)
        self._jwt_secret = secrets.token_urlsafe(64)
        atexit.register(self.stop)
        if threading.current_thread() is threading.main_thread():
            self._previous_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)
        try:
            self._start_emulator()
            if self.database == "postgres":
                self.postgres = PostgresInstance(free_port())
                self.postgres.start()
            self._start_services()
            self.cli("db", "migrate", timeout=300)
            if self.postgres is None:
                # WAL: the test's read-only queries never block a component's write (persists in the file)
                with contextlib.closing(sqlite3.connect(self.db_path)) as conn:
                    conn.execute("PRAGMA journal_mode=WAL")
            self.store_connections_and_pool()
            self._start("api-server", ["api-server"])
            self._start("scheduler", ["scheduler", "--skip-serve-logs"])
            self._start("dag-processor", ["dag-processor"])
            for name in self.triggerer_names:
                self.start_triggerer(name)
            self._start_workers()
            wait_for(self._api_healthy, 90, "the api-server to answer")
            wait_for(self._dags_serialized, 120, "the deployment Dags to be parsed")
            self._ready()
        except BaseException:
            self.stop()
            raise

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        # stop the components now, then end the test session the way Ctrl-C does
        self.stop()
        raise KeyboardInterrupt(f"signal {signum}")

    def _start_services(self) -> None:
        """Services the executor needs beside the metadata DB (none for the LocalExecutor)."""

    def _start_workers(self) -> None:
        """Worker processes of the executor (the LocalExecutor's are the scheduler's children)."""

    def _ready(self) -> None:
        """What needs the running components and parsed Dags before a scenario starts."""

    def emulator_options(self) -> dict[str, Any]:
        """The emulator's accounts, decider and limits: here no account decision ceiling binds."""
        from airflow_provider_systemzero.protocol.limits import Limits

        return {
            "api_keys": {MAIN_KEY: MAIN_MAX_CONCURRENT, SMALL_KEY: SMALL_MAX_CONCURRENT},
            "decider": f"rules:{self.rules}",
            "limits": Limits(account_decision_burst=10_000, account_decision_ceiling_per_minute=1_000_000),
            "decide_latency_ms": 100,
        }

    def _start_emulator(self) -> None:
        self.emulator_thread = EmulatorThread(**self.emulator_options())
        self.emulator = self.emulator_thread.__enter__()
        self.sampler = SocketSampler(self.emulator.port)
        self.sampler.start()

    def _start(self, name: str, args: Sequence[str], env: Mapping[str, str] | None = None) -> Component:
        component = Component(name, list(args), self.logs / f"{name}.log")
        component.start({**self.env(), **(env or {})})
        self.components[name] = component
        return component

    def start_triggerer(self, name: str, capacity: int | None = None) -> Component:
        """Start a triggerer (optionally with a capacity) and wait for its TriggererJob row."""
        known = {row[0] for row in self.query("SELECT id FROM job WHERE job_type = 'TriggererJob'")}
        args = ["triggerer", "--skip-serve-logs"] + (
            [] if capacity is None else ["--capacity", str(capacity)]
        )
        component = self._start(name, args)
        assert self.sampler is not None
        self.sampler.watch(component)

        def new_job() -> int | None:
            if not component.running():
                raise RuntimeError(f"{name} exited with {component.process and component.process.returncode}")
            rows = self.query(
                "SELECT id FROM job WHERE job_type = 'TriggererJob' AND end_date IS NULL ORDER BY id"
            )
            fresh = [row[0] for row in rows if row[0] not in known]
            return fresh[-1] if fresh else None

        self.triggerer_jobs[name] = wait_for(new_job, 90, f"{name}'s TriggererJob row")
        return component

    def stop(self) -> None:
        """Stop every component by its own PID, then the emulator. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        # SIGTERM (each by its own PID) to every component at once, then wait for each; the
        # api-server last, as the scheduler's running workers finish through its execution API
        components = list(self.components.values())
        for phase in (
            [c for c in components if c.name != "api-server"],
            [c for c in components if c.name == "api-server"],
        ):
            for component in phase:
                with contextlib.suppress(Exception):
                    component.terminate()
            for component in phase:
                with contextlib.suppress(Exception):
                    component.finish()
        if self.sampler is not None:
            self.sampler.stop()
        if self.emulator_thread is not None:
            with contextlib.suppress(Exception):
                self.emulator_thread.__exit__(None, None, None)
        if self.postgres is not None:
            with contextlib.suppress(Exception):
                self.postgres.stop()
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
        if self._previous_sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._previous_sigterm)

    # ------------------------------------------------------------------ setup helpers

    def cli(self, *args: str, timeout: float = 120) -> str:
        """Run an ``airflow`` CLI command in the deployment's environment; its output is logged."""
        log = self.logs / "cli.log"
        result = subprocess.run(
            [sys.executable, "-m", "airflow", *args],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        with log.open("a") as handle:
            handle.write(f"\n$ airflow {' '.join(args)}\n{result.stdout}{result.stderr}")
        if result.returncode != 0:
            raise RuntimeError(f"'airflow {' '.join(args)}' failed ({result.returncode}):\n{_tail(log, 30)}")
        return result.stdout

    def store_connections_and_pool(self) -> None:
        """Store the test's connections and pool in the deployment's database, before any component
        starts (a deployment that needs more, such as users, extends it)."""
        script = """
import json, os
from airflow.models import Connection
from airflow.models.pool import Pool
from airflow.utils.session import create_session
with create_session() as s:
    for conn_id, key in (("systemzero_default", "SZ_MAIN_KEY"), ("systemzero_small", "SZ_SMALL_KEY")):
        s.add(Connection(conn_id=conn_id, conn_type="systemzero", host=os.environ["SZ_ORIGIN"],
                         password=os.environ[key], extra=json.dumps({"model": "sz-deploy"})))
Pool.create_or_update_pool(os.environ["SZ_POOL"], int(os.environ["SZ_POOL_SLOTS"]),
                           "System Zero account capacity", include_deferred=True)
"""
        env = {
            **self.env(),
            "SZ_ORIGIN": self.emulator.origin,
            "SZ_MAIN_KEY": MAIN_KEY,
            "SZ_SMALL_KEY": SMALL_KEY,
            "SZ_POOL": ACCOUNT_POOL,
            "SZ_POOL_SLOTS": str(ACCOUNT_POOL_SLOTS),
        }
        result = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120, check=False
        )
        if result.returncode != 0:
            raise RuntimeError(f"storing the connections failed:\n{result.stderr[-3000:]}")

    def _api_healthy(self) -> bool:
        for component in self.components.values():
            if not component.running():
                raise RuntimeError(
                    f"{component.name} exited early ({component.process.returncode}):\n"  # type: ignore[union-attr]
                    f"{_tail(component.log_path, 40)}"
                )
        try:
            health = self.rest("GET", "/api/v2/monitor/health")
        except (OSError, urllib.error.URLError):
            return False
        return health.get("metadatabase", {}).get("status") == "healthy"

    def _dags_serialized(self) -> bool:
        rows = self.query("SELECT dag_id FROM serialized_dag")
        return set(self.dag_ids) <= {row[0] for row in rows}

    # ------------------------------------------------------------------ reading and acting

    @contextlib.contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True, timeout=30)
        try:
            yield conn
        finally:
            conn.close()

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """A read-only query on the metadata DB, ``?`` placeholders (SQLite: retried while a writer
        holds the lock)."""
        if self.postgres is not None:
            return self.postgres.query(sql, params)
        for attempt in range(20):
            try:
                with self._db() as conn:
                    return conn.execute(sql, params).fetchall()
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or attempt == 19:
                    raise
                time.sleep(0.1)
        raise AssertionError("unreachable")

    def rest(self, method: str, path: str, body: Any = None, token: str | None = None) -> Any:
        """Call the REST API as the deployment's own user (``token``: as that user)."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", **self.auth_headers(token)}
        request = urllib.request.Request(self.api + path, data=data, method=method, headers=headers)
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read() or b"null")

    def auth_headers(self, token: str | None = None) -> dict[str, str]:
        """The headers of a REST call as the user of ``token`` (none: the deployment's own user, whose
        token the simple auth manager's all-admins mode hands out — Airflow 3.3 takes a call without
        one, 3.1 does not)."""
        if token is None:
            token = getattr(self, "_api_token", None)
        if token is None:
            with urllib.request.urlopen(self.api + "/auth/token", timeout=30) as response:
                token = self._api_token = json.loads(response.read())["access_token"]
        return {"Authorization": f"Bearer {token}"}

    def trigger(self, dag_id: str, conf: Mapping[str, Any], run_id: str | None = None) -> str:
        """Create a manual run through the REST API; returns its run ID.

        On SQLite the API server answers 500 when another component holds the write lock past
        SQLite's 5 s busy timeout. The run ID is chosen here, so a failed request is retried only
        while that run does not exist (bounded), and never creates a second run.
        """
        run_id = run_id or f"manual__{time.time_ns()}"
        body = {"logical_date": None, "conf": dict(conf), "dag_run_id": run_id}
        for attempt in range(1, 5):
            try:
                return self.rest("POST", f"/api/v2/dags/{dag_id}/dagRuns", body)["dag_run_id"]
            except urllib.error.HTTPError as exc:
                if exc.code != 500:
                    raise
                if self.run_state(dag_id, run_id) is not None:  # created before the error
                    return run_id
                if attempt == 4:
                    raise AssertionError(
                        f"the API server refused run {run_id} 4 times: {exc.read()!r}"
                    ) from exc
                time.sleep(attempt)
        raise AssertionError("unreachable")

    def run_state(self, dag_id: str, run_id: str) -> str | None:
        rows = self.query("SELECT state FROM dag_run WHERE dag_id = ? AND run_id = ?", (dag_id, run_id))
        return rows[0][0] if rows else None

    def wait_run(self, dag_id: str, run_id: str, timeout: float) -> str:
        """Wait (bounded) for a run's final state."""

        def final() -> str | None:
            self.check_alive()
            state = self.run_state(dag_id, run_id)
            return state if state in ("success", "failed") else None

        return wait_for(final, timeout, f"run {dag_id}/{run_id} to finish", interval=0.5)

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, dict[str, Any]]:
        """``task_id[map_index] -> {state, try_number, pool, ...}``."""
        rows = self.query(
            "SELECT task_id, map_index, state, try_number, pool, trigger_id, next_method "
            "FROM task_instance WHERE dag_id = ? AND run_id = ?",
            (dag_id, run_id),
        )
        return {
            task + (f"[{index}]" if index >= 0 else ""): {
                "state": state,
                "try_number": tries,
                "pool": pool,
                "trigger_id": trigger,
                "next_method": nxt,
            }
            for task, index, state, tries, pool, trigger, nxt in rows
        }

    def xcoms(self, dag_id: str, run_id: str) -> dict[tuple[str, str], Any]:
        """``(task_id, key) -> value`` (XCom values are stored as JSON)."""
        rows = self.query(
            "SELECT task_id, key, value FROM xcom WHERE dag_id = ? AND run_id = ?", (dag_id, run_id)
        )
        out = {}
        for task, key, value in rows:
            if self.postgres is not None:  # a JSON column: psycopg2 decoded it already
                out[(task, key)] = value
                continue
            if isinstance(value, bytes):
                value = value.decode()
            out[(task, key)] = json.loads(value) if isinstance(value, str) else value
        return out

    def triggers_by_triggerer(self, dag_id: str, run_id: str) -> dict[str, list[str]]:
        """Triggerer component name -> task IDs whose trigger it runs now (``"?"``: unassigned/unknown)."""
        rows = self.query(
            "SELECT ti.task_id, t.triggerer_id FROM task_instance ti JOIN trigger t "
            "ON ti.trigger_id = t.id WHERE ti.dag_id = ? AND ti.run_id = ?",
            (dag_id, run_id),
        )
        names = {job: name for name, job in self.triggerer_jobs.items()}
        out: dict[str, list[str]] = {}
        for task, job in rows:
            out.setdefault(names.get(job, "?"), []).append(task)
        return out

    def trigger_kwargs_text(self, trigger_id: int) -> str:
        """A trigger row's kwargs as stored (JSON, however Airflow encoded it), decrypted with the
        deployment's Fernet key."""
        from cryptography.fernet import Fernet

        rows = self.query("SELECT kwargs FROM trigger WHERE id = ?", (trigger_id,))
        if not rows:
            return ""
        encrypted = rows[0][0]
        if encrypted.startswith("{"):
            return encrypted
        return Fernet(self._fernet_key.encode()).decrypt(encrypted.encode()).decode()

    def ledger(self) -> list[Any]:
        """Every decide call the emulator answered, all accounts (``LedgerEntry``: account, key, body
        hash, billed or replayed, time), snapshotted on the emulator's own loop."""
        assert self.emulator_thread is not None
        return self.emulator_thread.call(lambda emu: [e for entries in emu.ledger.values() for e in entries])

    def state_mismatches(self) -> list[dict[str, Any]]:
        """The scheduler's "state mismatch" audit rows: the stale executor event of apache/airflow#71580."""
        rows = self.query(
            "SELECT dag_id, task_id, run_id, map_index, try_number, extra FROM log "
            "WHERE event = 'state mismatch'"
        )
        return [
            {"dag_id": d, "task_id": t, "run_id": r, "map_index": m, "try_number": n, "extra": e}
            for d, t, r, m, n, e in rows
        ]

    def unexplained_retries(
        self, dag_id: str, run_id: str
    ) -> tuple[list[tuple[str, int]], set[tuple[str, int]]]:
        """The tasks of a run that needed more than one try without the scheduler having failed each
        earlier try on the stale executor event of apache/airflow#71580 ("state mismatch": the
        worker's exit after deferring — or after pausing for a person's answer — was processed after
        the task had already been resumed), and the (task, try) pairs that had that mismatch."""
        mismatched = {
            (m["task_id"], m["try_number"])
            for m in self.state_mismatches()
            if m["dag_id"] == dag_id and m["run_id"] == run_id
        }
        unexplained = [
            (task, ti["try_number"])
            for task, ti in self.task_instances(dag_id, run_id).items()
            if ti["try_number"] > 1 and not all((task, n) in mismatched for n in range(1, ti["try_number"]))
        ]
        return unexplained, mismatched

    def check_alive(self) -> None:
        """Fail fast when a component that should be running has exited."""
        for component in self.components.values():
            if not component.running() and not component.expected_down:
                raise RuntimeError(
                    f"{component.name} exited unexpectedly "
                    f"({component.process.returncode if component.process else None})"
                )

    def diagnostics(self, lines: int = 40) -> str:
        """The tails of every component's log, for a failure message."""
        parts = []
        for path in sorted(self.logs.glob("*.log")):
            parts.append(f"----- {path.name} (last {lines} lines) -----\n{_tail(path, lines)}")
        if self.postgres is not None and self.postgres.directory is not None:
            parts.append(f"----- postgres (last {lines} lines) -----\n{_tail(self.postgres.log_path, lines)}")
        return "\n".join(parts)


@contextlib.contextmanager
def running(deployment: Deployment) -> Iterator[Deployment]:
    """Start ``deployment`` (a start failure carries every component's log tail), yield it, stop it."""
    try:
        deployment.start()
    except BaseException as exc:
        if isinstance(exc, Exception):
            raise RuntimeError(f"the deployment did not start: {exc}\n{deployment.diagnostics()}") from exc
        raise
    try:
        yield deployment
    finally:
        deployment.stop()
