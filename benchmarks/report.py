"""The results as Markdown: ``docs/benchmarks-results.md``, included by ``docs/benchmarks.md``.

Everything here is computed from the JSON document of one run; the explanation of a missed
target quotes that run's own numbers.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["render", "summary"]

MET = "met"
#: En dash and multiplication sign, spelled as escapes to keep the source ASCII-unambiguous.
DASH = "\u2013"
TIMES = "\u00d7"
MISSED = "**missed**"


def _num(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return DASH
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _ms(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return DASH
    if value >= 10_000:
        return f"{value / 1000:,.1f} s"
    return f"{value:,.1f} ms"


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return [*lines, ""]


def _duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


def _load_note(doc: dict[str, Any]) -> str:
    """A sentence about other load on the machine, when there was enough to stretch stalls."""
    m = doc["machine"]
    load = max(m.get("load_average_before", [0])[0], m.get("load_average_after", [0])[0])
    cores = m.get("cores_usable") or m.get("cores") or 1
    if load <= cores / 2:
        return ""
    return (
        f" The machine's load average reached {load:.1f} on {cores} cores during the run (other processes "
        "competing for the CPU), which also shows up as stalls: the loop waits for a core."
    )


def _targets(doc: dict[str, Any]) -> tuple[list[list[Any]], list[str]]:
    """The target table's rows, and a sentence for every target missed."""
    res = doc["results"]
    rows: list[list[Any]] = []
    missed: list[str] = []

    lat = res.get("latency")
    if lat and "error" not in lat:
        base = (doc.get("baseline") or {}).get("latency") or {}
        if "figure_targets" in lat:
            figure = ""
            latency_missed = []
            for label, target, name, unit in FIGURES:
                figure = label or figure
                after, before = _figure(lat, name), _figure(base, name)
                ok = lat["figures_met"][name]
                shown = _unit(after, unit) if not base else f"{_unit(before, unit)} → {_unit(after, unit)}"
                rows.append([label, target, shown, MET if ok else MISSED])
                if not ok:
                    latency_missed.append(f"{figure}: {target}, measured {_unit(after, unit)}.")
            if latency_missed:
                latency_missed[-1] += _load_note(doc)
            missed += latency_missed
        else:
            warm = lat["warm"]
            for key, target in (("p50_ms", lat["targets"]["p50_ms"]), ("p99_ms", lat["targets"]["p99_ms"])):
                ok = warm[key] <= target
                rows.append(
                    [
                        "Change → event, push source, warm stream",
                        f"{key[:3]} ≤ {target:.0f} ms",
                        _ms(warm[key]),
                        MET if ok else MISSED,
                    ]
                )

    den = res.get("density")
    if den and "error" not in den:
        runs = den["runs"]
        ns = " / ".join(str(r["n"]) for r in runs)
        # the same N of the baseline's density run, when it has one: each cell reads "before → after"
        then = {r["n"]: r for r in ((doc.get("baseline") or {}).get("density") or {}).get("runs", [])}

        def cells(figure: Any) -> str:
            now = " / ".join(figure(r) for r in runs)
            if not all(r["n"] in then for r in runs):
                return now
            return " / ".join(figure(then[r["n"]]) for r in runs) + " → " + now

        sockets_ok = all(
            r["max_sockets_open"] <= r["max_streams_per_process"]
            and r["emulator_max_streams_open"] <= r["max_streams_per_process"]
            for r in runs
        )
        rows.append(
            [
                f"Triggerer density (N = {ns})",
                f"sockets open ≤ max_streams_per_process ({runs[0]['max_streams_per_process']})",
                cells(lambda r: str(max(r["max_sockets_open"], r["emulator_max_streams_open"]))),
                MET if sockets_ok else MISSED,
            ]
        )
        if not sockets_ok:
            missed.append("More sockets were open at once than max_streams_per_process allows.")
        target = den["targets"]["rss_per_trigger_kb"]
        rss = [r["rss_per_trigger_kb"] for r in runs]
        rss_ok = all(v <= target for v in rss)
        rows.append(
            [
                "",
                f"RSS per waiting trigger ≤ {target:.0f} KB",
                cells(lambda r: f"{r['rss_per_trigger_kb']:.1f} KB"),
                MET if rss_ok else MISSED,
            ]
        )
        if not rss_ok:
            mem = den.get("memory_breakdown", {})
            parts = ", ".join(
                f"{owner} {kb:.1f} KB" for owner, kb in mem.get("kb_per_trigger", {}).items() if kb >= 0.05
            )
            missed.append(
                f"RSS per waiting trigger is {min(rss):.1f}{DASH}{max(rss):.1f} KB, {max(rss) - target:.1f} KB over the "
                f"{target:.0f} KB target at worst. The Python objects a waiting trigger keeps add up to "
                f"{mem.get('total_kb_per_trigger', math.nan):.1f} KB ({parts}; measured with tracemalloc), "
                "and RSS adds allocator slack from the connections each trigger opened and closed on the way."
            )
        target = den["targets"]["idle_cpu_per_1000_pct"]
        idle = [r["idle_cpu_per_1000_pct"] for r in runs]
        idle_ok = all(v <= target for v in idle)
        rows.append(
            [
                "",
                f"idle CPU per 1000 waiting triggers ≤ {target:.0f} % of a core",
                cells(lambda r: f"{r['idle_cpu_per_1000_pct']:.2f} %"),
                MET if idle_ok else MISSED,
            ]
        )
        if not idle_ok:
            missed.append(f"Idle CPU per 1000 waiting triggers reaches {max(idle):.2f} % of a core.")
        target = den["targets"]["longest_stall_ms"]
        stall = [r["longest_stall_ms"] for r in runs]
        no_gc = [r["longest_stall_without_gc_ms"] for r in runs]
        stall_ok = all(v < target for v in stall)
        rows.append(
            [
                "",
                f"longest event-loop stall < {target:.0f} ms",
                cells(lambda r: _ms(r["longest_stall_ms"]))
                + " (without garbage collection: "
                + cells(lambda r: _ms(r["longest_stall_without_gc_ms"]))
                + ")",
                MET if stall_ok else MISSED,
            ]
        )
        if not stall_ok:
            worst = max(runs, key=lambda r: r["longest_stall_ms"])
            base_gc = [r["full_gc_ms_baseline"] for r in runs]
            no_gc_ok = all(v < target for v in no_gc)
            missed.append(
                f"The longest event-loop stall is {_ms(worst['longest_stall_ms'])} (N = {worst['n']}), "
                f"{_ms(worst['longest_stall_ms'] - target)} over the target. "
                + (
                    "Every stall over the target was a full garbage collection: "
                    if no_gc_ok
                    else "Part of it is garbage collection: "
                )
                + f"one full collection of the triggerer process takes {min(base_gc):.0f}{DASH}{max(base_gc):.0f} ms "
                "before any trigger exists (the Airflow import alone is about 200,000 objects) and "
                f"{worst['full_gc_ms_waiting']:.0f} ms with {worst['n']} waiting triggers. "
                f"Without the collector's share the longest stall is {_ms(max(no_gc))}." + _load_note(doc)
            )

    bil = res.get("billing")
    if bil and "error" not in bil:
        for case, added in bil["restart_added"].items():
            ok = added == 0
            rows.append(
                [
                    "Billing (busy log)",
                    f"billed decisions added: {case} = 0",
                    str(added),
                    MET if ok else MISSED,
                ]
            )
            if not ok:
                missed.append(f"A {case} added {added} billed decisions.")
        target = bil.get("decide_when_target")
        if target:
            ok = target["met"]
            rows.append(
                [
                    "",
                    f"decide_when billed ≤ 1/{round(1 / target['share'])} of the 30 s poke's",
                    f"{target['billed']} ({target.get('billed_with_initial', '?')} with the initial "
                    f"decision) vs {target['poke_30s_billed']}",
                    MET if ok else MISSED,
                ]
            )
            if not ok:
                missed.append(
                    f"decide_when billed {target['billed']} decisions, more than "
                    f"{target['share']:.0%} of the 30 s poke's {target['poke_30s_billed']}."
                )

    ing = res.get("ingest")
    if ing and "error" not in ing:
        ok = ing["rejections"] == 0
        rows.append(
            [
                "Ingest (10,000 lines/s)",
                "event_rate_limited rejections = 0",
                str(ing["rejections"]),
                MET if ok else MISSED,
            ]
        )
        if not ok:
            missed.append(f"The gateway rejected {ing['rejections']} mutations during ingest.")
        ok = ing["events_peak_1s"] <= ing["bucket_peak_1s"]
        rows.append(
            [
                "",
                f"events on the wire ≤ the limit ({ing['limit_events_per_s']}/s, burst "
                f"{ing['limit_event_burst']})",
                f"{ing['events_per_s_mean']:.2f}/s mean, {ing['events_per_s_after_burst']:.2f}/s after the "
                f"burst; at most {ing['events_peak_1s']} in any second",
                MET if ok else MISSED,
            ]
        )
        ok = ing["byte_identical"]
        rows.append(
            [
                "",
                "gateway's final state byte-identical to the source",
                "yes" if ok else "no",
                MET if ok else MISSED,
            ]
        )
        if not ok:
            missed.append("The gateway's final state differs from the file.")

    cor = res.get("core")
    if cor and "error" not in cor:
        budget = cor["budget"]
        ok = budget["codec_cpu_pct_at_limits"] < 5 and budget["change_cpu_pct_at_limits_1kb"] < 5
        rows.append(
            [
                "Protocol core",
                "never the bottleneck (CPU at the protocol's own limits)",
                f"codec {budget['codec_cpu_pct_at_limits']:.2f} %, client side of the changes "
                f"{budget['change_cpu_pct_at_limits_1kb']:.2f} % (1 KB state) / "
                f"{budget['change_cpu_pct_at_limits_1mb']:.1f} % (1 MB state) of a core",
                MET if ok else MISSED,
            ]
        )
        if not ok:
            missed.append("The protocol core costs more than 5 % of a core at the protocol's limits.")
    return rows, missed


