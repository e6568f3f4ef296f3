"""The release as a user gets it: metadata, the packages in the wheel, and the demo.

``make test-matrix`` runs this file in a fresh venv per corner where the built wheel is installed
(not editable) and the tests run from a copy outside the checkout; there the demo test proves
that a Dag runs against the emulator from the installed package alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import tomllib
from datetime import datetime, timedelta
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

import airflow_provider_systemzero
from airflow_provider_systemzero.demo import (
    MAKE_COMMAND_ENV,
    Invocation,
    done_message,
    example_dags_folder,
    log_tail,
)
from tests.helpers import REPO, audited_python, network_peers

DIST = metadata.distribution("airflow-provider-systemzero")
PACKAGE_DIR = Path(airflow_provider_systemzero.__file__).resolve().parent
#: Set by ``make test-matrix`` to the wheel's file name in each corner's venv.
INSTALLED_WHEEL = os.environ.get("SYSTEMZERO_INSTALLED_WHEEL")
SUPPORTED_PYTHONS = ("3.11", "3.12", "3.13")


def _editable() -> bool:
    direct_url = DIST.read_text("direct_url.json")
    return bool(direct_url and json.loads(direct_url).get("dir_info", {}).get("editable"))


@pytest.mark.skipif(
    INSTALLED_WHEEL is None or not os.environ.get("SYSTEMZERO_CONSTRAINTS"),
    reason="the support matrix installs the wheel with the production stack (make test-matrix)",
)
def test_the_wheel_installs_beside_the_production_stack_of_its_constraints() -> None:
    """The corner's constraints file resolves the provider with the FAB auth manager, the Celery
    executor and the PostgreSQL and Redis drivers, and the corner installed them with the wheel:
    each is there at the version the file pins, and imports as a deployment imports it."""
    pins = {}
    for line in Path(os.environ["SYSTEMZERO_CONSTRAINTS"]).read_text(encoding="utf-8").splitlines():
        name, _, version = line.partition("==")
        if version:
            pins[re.sub(r"[-_.]+", "-", name.strip().lower())] = version.strip()
    for dist in (
        "apache-airflow-providers-fab",
        "apache-airflow-providers-celery",
        "celery",
        "psycopg2-binary",
        "asyncpg",
        "redis",
        "python-dateutil",
    ):
        assert metadata.version(dist) == pins[dist], dist
    assert int(metadata.version("python-dateutil").split(".")[0]) < 3  # Flask-AppBuilder's bound
    import asyncpg  # noqa: F401
    import psycopg2  # noqa: F401
    import redis  # noqa: F401
    from airflow.providers.celery.executors import celery_executor  # a Celery worker's first import
    from airflow.providers.fab.auth_manager.fab_auth_manager import FabAuthManager

    assert celery_executor.app.main and FabAuthManager.__name__


def test_license_is_apache_2_with_its_spdx_expression() -> None:
    assert DIST.metadata["License-Expression"] == "Apache-2.0"
    (license_file,) = [f for f in DIST.files or [] if f.name == "LICENSE"]
    text = Path(license_file.locate()).read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text


def test_classifiers_name_every_supported_python() -> None:
    classifiers = set(DIST.metadata.get_all("Classifier") or [])
    for version in SUPPORTED_PYTHONS:
        assert f"Programming Language :: Python :: {version}" in classifiers
    assert {"Framework :: Apache Airflow", "Framework :: Apache Airflow :: Provider"} <= classifiers
    requires = DIST.metadata.get_all("Requires-Dist") or []
    (airflow,) = [r for r in requires if r.startswith("apache-airflow")]
    assert ">=3.1.0" in airflow and "<4" in airflow


def _long_description() -> str:
    """The long description as the index shows it: the installed metadata's body. An editable
    install's ``egg-info`` in the checkout (found first on ``sys.path``) carries no body; the file
    ``pyproject.toml`` declares is what the wheel's metadata holds then."""
    # The body after the headers, read from the file itself: in a long test session on
    # Airflow 3.1, ``DIST.metadata.get_payload()`` was seen to return "" for the same file.
    _, _, payload = (DIST.read_text("METADATA") or DIST.read_text("PKG-INFO") or "").partition("\n\n")
    if payload or INSTALLED_WHEEL:
        return payload
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    return (REPO / pyproject["project"]["readme"]["file"]).read_text(encoding="utf-8")


