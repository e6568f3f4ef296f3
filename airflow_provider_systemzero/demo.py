"""The demo: a sensor firing on a System Zero decision, and three more example Dags, offline, in one command.

``make demo`` runs it from a clone, ``python -m airflow_provider_systemzero.demo`` from an installed
package.

What it does, each step printed as it happens:

1. starts the embedded gateway emulator on a free loopback port (``rules:`` decider from the
   example Dags' ``emulator_rules.json``, so the answers are explainable);
2. creates a throwaway ``AIRFLOW_HOME`` with a migrated SQLite DB and a ``systemzero_default``
   connection stored in the DB;
3. runs the example Dags end to end with ``airflow dags test``: the deferrable sensor waiting on a
   growing log, the operator replaying three task outputs and branching, the mapped operator,
   and a decision policy routing a ticket (two confidence bars, a branch and a short circuit);
4. shows what happened: state changes the gateway accepted, decisions with probability and
   confidence, the XCom values;
5. stops the emulator and removes the home on every exit path (``--keep-home`` keeps it); when
   something fails, the home is kept and the end of the failing log is printed.

The demo is sealed (:class:`DemoHome`): its children start from an environment of their own, which
keeps of the caller's only what a child needs to run (:data:`KEPT_VARIABLES`: ``PATH``, the locale,
the temporary directory, the TLS trust settings, the library path) — never an ``AIRFLOW_*``,
``AIRFLOW__*``, ``AIRFLOW_CONN_*``, ``AIRFLOW_VAR_*`` or ``SYSTEMZERO_*`` variable it does not set
itself. Where a deployment sets its metadata database, its home or its connections by environment
(the official image, Helm and compose do), the demo still uses only the home and the SQLite
database it created, and every step that starts Airflow refuses, naming the variable, an
environment that points anywhere else (:meth:`DemoHome.check`).

The example Dags ship inside the package (``airflow_provider_systemzero.example_dags``), so
``python -m airflow_provider_systemzero.demo`` runs from an installed wheel as well as from a
checkout. Its usage line and its hints name the command that was run (:class:`Invocation`):
``make demo`` with ``DEMO_ARGS=...`` from a checkout, the ``python -m`` command otherwise.

Point it at a real System Zero instead with ``--origin wss://HOST`` and the key in the
``SYSTEMZERO_API_KEY`` environment variable (never on the command line); ``--model`` picks the
model (``SYSTEMZERO_MODEL``). A real gateway is used only when ``--origin`` says so: a
``SYSTEMZERO_ORIGIN`` or a ``systemzero_default`` connection in the caller's environment is not.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "KEPT_VARIABLES",
    "MAKE_COMMAND_ENV",
    "DemoHome",
    "Invocation",
    "airflow_cli",
    "done_message",
    "example_dags_folder",
    "log_tail",
    "main",
    "run_emulator",
    "run_in_home",
    "run_xcoms",
    "say",
    "say_sealed",
    "store_connection",
]

#: Set by the Makefile to the ``make`` command a person typed (``make demo``): the usage line and the
#: hints then say ``make demo DEMO_ARGS=...``; unset, they name the ``python -m`` command.
MAKE_COMMAND_ENV = "SYSTEMZERO_DEMO_MAKE"

DEMO_DAGS = (
    "systemzero_wait_for_ready",
    "systemzero_replay_and_branch",
    "systemzero_mapped",
    "systemzero_ticket_policy",
)


#: How many lines of a failing log the demo quotes.
LOG_TAIL_LINES = 30

#: What the demos' children keep of the caller's environment: what a process needs to run — where
#: programs are, the locale, the temporary directory, the shared-library path an interpreter may
#: need, the TLS trust settings (for ``--origin``) — and nothing that could point it at a
#: deployment. ``LC_*`` variables are kept too (the locale).
KEPT_VARIABLES = (
    "PATH",
    "LANG",
    "LANGUAGE",
    "TMPDIR",
    "TEMP",
    "TMP",
    "LD_LIBRARY_PATH",
    "DYLD_LIBRARY_PATH",
    "PYTHONHOME",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
)
#: The variables a demo never passes on unless it sets them itself (by prefix): Airflow's home,
#: configuration, connections and variables, and this provider's own settings.
_SEALED_PREFIXES = ("AIRFLOW", "SYSTEMZERO_")
#: What says Airflow would use another database, configuration, connection or variable than the
#: demo's own, beside ``AIRFLOW_HOME`` and the database URL (checked by :meth:`DemoHome.check`).
_ELSEWHERE = (
    "AIRFLOW_CONFIG",
    "AIRFLOW_CONN_",
    "AIRFLOW_VAR_",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_",  # _CMD, _SECRET
    "AIRFLOW__CORE__SQL_ALCHEMY_CONN",  # the setting's old home
    "AIRFLOW__SECRETS__",
    "SYSTEMZERO_API_KEY",
    "SYSTEMZERO_ORIGIN",
)
#: The file that marks a home as one a demo created.
_MARK = ".systemzero-demo-home"
#: Where the home's database lives, inside it.
_DATABASE = "airflow.db"


class DemoHome:
    """A throwaway ``AIRFLOW_HOME`` a demo creates, with its SQLite metadata database, and the sealed
    environment of every child the demo starts there.

    :param path: the home (an empty directory the demo created; :meth:`create` makes one).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        (path / _MARK).write_text("a throwaway Airflow home of the System Zero demo\n", encoding="utf-8")

    @classmethod
    def create(cls, prefix: str) -> DemoHome:
        """A new home in the temporary directory.

        :param prefix: its name's beginning (``systemzero-demo-``).
        """
        return cls(Path(tempfile.mkdtemp(prefix=prefix)))

    @property
    def database_url(self) -> str:
        """The home's own metadata database (SQLite, a file in the home)."""
        return f"sqlite:///{self.path / _DATABASE}"

    def environment(self, **sets: str) -> dict[str, str]:
        """The environment of the demo's children: :data:`KEPT_VARIABLES` (and ``LC_*``) of the
        caller's, the import path this package came from, this home and its database, and ``sets``
        (the only ``AIRFLOW*`` and ``SYSTEMZERO_*`` variables there are).

        :param sets: more variables (``AIRFLOW__CORE__DAGS_FOLDER`` …); the database URL may be
            given with options, as long as it is the home's database.
        """
        kept = {
            name: value
            for name, value in os.environ.items()
            if name in KEPT_VARIABLES or name.startswith("LC_")
        }
        path = _import_path()
        env = {
            **kept,
            **({"PYTHONPATH": path} if path else {}),
            "AIRFLOW_HOME": str(self.path),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.database_url,
            **sets,
        }
        self.check(env)
        return env

    @staticmethod
    def check(env: dict[str, str], what: str = "the demo's Airflow") -> None:
        """Refuse an environment in which Airflow would use a home or a database the demo did not
        create, or connections, variables, configuration or secrets from elsewhere.

        :param env: the environment of a child about to start.
        :param what: what the child is, for the message.
        :raises RuntimeError: naming the variable (never its value: it may hold a password).
        """
        home = env.get("AIRFLOW_HOME")
        if home is None or not (Path(home) / _MARK).is_file():
            raise RuntimeError(
                f"refusing to start {what} with AIRFLOW_HOME={'unset' if home is None else home}: the "
                "demo runs Airflow only in the throwaway home it created, never in another"
            )
        url = env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN")
        inside = f"sqlite:///{Path(home) / _DATABASE}"
        if url is not None and url != inside and not url.startswith(inside + "?"):
            raise RuntimeError(
                f"refusing to start {what} with AIRFLOW__DATABASE__SQL_ALCHEMY_CONN set to another database "
                f"(not shown: it may hold a password): the demo uses only {inside}, which it created"
            )
        for name in env:
            if name.startswith(_ELSEWHERE):
                raise RuntimeError(
                    f"refusing to start {what} with {name} set (not shown): Airflow would read a "
                    "configuration, a connection, a variable, a secret or a key the demo did not create"
                )