def _waiting_rows(doc: dict[str, Any]) -> list[list[Any]]:
    """The waiting-trigger and append figures: figure, target, before, after, met or missed."""
    from benchmarks.waiting import TARGETS, group

    res = doc["results"]
    base = doc.get("baseline") or {}
    after, before = res.get("waiting") or {}, base.get("waiting") or {}
    rows: list[list[Any]] = []

    def row(
        label: str,
        target: str,
        name: str,
        n: int,
        frozen: bool | None,
        fmt: Any,
        limit: float,
        strict: bool = False,
        then_name: str | None = None,
    ) -> None:
        # frozen None: a figure the collector setting does not change; as Airflow leaves it if measured
        # then_name: the before run's name for the figure, where it was measured under another name
        settings = (False, True) if frozen is None else (frozen,)
        now = next((g for f in settings if (g := group(after, n, f)) is not None), None)
        then = next((g for f in settings if (g := group(before, n, f)) is not None), None)
        if then is not None and (then_name or name) not in then:
            then = None
        value = None if now is None or name not in now else now[name]
        ok = value is not None and (value < limit if strict else value <= limit)
        verdict = "not measured" if value is None else MET if ok else MISSED
        rows.append(
            [
                label,
                target,
                DASH if then is None else fmt(then[then_name or name]),
                DASH if value is None else fmt(value),
                verdict,
            ]
        )

    if after and "error" not in after:
        kb, count, cpu = (lambda v: f"{v:.1f} KB"), (lambda v: f"{v:.0f}"), (lambda v: f"{v:.2f} %")
        for n in (1000, 5000):
            row(
                f"RSS per waiting trigger, N = {n:,}",
                f"≤ {TARGETS['rss_per_trigger_kb']:.0f} KB",
                "rss_per_trigger_kb",
                n,
                None,
                kb,
                TARGETS["rss_per_trigger_kb"],
            )
        row(
            "objects tracked by the collector per waiting trigger (N = 1,000)",
            f"≤ {TARGETS['gc_tracked_per_trigger']:.0f}",
            "gc_tracked_per_trigger",
            1000,
            None,
            count,
            TARGETS["gc_tracked_per_trigger"],
        )
        row(
            "full-GC time (CPU) added by 1,000 waiting triggers",
            f"≤ {TARGETS['full_gc_ms_added_per_1000']:.0f} ms",
            "full_gc_ms_added_per_1000",
            1000,
            None,
            _ms,
            TARGETS["full_gc_ms_added_per_1000"],
        )
        # the waiting phase (a quiet window with one full collection); before, one figure covered
        # start-up and the quiet window together, and its longest stall was always in start-up
        for phase, label, then_name in (
            ("waiting", "while 5,000 triggers wait, one full collection included", None),
            ("startup", "while 5,000 triggers start (to their first decision)", "longest_stall_ms"),
        ):
            row(
                f"longest event-loop stall {label}, `gc.freeze()` after start-up (production setting)",
                f"< {TARGETS['longest_stall_ms']:.0f} ms",
                f"{phase}_stall_ms",
                5000,
                True,
                _ms,
                TARGETS["longest_stall_ms"],
                strict=True,
                then_name=then_name,
            )
            row(
                f"{DASH} the same, collector as Airflow leaves it",
                f"< {TARGETS['longest_stall_ms']:.0f} ms",
                f"{phase}_stall_ms",
                5000,
                False,
                _ms,
                TARGETS["longest_stall_ms"],
                strict=True,
                then_name=then_name,
            )
        row(
            "idle CPU, N = 5,000",
            f"≤ {TARGETS['idle_cpu_pct']:.0f} % of a core",
            "idle_cpu_pct",
            5000,
            None,
            cpu,
            TARGETS["idle_cpu_pct"],
        )
    now = (res.get("core") or {}).get("append_cost")
    then = base.get("append_cost")
    if now:

        def us(value: float) -> str:
            return f"{value / 1000:.3f} ms"

        def big(cost: dict[str, Any] | None, name: str) -> Any:
            return None if not cost else cost["rows"][-1][name]

        def shown(value: Any, fmt: Any) -> str:
            return DASH if value is None else fmt(value)

        limit = TARGETS["append_body_key_us_4mb"]
        rows.append(
            [
                "client CPU per 100-byte append to a 4 MB text state: body + key",
                f"≤ {limit / 1000:.1f} ms",
                shown(big(then, "body_key_us"), us),
                us(big(now, "body_key_us")),
                MET if big(now, "body_key_us") <= limit else MISSED,
            ]
        )
        for part, label in (
            ("concatenation_us", "the new state: appended piece kept apart, or concatenation (not targeted)"),
            ("planning_us", "mutation planning: appended pieces, or a prefix check (not targeted)"),
            ("rest_us", "the rest, by difference (floored at 0): validation, frames, ack, decision, freeing"),
            ("client_us_per_append", "client CPU per append, all of it"),
        ):
            rows.append([f"{DASH} {label}", DASH, shown(big(then, part), us), us(big(now, part)), ""])
        ratio = TARGETS["append_ratio_4mb_to_1kb"]
        rows.append(
            [
                "client CPU per append, 4 MB ÷ 1 KB state (all of it)",
                f"≤ {ratio:.0f}{TIMES}",
                shown(None if not then else then["ratio_4mb_to_1kb"], lambda v: f"{v:.1f}{TIMES}"),
                f"{now['ratio_4mb_to_1kb']:.1f}{TIMES}",
                MET if now["ratio_4mb_to_1kb"] <= ratio else MISSED,
            ]
        )
        rows.append(
            [
                f"{DASH} body + key alone, 4 MB ÷ 1 KB (not targeted)",
                DASH,
                shown(None if not then else then["body_key_ratio_4mb_to_1kb"], lambda v: f"{v:.1f}{TIMES}"),
                f"{now['body_key_ratio_4mb_to_1kb']:.1f}{TIMES}",
                "",
            ]
        )
    return rows


