"""The results page's sections about triggers at scale: triggerer density, waiting triggers, the
fleet under the account's decision ceiling, and the ceiling spent by one process and shared by
several (:func:`benchmarks.report.render` puts them in order)."""

from __future__ import annotations

from typing import Any

from benchmarks.report_format import DASH, TIMES, fmt_ms, fmt_num, md_table

__all__ = ["ceiling_section", "density_section", "fleet_section", "waiting_section"]


def density_section(den: dict[str, Any]) -> list[str]:
    out = ["### 2. Triggerer density", ""]
    rows = []
    for r in den["runs"]:
        lat = r["latency"]
        rows.append(
            [
                r["n"],
                f"{r['startup_s']:.1f} s ({r['first_decisions_per_s']:.0f}/s)",
                f"{max(r['max_sockets_open'], r['emulator_max_streams_open'])} / {r['max_streams_per_process']}",
                f"{r['rss_per_trigger_kb']:.1f} KB",
                f"{r['idle_cpu_per_1000_pct']:.2f} %",
                f"{r['changes_per_s']:.1f}/s",
                f"{fmt_ms(lat['p50_ms'])} / {fmt_ms(lat['p95_ms'])}",
                f"{fmt_ms(r['longest_stall_ms'])} ({fmt_ms(r['longest_stall_without_gc_ms'])})",
                f"{r['full_gc_ms_baseline']:.0f} / {r['full_gc_ms_waiting']:.0f} ms",
                f"{r['change_phase_cpu_pct']:.0f} %",
            ]
        )
    out += md_table(
        [
            "N",
            "all first decisions (rate)",
            "max sockets / cap",
            "RSS per trigger",
            "idle CPU per 1000",
            "changes offered",
            "change → event p50 / p95",
            "longest stall (without GC)",
            "full GC before / with N",
            "CPU while changing",
        ],
        rows,
    )
    first = den["runs"][0]
    out += [
        f"Every trigger reads a {first.get('source', 'push')} source. "
        f"`lease_after` = {first['lease_after_s']} s; each source changes twice at random moments within "
        f"{first['change_window_s']:.0f} s, the second change being the decisive one. Failures: "
        + ", ".join(str(r["failures"]) for r in den["runs"])
        + ".",
        "",
    ]
    mem = den.get("memory_breakdown")
    if mem:
        rows = [[owner, f"{kb:.1f} KB"] for owner, kb in mem["kb_per_trigger"].items() if abs(kb) >= 0.05]
        rows.append(["**total**", f"**{mem['total_kb_per_trigger']:.1f} KB**"])
        out += [
            f"Python memory held per waiting trigger (tracemalloc, N = {mem['n']}; "
            f"{mem['gc_objects_per_trigger']:.0f} objects tracked by the garbage collector per trigger):",
            "",
        ]
        out += md_table(["charged to", "per trigger"], rows)
        sites = mem.get("top_provider_sites", [])[:6]
        if sites:
            out += [
                "Largest provider allocation sites: "
                + "; ".join(f"`{s['site']}` {s['bytes_per_trigger'] / 1024:.1f} KB" for s in sites)
                + ".",
                "",
            ]
    probe = den.get("default_lease_probe")
    if probe:
        out += [
            f"With the default `lease_after` of {probe['lease_after_s']:.0f} s, {probe['n']} triggers took "
            f"{probe['seconds']:.1f} s to all get a first decision: {probe['first_decisions_per_s']:.2f} per "
            "second per triggerer process.",
            "",
        ]
    return out