def _import_path() -> str:
    """The ``PYTHONPATH`` entries a child needs to import this package and Airflow as this process
    does (none when they are installed)."""
    import airflow_provider_systemzero

    holders = {Path(airflow_provider_systemzero.__file__).resolve().parent.parent}
    airflow = importlib.util.find_spec("airflow")
    if airflow is not None and airflow.origin is not None:
        holders.add(Path(airflow.origin).resolve().parent.parent)
    entries = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    return os.pathsep.join(entry for entry in entries if Path(entry).resolve() in holders)


def say_sealed(shown: int = 8) -> None:
    """Say which of the caller's ``AIRFLOW*`` and ``SYSTEMZERO_*`` variables the demo's Airflow does
    not see (their names only: a value may hold a password), if any.

    :param shown: the most names listed.
    """
    names = sorted(
        name
        for name in os.environ
        if name.startswith(_SEALED_PREFIXES) and name not in (MAKE_COMMAND_ENV, "SYSTEMZERO_API_KEY")
    )
    if names:
        more = f" and {len(names) - shown} more" if len(names) > shown else ""
        say(
            f"not passed on from your environment: {', '.join(names[:shown])}{more} (the demo uses its "
            "own home, database and connection; a real gateway only with --origin)"
        )


def example_dags_folder() -> Path:
    """The example Dags: the installed ``airflow_provider_systemzero.example_dags`` package.

    From a source tree that is not installed, ``example_dags/`` beside the package.
    """
    spec = importlib.util.find_spec("airflow_provider_systemzero.example_dags")
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        if (Path(location) / "emulator_rules.json").is_file():
            return Path(location)
    return Path(__file__).resolve().parent.parent / "example_dags"


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log, indented for quoting (``(empty)`` when there are none).

    :param path: the log file.
    :param lines: how many lines to quote.
    """
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return f"    (cannot read {path}: {exc.strerror})"
    tail = [line for line in text.splitlines() if line.strip()][-lines:]
    return "\n".join(f"    | {line}" for line in tail) if tail else "    (empty)"


@dataclasses.dataclass(frozen=True)
class Invocation:
    """The command that was run, as a person typed it: ``make <target>`` (the Makefile sets
    :data:`MAKE_COMMAND_ENV`; options then go in ``DEMO_ARGS``) or ``python -m <module>``.

    :param command: the command, without options.
    :param make: whether it was ``make`` (options are passed in ``DEMO_ARGS``).
    """

    command: str
    make: bool = False

    @classmethod
    def of(cls, module: str) -> Invocation:
        """How ``module`` was run: the Makefile's command, else ``python -m module``.

        :param module: the module's dotted name.
        """
        made = os.environ.get(MAKE_COMMAND_ENV, "").strip()
        return cls(made, make=True) if made else cls(f"python -m {module}")

    def with_options(self, options: str) -> str:
        """The command with ``options`` (``make demo DEMO_ARGS=--keep-home``).

        :param options: the options, as typed.
        """
        if not self.make:
            return f"{self.command} {options}"
        return (
            f'{self.command} DEMO_ARGS="{options}"'
            if " " in options
            else f"{self.command} DEMO_ARGS={options}"
        )

    def parser(self, description: str) -> argparse.ArgumentParser:
        """An argument parser whose usage line is this command's (the options inside ``DEMO_ARGS``
        with ``make``); add the arguments, then :meth:`finish` it.

        :param description: what the command does.
        """
        return argparse.ArgumentParser(prog=self.command, description=description)

    def finish(self, parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """Set ``parser``'s usage line once its arguments are added: ``make demo DEMO_ARGS="[...]"``.

        :param parser: a parser from :meth:`parser`.
        """
        if self.make:
            options = parser.format_usage().removeprefix("usage: ").strip().removeprefix(self.command).strip()
            parser.usage = self.with_options(" ".join(options.split()) or "...")
        return parser


def run_in_home(
    home: Path, work: Callable[[], int], *, keep_home: bool, logs: Sequence[Path], quoted: Sequence[Path]
) -> int:
    """Run a demo's ``work`` in its throwaway home and end every demo the same way: its exit code
    (0 when it succeeded), 1 on a failure — its message, then the end of each of ``quoted`` that
    the message does not quote already —, 130 when interrupted. The home is removed unless
    ``keep_home`` or something failed; then the last line says where it and its logs are.

    :param home: the throwaway ``AIRFLOW_HOME``.
    :param work: the demo's steps; returns the exit code, raises ``RuntimeError`` (or an ``OSError``
        or a ``SubprocessError``) with the cause when a step fails.
    :param keep_home: ``--keep-home`` was given.
    :param logs: the logs the last line names when the home is kept.
    :param quoted: the logs whose end a failure quotes.
    """
    failed = True
    try:
        code = work()
        failed = code != 0
        return code
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        say(str(exc), step="error")
        for log in quoted:
            if log.is_file() and str(log) not in str(exc):
                say(f"the end of {log}:\n{log_tail(log)}")
        return 1
    except KeyboardInterrupt:
        say("interrupted", step="error")
        return 130
    finally:
        if keep_home or failed:
            say(f"kept {home} (logs: {', '.join(map(str, logs))})")
        else:
            shutil.rmtree(home, ignore_errors=True)


def done_message(
    count: int, seconds: float, log_path: Path, *, keep_home: bool, invocation: Invocation
) -> str:
    """The last line of a successful run: where the full log is, or how to keep it.

    Without ``--keep-home`` the home, and the log in it, is removed right after this line, so the
    line names the flag instead of a file that is about to disappear.

    :param count: how many Dags succeeded.
    :param seconds: how long the whole demo took.
    :param log_path: the demo's log in the throwaway home.
    :param keep_home: whether ``--keep-home`` was given.
    :param invocation: the command that was run (the hint repeats it with ``--keep-home``).
    """
    summary = f"all {count} Dags succeeded in {seconds:.1f} s"
    if keep_home:
        return f"{summary} (full log: {log_path})"
    return f"{summary}; the home and its logs are removed ('{invocation.with_options('--keep-home')}' keeps them)"


def say(message: str = "", *, step: str | None = None) -> None:
    """Print one line of the demo's output: a step (``==> step message``) or a detail under it.

    :param message: what to say.
    :param step: the step's name (bold on a terminal); ``None``: an indented detail line.
    """
    prefix = (
        f"\033[1m==> {step}\033[0m " if step and sys.stdout.isatty() else (f"==> {step} " if step else "    ")
    )
    print(f"{prefix}{message}", flush=True)


def _emulator_command(rules: Path, key: str, admin: str) -> list[str]:
    """The command line that runs the demo's emulator (each value one argument, whatever it holds)."""
    return [
        sys.executable,
        "-m",
        "airflow_provider_systemzero.emulator",
        "--port",
        "0",
        "--api-key",
        f"{key}:8",
        "--decider",
        f"rules:{rules}",
        # one argument: a random token may begin with "-", which argparse would read as an option
        f"--admin-token={admin}",
        "--decide-latency-ms",
        "50",
    ]


