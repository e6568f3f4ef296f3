"""The gateway emulator in its own process, driven over stdin/stdout (one JSON object a line).

``python -m benchmarks.emulator_host --limits '{...}'`` starts an
:class:`~airflow_provider_systemzero.emulator.server.Emulator` on a free loopback port and
prints ``{"origin": "ws://127.0.0.1:PORT"}``. Then each request line gets one answer line:

==================================================  =========================================
``{"cmd": "stats"}``                                 the emulator's stats, plus its CPU and RSS
``{"cmd": "ledger", "namespaces": [...]}``           billing per key namespace
``{"cmd": "state", "key": "<prompt_cache_key>"}``    length and SHA-256 of the last accepted state
``{"cmd": "restart", "retry_after_ms": N}``          the graceful restart (goodbye, close 1012)
``{"cmd": "sample", "interval": S}``                 start sampling ``events_accepted``
``{"cmd": "samples"}``                               stop sampling; the ``[t, events, rejections]``
``{"cmd": "freeze"}``                                collect, then ``gc.freeze()`` what it holds
``{"cmd": "collections", "since": T}``               its collector's pauses of 1 ms or more since
                                                     ``perf_counter()`` T: ``[start, ms, generation]``
``{"cmd": "time_frames"}``                           from now on, time each client frame handled
``{"cmd": "frames", "since": T}``                    the frames timed since T, and forget them:
                                                     ``[start, wall ms, CPU ms]``
``{"cmd": "stop"}``                                  stop the emulator and exit
==================================================  =========================================

:class:`EmulatorProcess` is the parent's async handle. Running the gateway elsewhere keeps its
CPU, memory and event-loop time out of the measured process, as with a real remote gateway.

The emulator stands in for that gateway, but its own garbage collector is CPython's: a full
collection of a process holding a thousand streams' states pauses it for 15–40 ms, and every
decision due meanwhile waits. A scenario that measures the client asks the host to ``freeze``
once its streams are set up, so what a long-running gateway holds is not scanned again inside
the window measured, and reports the host's remaining pauses (``collections``) beside its
figures. ``perf_counter()`` is the system's monotonic clock on Linux, the same in both processes.

The gateway's own part of a round trip is the emulator's, not the provider's: ``time_frames``
times each complete text frame the emulator reads, from the moment its stream takes the frame to
the return of the write of what it answered (the ack, and a decision ready at once), so a
scenario can say how much of a change's latency was spent inside the gateway's stand-in.

A process of its own does not keep the emulator off the measured process's core, though. Left to
the operating system, the two exchanging messages end up on one core (the scheduler wakes a
receiver next to its sender) and take turns on it: each time the client writes, the emulator it
woke runs in its place, and a change that lands meanwhile waits for both while the other core is
idle. A remote gateway never takes the triggerer's CPU. ``EmulatorProcess(own_core=True)`` gives
the emulator the last CPU the parent may use and keeps the parent on the others (see
:func:`split_cores`); the parent's affinity is restored when the emulator stops.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import hashlib
import json
import os
import sys
import time
from collections import Counter
from typing import Any

__all__ = ["EmulatorProcess", "main", "split_cores"]


def split_cores() -> tuple[list[int], int] | None:
    """The CPUs this process may use less the last, and that last one for the emulator.

    ``None`` where the process may use only one CPU, or the platform cannot pin processes.
    """
    if not hasattr(os, "sched_getaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        return None
    return allowed[:-1], allowed[-1]


def _pin_process(cpus: set[int]) -> None:
    """Keep every thread of this process (and those it starts later) on ``cpus``."""
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(task), cpus)


def _rss_kb() -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class _Host:
    def __init__(self, emulator: Any) -> None:
        self.emulator = emulator
        self.sampler: asyncio.Task[None] | None = None
        self.samples: list[tuple[float, int, int]] = []
        self.pauses: list[tuple[float, float, int]] = []  # [start, ms, generation], ≥ 1 ms
        self._collecting_since = 0.0
        #: ``[start, wall ms, CPU ms]`` of each frame timed (see :func:`_time_frames`).
        self.frames: list[tuple[float, float, float]] | None = None
        gc.callbacks.append(self._on_collection)

    def _on_collection(self, phase: str, info: dict[str, int]) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._collecting_since = now
        elif now - self._collecting_since >= 0.001:
            self.pauses.append(
                (self._collecting_since, (now - self._collecting_since) * 1000, info["generation"])
            )

    async def handle(self, request: dict[str, Any]) -> Any:
        cmd = request["cmd"]
        emulator = self.emulator
        if cmd == "stats":
            data = emulator.stats.to_dict()
            data["cpu_seconds"] = time.process_time()
            data["rss_kb"] = _rss_kb()
            return data
        if cmd == "ledger":
            return self._ledger(request["namespaces"])
        if cmd == "state":
            accepted = emulator.latest_state(request["key"])
            if accepted is None:
                return None
            state = accepted.state
            raw = state.encode("utf-8") if isinstance(state, str) else json.dumps(state).encode("utf-8")
            return {
                "type": type(state).__name__,
                "bytes": len(raw),
                "sha256": hashlib.sha256(raw).hexdigest(),
            }
        if cmd == "restart":
            started = time.perf_counter()
            await emulator.restart(retry_after_ms=int(request.get("retry_after_ms", 500)))
            return {"seconds": time.perf_counter() - started}
        if cmd == "sample":
            await self._stop_sampler()
            self.samples = []
            self.sampler = asyncio.ensure_future(self._sample(float(request.get("interval", 0.02))))
            return True
        if cmd == "samples":
            await self._stop_sampler()
            return self.samples
        if cmd == "freeze":
            gc.collect()
            gc.freeze()
            return {"frozen": gc.get_freeze_count()}
        if cmd == "collections":
            since = float(request.get("since", 0.0))
            return [pause for pause in self.pauses if pause[0] >= since]
        if cmd == "time_frames":
            if self.frames is None:
                self.frames = []
                _time_frames(self.frames)
            return True
        if cmd == "frames":
            since = float(request.get("since", 0.0))
            timed = [frame for frame in self.frames or () if frame[0] >= since]
            if self.frames is not None:
                self.frames.clear()  # the list the timer appends to: emptied, not replaced
            return timed
        raise ValueError(f"unknown command {cmd!r}")

    def _ledger(self, namespaces: list[str]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        entries = [e for per_account in self.emulator.ledger.values() for e in per_account]
        for namespace in namespaces:
            prefix = namespace + ":"
            mine = [
                e for e in entries if e.idempotency_key is not None and e.idempotency_key.startswith(prefix)
            ]
            billed = [e.body_sha256 for e in mine if e.billed]
            counts = Counter(billed)
            result[namespace] = {
                "billed": len(billed),
                "replayed": sum(1 for e in mine if not e.billed),
                "distinct_billed": len(counts),
                "billed_twice": sum(n - 1 for n in counts.values() if n > 1),
            }
        return result

    async def _sample(self, interval: float) -> None:
        start = time.perf_counter()
        while True:
            stats = self.emulator.stats
            self.samples.append((time.perf_counter() - start, stats.events_accepted, stats.rejections))
            await asyncio.sleep(interval)

    async def _stop_sampler(self) -> None:
        sampler, self.sampler = self.sampler, None
        if sampler is not None:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler


def _time_frames(into: list[tuple[float, float, float]]) -> None:
    """Time every text frame a stream of this process handles from here on, into ``into``.

    A stream handles a frame in one callback (``StreamLoop.receive_text``): decoded, fed to its
    session, a decide that is ready at once run, and the replies written, before it returns. So
    the span of that call is the gateway's share of a change's round trip. This host process only
    runs the emulator, so wrapping the method here changes nothing else.
    """
    from airflow_provider_systemzero.emulator.connection import StreamLoop

    receive = StreamLoop.receive_text

    def timed(loop: StreamLoop, text: str, size: int | None = None) -> None:
        started, cpu = time.perf_counter(), time.thread_time()
        try:
            receive(loop, text, size)
        finally:
            into.append((started, (time.perf_counter() - started) * 1000, (time.thread_time() - cpu) * 1000))

    StreamLoop.receive_text = timed  # type: ignore[method-assign]


async def _serve(args: argparse.Namespace) -> None:
    from airflow_provider_systemzero.emulator.server import Emulator
    from airflow_provider_systemzero.protocol.limits import Limits

    limits = Limits(**json.loads(args.limits))
    emulator = Emulator(
        api_keys={args.api_key: args.max_concurrent},
        limits=limits,
        decider=args.decider,
        decide_latency_ms=args.decide_latency_ms,
    )
    await emulator.start()
    host = _Host(emulator)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    def answer(payload: Any) -> None:
        sys.stdout.write(json.dumps(payload) + "\n")
        sys.stdout.flush()

    answer({"origin": emulator.origin, "pid": os.getpid()})
    try:
        while True:
            line = await reader.readline()
            if not line:
                break
            request = json.loads(line)
            if request.get("cmd") == "stop":
                break
            try:
                answer({"ok": await host.handle(request)})
            except Exception as exc:  # report it; the parent decides what to do
                answer({"error": f"{type(exc).__name__}: {exc}"})
    finally:
        await host._stop_sampler()
        await emulator.stop(retry_after_ms=0)
    answer({"ok": "stopped"})


def main(argv: list[str] | None = None) -> None:
    """Run the emulator host (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.emulator_host")
    parser.add_argument("--api-key", default="bench-key-0001")
    parser.add_argument("--max-concurrent", type=int, default=8)
    parser.add_argument("--decider", default="python:benchmarks.fixtures:decide")
    parser.add_argument("--decide-latency-ms", type=int, default=0)
    parser.add_argument("--limits", default="{}", help="Limits overrides as a JSON object")
    parser.add_argument("--cpu", type=int, default=None, help="run on this CPU only")
    args = parser.parse_args(argv)
    if args.cpu is not None:
        _pin_process({args.cpu})
    asyncio.run(_serve(args))


class EmulatorProcess:
    """The parent's handle on an emulator host process (``async with``).

    :param limits: :class:`~airflow_provider_systemzero.protocol.limits.Limits` overrides.
    :param api_key: the account's API key.
    :param max_concurrent: the account's ``max_concurrent`` (stream capacity is half of it).
    :param decide_latency_ms: simulated inference time of each fresh decision.
    :param decider: the emulator's ``--decider`` (default: :func:`benchmarks.fixtures.decide`).
    :param own_core: run the emulator on a CPU of its own and keep this process off it while the
        emulator runs (see the module docstring); nothing changes where :func:`split_cores` cannot.
    """

    def __init__(
        self,
        *,
        limits: dict[str, int] | None = None,
        api_key: str = "bench-key-0001",
        max_concurrent: int = 8,
        decide_latency_ms: int = 0,
        decider: str = "python:benchmarks.fixtures:decide",
        own_core: bool = False,
    ) -> None:
        self.decider = decider
        self.own_core = own_core
        #: the CPUs of this process and of the emulator while it runs, when ``own_core`` took effect
        self.cores: dict[str, list[int]] | None = None
        self._affinity: set[int] | None = None  # this process's CPUs before, to restore
        self.limits = dict(limits or {})
        self.api_key = api_key
        self.max_concurrent = max_concurrent
        self.decide_latency_ms = decide_latency_ms
        self.origin = ""
        self.pid = 0
        self._proc: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()

    async def __aenter__(self) -> EmulatorProcess:
        split = split_cores() if self.own_core else None
        pin: list[str] = []
        if split is not None:
            measured, emulator_cpu = split
            self._affinity = os.sched_getaffinity(0)
            _pin_process(set(measured))
            self.cores = {"measured": measured, "emulator": [emulator_cpu]}
            pin = ["--cpu", str(emulator_cpu)]
        try:
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "benchmarks.emulator_host",
                "--api-key",
                self.api_key,
                "--max-concurrent",
                str(self.max_concurrent),
                "--decide-latency-ms",
                str(self.decide_latency_ms),
                "--limits",
                json.dumps(self.limits),
                "--decider",
                self.decider,
                *pin,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                limit=2**24,
            )
            hello = await self._read()
        except BaseException:
            await self.__aexit__(None, None, None)  # this process's CPUs back; the host stopped
            raise
        self.origin, self.pid = hello["origin"], hello["pid"]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._affinity is not None:
            _pin_process(self._affinity)
            self._affinity = None
        proc = self._proc
        if proc is None:
            return
        self._proc = None
        with contextlib.suppress(Exception):
            assert proc.stdin is not None
            proc.stdin.write(b'{"cmd": "stop"}\n')
            await proc.stdin.drain()
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except TimeoutError:
            proc.kill()
            await proc.wait()

    def connection_env(self) -> dict[str, str]:
        """The ``AIRFLOW_CONN_*`` variable that points the benchmark connection at this emulator."""
        from benchmarks.fixtures import CONN_ID

        return {
            f"AIRFLOW_CONN_{CONN_ID.upper()}": json.dumps(
                {"conn_type": "systemzero", "host": self.origin, "password": self.api_key}
            )
        }

    async def _read(self) -> Any:
        assert self._proc is not None and self._proc.stdout is not None
        line = await self._proc.stdout.readline()
        if not line:
            raise RuntimeError("the emulator host exited")
        return json.loads(line)

    async def call(self, cmd: str, **params: Any) -> Any:
        """Send one command and return its answer.

        :raises RuntimeError: the host reported an error.
        """
        assert self._proc is not None and self._proc.stdin is not None
        async with self._lock:
            self._proc.stdin.write((json.dumps({"cmd": cmd, **params}) + "\n").encode())
            await self._proc.stdin.drain()
            reply = await self._read()
        if "error" in reply:
            raise RuntimeError(f"emulator host: {reply['error']}")
        return reply["ok"]

    async def stats(self) -> dict[str, Any]:
        """The emulator's stats (``EmulatorStats.to_dict()`` plus ``cpu_seconds`` and ``rss_kb``)."""
        return await self.call("stats")


if __name__ == "__main__":
    main()
