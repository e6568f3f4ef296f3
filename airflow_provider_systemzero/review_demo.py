"""The review demo: a person answers an unsure decision through Airflow's REST API, as a script would.

``make review-demo`` runs it from a clone, ``python -m airflow_provider_systemzero.review_demo``
from an installed package. Everything runs on loopback, in a throwaway ``AIRFLOW_HOME``, and each
step is printed as it happens:

1. the gateway emulator, answering from the example Dags' rules;
2. Airflow's ``api-server``, with the simple auth manager making every user an admin
   (``AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS=True``: for a local try, never a deployment);
3. ``airflow dags test systemzero_ticket_policy -c '{"ticket": "T-1003"}'`` in the background: the
   model is unsure which team gets the ticket (confidence 0.6, between the policy's two bars), so
   the ``route`` task asks a person and waits;
4. the review request, read from the REST API
   (``GET /api/v2/dags/<dag>/dagRuns/~/hitlDetails?response_received=false``);
5. the answer: a token from ``GET /auth/token``, then ``PATCH
   /api/v2/dags/<dag>/dagRuns/<run ID, URL-encoded>/taskInstances/route/-1/hitlDetails``, each
   printed as the ``curl`` command that does the same;
6. the ``decision`` record the task pushed once the run ended: ``decided_by: human``, when
   System Zero decided (``decided_at``) and when the person answered (``answered_at``).

Like the demo, it is sealed (:class:`~airflow_provider_systemzero.demo.DemoHome`): no ``AIRFLOW*``
or ``SYSTEMZERO_*`` variable of the caller's reaches its processes, so a connection, a database or
a home set by environment (a real gateway and key in ``AIRFLOW_CONN_SYSTEMZERO_DEFAULT``) is never
used, and every process it starts is refused an environment that points elsewhere.

It works on every supported Airflow: on 3.3 the task waits in ``awaiting_input``; on 3.1 and 3.2 it
waits deferred, and Airflow's ``HITLTrigger`` (run in-process by ``dags test``) checks for the
answer every second. The home is removed on exit unless ``--keep-home`` is given or something failed.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from airflow_provider_systemzero.demo import (
    DemoHome,
    Invocation,
    airflow_cli,
    example_dags_folder,
    log_tail,
    loopback_opener,
    run_emulator,
    run_in_home,
    run_xcoms,
    say,
    say_sealed,
    store_connection,
)
from airflow_provider_systemzero.durations import readable

__all__ = ["DAG_ID", "TASK_ID", "TICKET", "Background", "RestApi", "main"]

T = TypeVar("T")

#: The example Dag, the ticket the model is unsure about, and the task that asks a person.
DAG_ID = "systemzero_ticket_policy"
TICKET = "T-1003"
TASK_ID = "route"
#: The longest each wait may take (seconds): the api-server to answer, the review request to
#: appear, and the run to end once answered (a first run on a busy 2-core machine takes a minute).
API_START_S = 180.0
REVIEW_ASKED_S = 300.0
RUN_END_S = 300.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Background:
    """A child process the demo starts, its output in a log; stopped (its whole process group, by
    its ID: the api-server has worker processes) when the demo leaves the ``with`` block.

    :param name: what it is, for messages.
    :param command: the command line.
    :param env: its environment.
    :param log_path: where its output goes.
    """

    def __init__(self, name: str, command: Sequence[str], env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.command = list(command)
        self.env = env
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Background:
        DemoHome.check(self.env, self.name)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        return self

    def __exit__(self, *exc_info: object) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)

    @property
    def returncode(self) -> int | None:
        """The exit code, or ``None`` while it runs."""
        return None if self.process is None else self.process.poll()

    def check_running(self) -> None:
        """Raise when the process has exited (the wait that needs it cannot end).

        :raises RuntimeError: naming the process, its exit code and the end of its log.
        """
        code = self.returncode
        if code is not None:
            raise RuntimeError(
                f"{self.name} exited {code} before the demo was done; the end of {self.log_path}:\n"
                f"{log_tail(self.log_path)}"
            )


class RestApi:
    """Airflow's REST API on loopback, called the way a script calls it: a token from
    ``GET /auth/token`` (the simple auth manager's all-admins mode hands one out without a
    password), then ``Authorization: Bearer <token>`` on each call.

    :param base: the api-server's URL (``http://127.0.0.1:PORT``).
    """

    def __init__(self, base: str) -> None:
        self.base = base
        self._token: str | None = None

    def _call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._token is not None:
            headers["Authorization"] = f"Bearer {self._token}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        try:
            with loopback_opener.open(request, timeout=30) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace")
            with contextlib.suppress(json.JSONDecodeError):
                return exc.code, json.loads(text)
            return exc.code, text

    def healthy(self) -> bool:
        """Whether the api-server answers and reaches the metadata DB."""
        try:
            status, health = self._call("GET", "/api/v2/monitor/health")
        except OSError:
            return False
        return status == 200 and health.get("metadatabase", {}).get("status") == "healthy"

    def log_in(self) -> None:
        """Take a token from ``GET /auth/token``.

        :raises RuntimeError: the api-server handed out no token.
        """
        status, body = self._call("GET", "/auth/token")
        token = body.get("access_token") if isinstance(body, dict) else None
        if not token:
            raise RuntimeError(f"GET /auth/token answered {status}: {body}")
        self._token = token

    def pending_review(self, dag_id: str) -> dict[str, Any] | None:
        """The first unanswered review request of ``dag_id``'s runs, or ``None``.

        :param dag_id: the Dag.
        """
        status, body = self._call(
            "GET",
            f"/api/v2/dags/{urllib.parse.quote(dag_id, safe='')}/dagRuns/~/hitlDetails?response_received=false",
        )
        if status != 200 or not isinstance(body, dict):
            return None
        details = body.get("hitl_details") or []
        return details[0] if details else None

    def answer(self, path: str, chosen: list[str]) -> tuple[int, Any]:
        """``PATCH`` a review's answer.

        :param path: the review's ``hitlDetails`` path.
        :param chosen: the options chosen.
        """
        return self._call("PATCH", path, {"chosen_options": chosen, "params_input": {}})


def _wait(what: str, seconds: float, check: Callable[[], T | None], alive: Callable[[], None]) -> T:
    """Wait until ``check`` gives a value, at most ``seconds``, saying first what it waits for.

    :raises RuntimeError: ``alive`` found that a process the wait needs exited, or the time ran out.
    """
    say(f"waiting for {what} (at most {readable(seconds)})")
    deadline = time.monotonic() + seconds
    while True:
        alive()
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not happen within {readable(seconds)}: see the logs below")
        time.sleep(0.5)


def _quoted(lines: str) -> None:
    for line in lines.splitlines():
        say(f"| {line}")


def _environment(home: DemoHome, api: str, port: int) -> dict[str, str]:
    """The environment of every process of the demo: sealed (:meth:`DemoHome.environment`: nothing
    of the caller's Airflow or System Zero settings), one throwaway home on SQLite, the example
    Dags, and an api-server where every user is an admin. The emulator's key reaches only the
    process that stores it."""
    return home.environment(
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__DAGS_FOLDER=str(example_dags_folder()),
        # two processes write the DB (dags test, the api-server's answer): a writer waits for the lock
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"{home.database_url}?timeout=30",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS="True",
        AIRFLOW__API__HOST="127.0.0.1",
        AIRFLOW__API__PORT=str(port),
        AIRFLOW__API__BASE_URL=api,
        AIRFLOW__API__WORKERS="1",
        AIRFLOW__API__SECRET_KEY=secrets.token_urlsafe(24),
        AIRFLOW__API_AUTH__JWT_SECRET=secrets.token_urlsafe(64),
        SYSTEMZERO_EXAMPLE_DIR=str(home.path / "examples"),
        PYTHONWARNINGS="ignore",
    )


def _show_request(request: dict[str, Any]) -> None:
    say(str(request.get("subject")), step="review")
    _quoted(str(request.get("body") or ""))
    defaults = request.get("defaults")
    say(
        f"options: {', '.join(request.get('options') or [])}"
        + (f" (if nobody answers in time: {', '.join(defaults)})" if defaults else "")
    )


def _show_record(record: dict[str, Any]) -> None:
    say(
        f"{TASK_ID}: proposed {record.get('proposed')!r}, decision {record.get('decision')!r}, "
        f"decided by {record.get('decided_by')}",
        step="decision",
    )
    say(
        f"System Zero decided at {record.get('decided_at')}; the person answered at {record.get('answered_at')}"
    )
    say(f"the {TASK_ID}.decision XCom:")
    _quoted(json.dumps(record, indent=2))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the review demo; returns the exit code."""
    invocation = Invocation.of("airflow_provider_systemzero.review_demo")
    parser = invocation.parser(__doc__.split("\n\n")[0])
    parser.add_argument(
        "--answer",
        default="billing",
        choices=("billing", "engineering", "support"),
        help="the team the person chooses (the model proposes support)",
    )
    parser.add_argument("--keep-home", action="store_true", help="keep the throwaway AIRFLOW_HOME")
    args = invocation.finish(parser).parse_args(argv)

    started = time.monotonic()
    sealed = DemoHome.create("systemzero-review-demo-")
    home = sealed.path
    (home / "examples").mkdir()
    log_path = home / "demo.log"
    port = _free_port()
    api = f"http://127.0.0.1:{port}"
    env = _environment(sealed, api, port)

    def work() -> int:
        with contextlib.ExitStack() as stack:
            key = "demo-" + secrets.token_hex(8)
            origin = stack.enter_context(
                run_emulator(
                    example_dags_folder() / "emulator_rules.json",
                    key,
                    secrets.token_urlsafe(16),
                    home / "emulator.log",
                    env=env,
                )
            )
            say(
                f"emulator listening on {origin} (rules decider, log {home / 'emulator.log'})", step="gateway"
            )
            say(f"AIRFLOW_HOME={home}", step="airflow")
            say_sealed()
            airflow_cli(["db", "migrate"], env, log_path)
            with contextlib.closing(sqlite3.connect(home / "airflow.db")) as db:
                db.execute("PRAGMA journal_mode=WAL")  # the api-server's reads never block a write
            store_connection(env, origin, key, "sz-demo")
            say("metadata DB migrated; connection systemzero_default stored in the DB")

            server = stack.enter_context(
                Background(
                    "the api-server",
                    [
                        sys.executable,
                        "-m",
                        "airflow",
                        "api-server",
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(port),
                    ],
                    env,
                    home / "api-server.log",
                )
            )
            say(
                f"{api}, every user an admin (AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS=True: for "
                f"this local try only; log {home / 'api-server.log'})",
                step="api-server",
            )
            rest = RestApi(api)
            _wait("the api-server to answer", API_START_S, rest.healthy, server.check_running)

            conf = json.dumps({"ticket": TICKET})
            run = stack.enter_context(
                Background(
                    f"'airflow dags test {DAG_ID}'",
                    [sys.executable, "-m", "airflow", "dags", "test", DAG_ID, "-c", conf],
                    env,
                    log_path,
                )
            )
            say(f"{DAG_ID} -c {shlex.quote(conf)}, in the background (log {log_path})", step="dags test")

            def both_running() -> None:
                server.check_running()
                run.check_running()

            say(
                "$ TOKEN=$(curl -s "
                + shlex.quote(f"{api}/auth/token")
                + """ | python3 -c 'import json, sys; print(json.load(sys.stdin)["access_token"])')"""
                + "   # the token every call below carries",
                step="log in",
            )
            rest.log_in()
            request = _wait(
                f"the {TASK_ID} task to ask a person",
                REVIEW_ASKED_S,
                lambda: rest.pending_review(DAG_ID),
                both_running,
            )
            _show_request(request)

            ti = request["task_instance"]
            path = (
                f"/api/v2/dags/{urllib.parse.quote(ti['dag_id'], safe='')}/dagRuns/"
                f"{urllib.parse.quote(ti['dag_run_id'], safe='')}/taskInstances/"
                f"{urllib.parse.quote(ti['task_id'], safe='')}/{ti.get('map_index', -1)}/hitlDetails"
            )
            body = json.dumps({"chosen_options": [args.answer], "params_input": {}})
            say(
                # double quotes: the shell puts the token in; single quotes would send "$TOKEN"
                "$ curl -s -X PATCH -H \"Authorization: Bearer $TOKEN\" -H 'Content-Type: application/json' "
                f"-d {shlex.quote(body)} {shlex.quote(api + path)}",
                step="answer",
            )
            status, answered = rest.answer(path, [args.answer])
            if status != 200:
                raise RuntimeError(f"PATCH {path} answered {status}: {answered}")
            responder = answered.get("responded_by_user") or answered.get("responded_by") or {}
            say(f"{args.answer!r} recorded for {responder.get('name')!r} at {answered.get('responded_at')}")

            _wait(
                f"the run of {DAG_ID} to end",
                RUN_END_S,
                lambda: run.returncode is not None,
                server.check_running,
            )
            info = run_xcoms(env, DAG_ID)
            if run.returncode != 0 or info["state"] != "success":
                raise RuntimeError(
                    f"{DAG_ID} ended {info['state']}: {info['tasks']}; the end of {log_path}:\n{log_tail(log_path)}"
                )
            say(f"{DAG_ID}: {info['state']}; tasks {info['tasks']}", step="dags test")
            record = info["xcom"].get(f"{TASK_ID}.decision")
            if not isinstance(record, dict):
                raise RuntimeError(f"{TASK_ID} pushed no decision record; XComs: {sorted(info['xcom'])}")
            _show_record(record)
        kept = (
            ""
            if args.keep_home
            else f"; the home is removed ('{invocation.with_options('--keep-home')}' keeps it)"
        )
        say(
            f"a person's review answered through the REST API in {time.monotonic() - started:.1f} s{kept}",
            step="done",
        )
        return 0

    logs = [log_path, home / "api-server.log", home / "emulator.log"]
    return run_in_home(home, work, keep_home=args.keep_home, logs=logs, quoted=logs[1:])


if __name__ == "__main__":
    sys.exit(main())