#: The latency figures of the target table: label (naming the source), target, figure, unit.
FIGURES = [
    ("Change → event, file source on notifications, one trigger", "p50 ≤ 10 ms", "file_p50_ms", "ms"),
    ("", "p99 ≤ 30 ms", "file_p99_ms", "ms"),
    (
        "1,000 triggers tailing 1,000 files (notifications), 66 changes/s",
        "p50 ≤ 15 ms",
        "file_crowd_p50_ms",
        "ms",
    ),
    ("", "p99 ≤ 50 ms", "file_crowd_p99_ms", "ms"),
    ("", "inotify descriptors: O(1)", "file_crowd_inotify_descriptors", ""),
    ("", "idle CPU ≤ 2 % of a core", "file_crowd_idle_cpu_pct", "%"),
    ("Change → event, push source, warm stream", "p50 ≤ 1.5 ms", "push_p50_ms", "ms"),
    ("", "p99 ≤ 5 ms", "push_p99_ms", "ms"),
    ("1,000 triggers on push sources, 66 changes/s", "p99 ≤ 10 ms", "push_crowd_p99_ms", "ms"),
    ("", "max ≤ 30 ms", "push_crowd_max_ms", "ms"),
]
#: Where each figure is in the latency results (a run of code without file notifications polled
#: its files: its ``file`` figures are polling's).
_FIGURE_PATHS = {
    "file_p50_ms": ("file_warm", "p50_ms"),
    "file_p99_ms": ("file_warm", "p99_ms"),
    "file_crowd_p50_ms": ("crowds", "file", "latency", "p50_ms"),
    "file_crowd_p99_ms": ("crowds", "file", "latency", "p99_ms"),
    "file_crowd_inotify_descriptors": ("crowds", "file", "watching", "inotify_descriptors"),
    "file_crowd_idle_cpu_pct": ("crowds", "file", "idle_cpu_per_1000_pct"),
    "push_p50_ms": ("warm", "p50_ms"),
    "push_p99_ms": ("warm", "p99_ms"),
    "push_crowd_p99_ms": ("crowds", "push", "latency", "p99_ms"),
    "push_crowd_max_ms": ("crowds", "push", "latency", "max_ms"),
}