@contextlib.contextmanager
def run_emulator(
    rules: Path, key: str, admin: str, log_path: Path, *, env: dict[str, str] | None = None
) -> Iterator[str]:
    """Run ``systemzero-emulator`` as a child process; yield its origin; always stop it.

    :param env: its environment (the demo's sealed one; ``None``: this process's).
    """
    command = _emulator_command(rules, key, admin)
    with log_path.open("w") as log:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if "listening on" not in line:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
            raise RuntimeError(
                f"the emulator did not start (exit code {process.poll()}); the end of "
                f"{log_path}:\n{log_tail(log_path)}"
            )
        url = line.split("listening on ", 1)[1].split()[0]
        yield url.split("/v1/", 1)[0]
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
        if process.stdout is not None:
            process.stdout.close()


#: Opens the demo's own loopback addresses (the emulator, the api-server) directly: never through a
#: proxy the caller's environment names.
loopback_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _stats(origin: str, admin: str) -> dict[str, Any]:
    url = origin.replace("ws://", "http://", 1) + "/_emulator/stats"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {admin}"})
    with loopback_opener.open(request, timeout=5) as response:
        return json.loads(response.read())


def airflow_cli(args: Sequence[str], env: dict[str, str], log_path: Path, *, timeout: float = 300) -> None:
    """Run ``airflow ARGS`` with the demo's environment, its output appended to ``log_path``.

    :param args: the command's arguments.
    :param env: the environment (the throwaway ``AIRFLOW_HOME``).
    :param log_path: where the output goes.
    :param timeout: seconds the command may take.
    :raises RuntimeError: the command failed (the message quotes the end of the log), or ``env``
        points Airflow at a home or a database the demo did not create (:meth:`DemoHome.check`).
    """
    DemoHome.check(env, f"'airflow {' '.join(args)}'")
    with log_path.open("a") as log:
        log.write(f"\n$ airflow {' '.join(args)}\n")
        log.flush()
        result = subprocess.run(
            [sys.executable, "-m", "airflow", *args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
        )
    if result.returncode != 0:
        raise RuntimeError(
            f"'airflow {' '.join(args)}' exited {result.returncode}; the end of {log_path}:\n"
            f"{log_tail(log_path)}"
        )


def store_connection(env: dict[str, str], origin: str, key: str, model: str) -> None:
    """Store ``systemzero_default`` in the metadata DB, with its port (the Test button needs one:
    see the connection docs); the key travels in the child's environment, never on a command line
    (where ``ps`` would show it).

    :raises RuntimeError: ``env`` points Airflow at a home or a database the demo did not create.
    """
    DemoHome.check(env, "the process that stores the demo's connection")
    script = """
import json, os
from airflow.models import Connection
from airflow.utils.session import create_session
from airflow_provider_systemzero.hooks.systemzero import stored_port
origin = os.environ["SZ_DEMO_ORIGIN"]
with create_session() as s:
    s.query(Connection).filter(Connection.conn_id == "systemzero_default").delete()
    s.add(Connection(conn_id="systemzero_default", conn_type="systemzero", host=origin, port=stored_port(origin),
                     password=os.environ["SZ_DEMO_KEY"], extra=json.dumps({"model": os.environ["SZ_DEMO_MODEL"]})))
"""
    child = {**env, "SZ_DEMO_ORIGIN": origin, "SZ_DEMO_KEY": key, "SZ_DEMO_MODEL": model}
    subprocess.run([sys.executable, "-c", script], env=child, capture_output=True, timeout=120, check=True)


def run_xcoms(env: dict[str, str], dag_id: str) -> dict[str, Any]:
    """The latest run's XComs, read in a child process with the demo's AIRFLOW_HOME.

    :raises RuntimeError: ``env`` points Airflow at a home or a database the demo did not create.
    """
    DemoHome.check(env, "the process that reads the demo's XComs")
    script = f"""
import json
from airflow.models.dagrun import DagRun
from airflow.models.xcom import XComModel
from airflow.utils.session import create_session
with create_session() as s:
    run = s.query(DagRun).filter(DagRun.dag_id == {dag_id!r}).order_by(DagRun.id.desc()).first()
    rows = s.query(XComModel).filter(XComModel.dag_id == {dag_id!r}, XComModel.run_id == run.run_id).all()
    states = {{ti.task_id + ('' if ti.map_index < 0 else f'[{{ti.map_index}}]'): str(ti.state)
              for ti in run.get_task_instances(session=s)}}
    out = {{"state": str(run.state), "tasks": states, "xcom": {{}}}}
    for r in rows:
        name = r.task_id + ('' if r.map_index < 0 else f'[{{r.map_index}}]') + '.' + r.key
        out["xcom"][name] = XComModel.deserialize_value(r)
print(json.dumps(out, default=str))
"""
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def _show(dag_id: str, info: dict[str, Any]) -> None:
    xcom = info["xcom"]
    if dag_id == "systemzero_wait_for_ready":
        decision = xcom.get("wait_until_ready.return_value") or {}
        say(
            f"sensor fired: ready={decision.get('decision')} probability={decision.get('probability')} "
            f"confidence={decision.get('confidence')} at state version {decision.get('state_version')} "
            f"(covered {len(decision.get('covered_event_ids') or [])} event(s), reply {decision.get('reply_id')})"
        )
    elif dag_id == "systemzero_replay_and_branch":
        answers = xcom.get("decide.answers") or {}
        for name, answer in answers.items():
            say(
                f"decide: {name} = {answer.get('decision')!r} (probability {answer.get('probability')}, "
                f"confidence {answer.get('confidence')})"
            )
        say(f"XCom decide.return_value = {xcom.get('decide.return_value')}")
        say(
            f"branch: publish={info['tasks'].get('publish')} quarantine={info['tasks'].get('quarantine')} "
            f"-> {xcom.get('publish.return_value') or xcom.get('quarantine.return_value')}"
        )
    elif dag_id == "systemzero_mapped":
        for index in range(10):
            value = xcom.get(f"triage[{index}].return_value")
            if value is None:
                break
            say(f"triage[{index}] -> {value}")
        say(f"summary: {xcom.get('summarise.return_value')}")
    elif dag_id == "systemzero_ticket_policy":
        for name, value in sorted(xcom.items()):
            if name.endswith(".decision") and isinstance(value, dict):
                say(
                    f"{name.removesuffix('.decision')}: proposed {value.get('proposed')!r} -> "
                    f"{value.get('action')} (decided by {value.get('decided_by')}, probability "
                    f"{value.get('probability')}, confidence {value.get('confidence')})"
                )
        ran = sorted(task for task, state in info["tasks"].items() if state == "success")
        say(f"tasks that ran: {ran}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; returns the exit code."""
    invocation = Invocation.of("airflow_provider_systemzero.demo")
    parser = invocation.parser(__doc__.split("\n\n")[0])
    parser.add_argument(
        "--origin",
        help="a real System Zero API origin (wss://… or https://…); the key comes from "
        "SYSTEMZERO_API_KEY. Default: the embedded emulator",
    )
    parser.add_argument("--model", default=os.environ.get("SYSTEMZERO_MODEL", "sz-demo"), help="model ID")
    parser.add_argument("--dags", nargs="*", default=list(DEMO_DAGS), help="example Dag IDs to run")
    parser.add_argument("--keep-home", action="store_true", help="keep the throwaway AIRFLOW_HOME")
    args = invocation.finish(parser).parse_args(argv)

    started = time.monotonic()
    sealed = DemoHome.create("systemzero-demo-")
    home = sealed.path
    dags = example_dags_folder()
    examples = home / "examples"
    examples.mkdir()
    log_path = home / "demo.log"
    # the key reaches only the process that stores the connection (store_connection)
    env = sealed.environment(
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__DAGS_FOLDER=str(dags),
        SYSTEMZERO_EXAMPLE_DIR=str(examples),
        PYTHONWARNINGS="ignore",
    )
    admin = secrets.token_urlsafe(16)

    def work() -> int:
        with contextlib.ExitStack() as stack:
            if args.origin:
                key = os.environ.get("SYSTEMZERO_API_KEY")
                if not key:
                    say("--origin needs the API key in SYSTEMZERO_API_KEY", step="error")
                    return 2
                origin = args.origin
                say(f"using System Zero at {origin}", step="gateway")
            else:
                key = "demo-" + secrets.token_hex(8)
                origin = stack.enter_context(
                    run_emulator(dags / "emulator_rules.json", key, admin, home / "emulator.log", env=env)
                )
                say(
                    f"emulator listening on {origin} (rules decider, log {home / 'emulator.log'})",
                    step="gateway",
                )
            say(f"AIRFLOW_HOME={home}", step="airflow")
            say_sealed()
            airflow_cli(["db", "migrate"], env, log_path)
            store_connection(env, origin, key, args.model)
            say("metadata DB migrated; connection systemzero_default stored in the DB")
            for dag_id in args.dags:
                before = None if args.origin else _stats(origin, admin)
                say(dag_id, step="dags test")
                t0 = time.monotonic()
                airflow_cli(["dags", "test", dag_id], env, log_path)
                info = run_xcoms(env, dag_id)
                if info["state"] != "success":
                    raise RuntimeError(
                        f"{dag_id} ended {info['state']}: {info['tasks']}; the end of {log_path}:\n"
                        f"{log_tail(log_path)}"
                    )
                say(f"{dag_id}: {info['state']} in {time.monotonic() - t0:.1f} s; tasks {info['tasks']}")
                if before is not None:
                    after = _stats(origin, admin)
                    say(
                        f"gateway: {after['events_accepted'] - before['events_accepted']} state change(s) accepted, "
                        f"{after['decisions_dispatched'] - before['decisions_dispatched']} decision(s) dispatched, "
                        f"{after['decisions_billed'] - before['decisions_billed']} billed, "
                        f"{after['decisions_replayed'] - before['decisions_replayed']} replayed unbilled"
                    )
                _show(dag_id, info)
        say(
            done_message(
                len(args.dags),
                time.monotonic() - started,
                log_path,
                keep_home=args.keep_home,
                invocation=invocation,
            ),
            step="done",
        )
        return 0

    emulator_log = home / "emulator.log"
    return run_in_home(
        home, work, keep_home=args.keep_home, logs=[log_path, emulator_log], quoted=[emulator_log]
    )


if __name__ == "__main__":
    sys.exit(main())
