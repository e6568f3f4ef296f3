"""The processes of the throwaway deployment (:mod:`tests.helpers.deployment.harness`): one Airflow
component started from the project's environment and stopped by its own PID, and a sampler of the
TCP connections each triggerer holds to the emulator.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

__all__ = ["Component", "SocketSampler"]

#: Runs a command with PR_SET_PDEATHSIG=SIGTERM, then execs it (same PID). Linux only; elsewhere
#: it just execs.
_PDEATHSIG_SHIM = (
    "import ctypes, os, signal, sys\n"
    "try:\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)\n"  # PR_SET_PDEATHSIG
    "except (OSError, AttributeError):\n"
    "    pass\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(1)\n"  # the test process died before prctl took effect
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


@dataclass
class Component:
    """One Airflow component: a process started from the project's environment."""

    name: str
    args: Sequence[str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    #: the process tree when it was told to stop (its children outlive a killed parent)
    snapshot: list[psutil.Process] = field(default_factory=list)
    #: stopped or killed on purpose (not a failure)
    expected_down: bool = False

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, env: Mapping[str, str]) -> None:
        command = [
            sys.executable,
            "-c",
            _PDEATHSIG_SHIM,
            str(os.getpid()),
            sys.executable,
            "-m",
            "airflow",
            *self.args,
        ]
        with self.log_path.open("ab") as log:
            log.write(f"\n==== {time.strftime('%H:%M:%S')} airflow {' '.join(self.args)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                command,
                env=dict(env),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def tree(self) -> list[psutil.Process]:
        """The component's process and its descendants (empty when it is gone)."""
        if self.process is None:
            return []
        try:
            root = psutil.Process(self.process.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []
        return procs

    def kill(self) -> None:
        """SIGKILL the whole tree at once, as when a node or container dies."""
        self.expected_down = True
        procs = self.tree()
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        if self.process is not None:
            self.process.wait(timeout=10)
            psutil.wait_procs([p for p in procs if p.pid != self.process.pid], timeout=10)

    def terminate(self) -> None:
        """Send SIGTERM to the component's own PID (remembering its tree first)."""
        if self.process is None:
            return
        self.expected_down = True
        self.snapshot = self.tree()
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)

    def finish(self, timeout: float = 30.0) -> None:
        """Wait for the component to exit (SIGKILL after ``timeout``), then SIGKILL what is left of its tree."""
        if self.process is None:
            return
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            self.process.wait(timeout=10)
        # is_running() also checks the creation time, so a reused PID is never touched
        leftovers = [proc for proc in self.snapshot if proc.is_running() and proc.pid != self.process.pid]
        _, alive = psutil.wait_procs(leftovers, timeout=5)
        for proc in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        psutil.wait_procs(alive, timeout=5)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the component's PID, wait, then SIGKILL whatever of its tree is left."""
        self.terminate()
        self.finish(timeout)


class SocketSampler:
    """Samples, in a background thread, the established TCP connections each triggerer's process
    tree holds to the emulator's port, and keeps the per-triggerer maximum."""

    def __init__(self, port: int, interval: float = 0.1) -> None:
        self.port = port
        self.interval = interval
        self.maxima: dict[str, int] = {}
        self.samples = 0
        self._components: dict[str, Component] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="socket-sampler", daemon=True)

    def watch(self, component: Component) -> None:
        with self._lock:
            self._components[component.name] = component
            self.maxima.setdefault(component.name, 0)

    def reset(self) -> None:
        with self._lock:
            self.maxima = dict.fromkeys(self._components, 0)

    def count(self, component: Component) -> int:
        total = 0
        for proc in component.tree():
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                total += sum(
                    1
                    for c in proc.net_connections(kind="tcp")
                    if c.status == psutil.CONN_ESTABLISHED and c.raddr and c.raddr.port == self.port
                )
        return total

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                components = list(self._components.values())
            counts = {c.name: self.count(c) for c in components if c.running()}
            with self._lock:
                for name, value in counts.items():
                    self.maxima[name] = max(self.maxima.get(name, 0), value)
                self.samples += 1

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
