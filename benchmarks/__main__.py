"""``python -m benchmarks`` (``make bench``): run the scenarios, write the JSON and its table.

A full run takes about ten minutes on two cores, plus 10–20 minutes for scenario 6 (waiting
triggers up to N = 5,000; ``--only`` leaves it out) and about six for the account's decision
ceiling (``ceiling``), and writes ``benchmarks/results/latest.json`` and every figure of it as a
Markdown table, ``benchmarks/results/latest.md``, from which the written page
``docs/benchmarks-results.md`` takes its runs of record. ``--quick`` is a smoke run of about three
minutes with fewer samples and shorter windows; it writes ``.cache/benchmarks/quick.json`` (not
tracked) and no table unless ``--table`` is given.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from benchmarks import (
    billing,
    ceiling,
    cold_cost,
    core,
    density,
    fleet,
    ingest,
    latency,
    report,
    sharing,
    waiting,
    watchers,
)
from benchmarks.common import Options, machine

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
QUICK_RESULTS = ROOT / ".cache" / "benchmarks"
TABLE = ROOT / "benchmarks" / "results" / "latest.md"

#: Scenario name → runner, in the order they run (the CPU-only core first, density last).
SCENARIOS: dict[str, Callable[[Options], Awaitable[dict[str, Any]]]] = {
    "core": core.run,
    "latency": latency.run,
    "cold": cold_cost.run,
    "billing": billing.run,
    "ingest": ingest.run,
    "density": density.run,
    "waiting": waiting.run,
    "fleet": fleet.run,
    "ceiling": ceiling.run,
    "sharing": sharing.run,
    "watchers": watchers.run,
}


def _write(path: Path, text: str) -> None:
    """Write through a ``.tmp`` file and rename, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


async def _run_all(options: Options, names: list[str]) -> tuple[dict[str, Any], dict[str, float], bool]:
    results: dict[str, Any] = {}
    durations: dict[str, float] = {}
    failed = False
    for name in names:
        print(f"[bench] {name} ...", flush=True)
        started = time.perf_counter()
        try:
            results[name] = await SCENARIOS[name](options)
        except Exception as exc:
            failed = True
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
            traceback.print_exc()
        durations[name] = time.perf_counter() - started
        print(f"[bench] {name} done in {durations[name]:.1f} s", flush=True)
    return results, durations, failed


def _previous(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _keep_unrun(document: dict[str, Any], previous: dict[str, Any]) -> None:
    """A run of some scenarios keeps the others' results from the previous run, saying when and where from."""
    kept = {}
    for name, result in previous.get("results", {}).items():
        if name not in document["results"] and name in SCENARIOS:
            document["results"][name] = result
            origin = previous.get("kept_from", {}).get(name) or {
                "started_at": previous.get("started_at"),
                "commit": previous.get("machine", {}).get("commit"),
            }
            kept[name] = origin
    if kept:
        document["kept_from"] = kept


def _baseline(path: Path, previous: dict[str, Any]) -> dict[str, Any]:
    """The 'before' of the latency, waiting-trigger and append figures: a run of earlier code.

    Only the parts that run measured replace those of ``previous`` (the baseline already in the
    results file), each with the commit and date it was measured at.
    """
    earlier = json.loads(path.read_text(encoding="utf-8"))
    results = earlier.get("results", {})
    origin = {
        "started_at": earlier.get("started_at"),
        "commit": earlier.get("machine", {}).get("commit"),
        "load_average": earlier.get("machine", {}).get("load_average_before"),
    }
    baseline = dict(previous)
    if results.get("latency"):
        baseline.update(origin, latency=results["latency"])
    append_cost = (results.get("core") or {}).get("append_cost")
    kept = earlier.get("kept_from", {})  # a scenario that file kept from an earlier run: that run's commit

    def measured(name: str) -> dict[str, Any]:
        return {**origin, "load_average": None, **kept[name]} if name in kept else origin

    if results.get("cold") and "error" not in results["cold"]:
        baseline.update(cold=results["cold"], cold_from=measured("cold"))
    if results.get("density") and "error" not in results["density"]:
        baseline.update(density=results["density"], density_from=measured("density"))
    if baseline.get("append_cost") and "append_from" not in baseline:
        baseline["append_from"] = baseline.get("waiting_from")  # one origin covered both until now
    if results.get("waiting"):
        baseline.update(waiting=results["waiting"], waiting_from=measured("waiting"))
    if append_cost:
        baseline.update(append_cost=append_cost, append_from=measured("core"))
    return baseline


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks; returns the exit status (1 when a scenario failed)."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smoke run (about three minutes)")
    parser.add_argument(
        "--only", default="", help=f"comma-separated scenarios (default all: {','.join(SCENARIOS)})"
    )
    parser.add_argument("--seed", type=int, default=Options.seed, help="random seed of the change times")
    parser.add_argument(
        "--sources",
        default="",
        help="latency only: comma-separated sources to measure (push, file; default all)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="the JSON results (default benchmarks/results/latest.json; with --quick "
        ".cache/benchmarks/quick.json)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="the JSON results of a run of earlier code: its latency, waiting-trigger and append "
        "figures are shown as 'before' "
        "(default: the baseline already in the results file, if any)",
    )
    table = parser.add_mutually_exclusive_group()
    table.add_argument(
        "--table",
        dest="table",
        action="store_true",
        default=None,
        help="render every figure as Markdown in benchmarks/results/latest.md (the default for a full run)",
    )
    table.add_argument("--no-table", dest="table", action="store_false", help="write no table")
    args = parser.parse_args(argv)

    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario {unknown[0]!r}; choose from {', '.join(SCENARIOS)}")
    sources = tuple(s.strip() for s in args.sources.split(",") if s.strip())
    if any(s not in ("push", "file") for s in sources):
        parser.error(f"--sources: unknown source in {args.sources!r}; choose from push, file")
    options = Options(quick=args.quick, seed=args.seed, sources=sources)
    out = (args.out or (QUICK_RESULTS / "quick.json" if args.quick else RESULTS / "latest.json")).resolve()
    render_table = args.table if args.table is not None else not args.quick

    info = machine()
    info["load_average_before"] = list(os.getloadavg())
    started_at = datetime.datetime.now(datetime.UTC)
    started = time.perf_counter()
    results, durations, failed = asyncio.run(_run_all(options, names))
    info["load_average_after"] = list(os.getloadavg())
    document = {
        "schema": 1,
        "started_at": started_at.isoformat(timespec="seconds"),
        "duration_s": time.perf_counter() - started,
        "options": {"quick": options.quick, "seed": options.seed, "scenarios": names},
        "machine": info,
        "scenario_duration_s": durations,
        "results": results,
    }
    previous = _previous(out)
    _keep_unrun(document, previous)
    baseline = (
        _baseline(args.baseline, previous.get("baseline") or {})
        if args.baseline
        else previous.get("baseline")
    )
    if baseline:
        document["baseline"] = baseline
    _write(out, json.dumps(document, indent=2, sort_keys=False) + "\n")
    shown = out.relative_to(ROOT) if out.is_relative_to(ROOT) else out
    print(f"[bench] results written to {shown}")
    markdown = report.render(document, source=str(shown))
    if render_table:
        _write(TABLE, markdown)
        print(f"[bench] table written to {TABLE.relative_to(ROOT)}")
    print(report.summary(document))
    print(f"[bench] total {document['duration_s']:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