def test_long_description_reads_well_on_an_index_page() -> None:
    description = _long_description()
    assert description.startswith("# airflow-provider-systemzero")
    links = re.findall(r"\]\(([^)]+)\)", description)
    assert links and all(link.startswith("https://") for link in links), links
    assert "make " not in description and ".venv" not in description


def test_every_package_of_the_source_tree_is_listed_for_the_wheel() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    listed = set(pyproject["tool"]["setuptools"]["packages"])
    installed = {
        ".".join(path.parent.relative_to(PACKAGE_DIR.parent).parts)
        for path in PACKAGE_DIR.rglob("__init__.py")
        if "__pycache__" not in path.parts
    }
    assert installed <= listed, f"add {sorted(installed - listed)} to [tool.setuptools] packages"
    assert (example_dags_folder() / "emulator_rules.json").is_file()


def test_the_installed_wheel_is_what_runs() -> None:
    if not INSTALLED_WHEEL:
        pytest.skip("runs in make test-matrix, where the built wheel is installed into a fresh venv")
    assert not _editable(), "the matrix must test the built wheel, not an editable install"
    assert "site-packages" in PACKAGE_DIR.parts
    assert example_dags_folder() == PACKAGE_DIR / "example_dags"
    assert DIST.version in INSTALLED_WHEEL


