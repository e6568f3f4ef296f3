"""A Redis server of the deployment test's own, the Celery executor's broker: Debian's
``redis-server`` (installed with ``apt-get`` when missing), listening on a free loopback port
only, with no persistence, stopped by its own PID on :meth:`stop`.

The Celery executor's Python side (``apache-airflow-providers-celery`` and the ``redis``
client) is installed with ``pip`` from ``requirements-celery.txt``, pinned by the project's
``constraints.txt``, when it is missing.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests.helpers.deployment.system import apt_install, ensure_python_packages

REQUIREMENTS = Path(__file__).resolve().parents[3] / "tests" / "deployment" / "requirements-celery.txt"


class RedisInstance:
    """One throwaway Redis server (see the module docstring).

    :param port: the loopback TCP port to listen on.
    """

    def __init__(self, port: int) -> None:
        self.port = port
        self.directory: Path | None = None
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The broker URL Celery connects with."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        assert self.directory is not None
        return self.directory / "redis.log"

    def start(self) -> None:
        """Install what is missing, start the server and wait (bounded) until it answers a PING."""
        if shutil.which("redis-server") is None:
            apt_install(["redis-server"])
        ensure_python_packages(
            REQUIREMENTS, ["redis", "celery", "airflow.providers.celery", "airflow.providers.fab"]
        )
        server = shutil.which("redis-server")
        if server is None:
            raise RuntimeError("no redis-server on PATH after installing Debian's 'redis-server'")
        self.directory = Path(tempfile.mkdtemp(prefix="sz-deploy-redis-"))
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    server,
                    "--port",
                    str(self.port),
                    "--bind",
                    "127.0.0.1",
                    "--dir",
                    str(self.directory),
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--daemonize",
                    "no",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + 30
        while not self._pong():
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited ({self.process.returncode}):\n{self._log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not answer PING in 30 s:\n{self._log_tail()}")
            time.sleep(0.1)

    def stop(self) -> None:
        """Stop the server by its PID (SIGTERM, then SIGKILL) and remove its directory. Idempotent."""
        if self.process is not None:
            if self.process.poll() is None:
                self.process.terminate()
                try:
                    self.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait(timeout=10)
            self.process = None
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None

    def _pong(self) -> bool:
        with (
            contextlib.suppress(OSError),
            socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock,
        ):
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
        return False

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-2000:]
        return ""
