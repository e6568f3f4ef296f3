"""The support matrix: Airflow 3.1, 3.2 and 3.3 (newest patch of each) × Python 3.11, 3.12 and 3.13.

Two commands, both driven by ``make`` (a third, ``production``, prints :data:`PRODUCTION`):

``lock``
    Airflow's own constraints approach, once per corner: a throwaway venv on that Python installs
    the newest patch of that Airflow minor together with the project, all its extras and the
    production stack (:data:`PRODUCTION`: the FAB auth manager, the Celery executor, the PostgreSQL
    and Redis drivers), unpinned; ``pip freeze`` of the result becomes
    ``constraints/airflow-<minor>-py<python>.txt``, so that one file installs the provider beside
    them. The oldest corner also pins the lowest ``websockets`` the package declares, so that bound
    is tested too.
``run``
    Once per corner: a fresh venv installs the built wheel (never the source tree, never editable)
    with the ``test`` extra and the production stack, pinned by the corner's constraints file
    (``pip check`` must then pass); a copy of ``tests/`` and
    ``example_dags/`` outside the checkout then runs the whole suite against the installed package.
    A summary table (corner, versions, result, time) is printed and written to
    ``.cache/matrix/summary.md``.

Corners are written ``AIRFLOW:PYTHON`` (``3.1:3.11``); ``MATRIX="3.1:3.11 3.3:3.13"`` picks a subset.
Only the standard library is used, so any Python 3.11+ runs this script.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / ".cache"
CONSTRAINTS = REPO / "constraints"
AIRFLOW_MINORS = ("3.1", "3.2", "3.3")
PYTHONS = ("3.11", "3.12", "3.13")
#: The corner that also proves the lower bounds of the package's own dependencies.
OLDEST = ("3.1", "3.11")
#: Lowest releases declared in pyproject.toml, pinned in the oldest corner's lock.
LOWEST_PINS = ("websockets==17.0",)
#: Caps a minor's lock needs because that Airflow release does not cap them itself and breaks with
#: the newest: Airflow 3.2.2's in-process execution API (``dag.test()``) fails with FastAPI 0.137+
#: (its route models no longer build) and with svcs 26 (the API's service registry is never set);
#: Airflow 3.1.8 marks its Fernet by setting an attribute on cryptography's ``MultiFernet``, which
#: cryptography 51 no longer allows (every connection with a password fails to save).
MINOR_PINS = {"3.1": ("cryptography<51",), "3.2": ("fastapi<0.137", "svcs<26")}
#: What production deployments install beside the provider, resolved into every corner's lock and
#: installed with the wheel in every corner's run: the FAB auth manager, the Celery executor, and the
#: PostgreSQL (psycopg2 for the components' sessions, asyncpg for the async engine) and Redis
#: (Celery's broker) drivers.
PRODUCTION = (
    "apache-airflow-providers-fab",
    "apache-airflow-providers-celery",
    # the Celery provider (3.26) imports celery.backends.database.retry, which Celery 5.7 removed:
    # every worker fails at start with 5.7 (the version Airflow's own constraints pin is below it)
    "celery<5.7",
    "psycopg2-binary",
    "asyncpg",
    "redis",
)
LOCK_EXTRAS = "test,docs,release"
SUITE_EXTRAS = "test"
#: What the suite of a corner runs: everything ``make test`` runs (the deployment test is its own target);
#: ``benchmarks`` too, whose figures' definitions have unit tests (it is not part of the wheel).
COPIED = ("tests", "example_dags", "benchmarks", "pyproject.toml")


@dataclass(frozen=True)
class Corner:
    """One Airflow minor on one Python."""

    airflow: str
    python: str

    @classmethod
    def parse(cls, text: str) -> Corner:
        """Read ``AIRFLOW:PYTHON`` (``3.1:3.11``).

        :param text: the corner as written on the command line or in ``MATRIX``.
        """
        match = re.fullmatch(r"(3\.\d+):(3\.\d+)", text.strip())
        if not match or match[1] not in AIRFLOW_MINORS or match[2] not in PYTHONS:
            raise SystemExit(
                f"error: corner {text!r} is not AIRFLOW:PYTHON with AIRFLOW in {AIRFLOW_MINORS} and PYTHON in "
                f'{PYTHONS}; write e.g. MATRIX="3.1:3.11 3.3:3.13"'
            )
        return cls(match[1], match[2])

    @property
    def name(self) -> str:
        return f"airflow-{self.airflow}-py{self.python}"

    @property
    def constraints(self) -> Path:
        return CONSTRAINTS / f"{self.name}.txt"

    @property
    def interpreter(self) -> str:
        """This corner's Python: ``PYTHON3_12``-style variable, ``python3.12`` on ``PATH``, or a pyenv build."""
        override = os.environ.get(f"PYTHON{self.python.replace('.', '_')}")
        candidates = [override] if override else []
        candidates.append(shutil.which(f"python{self.python}"))
        root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
        candidates += [
            str(p) for p in sorted((root / "versions").glob(f"{self.python}.*/bin/python{self.python}"))
        ]
        for candidate in filter(None, candidates):
            # A pyenv shim exists on PATH even when that version is not selected, and then fails.
            probe = subprocess.run(
                [candidate, "-c", "import sys; print(sys.version_info[:2])"],
                capture_output=True,
                text=True,
                check=False,
            )
            if probe.returncode == 0 and probe.stdout.strip() == str(tuple(map(int, self.python.split(".")))):
                return candidate
        raise SystemExit(
            f"error: no working python{self.python} found (PATH, pyenv); install it or set "
            f"PYTHON{self.python.replace('.', '_')}=/path/to/python{self.python}"
        )

    def __str__(self) -> str:
        return f"{self.airflow}:{self.python}"


