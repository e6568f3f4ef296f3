"""Instructions per cold change, counted by valgrind's callgrind: the client's own work, in a unit
that does not move with the host.

On a virtual machine the CPU time of one cold change (:mod:`benchmarks.cold_cost`) moves by
10–15 % between runs minutes apart, with the load other guests put on the host, so a change of
the provider that saves a tenth of its work cannot be told from noise by timing it. The number of
instructions the client process executes for the same exchanges is the same from run to run
(within a fraction of a percent: timers and the harness's polling vary a little).

For each client a child process runs the cold scenario's exchanges under ``valgrind
--tool=callgrind --instr-atstart=no`` (the emulator, its child, runs natively). Instrumentation is
switched on for the measured changes only (``callgrind_control``: the imports, the warm-up and
the set-up are not counted), then off, and the count dumped. The trigger's harness polls whether
the trigger went dormant again; those polls are counted in a second window of polling alone and
taken out. Only the client process's user-space instructions are counted: not the kernel's work
for its system calls, not the emulator's.

``python -m benchmarks.instructions [--n 50] [--clients provider,stream_alone,websockets_alone]``
prints the counts as JSON; the cold scenario adds them to its results when valgrind is installed
(Debian's ``valgrind``). About half a minute per client.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.cold_cost import CLIENTS, LIMITS, Meter, _poll_cost

__all__ = ["available", "count", "instructions_in"]

#: Cold changes measured per client under valgrind (each takes tens of milliseconds there).
DEFAULT_CHANGES = 50
#: Polls of the trigger's harness counted alone, to take the polling out.
POLL_SAMPLES = 200
_TOTALS = re.compile(r"^totals:\s+(\d+)", re.MULTILINE)
#: Where ``python -m benchmarks.instructions`` runs from (the checkout holding this package).
ROOT = Path(__file__).resolve().parent.parent


def available() -> bool:
    """Whether valgrind's callgrind and its control command are installed."""
    return shutil.which("valgrind") is not None and shutil.which("callgrind_control") is not None


def instructions_in(dump: str) -> int:
    """The instructions a callgrind dump counted (its ``totals:`` line).

    :param dump: the text of a ``callgrind.out`` file.
    :raises ValueError: the text is not a callgrind dump.
    """
    found = _TOTALS.search(dump)
    if found is None:
        raise ValueError("not a callgrind dump: no 'totals:' line")
    return int(found.group(1))


class _Callgrind(Meter):
    """Counts what runs between :meth:`start` and :meth:`stop` (one dump per window)."""

    def _control(self, *args: str) -> None:
        subprocess.run(["callgrind_control", *args, str(os.getpid())], check=True, capture_output=True)

    def start(self) -> None:
        self._control("--zero")
        self._control("--instr=on")

    def stop(self) -> None:
        self._control("--instr=off")
        self._control("--dump")


async def _child(client: str, changes: int) -> dict[str, Any]:
    """Under callgrind: ``changes`` cold changes of ``client`` (dump 1), then, for the trigger,
    :data:`POLL_SAMPLES` polls of its harness alone (dump 2)."""
    from airflow_provider_systemzero.hooks.systemzero import SystemZeroHook
    from benchmarks.emulator_host import EmulatorProcess
    from benchmarks.fixtures import CONN_ID

    meter = _Callgrind()
    async with EmulatorProcess(limits=LIMITS, max_concurrent=16) as emulator:
        os.environ.update(emulator.connection_env())
        settings = await SystemZeroHook(systemzero_conn_id=CONN_ID).aget_settings()
        result = await CLIENTS[client](emulator, settings, changes, meter)
    polls = result.get("harness_polls", 0)
    if polls:
        meter.start()
        await _poll_cost(POLL_SAMPLES)
        meter.stop()
    return {"client": client, "changes": changes, "polls": polls, "streams_opened": result["streams_opened"]}


def _dumped(directory: Path) -> dict[int, int]:
    """The instructions of each dump a callgrind run wrote in ``directory``, by its number."""
    return {
        int(path.name.rsplit(".", 1)[1]): instructions_in(path.read_text())
        for path in directory.glob("callgrind.out.*.*")
    }


async def _count_one(client: str, changes: int, root: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sz-callgrind-") as directory:
        out = Path(directory)
        proc = await asyncio.create_subprocess_exec(
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={out}/callgrind.out.%p",
            sys.executable,
            "-m",
            "benchmarks.instructions",
            "--child",
            client,
            "--n",
            str(changes),
            cwd=root,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        async with asyncio.timeout(900):
            stdout, _ = await proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"the callgrind run of {client} failed with exit status {proc.returncode}")
        report = json.loads(stdout.decode().strip().splitlines()[-1])
        counts = _dumped(out)
        measured = counts[1]
        polling = counts[2] / POLL_SAMPLES if report["polls"] else 0.0
    return {
        "instructions_per_change": (measured - polling * report["polls"]) / changes,
        "changes": changes,
        "harness_polls": report["polls"],
        "instructions_per_poll": polling,
        "streams_opened": report["streams_opened"],
    }


async def count(changes: int = DEFAULT_CHANGES, clients: tuple[str, ...] = tuple(CLIENTS)) -> dict[str, Any]:
    """Instructions per cold change of each client, one callgrind run each.

    :param changes: cold changes counted per client.
    :param clients: which clients (:data:`benchmarks.cold_cost.CLIENTS`).
    """
    return {client: await _count_one(client, changes, ROOT) for client in clients}


def main() -> None:
    """``python -m benchmarks.instructions``: print the counts as JSON."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.instructions", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--n", type=int, default=DEFAULT_CHANGES, help="cold changes counted per client")
    parser.add_argument("--clients", default=",".join(CLIENTS), help="comma-separated clients")
    parser.add_argument("--child", choices=tuple(CLIENTS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(_child(args.child, args.n))))
        return
    if not available():
        parser.error("valgrind and callgrind_control are needed (Debian: apt-get install valgrind)")
    clients = tuple(c.strip() for c in args.clients.split(",") if c.strip())
    unknown = [c for c in clients if c not in CLIENTS]
    if unknown:
        parser.error(f"unknown client {unknown[0]!r}; choose from {', '.join(CLIENTS)}")
    print(json.dumps(asyncio.run(count(args.n, clients)), indent=2))


if __name__ == "__main__":
    main()