def waiting_section(data: dict[str, Any]) -> list[str]:
    """Scenario 6: one row per N and collector setting, then what a waiting trigger keeps."""
    out = ["### 6. Waiting triggers at scale", ""]
    from benchmarks.waiting import source_of

    rows = [
        [
            source_of(g),
            f"{g['n']:,}",
            "`gc.freeze()` after start-up" if g["gc_freeze"] else "as Airflow leaves it",
            g["repeats"],
            f"{g['rss_per_trigger_kb']:.1f} KB",
            f"{g['gc_tracked_per_trigger']:.0f}",
            fmt_ms(g["full_gc_ms_baseline"]),
            fmt_ms(g["full_gc_ms_waiting"]),
            fmt_ms(g["full_gc_ms_added_per_1000"]),
            *(
                f"{fmt_ms(g[f'{phase}_stall_ms'])} ({fmt_ms(g[f'{phase}_stall_without_gc_ms'])})"
                if f"{phase}_stall_ms" in g
                else DASH
                for phase in ("waiting", "startup")
            ),
            f"{g['idle_cpu_pct']:.2f} %",
            f"{g['startup_s']:.0f} s",
        ]
        for g in data["groups"]
    ]
    out += [
        "Medians over the runs. Full-GC columns are the CPU time of one `gc.collect()` with no trigger, "
        "with the N triggers waiting, and the difference scaled to 1,000 triggers. Stalls are the longest "
        "loop iteration (wall time, so they include waiting for a core on a loaded machine; in brackets "
        "without the collector's share), per phase: *waiting* is a 5 s window at a 10 ms step while the N "
        "triggers wait, in which the loop runs one full collection (`gc.collect()`), as the collector does "
        "whenever its threshold trips; *start-up* is from the first trigger handed over until every one "
        "has had its first decision and given its stream back. Sources: *push* is the smallest correct "
        "push source (an async generator awaiting one future per wait), *file* a tailed file on "
        "notifications, *push-queue* the same push source written with an `asyncio.Queue` per reader "
        "(N = 1,000 only: it shows what a source's own objects cost).",
        "",
    ]
    out += md_table(
        [
            "source",
            "N",
            "collector",
            "runs",
            "RSS / trigger",
            "tracked objects / trigger",
            "full GC, no trigger",
            "full GC, waiting",
            "added per 1,000",
            "longest stall, waiting",
            "longest stall, start-up",
            "idle CPU",
            "start-up",
        ],
        rows,
    )
    for census in _censuses(data["runs"]):
        types = ", ".join(
            f"{name.removeprefix('builtins.')} {count:.0f}"
            for name, count in census["gc_tracked_types_per_trigger"].items()
            if count >= 2
        )
        tasks = ", ".join(
            f"`{name}`" for name, count in census.get("tasks_per_trigger", {}).items() if count >= 0.9
        )
        out += [
            f"What one waiting trigger on the {source_of(census)} source keeps (N = {census['n']:,}), "
            f"objects by type: {types}." + (f" Tasks per waiting trigger: {tasks}." if tasks else ""),
            "",
        ]
    return out


