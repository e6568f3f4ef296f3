"""The Autobahn|Testsuite fuzzing server, and the virtualenvs the conformance run needs.

* :func:`find_python27` — the Python 2.7 the fuzzing server runs on (``autobahntestsuite`` 0.8.2
  runs on nothing newer): ``$PYTHON27``, ``python2.7`` on ``PATH``, or one pyenv installed;
* :func:`fuzzing_server_env` — a virtualenv of its own under ``.cache/conformance`` with the
  releases of ``requirements-py2.7.txt`` (made once; again when that file changes);
* :func:`websockets_env` — a virtualenv holding one websockets release and nothing else, in which
  :mod:`tests.conformance.echo` runs with the repository on ``PYTHONPATH``;
* :class:`FuzzingServer` — ``wstest -m fuzzingserver`` on a free loopback port, until stopped;
* :func:`results` — what its report says of each case, per agent.

Everything is installed with pip from the package index, as a person would, through
:func:`tests.helpers.deployment.system.run_command`: a failure names the command and shows its output.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.helpers.deployment.system import run_command

__all__ = [
    "CASES",
    "FuzzingServer",
    "Outcome",
    "find_python27",
    "fuzzing_server_env",
    "results",
    "websockets_env",
]

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
HERE = REPO / "tests" / "conformance"
CACHE = REPO / ".cache" / "conformance"
REQUIREMENTS = HERE / "requirements-py2.7.txt"
#: The cases run: framing, pings and pongs, reserved bits and opcodes, fragmentation, UTF-8 and
#: the close handshake (1–7), auto-fragmentation (10), and the 1,000-message round trips of text
#: (9.7) and binary (9.8) messages whose durations the summary compares. 12 and 13 need
#: compression, which a stream never negotiates.
CASES = ["1.*", "2.*", "3.*", "4.*", "5.*", "6.*", "7.*", "9.7.*", "9.8.*", "10.*"]
#: Seconds the fuzzing server may take to listen once started (Twisted's start-up on a loaded
#: machine takes a few).
START_TIMEOUT = 60.0


def find_python27() -> Path | None:
    """The Python 2.7 interpreter to run the fuzzing server with, or ``None`` when there is none."""
    candidates: list[str] = []
    if os.environ.get("PYTHON27"):
        candidates.append(os.environ["PYTHON27"])
    on_path = shutil.which("python2.7")
    if on_path:
        candidates.append(on_path)
    roots = [os.environ.get("PYENV_ROOT", ""), str(Path.home() / ".pyenv")]
    for root in filter(None, roots):
        candidates.extend(sorted(glob.glob(f"{root}/versions/2.7*/bin/python2.7"), reverse=True))
    for candidate in candidates:
        try:
            found = subprocess.run(
                [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        except OSError:
            continue
        if found.returncode == 0 and found.stdout.strip() == "2.7":
            return Path(candidate)
    return None


def _stamped(directory: Path, stamp: str) -> bool:
    marker = directory / ".installed"
    return marker.is_file() and marker.read_text() == stamp


def fuzzing_server_env(python27: Path) -> Path:
    """The ``wstest`` script of a virtualenv holding the fuzzing server (made when missing).

    :param python27: the Python 2.7 interpreter (:func:`find_python27`).
    """
    pins = REQUIREMENTS.read_text()
    stamp = hashlib.sha256(f"{python27}\n{pins}".encode()).hexdigest()
    env = CACHE / "autobahn-py2.7"
    wstest = env / "bin" / "wstest"
    if _stamped(env, stamp) and wstest.exists():
        return wstest
    shutil.rmtree(env, ignore_errors=True)
    tool = CACHE / "virtualenv"
    virtualenv = next(line[2:] for line in pins.splitlines() if line.startswith("# virtualenv=="))
    if not (tool / "virtualenv").is_dir():
        run_command([str(python27), "-m", "pip", "install", "--quiet", "--target", str(tool), virtualenv])
    run_command(
        [str(python27), "-m", "virtualenv", "--quiet", str(env)], env={**os.environ, "PYTHONPATH": str(tool)}
    )
    run_command([str(env / "bin" / "python"), "-m", "pip", "install", "--quiet", "-r", str(REQUIREMENTS)])
    (env / ".installed").write_text(stamp)
    return wstest


def websockets_env(version: str) -> Path:
    """The interpreter of a virtualenv holding websockets ``version`` alone (made when missing).

    :param version: a websockets release, such as ``17.0``.
    """
    env = CACHE / f"websockets-{version}"
    python = env / "bin" / "python"
    stamp = f"{sys.version}\nwebsockets=={version}"
    if _stamped(env, stamp) and python.exists():
        return python
    shutil.rmtree(env, ignore_errors=True)
    run_command([sys.executable, "-m", "venv", str(env)])
    run_command([str(python), "-m", "pip", "install", "--quiet", f"websockets=={version}"])
    (env / ".installed").write_text(stamp)
    return python


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class FuzzingServer:
    """``wstest -m fuzzingserver`` on a free loopback port, writing its reports to ``outdir``.

    :param wstest: the script (:func:`fuzzing_server_env`).
    :param outdir: where the reports go (``index.json`` and one file per case and agent).
    """

    def __init__(self, wstest: Path, outdir: Path) -> None:
        self.wstest = wstest
        self.outdir = outdir
        self.port = _free_port()
        self.url = f"ws://127.0.0.1:{self.port}"
        self.log_path = outdir / "fuzzingserver.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the server and wait until it listens (at most :data:`START_TIMEOUT` seconds)."""
        self.outdir.mkdir(parents=True, exist_ok=True)
        spec = self.outdir / "fuzzingserver.json"
        spec.write_text(
            json.dumps(
                {
                    "url": self.url,
                    "outdir": str(self.outdir),
                    "cases": CASES,
                    "exclude-cases": [],
                    "exclude-agent-cases": {},
                }
            )
        )
        with self.log_path.open("wb") as output:
            self.process = subprocess.Popen(
                [str(self.wstest), "-m", "fuzzingserver", "-s", str(spec), "--webport=0"],
                cwd=self.outdir,
                stdout=output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        log.info("waiting for the fuzzing server to listen on %s (at most %.0f s)", self.url, START_TIMEOUT)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the fuzzing server exited ({self.process.returncode}):\n{self.output()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(
            f"the fuzzing server did not listen on {self.url} within {START_TIMEOUT:.0f} s (a machine "
            f"too loaded, or the port taken meanwhile: run again); its output:\n{self.output()}"
        )

    def output(self) -> str:
        """The end of what the server printed."""
        return self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""

    def stop(self) -> None:
        """Stop the server (this process started it)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass(frozen=True)
class Outcome:
    """What the fuzzing server said of one case for one agent.

    :param behavior: the verdict on the exchange (``OK``, ``NON-STRICT``, ``INFORMATIONAL``,
        ``UNIMPLEMENTED``, ``FAILED``).
    :param close: the verdict on the close (``OK``, ``INFORMATIONAL``, ``WRONG CODE``, ``UNCLEAN``,
        ``FAILED``).
    :param duration_ms: how long the case took.
    """

    behavior: str
    close: str
    duration_ms: int

    #: Verdicts within RFC 6455: ``NON-STRICT`` is a behaviour the RFC allows but does not ask for
    #: (a message echoed before the frame that fails the connection was read), ``INFORMATIONAL`` a
    #: case that only records what happened.
    PASSING = frozenset({"OK", "NON-STRICT", "INFORMATIONAL"})

    @property
    def passed(self) -> bool:
        """Whether both verdicts are within RFC 6455."""
        return self.behavior in self.PASSING and self.close in self.PASSING


def results(outdir: Path) -> dict[str, dict[str, Outcome]]:
    """The report's verdicts: agent → case → :class:`Outcome`.

    :param outdir: the server's report directory.
    """
    index: dict[str, dict[str, Any]] = json.loads((outdir / "index.json").read_text())
    return {
        agent: {
            case: Outcome(entry["behavior"], entry["behaviorClose"], int(entry.get("duration", 0)))
            for case, entry in cases.items()
        }
        for agent, cases in index.items()
    }


#: Lines of the run's summary (verdicts and timings per client), shown after the tests.
SUMMARY: list[str] = []