def _demo(
    tmp_path: Path,
    *args: str,
    module: str = "demo",
    deployment: Deployment | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a demo from the installed package, in the test's environment or, with ``deployment``,
    in that deployment's (by its Python, which writes down every address a process connects to)."""
    # -I: the checkout is neither on sys.path nor the working directory; only the installed package runs.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "SYSTEMZERO_", "PYTHON"))}
    if deployment is not None:
        env.update(deployment.env)
    python = sys.executable if deployment is None else str(deployment.python)
    return subprocess.run(
        [python, "-I", "-m", f"airflow_provider_systemzero.{module}", *args],
        cwd=tmp_path,
        env={**env, "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


#: A deployment's real-looking gateway and key (nothing listens there; a demo must not try).
LIVE_ORIGIN = "wss://systemzero.example.com"
LIVE_KEY = "sz-live-4f8a2c9e1b7d6a3f5e0c"


@dataclasses.dataclass
class Deployment:
    """An environment as a deployment sets it (the official image, Helm, compose): its own
    ``AIRFLOW_HOME``, its metadata database by URL (a migrated one, with a ``systemzero_default``
    connection to a real gateway), a connection, a variable and this provider's settings by
    environment, and a proxy. A demo run there must leave all of it as it was and open no socket
    beyond loopback.

    :param env: the variables.
    :param python: the interpreter to run the demo with (:func:`~tests.helpers.audited_python`).
    :param connections: where it writes down every address its processes connect to.
    :param home: the deployment's ``AIRFLOW_HOME`` (its database inside).
    """

    env: dict[str, str]
    python: Path
    connections: Path
    home: Path

    def snapshot(self) -> dict[str, str]:
        """Every file of the deployment's home, by its content's hash."""
        return {
            str(path.relative_to(self.home)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(self.home.rglob("*"))
            if path.is_file()
        }

    def systemzero_default(self) -> tuple[Any, ...]:
        with contextlib.closing(sqlite3.connect(self.home / "airflow.db")) as db:
            return db.execute(
                "SELECT conn_type, host, password, extra FROM connection WHERE conn_id = 'systemzero_default'"
            ).fetchone()


@pytest.fixture
def deployment(tmp_path: Path, airflow_db: None, airflow_home: Path) -> Deployment:
    home = tmp_path / "deployment"
    home.mkdir()
    database = home / "airflow.db"
    with (
        contextlib.closing(sqlite3.connect(airflow_home / "airflow.db")) as source,
        contextlib.closing(sqlite3.connect(database)) as copy,
    ):
        source.backup(copy)  # a migrated metadata database, as a deployment's is
        copy.execute("DELETE FROM connection WHERE conn_id = 'systemzero_default'")
        copy.execute(
            "INSERT INTO connection (conn_id, conn_type, host, password, extra, is_encrypted, "
            "is_extra_encrypted) VALUES ('systemzero_default', 'systemzero', ?, ?, ?, 0, 0)",
            (LIVE_ORIGIN, LIVE_KEY, json.dumps({"model": "sz-large"})),
        )
        copy.commit()
    url = f"sqlite:///{database}"
    (home / "airflow.cfg").write_text(f"[database]\nsql_alchemy_conn = {url}\n", encoding="utf-8")
    python, connections = audited_python(tmp_path)
    connection = {"conn_type": "systemzero", "host": LIVE_ORIGIN, "password": LIVE_KEY}
    env = {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": url,
        "AIRFLOW__CORE__LOAD_EXAMPLES": "True",
        "AIRFLOW_CONN_SYSTEMZERO_DEFAULT": json.dumps(connection),
        "AIRFLOW_VAR_ENVIRONMENT": "production",
        "SYSTEMZERO_ORIGIN": LIVE_ORIGIN,
        "SYSTEMZERO_API_KEY": LIVE_KEY,
        # a proxy nothing may go through: the demos talk to loopback only
        "HTTP_PROXY": "http://203.0.113.10:3128",
        "HTTPS_PROXY": "http://203.0.113.10:3128",
        "ALL_PROXY": "http://203.0.113.10:3128",
    }
    return Deployment(env, python, connections, home)


def _left_alone(deployment: Deployment, before: dict[str, str], out: str) -> None:
    """The deployment's home and database as they were, its gateway and key unused, and no socket
    opened beyond loopback by any process of the demo."""
    assert deployment.snapshot() == before, "the deployment's home or database changed"
    assert deployment.systemzero_default() == ("systemzero", LIVE_ORIGIN, LIVE_KEY, '{"model": "sz-large"}')
    assert network_peers(deployment.connections) == []
    assert deployment.connections.read_text(), "the audit hook wrote nothing: it did not run"
    assert LIVE_KEY not in out and "systemzero.example.com" not in out
    (sealed,) = [line for line in out.splitlines() if "not passed on from your environment" in line]
    for name in ("AIRFLOW_CONN_SYSTEMZERO_DEFAULT", "AIRFLOW_HOME", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"):
        assert name in sealed, sealed


def test_the_demo_runs_a_dag_against_the_emulator_from_the_installed_package(
    tmp_path: Path, deployment: Deployment
) -> None:
    """In a deployment's environment (issue 54 items 3 and 4): its database, its connection and
    its gateway untouched, no socket beyond loopback."""
    before = deployment.snapshot()
    result = _demo(tmp_path, "--dags", "systemzero_replay_and_branch", deployment=deployment)
    assert result.returncode == 0, result.stdout + result.stderr
    _left_alone(deployment, before, result.stdout + result.stderr)
    assert "systemzero_replay_and_branch: success" in result.stdout
    assert "decide: " in result.stdout and "state change(s) accepted" in result.stdout
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("systemzero-demo-")], "home not removed"
    (done,) = [line for line in result.stdout.splitlines() if "Dags succeeded" in line]
    assert "demo.log" not in done, "the last line points at a removed log"
    # the hint names the command that was run: there is no Makefile beside an installed package
    assert "('python -m airflow_provider_systemzero.demo --keep-home' keeps them)" in done
    assert "make" not in result.stdout


def test_the_review_demo_answers_a_review_through_the_rest_api_from_the_installed_package(
    tmp_path: Path, deployment: Deployment
) -> None:
    """On every supported Airflow (3.1 and 3.2 included, where the review waits in HITLTrigger run
    by ``dags test``): the request is shown, a script's PATCH answers it, the record says so. In a
    deployment's environment (issue 54 items 3 and 4): its database, its connection and its gateway
    untouched, no socket beyond loopback."""
    before = deployment.snapshot()
    result = _demo(tmp_path, "--answer", "engineering", module="review_demo", deployment=deployment)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    _left_alone(deployment, before, out + result.stderr)
    assert "==> review System Zero is unsure: team" in out and "**Why you are asked:** confidence 0.6" in out
    assert re.search(r"\$ TOKEN=\$\(curl -s http://127\.0\.0\.1:\d+/auth/token \| python3 -c ", out)
    # the PATCH as printed, pasted into a shell: the token is put into its header
    (patch,) = [line.split("$ ", 1)[1] for line in out.splitlines() if "curl -s -X PATCH" in line]
    shell = subprocess.run(
        ["bash", "-c", "printf '%s\\n' " + patch.removeprefix("curl ")],
        env={"PATH": os.environ["PATH"], "TOKEN": "t0ken"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert "Authorization: Bearer t0ken" in shell.stdout.splitlines(), shell.stdout
    # the run ID URL-encoded in the path a script PATCHes
    assert re.search(
        r"/dagRuns/manual__\d{4}-\d\d-\d\dT\d\d%3A\d\d%3A[\d.]+%2B00%3A00/taskInstances/route/-1/", out
    )
    assert "route: proposed 'support', decision 'engineering', decided by human" in out
    decided, answered = re.search(r"System Zero decided at (\S+); the person answered at (\S+)", out).groups()  # type: ignore[union-attr]
    assert decided.endswith("Z") and answered.endswith("Z")
    assert datetime.fromisoformat(decided) <= datetime.fromisoformat(answered) + timedelta(seconds=1)
    assert "'python -m airflow_provider_systemzero.review_demo --keep-home' keeps it" in out
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("systemzero-review-demo-")], (
        "home not removed"
    )


def test_the_demo_names_its_log_only_when_the_log_is_kept() -> None:
    log = Path("/tmp/systemzero-demo-x/demo.log")
    python = Invocation.of("airflow_provider_systemzero.demo")
    kept = done_message(4, 67.84, log, keep_home=True, invocation=python)
    assert kept == f"all 4 Dags succeeded in 67.8 s (full log: {log})"
    removed = done_message(4, 67.84, log, keep_home=False, invocation=python)
    assert removed.startswith("all 4 Dags succeeded in 67.8 s")
    assert str(log) not in removed
    assert removed.endswith("('python -m airflow_provider_systemzero.demo --keep-home' keeps them)")
    made = done_message(4, 67.84, log, keep_home=False, invocation=Invocation("make demo", make=True))
    assert made.endswith("('make demo DEMO_ARGS=--keep-home' keeps them)")


def test_the_demos_usage_names_the_command_that_was_run(monkeypatch: pytest.MonkeyPatch) -> None:
    result = subprocess.run(
        [sys.executable, "-I", "-m", "airflow_provider_systemzero.demo", "--help"],
        env={k: v for k, v in os.environ.items() if not k.startswith("SYSTEMZERO_")},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert result.stdout.startswith(
        "usage: python -m airflow_provider_systemzero.demo [-h] [--origin ORIGIN]"
    )
    assert "make" not in result.stdout
    # from the Makefile, the options go in DEMO_ARGS
    monkeypatch.setenv(MAKE_COMMAND_ENV, "make demo")
    invocation = Invocation.of("airflow_provider_systemzero.demo")
    parser = invocation.parser("the demo")
    parser.add_argument("--keep-home", action="store_true")
    assert invocation.finish(parser).format_usage() == 'usage: make demo DEMO_ARGS="[-h] [--keep-home]"\n'
    assert invocation.with_options("--origin wss://h --keep-home") == (
        'make demo DEMO_ARGS="--origin wss://h --keep-home"'
    )


def test_the_makefile_tells_the_demos_which_command_ran() -> None:
    if not (REPO / "Makefile").is_file() or not shutil.which("make"):
        pytest.skip("needs the checkout's Makefile (a matrix corner runs a copy of tests/ alone)")
    for target, module in (("demo", "demo"), ("review-demo", "review_demo")):
        dry_run = subprocess.run(
            ["make", "-n", target], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout
        (line,) = [line for line in dry_run.splitlines() if f"airflow_provider_systemzero.{module}" in line]
        assert line.startswith(f'{MAKE_COMMAND_ENV}="make {target}" ')


def test_a_failing_demo_keeps_its_home_and_quotes_the_log(tmp_path: Path) -> None:
    result = _demo(tmp_path, "--dags", "no_such_dag")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "'airflow dags test no_such_dag' exited" in result.stdout
    assert "    | " in result.stdout, "no log lines quoted"
    assert "no_such_dag" in result.stdout.split("exited", 1)[1]
    (home,) = [p for p in tmp_path.iterdir() if p.name.startswith("systemzero-demo-")]
    assert f"kept {home}" in result.stdout
    assert f"the end of {home / 'emulator.log'}:" in result.stdout, "the emulator's log is not quoted"
    assert (home / "demo.log").is_file() and (home / "emulator.log").is_file()


def test_log_tail_quotes_the_last_lines(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("".join(f"line {i}\n" for i in range(50)) + "\n\n")
    assert log_tail(log, 3).splitlines() == ["    | line 47", "    | line 48", "    | line 49"]
    log.write_text("")
    assert log_tail(log) == "    (empty)"
    assert "cannot read" in log_tail(tmp_path / "missing.log")


def test_make_test_matrix_hands_pytest_arguments_that_start_with_a_dash_to_the_corners() -> None:
    if not (REPO / "Makefile").is_file() or not shutil.which("make"):
        pytest.skip("needs the checkout's Makefile (a matrix corner runs a copy of tests/ alone)")
    dry_run = subprocess.run(
        ["make", "-n", "test-matrix", "MATRIX=3.1:3.11", "MATRIX_WORKERS=2", "PYTEST_ARGS=-rfEs"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (line,) = [line for line in dry_run.splitlines() if "scripts/matrix.py run" in line]
    argv = shlex.split(line)
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import matrix
    finally:
        sys.path.remove(str(REPO / "scripts"))
    args = matrix.parse_args(argv[argv.index("scripts/matrix.py") + 1 :])
    assert (args.corners, args.workers, args.pytest_args) == (["3.1:3.11"], 2, "-rfEs")


def test_ci_runs_the_oldest_and_the_newest_corner_of_the_matrix() -> None:
    ci = REPO / ".ci" / "run"
    if not ci.is_file():
        pytest.skip("needs the checkout's .ci/run (a matrix corner runs a copy of tests/ alone)")
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import matrix
    finally:
        sys.path.remove(str(REPO / "scripts"))
    runs = [
        shlex.split(line)
        for line in ci.read_text().splitlines()
        if line.strip().startswith("make test-matrix")
    ]
    (run,) = runs
    corners = {matrix.Corner.parse(c) for arg in run if arg.startswith("MATRIX=") for c in arg[7:].split()}
    oldest = matrix.Corner(*matrix.OLDEST)
    newest = matrix.Corner(matrix.AIRFLOW_MINORS[-1], matrix.PYTHONS[-1])
    assert corners == {oldest, newest}, corners


def test_the_readme_and_the_quickstart_install_with_the_repositorys_constraints() -> None:
    """Both give the one install command, and its constraints file exists for the Airflow and the
    Python it runs with (here: the suite's own)."""
    documents = [REPO / "README.md", REPO / "docs" / "quickstart.md"]
    if not all(d.is_file() for d in documents):
        pytest.skip("needs the checkout's README and docs (a matrix corner runs a copy of tests/ alone)")
    for document in documents:
        text = " ".join(document.read_text(encoding="utf-8").split())
        assert (
            "Install with `constraints/airflow-<minor>-py<ver>.txt` from this repository, or Airflow's own constraints where you can reach them"
            in text
        ), document
        (block,) = [b for b in text.split("```bash")[1:] if "pip install dist/" in b.split("```")[0]]
        command = block.split("```")[0]
        assert '-c "constraints/airflow-${AIRFLOW_MINOR}-py${PYTHON_MINOR}.txt"' in command, document
        # the lines that pick the file, run with this interpreter
        script = "\n".join(
            line.replace("$(python ", f"$({shlex.quote(sys.executable)} ")
            for line in document.read_text(encoding="utf-8").splitlines()
            if line.startswith(("AIRFLOW_MINOR=", "PYTHON_MINOR="))
        )
        picked = subprocess.run(
            [
                "bash",
                "-c",
                f'{script}\necho "constraints/airflow-${{AIRFLOW_MINOR}}-py${{PYTHON_MINOR}}.txt"',
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert (REPO / picked).is_file(), picked


def test_the_demo_hands_a_random_admin_token_to_the_emulator_as_one_argument() -> None:
    # a token_urlsafe token begins with "-" one time in 64; as a separate argument argparse read it
    # as an option and the emulator refused to start
    from airflow_provider_systemzero.demo import _emulator_command
    from airflow_provider_systemzero.emulator.cli import build_parser

    command = _emulator_command(Path("rules.json"), "demo-key", "-Xy_token")
    args = build_parser().parse_args(command[3:])
    assert args.admin_token == "-Xy_token"


def test_the_demos_children_keep_only_what_a_process_needs_of_the_callers_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 54 items 3 and 4: every AIRFLOW_*, AIRFLOW__*, AIRFLOW_CONN_*, AIRFLOW_VAR_* and
    SYSTEMZERO_* variable of the caller's is dropped; PATH, the locale and the temporary directory
    are kept."""
    from airflow_provider_systemzero.demo import DemoHome

    for name, value in {
        "AIRFLOW_HOME": "/opt/airflow",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "postgresql://airflow:pw@db/airflow",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_CMD": "cat /run/secrets/db",
        "AIRFLOW_CONN_SYSTEMZERO_DEFAULT": json.dumps({"conn_type": "systemzero", "host": LIVE_ORIGIN}),
        "AIRFLOW_VAR_ENVIRONMENT": "production",
        "AIRFLOW_CONFIG": "/opt/airflow/airflow.cfg",
        "SYSTEMZERO_ORIGIN": LIVE_ORIGIN,
        "SYSTEMZERO_API_KEY": LIVE_KEY,
        "HTTPS_PROXY": "http://203.0.113.10:3128",
        "LC_ALL": "C.UTF-8",
        "TMPDIR": str(tmp_path),
    }.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "home").mkdir()
    home = DemoHome(tmp_path / "home")
    env = home.environment(AIRFLOW__CORE__LOAD_EXAMPLES="False", SYSTEMZERO_EXAMPLE_DIR="/x")
    ours = {name for name in env if name.startswith(("AIRFLOW", "SYSTEMZERO_"))}
    assert ours == {
        "AIRFLOW_HOME",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
        "AIRFLOW__CORE__LOAD_EXAMPLES",
        "SYSTEMZERO_EXAMPLE_DIR",
    }
    assert env["AIRFLOW_HOME"] == str(home.path)
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == f"sqlite:///{home.path / 'airflow.db'}"
    assert (env["PATH"], env["LC_ALL"], env["TMPDIR"]) == (os.environ["PATH"], "C.UTF-8", str(tmp_path))
    assert "HTTPS_PROXY" not in env and "HOME" not in env


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("AIRFLOW_HOME", "/opt/airflow"),
        ("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "postgresql://airflow:pw-123@db/airflow"),
        ("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_CMD", "cat /run/secrets/pw-123"),
        ("AIRFLOW__CORE__SQL_ALCHEMY_CONN", "postgresql://airflow:pw-123@db/airflow"),
        ("AIRFLOW_CONFIG", "/opt/airflow/pw-123.cfg"),
        ("AIRFLOW_CONN_SYSTEMZERO_DEFAULT", json.dumps({"host": LIVE_ORIGIN, "password": "pw-123"})),
        ("AIRFLOW_VAR_TOKEN", "pw-123"),
        ("AIRFLOW__SECRETS__BACKEND", "pw-123"),
        ("SYSTEMZERO_API_KEY", "pw-123"),
    ],
)
def test_a_demo_refuses_to_start_airflow_where_it_did_not_create_the_home_or_the_database(
    tmp_path: Path, name: str, value: str
) -> None:
    """Asked to run Airflow with a home, a database, a configuration, a connection or a key it did
    not create, a demo's step refuses before it starts anything, naming the variable (never its
    value)."""
    from airflow_provider_systemzero.demo import DemoHome, airflow_cli, run_xcoms, store_connection

    (tmp_path / "home").mkdir()
    env = {**DemoHome(tmp_path / "home").environment(), name: value}
    log = tmp_path / "demo.log"
    for step in (
        lambda: airflow_cli(["db", "migrate"], env, log),
        lambda: store_connection(env, "ws://127.0.0.1:1", "demo-key", "sz-demo"),
        lambda: run_xcoms(env, "systemzero_mapped"),
    ):
        with pytest.raises(RuntimeError, match=f"refusing to start .* {name}") as refused:
            step()
        assert "pw-123" not in str(refused.value)
    assert not log.exists(), "a step ran"