def _figure(lat: dict[str, Any], name: str) -> Any:
    value: Any = lat
    for key in _FIGURE_PATHS[name]:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _unit(value: Any, unit: str) -> str:
    if value is None:
        return DASH
    if unit == "ms":
        return _ms(value)
    if unit == "%":
        return f"{value:.2f} %"
    return _num(value)


def _machine(doc: dict[str, Any]) -> list[str]:
    m = doc["machine"]
    before, after = m.get("load_average_before", [math.nan]), m.get("load_average_after", [math.nan])
    rows = [
        ["CPU", f"{m['cpu']} — {m['cores']} cores ({m['cores_usable']} usable)"],
        ["RAM", f"{m['ram_gib']} GiB"],
        ["OS", m["os"]],
        ["Python", f"{m['python']} ({m['python_implementation']})"],
        ["Apache Airflow", m["airflow"]],
        ["websockets", m["websockets"]],
        ["airflow-provider-systemzero", f"{m['provider']} (commit `{m['commit']}`)"],
        ["Load average (1 min) before / after", f"{before[0]:.2f} / {after[0]:.2f}"],
    ]
    return _table(["Machine", ""], rows)


def _source_rows(lat: dict[str, Any], base: dict[str, Any]) -> list[list[Any]]:
    """One row per (source, case): samples, p50, p95, p99, max — with the earlier run's beside them."""
    polled = "" if lat.get("file_notifications", True) else " (polled: no notifications in this code)"
    cases = [
        ("push source", "warm stream (held after its last decision)", "warm"),
        ("push source", "cold stream (given back; reconnect and replay)", "cold"),
        ("file source, notifications" + polled, "warm stream", "file_warm"),
        ("file source, notifications" + polled, "cold stream", "file_cold"),
        ("file source, polled every 1 s", "warm stream", "file_poll"),
        ("none: one poke", "the hook's sync `decide()`", "poke_decide"),
        ("none: the loopback floor", "a bare websockets echo round trip", "loopback_floor"),
    ]
    rows = []
    for source, case, key in cases:
        data = lat.get(key)
        if not data:
            continue
        before = base.get(key) or {}
        cells = [
            f"{_ms(before.get(k))} → {_ms(data[k])}" if base else _ms(data[k])
            for k in ("p50_ms", "p95_ms", "p99_ms", "max_ms")
        ]
        rows.append([source, case, data["n"], *cells])
    return rows