def _censuses(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One run per source with an object census: at N = 1,000 with ``gc.freeze()`` when there is one."""
    from benchmarks.waiting import source_of

    chosen: dict[str, dict[str, Any]] = {}
    for run in sorted(runs, key=lambda r: (r["n"], bool(r.get("gc_freeze"))) != (1000, True)):
        if run.get("gc_tracked_types_per_trigger"):
            chosen.setdefault(source_of(run), run)
    return list(chosen.values())


def fleet_section(fleet: dict[str, Any]) -> list[str]:
    runs = fleet["runs"]
    first = next(iter(runs.values()))
    out = [
        "### Fleet under the account ceiling",
        "",
        f"{first['n']:,} decision triggers (`on_request`) in {first['processes']} triggerer processes on one "
        f"account at the public limits (burst 5, 60 starts a minute); time {first['factor']:.0f}{TIMES} "
        "faster with every binding limit scaled, figures in real-limit units. A decision counts as "
        f"on a superseded state when its source had a newer line {fleet['grace_s']:.1f} s before it "
        "started; a wait is from a line to the first decision start covering it, against its fair wait "
        "(the time its process's half of the ceiling, dealt evenly over the triggers of the process "
        "with an undecided line at each moment, takes to add up to one start; in brackets: the "
        "account's ceiling over the whole fleet's such triggers). The bound on that ratio is for "
        "the run without a filter, where every trigger competes for starts; with `decide_when` only "
        "a few lines wait at any moment, their fair wait is a fraction of one Retry-After, and "
        "the targets are the latency and the bill.",
        "",
    ]
    header = [
        "run",
        "decisive → event p50",
        "p99",
        "billed ÷ decisive",
        "on superseded states",
        "429s heard / refused",
        "longest wait for a start",
        "longest ÷ fair share",
    ]
    rows = [
        [
            "decide_when" if r.get("decide_when") else "no filter",
            fmt_ms(r["latency"]["p50_ms"]),
            fmt_ms(r["latency"]["p99_ms"]),
            fmt_num(r["billed_per_decisive"], 2),
            r["decisions_on_superseded_states"],
            f"{r['rate_limited_429s_heard']} / {r['rate_limited_429s_refused']}",
            f"{r['longest_wait_for_start_s']:,.0f} s",
            f"{fmt_num(r['fair_share_ratio_max'], 2)} ({fmt_num(r.get('fleet_fair_share_ratio_max'), 2)})"
            + ("" if r.get("decide_when") else f"; bound {fleet['fair_share_bound']:.0f}"),
        ]
        for r in runs.values()
    ]
    return out + md_table(header, rows)


def _met(ok: bool | None) -> str:
    return DASH if ok is None else ("met" if ok else "**missed**")


def _versus_ideal(run: dict[str, Any]) -> str:
    ideal = f"{run['ideal_last_decisive_to_event_s']:,.1f} s"
    if run["last_vs_ideal"] is None:
        return f"{run['not_fired']} of {run['fired'] + run['not_fired']} never fired (ideal: {ideal})"
    return f"{run['last_decisive_to_event_s']:,.1f} s ÷ {ideal} = {fmt_num(run['last_vs_ideal'], 2)}"


def ceiling_section(ceiling: dict[str, Any], fleet: dict[str, Any] | None = None) -> list[str]:
    """The issue's table: each figure's target, the run of the code before (``before``) and this one.

    :param ceiling: the ceiling scenario's result.
    :param fleet: the fleet scenario's result of the same run (its ``decide_when`` row), if any.
    """
    runs, before, targets = ceiling["runs"], ceiling.get("before") or {}, ceiling["targets"]
    commit = ceiling.get("before_commit")
    out = [
        "### The account's decision ceiling, spent fully",
        "",
        "One process: 12, 100 and 1,000 decision triggers with their defaults (`on_change`, no "
        "`decide_when`, `lease_after` 0.5 s), each on a file that gains an initial line, a "
        '"still working" line 2 s later and "Job is ready." 3 s after that, at the published '
        f"account limits (burst 5, 60 starts a minute); 12 in real time, 100 and 1,000 {TIMES}20 faster "
        "with every binding limit scaled (figures in real-limit units). The ideal is the schedule the "
        "published budget allows for the same lines: the bucket full at the first line, a start the "
        "moment a token is there for the trigger whose newest undecided line waited longest, decided "
        "at once. Shared: 2 and 4 triggerer processes of 60 triggers each, every file gaining a line "
        "about every 10 s (each process always has more to decide than its share), measured over "
        "the window after a warm-up; a process's share of its fair share is its accepted starts ÷ "
        "(the account's ÷ the processes)."
        + (f" 'Before' is this scenario run against commit `{commit}`." if commit else ""),
        "",
    ]

    rows: list[list[str]] = []

    def row(label: str, target: str, then: Any, now: Any, show: Any, ok: bool) -> None:
        rows.append([label, target, DASH if not then else show(then), show(now), _met(ok)])

    for name, label in (("one_12", "12"), ("one_100", "100"), ("one_1000", "1,000")):
        run, then = runs.get(name), before.get(name)
        if run is None:
            continue
        limit = targets["rate_limited_per_accepted_one"]
        row(
            f"one process, {label} sensors: 429s per accepted start",
            f"≤ {limit}",
            then,
            run,
            lambda r: fmt_num(r["rate_limited_per_accepted"], 2),
            run["rate_limited_per_accepted"] <= limit,
        )
        limit = targets["last_vs_ideal"]
        row(
            f"one process, {label} sensors: last decisive line → event ÷ ideal",
            f"≤ {limit} {TIMES}",
            then,
            run,
            _versus_ideal,
            run["last_vs_ideal"] is not None and run["last_vs_ideal"] <= limit,
        )
        row(
            f"one process, {label} sensors: 1013 closes",
            "0",
            then,
            run,
            lambda r: str(r["closes_1013"]),
            run["closes_1013"] == 0,
        )
    for name, label in (("shared_2", "two"), ("shared_4", "four")):
        run, then = runs.get(name), before.get(name)
        if run is None:
            continue
        limit = targets["worst_fair_share"]
        row(
            f"{label} processes: worst process's share of its fair share (ceiling used)",
            f"≥ {limit:.0%}",
            then,
            run,
            lambda r: f"{r['worst_fair_share']:.0%} ({r['ceiling_used']:.0%})",
            run["worst_fair_share"] >= limit,
        )
        limit = targets["rate_limited_per_accepted_shared"]
        row(
            f"{label} processes: 429s per accepted start (1013 closes)",
            f"≤ {limit}",
            then,
            run,
            lambda r: f"{fmt_num(r['rate_limited_per_accepted'], 2)} ({r['closes_1013']})",
            run["rate_limited_per_accepted"] <= limit,
        )
    filtered = ((fleet or {}).get("runs") or {}).get("decide_when")
    if filtered:
        lat = filtered["latency"]
        row(
            "`decide_when`, 1,000 sensors in two processes (the fleet scenario): p50 / p99 / billed ÷ decisive",
            "≤ 2 s / ≤ 15 s / ≤ 1.1",
            before.get("fleet_decide_when"),
            filtered,
            lambda r: (
                f"{fmt_ms(r['latency']['p50_ms'])} / {fmt_ms(r['latency']['p99_ms'])} / "
                f"{fmt_num(r['billed_per_decisive'], 2)}"
            ),
            lat["p50_ms"] <= 2000 and lat["p99_ms"] <= 15000 and filtered["billed_per_decisive"] <= 1.1,
        )
    return out + md_table(["figure", "target", "before", "after", ""], rows)
