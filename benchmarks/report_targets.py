"""The target table of the results page: each target, its figure, met or missed, and why.

Computed from the JSON document of one run (and its baseline, for before → after); the
explanation of a missed target quotes that run's own numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from benchmarks.report_format import (
    DASH,
    FIGURES,
    MET,
    MISSED,
    TIMES,
    fmt_ms,
    fmt_range_ms,
    latency_figure,
    with_unit,
)
from benchmarks.report_latency import wake_phrase

__all__ = ["load_note", "target_rows", "waiting_target_rows"]

#: The warm push figures a missed target explains with what the same run measured around them.
WARM_FIGURES = ("push_p50_ms", "push_p99_ms")


def load_note(doc: dict[str, Any], scenario: str) -> str:
    """A sentence about other load on the machine, when there was enough to stretch stalls.

    The load average after a run counts the run's own processes (a triggerer and an emulator,
    up to about a core between them in the crowds), so it speaks of other load only above the
    number of cores; the load before the run speaks of it above half of them. A scenario the
    document kept from an earlier run gets no sentence: this run's load says nothing of it.

    :param doc: the results document.
    :param scenario: the scenario whose figure the sentence explains.
    """
    if scenario in doc.get("kept_from", {}):
        return ""
    m = doc["machine"]
    cores = m.get("cores_usable") or m.get("cores") or 1
    before = m.get("load_average_before", [0])[0]
    after = m.get("load_average_after", [0])[0]
    load = max(before if before > cores / 2 else 0, after if after > cores else 0)
    if not load:
        return ""
    return (
        f" The machine's load average reached {load:.1f} on {cores} cores during the run (other processes "
        "competing for the CPU), which also shows up as stalls: the loop waits for a core."
    )


def _warm_why(lat: dict[str, Any], key: str = "p50_ms") -> str:
    """What the same run measured around a missed warm figure, at the same percentile (``key``):
    the floor, the emulator's own share and the same path without the idle gap; for the p50 also
    how far it moved within the run and how much slower Python ran just after a wake."""
    warm = lat.get("warm") or {}
    block = warm.get("blocks") or {}
    blocks = (block.get("p50_ms") or []) if key == "p50_ms" else []
    parts = [
        f"the loopback floor {fmt_ms(value)}"
        if (value := (lat.get("loopback_floor") or {}).get(key)) is not None
        else "",
        f"the emulator's own handling of the change {fmt_ms(value)}"
        if (value := (warm.get("gateway") or {}).get(key)) is not None
        else "",
        f"the same path back to back (no idle gap before the change) {fmt_ms(value)}"
        if (value := (lat.get("warm_back_to_back") or {}).get(key)) is not None
        else "",
        f"the warm p50 of each {block.get('samples')} samples in turn {fmt_range_ms(blocks)}"
        if blocks
        else "",
        wake_phrase(lat) if key == "p50_ms" else "",
    ]
    shown = [part for part in parts if part]
    where = "at the median" if key == "p50_ms" else f"at the {key.removesuffix('_ms')}"
    return f" In the same run, {where}: {'; '.join(shown)}." if shown else ""


def _crowd_why(lat: dict[str, Any], base: dict[str, Any], kind: str) -> str:
    """What the same run measured around a missed crowd figure: the CPU the triggers' process and
    the emulator used over the changes, beside the baseline run's for the same work (the
    emulator's code is the gateway's stand-in: its share rising with the client's says the host
    ran slower), and the emulator's longest collector pause, which every decision due waits out."""
    crowd = (lat.get("crowds") or {}).get(kind) or {}
    then = (base.get("crowds") or {}).get(kind) or {}
    if "change_phase_cpu_pct" not in crowd:
        return ""

    def shares(run: dict[str, Any]) -> str:
        return (
            f"{run['change_phase_cpu_pct']:.1f} % of a core (triggers) and "
            f"{run['change_phase_emulator_cpu_pct']:.1f} % (emulator)"
        )

    text = f" In the same run, over the changes: {shares(crowd)}"
    if "change_phase_cpu_pct" in then:
        text += f", against {shares(then)} for the same changes in the baseline run"
    pause = (crowd.get("emulator_collections") or {}).get("longest_ms")
    if pause is not None:
        text += f"; the emulator's longest collector pause {fmt_ms(pause)}"
    return text + "."