def _crowd_rows(lat: dict[str, Any], base: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for kind, label in (
        ("push", "push source"),
        ("file", "file source, notifications"),
        ("file-poll", "file source, polled every 1 s"),
    ):
        data = lat.get("crowds", {}).get(kind)
        if not data:
            continue
        before = (base.get("crowds") or {}).get(kind) or {}
        if kind == "file" and base and not base.get("file_notifications", True):
            label += " (before: polled)"

        def pair(get: Any, fmt: Any, data: dict[str, Any] = data, before: dict[str, Any] = before) -> str:
            now = fmt(get(data))
            return f"{fmt(get(before))} → {now}" if before else now

        watching = data.get("watching", {})
        rows.append(
            [
                label,
                data["n"],
                f"{data['changes_per_s']:.0f}/s",
                pair(lambda d: d.get("latency", {}).get("p50_ms"), _ms),
                pair(lambda d: d.get("latency", {}).get("p99_ms"), _ms),
                pair(lambda d: d.get("latency", {}).get("max_ms"), _ms),
                pair(lambda d: d.get("idle_cpu_per_1000_pct"), lambda v: _unit(v, "%")),
                f"{watching.get('inotify_descriptors', DASH)} / {watching.get('watched_directories', DASH)}",
                watching.get("threads", DASH),
            ]
        )
    return rows


def _latency(lat: dict[str, Any], base: dict[str, Any] | None = None) -> list[str]:
    base = base or {}
    out = ["### 1. Change → event latency", ""]
    if base:
        out += ["Each cell: before → after (the earlier run is named under the target table).", ""]
    out += _table(["source", "case", "samples", "p50", "p95", "p99", "max"], _source_rows(lat, base))
    crowd = _crowd_rows(lat, base)
    if crowd:
        out += [
            "Crowds: N triggers in one process, each source changing twice at random moments over 30 s "
            "(the second change decisive), at most 4 streams open at once; idle CPU is the waiting "
            "triggers' share of one core above the same process with none; the last columns are what "
            "watches the files (inotify descriptors / watched directories, and the process's threads).",
            "",
        ]
        out += _table(
            [
                "source",
                "N",
                "changes",
                "p50",
                "p99",
                "max",
                "idle CPU per 1,000",
                "inotify fds / dirs",
                "threads",
            ],
            crowd,
        )
    rows = []
    for base in lat["poke_baselines"]:
        rows.append(
            [
                f"{base['poke_interval_s']:.0f} s",
                _ms(base["p50_ms"]),
                _ms(base["p99_ms"]),
                f"{base['ratio_p50_vs_warm']:,.0f}{TIMES}",
                f"{base['ratio_p99_vs_warm']:,.0f}{TIMES}",
                f"{base['ratio_p50_vs_cold']:,.0f}{TIMES}",
            ]
        )
    out += [
        "Poke baseline (a sensor calling `decide()` every `poke_interval`, reading its source at each "
        "poke), from the measured decide time; the ratios are to the push source's warm and cold figures:",
        "",
    ]
    out += _table(
        [
            "poke_interval",
            "p50",
            "p99",
            "p50 ÷ push warm p50",
            "p99 ÷ push warm p99",
            "p50 ÷ push cold p50",
        ],
        rows,
    )
    check = lat["poke_model_check"]
    out += [
        f"Model check: real poke loops at {check['poke_interval_s']} s measured p50 "
        f"{_ms(check['measured']['p50_ms'])} and p99 {_ms(check['measured']['p99_ms'])} over "
        f"{check['measured']['n']} changes; the model gives {_ms(check['model_p50_ms'])} and "
        f"{_ms(check['model_p99_ms'])}.",
        "",
    ]
    return out


def _density(den: dict[str, Any]) -> list[str]:
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
                f"{_ms(lat['p50_ms'])} / {_ms(lat['p95_ms'])}",
                f"{_ms(r['longest_stall_ms'])} ({_ms(r['longest_stall_without_gc_ms'])})",
                f"{r['full_gc_ms_baseline']:.0f} / {r['full_gc_ms_waiting']:.0f} ms",
                f"{r['change_phase_cpu_pct']:.0f} %",
            ]
        )
    out += _table(
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
        out += _table(["charged to", "per trigger"], rows)
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


def _billing(bil: dict[str, Any]) -> list[str]:
    out = ["### 3. Billing", ""]
    rows = [
        [r["log"], r["case"], r["distinct_states"], r["billed"], r["replayed"], r["added"]]
        for r in bil["trigger"]
    ]
    out += [
        f"Trigger (`on_change`), {bil['simulated_minutes']:.0f} simulated minutes, "
        f"{bil['scale']:.0f}{TIMES} faster than real time:",
        "",
    ]
    out += _table(["log", "case", "distinct states", "billed", "replayed (unbilled)", "added"], rows)
    rows = [
        [
            r["log"],
            f"{r['poke_interval_s']:.0f} s",
            "per-state keys" if r["keyed"] else "none",
            r["pokes"],
            r["billed"],
            r["replayed"],
            f"{r['detected_after_s']:.0f} s",
        ]
        for r in bil["poke"]
    ]
    out += ["Poking sensor, same logs:", ""]
    out += _table(
        [
            "log",
            "poke_interval",
            "idempotency keys",
            "pokes",
            "billed",
            "replayed (unbilled)",
            "READY seen after",
        ],
        rows,
    )
    if bil.get("filters"):
        rows = [
            [
                r["case"],
                r["billed"],
                "n/a" if r["decided_after_s"] is None else f"{r['decided_after_s']:.1f} s",
            ]
            for r in bil["filters"]
        ]
        out += [
            "Decision filters, busy log (the trigger; simulated seconds from the READY line to the event, "
            f"so each real millisecond counts {bil['scale']:.0f} ms):",
            "",
        ]
        out += _table(["knobs", "billed", "READY decided after"], rows)
    return out


def _ingest(ing: dict[str, Any]) -> list[str]:
    out = ["### 4. Ingest", ""]
    stalls = ing["stalls"]
    rows = [
        ["lines written", f"{ing['lines']:,} ({ing['line_bytes']} bytes each) in {ing['seconds']:.0f} s"],
        ["state at the end", f"{ing['state_bytes']:,} bytes"],
        [
            "mutations accepted",
            f"{ing['events_accepted']} ({ing['lines_per_event']:,.0f} lines each on average)",
        ],
        [
            "mutations per second",
            f"{ing['events_per_s_mean']:.2f} mean, {ing['events_per_s_after_burst']:.2f} "
            f"after the burst, at most {ing['events_peak_1s']} in any second",
        ],
        ["rejections (event_rate_limited and any other)", ing["rejections"]],
        [
            "gateway's final state",
            f"{ing['gateway_state_bytes']:,} bytes, "
            + ("byte-identical to the file" if ing["byte_identical"] else "DIFFERS"),
        ],
        ["decisions billed", ing["decisions_billed"]],
        ["event after the writer stopped", _ms(ing["catch_up_s"] * 1000)],
        ["trigger process CPU", f"{ing['trigger_cpu_pct']:.0f} % of a core"],
        [
            "longest event-loop stall",
            f"{_ms(stalls['longest_ms'])} (without GC {_ms(stalls['longest_without_gc_ms'])})",
        ],
    ]
    out += _table(["", ""], rows)
    return out


def _core(cor: dict[str, Any]) -> list[str]:
    out = ["### 5. Protocol core", ""]
    rows = [
        [r["message"], r["bytes"], f"{r['encode_us']:.1f} µs", f"{r['decode_us']:.1f} µs"]
        for r in cor["codec"]
    ]
    out += _table(["message", "bytes", "encode", "decode"], rows)
    rows = [
        [
            f"{r['state_bytes']:,}",
            f"{r['us_per_change']:,.0f} µs",
            f"{r['client_us_per_change']:,.0f} µs",
            f"{r['changes_per_s_one_core']:,.0f}",
            f"{r['set_desired_us']:,.0f} µs",
        ]
        for r in cor["change_round_trip"]
    ]
    out += [
        "One change (a 20-byte append) through both state machines — the client's `append_text` and "
        "`data_to_send`, the gateway's accept, ack and dispatch, the client reading the ack and the "
        "decision — and, last column, what a trigger's source pays instead of `append_text`: "
        "`set_desired` with the whole new state:",
        "",
    ]
    out += _table(
        [
            "state bytes",
            "per change",
            "of which the client",
            "changes per second on one core",
            "client `set_desired`",
        ],
        rows,
    )
    budget = cor["budget"]
    out += [
        f"At the protocol's own limits ({budget['max_streams_per_process']} streams {TIMES} "
        f"{budget['max_messages_per_second']} messages/s, {budget['max_events_per_second']} changes/s each) "
        f"the codec costs {budget['codec_cpu_pct_at_limits']:.2f} % of a core, and the client's side of the "
        f"changes {budget['change_cpu_pct_at_limits_1kb']:.2f} % with 1 KB states, "
        f"{budget['change_cpu_pct_at_limits_1mb']:.1f} % with 1 MB states.",
        "",
    ]
    appends = cor.get("append_cost")
    if appends:
        rows = [
            [
                f"{r['state_bytes']:,}",
                *(
                    f"{r[k]:,.1f} µs"
                    for k in (
                        "client_us_per_append",
                        "body_key_us",
                        "concatenation_us",
                        "planning_us",
                        "rest_us",
                    )
                ),
            ]
            for r in appends["rows"]
        ]
        origin = appends.get("measured")
        out += [
            "Client CPU per 100-byte `append_text` (CPU time, medians), split as described above"
            + (
                f" (measured {str(origin['started_at'])[:10]} at commit `{origin['commit']}`)"
                if origin
                else ""
            )
            + ":",
            "",
        ]
        out += _table(
            ["state bytes", "client, all of it", "body + key", "concatenation", "planning", "the rest"], rows
        )
    return out


def _waiting(data: dict[str, Any]) -> list[str]:
    """Scenario 6: one row per N and collector setting, then what a waiting trigger keeps."""
    out = ["### 6. Waiting triggers at scale", ""]
    rows = [
        [
            f"{g['n']:,}",
            "`gc.freeze()` after start-up" if g["gc_freeze"] else "as Airflow leaves it",
            g["repeats"],
            f"{g['rss_per_trigger_kb']:.1f} KB",
            f"{g['gc_tracked_per_trigger']:.0f}",
            _ms(g["full_gc_ms_baseline"]),
            _ms(g["full_gc_ms_waiting"]),
            _ms(g["full_gc_ms_added_per_1000"]),
            *(
                f"{_ms(g[f'{phase}_stall_ms'])} ({_ms(g[f'{phase}_stall_without_gc_ms'])})"
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
        "has had its first decision and given its stream back.",
        "",
    ]
    out += _table(
        [
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
    census = next((r for r in data["runs"] if r.get("gc_tracked_types_per_trigger")), None)
    if census:
        types = ", ".join(
            f"{name.removeprefix('builtins.')} {count:.0f}"
            for name, count in census["gc_tracked_types_per_trigger"].items()
            if count >= 2
        )
        tasks = ", ".join(
            f"`{name}`" for name, count in census.get("tasks_per_trigger", {}).items() if count >= 0.9
        )
        out += [
            f"What one waiting trigger keeps (N = {census['n']:,}), objects by type: {types}."
            + (f" Tasks per waiting trigger: {tasks}." if tasks else ""),
            "",
        ]
    return out


def _fleet(fleet: dict[str, Any]) -> list[str]:
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
            _ms(r["latency"]["p50_ms"]),
            _ms(r["latency"]["p99_ms"]),
            _num(r["billed_per_decisive"], 2),
            r["decisions_on_superseded_states"],
            f"{r['rate_limited_429s_heard']} / {r['rate_limited_429s_refused']}",
            f"{r['longest_wait_for_start_s']:,.0f} s",
            f"{_num(r['fair_share_ratio_max'], 2)} ({_num(r.get('fleet_fair_share_ratio_max'), 2)})"
            + ("" if r.get("decide_when") else f"; bound {fleet['fair_share_bound']:.0f}"),
        ]
        for r in runs.values()
    ]
    return out + _table(header, rows)


def render(doc: dict[str, Any], source: str = "benchmarks/results/latest.json") -> str:
    """The Markdown for ``docs/benchmarks-results.md``.

    :param doc: the JSON document of a run.
    :param source: where that document was written (named in the header comment).
    """
    m = doc["machine"]
    kind = "smoke run (`--quick`)" if doc["options"]["quick"] else "full run"
    if doc.get("kept_from"):
        ran = [name for name in doc["results"] if name not in doc["kept_from"]]
        kind = f"{', '.join(ran)} (the other scenarios are kept from earlier runs, each named below)"
    lines = [
        f"<!-- Generated by `make bench` (python -m benchmarks) from {source}. Do not edit by hand. -->",
        "",
        f"Measured {doc['started_at'][:10]} at commit `{m['commit']}`: {kind}, "
        f"{_duration(doc['duration_s'])}.",
        "",
    ]
    lines += _machine(doc)
    rows, missed = _targets(doc)
    lines += ["### Targets", ""]
    lines += _table(["scenario", "target", "result", ""], rows)
    baseline = doc.get("baseline")
    if baseline:
        lines += [
            f"Before → after: the latency figures' 'before' is a run of commit `{baseline.get('commit')}` "
            f"on {str(baseline.get('started_at'))[:10]} (load average "
            f"{(baseline.get('load_average') or [math.nan])[0]:.1f}), where a file source polled.",
            "",
        ]
        density_from = baseline.get("density_from")
        if density_from and (res := doc["results"].get("density")) and "error" not in res:
            lines += [
                f"The triggerer-density cells read before → after: 'before' is a run of commit "
                f"`{density_from.get('commit')}` on {str(density_from.get('started_at'))[:10]}.",
                "",
            ]
    if missed:
        lines += ["Missed, by how much and why:", ""] + [f"- {m}" for m in missed] + [""]
    waiting_rows = _waiting_rows(doc)
    if waiting_rows:
        lines += ["### Waiting triggers and appends, before → after", ""]
        origin = (baseline or {}).get("waiting_from")
        if origin:
            load = origin.get("load_average")
            lines += [
                f"'Before' is the same benchmark code run against commit `{origin.get('commit')}` "
                f"({str(origin.get('started_at'))[:16].replace('T', ' ')} UTC"
                + (f", load average {load[0]:.1f} on 2 cores" if load else "")
                + "); each figure is a median of repeats.",
                "",
            ]
        lines += _table(["figure", "target", "before", "after", ""], waiting_rows)
        lines += [
            "The stall rows cover one phase each (scenario 6 below): *while 5,000 triggers wait* is a 5 s "
            "window in which the loop runs one full collection, as the collector does whenever its "
            "threshold trips; *while they start* runs from the first trigger handed over until all have "
            "had their first decision. 'Before' had one figure for both, and its longest stall was in "
            "start-up in every run, so it is shown on the start-up rows.",
            "",
        ]
    res = doc["results"]
    for name, section in (
        ("latency", _latency),
        ("density", _density),
        ("billing", _billing),
        ("ingest", _ingest),
        ("core", _core),
        ("waiting", _waiting),
        ("fleet", _fleet),
    ):
        data = res.get(name)
        if data is None:
            continue
        if "error" in data:
            lines += [f"### {name}", "", f"This scenario failed: `{data['error']}`.", ""]
            continue
        if name == "latency":
            lines += _latency(data, (doc.get("baseline") or {}).get("latency"))
        else:
            lines += section(data)
        origin = doc.get("kept_from", {}).get(name)
        if origin:
            lines += [
                f"*(Kept from the run of {str(origin.get('started_at'))[:10]} at commit "
                f"`{origin.get('commit')}`: this scenario was not run this time.)*",
                "",
            ]
    return "\n".join(lines).rstrip() + "\n"


def summary(doc: dict[str, Any]) -> str:
    """A plain-text summary of the target table for the terminal."""
    rows, missed = _targets(doc)
    width = max((len(r[1]) for r in rows), default=10)
    text = [f"{r[1]:<{width}}  {r[2]}  [{r[3].strip('*')}]" for r in rows]
    text += [
        f"{r[0]}: {r[2]} -> {r[3]} (target {r[1]}) [{r[4].strip('*') or '-'}]" for r in _waiting_rows(doc)
    ]
    return "\n".join(text + [f"missed: {m}" for m in missed])
