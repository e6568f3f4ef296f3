"""A PostgreSQL server of the deployment test's own: Debian's ``postgresql`` binaries, a fresh
cluster in a temporary directory, listening on a free loopback port only, removed on :meth:`stop`.

PostgreSQL refuses to run as root, and the test usually runs as root (CI, containers): the
cluster then belongs to the ``postgres`` account the Debian package creates (``nobody`` where
there is none), and ``initdb``/``pg_ctl`` run as that user. The superuser is ``airflow`` with
``trust`` authentication, reachable only on 127.0.0.1 and through the cluster's own socket
directory. Durability is switched off (``fsync``, ``synchronous_commit``, ``full_page_writes``):
the cluster lives for one test run.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tests.helpers.deployment.system import apt_install, ensure_python_packages

REQUIREMENTS = Path(__file__).resolve().parents[3] / "tests" / "deployment" / "requirements-postgres.txt"
USER = "airflow"
DATABASE = "airflow"


def _server_bin() -> Path | None:
    """The newest installed ``/usr/lib/postgresql/<version>/bin``."""
    candidates = [path for path in Path("/usr/lib/postgresql").glob("*/bin") if (path / "initdb").exists()]
    return max(candidates, key=lambda path: int(path.parent.name), default=None)


class PostgresInstance:
    """One throwaway PostgreSQL cluster (see the module docstring).

    :param port: the loopback TCP port to listen on.
    """

    def __init__(self, port: int) -> None:
        self.port = port
        self.directory: Path | None = None
        self._bin: Path | None = None
        self._owner: pwd.struct_passwd | None = None
        self._started = False

    @property
    def url(self) -> str:
        """The SQLAlchemy URL Airflow connects with (psycopg2, the driver of Airflow's postgres extra)."""
        return f"postgresql+psycopg2://{USER}@127.0.0.1:{self.port}/{DATABASE}"

    @property
    def log_path(self) -> Path:
        assert self.directory is not None
        return self.directory / "server.log"

    def start(self) -> None:
        """Install what is missing, create the cluster and start it (waits until it accepts connections)."""
        if _server_bin() is None:
            apt_install(["postgresql"])
        ensure_python_packages(REQUIREMENTS, ["psycopg2", "asyncpg"])
        self._bin = _server_bin()
        if self._bin is None:
            raise RuntimeError("no PostgreSQL server under /usr/lib/postgresql after installing 'postgresql'")
        if os.geteuid() == 0:
            try:
                self._owner = pwd.getpwnam("postgres")
            except KeyError:
                self._owner = pwd.getpwnam("nobody")
        # /tmp, not pytest's 0700 tmp_path: the cluster's owner must be able to enter it
        self.directory = Path(tempfile.mkdtemp(prefix="sz-deploy-pg-"))
        if self._owner is not None:
            os.chown(self.directory, self._owner.pw_uid, self._owner.pw_gid)
        data = self.directory / "data"
        self._run(
            "initdb", "-D", str(data), "-U", USER, "--auth=trust", "--encoding=UTF8", "--locale=C.UTF-8"
        )
        options = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories={self.directory} "
            "-c max_connections=200 -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        self._run(
            "pg_ctl", "-D", str(data), "-l", str(self.log_path), "-o", options, "-w", "-t", "120", "start"
        )
        self._started = True
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", USER, DATABASE)

    def stop(self) -> None:
        """Stop the server (fast shutdown, then immediate) and remove its directory. Idempotent."""
        if self.directory is None:
            return
        if self._started:
            self._started = False
            data = str(self.directory / "data")
            try:
                self._run("pg_ctl", "-D", data, "-m", "fast", "-w", "-t", "30", "stop")
            except Exception:
                with contextlib.suppress(Exception):
                    self._run("pg_ctl", "-D", data, "-m", "immediate", "-w", "-t", "30", "stop")
        shutil.rmtree(self.directory, ignore_errors=True)
        self.directory = None

    @contextlib.contextmanager
    def connect(self) -> Iterator[Any]:
        """A short-lived autocommit connection as the superuser."""
        import psycopg2

        conn = psycopg2.connect(
            host="127.0.0.1", port=self.port, user=USER, dbname=DATABASE, connect_timeout=30
        )
        conn.autocommit = True
        try:
            yield conn
        finally:
            conn.close()

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run ``sql`` (``?`` placeholders, as for sqlite3) and return its rows."""
        with self.connect() as conn, conn.cursor() as cursor:
            cursor.execute(sql.replace("?", "%s"), tuple(params))
            return [tuple(row) for row in cursor.fetchall()] if cursor.description else []

    def _run(self, tool: str, *args: str) -> None:
        assert self._bin is not None
        kwargs: dict[str, Any] = {}
        if self._owner is not None:
            kwargs.update(user=self._owner.pw_uid, group=self._owner.pw_gid, extra_groups=[])
        result = subprocess.run(
            [str(self._bin / tool), *args],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
            stdin=subprocess.DEVNULL,
            cwd=self.directory,
            **kwargs,
        )
        if result.returncode != 0:
            log = ""
            with contextlib.suppress(OSError):
                log = self.log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(
                f"PostgreSQL '{tool}' failed ({result.returncode}):\n"
                f"{(result.stdout + result.stderr)[-2000:]}\n{log}"
            )