def target_rows(doc: dict[str, Any]) -> tuple[list[list[Any]], list[str]]:
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
                after, before = latency_figure(lat, name), latency_figure(base, name)
                ok = lat["figures_met"][name]
                shown = (
                    with_unit(after, unit)
                    if not base
                    else f"{with_unit(before, unit)} → {with_unit(after, unit)}"
                )
                rows.append([label, target, shown, MET if ok else MISSED])
                if not ok:
                    if name in WARM_FIGURES:
                        why = _warm_why(lat, name.removeprefix("push_"))
                    elif "_crowd_" in name:
                        why = _crowd_why(lat, base, name.split("_crowd_")[0])
                    else:
                        why = ""
                    latency_missed.append(f"{figure}: {target}, measured {with_unit(after, unit)}.{why}")
            if latency_missed:
                latency_missed[-1] += load_note(doc, "latency")
            missed += latency_missed
        else:
            warm = lat["warm"]
            for key, target in (("p50_ms", lat["targets"]["p50_ms"]), ("p99_ms", lat["targets"]["p99_ms"])):
                ok = warm[key] <= target
                rows.append(
                    [
                        "Change → event, push source, warm stream",
                        f"{key[:3]} ≤ {target:.0f} ms",
                        fmt_ms(warm[key]),
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

        def bounded(name: str, label: str, show: Callable[[float], str]) -> tuple[float, list[float], bool]:
            """A row for a figure bounded by its target, for every N: (target, values, met)."""
            target = den["targets"][name]
            values = [r[name] for r in runs]
            ok = all(v <= target for v in values)
            rows.append(
                ["", label.format(target=target), cells(lambda r: show(r[name])), MET if ok else MISSED]
            )
            return target, values, ok

        target, rss, rss_ok = bounded(
            "rss_per_trigger_kb", "RSS per waiting trigger ≤ {target:.0f} KB", lambda v: f"{v:.1f} KB"
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
        _, idle, idle_ok = bounded(
            "idle_cpu_per_1000_pct",
            "idle CPU per 1000 waiting triggers ≤ {target:.0f} % of a core",
            lambda v: f"{v:.2f} %",
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
                cells(lambda r: fmt_ms(r["longest_stall_ms"]))
                + " (without garbage collection: "
                + cells(lambda r: fmt_ms(r["longest_stall_without_gc_ms"]))
                + ")",
                MET if stall_ok else MISSED,
            ]
        )
        if not stall_ok:
            worst = max(runs, key=lambda r: r["longest_stall_ms"])
            base_gc = [r["full_gc_ms_baseline"] for r in runs]
            no_gc_ok = all(v < target for v in no_gc)
            missed.append(
                f"The longest event-loop stall is {fmt_ms(worst['longest_stall_ms'])} (N = {worst['n']}), "
                f"{fmt_ms(worst['longest_stall_ms'] - target)} over the target. "
                + (
                    "Every stall over the target was a full garbage collection: "
                    if no_gc_ok
                    else "Part of it is garbage collection: "
                )
                + f"one full collection of the triggerer process takes {min(base_gc):.0f}{DASH}{max(base_gc):.0f} ms "
                "before any trigger exists (the Airflow import alone is about 200,000 objects) and "
                f"{worst['full_gc_ms_waiting']:.0f} ms with {worst['n']} waiting triggers. "
                f"Without the collector's share the longest stall is {fmt_ms(max(no_gc))}."
                + load_note(doc, "density")
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


def waiting_target_rows(doc: dict[str, Any]) -> list[list[Any]]:
    """The waiting-trigger and append figures: figure, target, before, after, met or missed.

    The waiting rows come per source (:data:`benchmarks.waiting.SOURCES`); each row's 'before' is
    the baseline's group of the same source, N and collector setting.
    """
    from benchmarks.waiting import SOURCE_SIZES, SOURCES, TARGETS, group

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
        source: str,
        strict: bool = False,
        then_name: str | None = None,
        judged: bool = True,
    ) -> None:
        # frozen None: a figure the collector setting does not change; as Airflow leaves it if measured
        # then_name: the before run's name for the figure, where it was measured under another name
        settings = (False, True) if frozen is None else (frozen,)
        now = next((g for f in settings if (g := group(after, n, f, source)) is not None), None)
        then = next((g for f in settings if (g := group(before, n, f, source)) is not None), None)
        if then is not None and name in then:
            then_name = None  # the before run measured it under the same name
        if then is not None and (then_name or name) not in then:
            then = None
        value = None if now is None or name not in now else now[name]
        if value is None and then is None:
            return  # neither run measured it (a source measured at one N only)
        ok = value is not None and (value < limit if strict else value <= limit)
        verdict = "not measured" if value is None else (MET if ok else MISSED) if judged else ""
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
        names = {
            "push": "push source",
            "file": "file source (notifications)",
            "push-queue": "push source through a queue",
        }
        for source in SOURCES:
            on = f"{names.get(source, source)}: "
            sizes = SOURCE_SIZES.get(source, (1000, 5000))
            for n in sizes:
                row(
                    f"{on}RSS per waiting trigger, N = {n:,}",
                    f"≤ {TARGETS['rss_per_trigger_kb']:.0f} KB",
                    "rss_per_trigger_kb",
                    n,
                    None,
                    kb,
                    TARGETS["rss_per_trigger_kb"],
                    source,
                )
            row(
                f"{on}objects tracked by the collector per waiting trigger (N = 1,000)",
                f"≤ {TARGETS['gc_tracked_per_trigger']:.0f}",
                "gc_tracked_per_trigger",
                1000,
                None,
                count,
                TARGETS["gc_tracked_per_trigger"],
                source,
            )
            # with gc.freeze() a collection with no trigger costs almost nothing, so the figure is the
            # triggers' own; as Airflow leaves it, it is the difference of two ~150 ms collections,
            # whose noise is larger than the target
            row(
                f"{on}full-GC time (CPU) added by 1,000 waiting triggers, `gc.freeze()` after start-up",
                f"≤ {TARGETS['full_gc_ms_added_per_1000']:.0f} ms",
                "full_gc_ms_added_per_1000",
                1000,
                True,
                fmt_ms,
                TARGETS["full_gc_ms_added_per_1000"],
                source,
            )
            row(
                f"{DASH} the same, collector as Airflow leaves it (a difference of two ~150 ms collections: "
                "not judged, its noise is larger than the target)",
                DASH,
                "full_gc_ms_added_per_1000",
                1000,
                False,
                fmt_ms,
                TARGETS["full_gc_ms_added_per_1000"],
                source,
                judged=False,
            )
            if 5000 not in sizes:
                continue
            # the waiting phase (a quiet window with one full collection); before, one figure covered
            # start-up and the quiet window together, and its longest stall was always in start-up
            for phase, label, then_name in (
                ("waiting", "while 5,000 triggers wait, one full collection included", None),
                ("startup", "while 5,000 triggers start (to their first decision)", "longest_stall_ms"),
            ):
                row(
                    f"{on}longest event-loop stall {label}, `gc.freeze()` after start-up (production setting)",
                    f"< {TARGETS['longest_stall_ms']:.0f} ms",
                    f"{phase}_stall_ms",
                    5000,
                    True,
                    fmt_ms,
                    TARGETS["longest_stall_ms"],
                    source,
                    strict=True,
                    then_name=then_name,
                )
                row(
                    f"{DASH} the same, collector as Airflow leaves it",
                    f"< {TARGETS['longest_stall_ms']:.0f} ms",
                    f"{phase}_stall_ms",
                    5000,
                    False,
                    fmt_ms,
                    TARGETS["longest_stall_ms"],
                    source,
                    strict=True,
                    then_name=then_name,
                )
            row(
                f"{on}idle CPU, N = 5,000",
                f"≤ {TARGETS['idle_cpu_pct']:.0f} % of a core",
                "idle_cpu_pct",
                5000,
                None,
                cpu,
                TARGETS["idle_cpu_pct"],
                source,
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