def all_corners() -> list[Corner]:
    """Every corner, oldest first."""
    return [Corner(a, p) for a in AIRFLOW_MINORS for p in PYTHONS]


def _run(
    command: list[str], *, log: Path | None = None, cwd: Path | None = None, env: dict[str, str] | None = None
) -> None:
    print("    $", " ".join(command), flush=True)
    if log is None:
        subprocess.run(command, check=True, cwd=cwd, env=env)
        return
    with log.open("a") as out:
        result = subprocess.run(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
    if result.returncode:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        raise RuntimeError(f"{command[0]} exited {result.returncode}; last lines of {log}:\n{tail}")


def _venv(corner: Corner, path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    _run([corner.interpreter, "-m", "venv", str(path)])
    python = path / "bin" / "python"
    _pip(python, "--upgrade", "pip")
    return python


def _pip(python: Path, *args: str, log: Path | None = None) -> None:
    _run([str(python), "-m", "pip", "install", "--quiet", *args], log=log)


def lock(corner: Corner) -> None:
    """Resolve one corner in a throwaway venv and write its constraints file.

    :param corner: the Airflow minor and Python to resolve.
    """
    venv = CACHE / "lock" / corner.name
    python = _venv(corner, venv)
    pins = list(LOWEST_PINS) if (corner.airflow, corner.python) == OLDEST else []
    pins += MINOR_PINS.get(corner.airflow, ())
    _pip(python, f"apache-airflow~={corner.airflow}.0", *pins, *PRODUCTION, "-e", f"{REPO}[{LOCK_EXTRAS}]")
    frozen = subprocess.run(
        [str(python), "-m", "pip", "freeze", "--exclude-editable"], check=True, capture_output=True, text=True
    ).stdout
    version = subprocess.run(
        [str(python), "-c", "import platform; print(platform.python_version())"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    CONSTRAINTS.mkdir(exist_ok=True)
    header = [
        f"# Constraints of the Airflow {corner.airflow} x Python {corner.python} corner of the support matrix.",
        f"# Resolved by 'make lock-matrix' on Python {version}: the newest Airflow {corner.airflow}.x with the",
        f"# project and its [{LOCK_EXTRAS}] extras and the production stack ({', '.join(PRODUCTION)}),",
        "# unpinned, in a throwaway venv, then 'pip freeze'.",
    ]
    if pins:
        header.append(f"# Pinned or capped for this corner (see scripts/matrix.py): {', '.join(pins)}.")
    corner.constraints.write_text("\n".join(header) + "\n" + frozen)
    shutil.rmtree(venv, ignore_errors=True)
    print(f"==> wrote {corner.constraints.relative_to(REPO)}", flush=True)


def _pinned(corner: Corner, package: str) -> str:
    for line in corner.constraints.read_text().splitlines():
        name, _, version = line.partition("==")
        if name.strip().lower() == package:
            return version.strip()
    return "?"


def _wheel() -> Path:
    wheels = sorted((REPO / "dist").glob("airflow_provider_systemzero-*.whl"))
    if len(wheels) != 1:
        raise SystemExit(
            f"error: expected one built wheel in dist/, found {len(wheels)}; run 'make dist' first"
        )
    return wheels[0]


def run(corner: Corner, pytest_args: list[str], workers: int = 0) -> tuple[bool, float, str]:
    """Install the wheel in a fresh venv for one corner and run the suite from a copy of the tests.

    :param corner: the Airflow minor and Python.
    :param pytest_args: extra pytest arguments (``PYTEST_ARGS``).
    :param workers: pytest-xdist worker processes, each test file whole on one worker (``0``: none).
    :returns: passed, seconds, pytest's closing line.
    """
    if not corner.constraints.is_file():
        raise RuntimeError(
            f"{corner.constraints.relative_to(REPO)} is missing; run 'make lock-matrix MATRIX={corner}'"
        )
    started = time.monotonic()
    root = CACHE / "matrix" / corner.name
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    log = root / "run.log"
    python = _venv(corner, root / "venv")
    _pip(python, "-c", str(corner.constraints), f"{_wheel()}[{SUITE_EXTRAS}]", *PRODUCTION, log=log)
    _run([str(python), "-m", "pip", "check"], log=log)
    tree = root / "tree"
    tree.mkdir()
    for name in COPIED:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, tree / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, tree / name)
    env = {
        **os.environ,
        "SYSTEMZERO_INSTALLED_WHEEL": str(_wheel().name),
        "SYSTEMZERO_CONSTRAINTS": str(corner.constraints),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    env.pop("PYTHONPATH", None)
    # A corner installs its own Airflow into a cold venv; its first Dag runs are slower than in .venv.
    command = [
        str(python),
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--durations=15",
        "--timeout=300",
        *([f"--numprocesses={workers}", "--dist=loadfile"] if workers else []),
        *pytest_args,
    ]
    print("    $", " ".join(command), f"(in {tree.relative_to(REPO)})", flush=True)
    with log.open("a") as out:
        result = subprocess.run(command, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    closing = next(
        (line.strip("= ") for line in reversed(lines) if re.search(r"\d+ (passed|failed|error)", line)),
        lines[-1] if lines else "no output",
    )
    if result.returncode:
        print("\n".join(lines[-60:]), flush=True)
    return result.returncode == 0, time.monotonic() - started, closing


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line of :func:`main`.

    :param argv: the arguments after the script's name (``None``: ``sys.argv``).
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("lock", "run", "production"))
    parser.add_argument("corners", nargs="*", help="AIRFLOW:PYTHON corners (default: all nine)")
    parser.add_argument("--pytest-args", default="", help="extra pytest arguments, one string")
    parser.add_argument("--jobs", type=int, default=1, help="corners run side by side (run only; default 1)")
    parser.add_argument(
        "--workers",
        type=int,
        default=0,
        help="run each corner's suite in this many pytest-xdist workers, a test file per worker (0: one process)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python scripts/matrix.py {lock,run} [CORNER ...]``."""
    args = parse_args(argv)
    if args.command == "production":  # the list, for 'make lock' and the deployment test
        print(" ".join(PRODUCTION))
        return 0
    corners = [Corner.parse(c) for c in args.corners] or all_corners()
    if args.command == "lock":
        for corner in corners:
            print(f"==> lock {corner}", flush=True)
            lock(corner)
        return 0

    _wheel()
    started = time.monotonic()

    def one(corner: Corner) -> tuple[Corner, bool, float, str]:
        print(
            f"==> corner {corner}: Airflow {_pinned(corner, 'apache-airflow')} on Python {corner.python}",
            flush=True,
        )
        try:
            passed, seconds, closing = run(corner, args.pytest_args.split(), args.workers)
        except (RuntimeError, subprocess.CalledProcessError) as exc:
            passed, seconds, closing = False, 0.0, f"install failed: {exc}"
        print(
            f"==> corner {corner}: {'passed' if passed else 'FAILED'} in {seconds:.0f} s: {closing}",
            flush=True,
        )
        return corner, passed, seconds, closing

    # Corners share nothing but the wheel (each has its own venv, tree and log): run side by side,
    # they overlap one corner's waits (installs, Dag runs, timers) with the other's work.
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        rows = list(pool.map(one, corners))
    total = time.monotonic() - started
    table = [
        f"Matrix run: {len(rows)} corner(s), {total / 60:.1f} min in all, {os.cpu_count()} CPU(s), "
        f"{platform.machine()}.",
        "",
        "| Airflow | Python | websockets | result | time | pytest |",
        "|---|---|---|---|---|---|",
    ]
    for corner, passed, seconds, closing in rows:
        table.append(
            f"| {_pinned(corner, 'apache-airflow')} | {corner.python} | {_pinned(corner, 'websockets')} | "
            f"{'pass' if passed else 'FAIL'} | {seconds / 60:.1f} min | {closing.splitlines()[0]} |"
        )
    summary = "\n".join(table)
    (CACHE / "matrix").mkdir(parents=True, exist_ok=True)
    (CACHE / "matrix" / "summary.md").write_text(summary + "\n")
    print(summary, flush=True)
    return 0 if all(passed for _, passed, _, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
