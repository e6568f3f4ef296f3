"""Scenario 1's section of the results page: change → event latency per source, the push and
file crowds, and the poke baseline (see :mod:`benchmarks.latency`)."""

from __future__ import annotations

from typing import Any

from benchmarks.report_format import DASH, TIMES, at_path, fmt_ms, fmt_range_ms, md_table, with_unit

__all__ = ["SHARED", "latency_section", "wake_phrase"]


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
        ("push source, back to back", "warm stream, no idle gap before the change", "warm_back_to_back"),
        (
            "none: the loopback floor, back to back",
            "a bare websockets echo round trip, no idle gap",
            "loopback_floor_back_to_back",
        ),
        (f"push source, {SHARED}", "warm stream", ("shared_cores", "warm")),
        (
            f"none: the loopback floor, {SHARED}",
            "a bare websockets echo round trip",
            ("shared_cores", "loopback_floor"),
        ),
    ]
    rows = []
    for source, case, key in cases:
        data = at_path(lat, key)
        if not data:
            continue
        before = _before(base, key)
        cells = [
            f"{fmt_ms(before.get(k))} → {fmt_ms(data[k])}" if base else fmt_ms(data[k])
            for k in ("p50_ms", "p95_ms", "p99_ms", "max_ms")
        ]
        rows.append([source, case, data["n"], *cells])
    return rows


#: How the rows measured with the emulator free to share the client's cores are labelled.
SHARED = "the emulator sharing the client's cores"


#: Where a baseline that ran before the emulator had a CPU of its own keeps each shared-cores
#: figure: it measured everything with the emulator sharing the cores.
_SHARED_BEFORE: dict[tuple[str, ...], tuple[str, ...]] = {
    ("shared_cores", "warm"): ("warm",),
    ("shared_cores", "loopback_floor"): ("loopback_floor",),
    ("shared_cores", "push_crowd"): ("crowds", "push"),
}


def _before(base: dict[str, Any], key: str | tuple[str, ...]) -> dict[str, Any]:
    """The baseline's figures for a row (see :data:`_SHARED_BEFORE`)."""
    if "cores" not in base and isinstance(key, tuple) and key in _SHARED_BEFORE:
        key = _SHARED_BEFORE[key]
    return at_path(base, key) or {}


def _crowd_rows(lat: dict[str, Any], base: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for kind, label in (
        (("crowds", "push"), "push source"),
        (("crowds", "file"), "file source, notifications"),
        (("crowds", "file-poll"), "file source, polled every 1 s"),
        (("shared_cores", "push_crowd"), f"push source, {SHARED}"),
    ):
        data = at_path(lat, kind)
        if not data:
            continue
        before = _before(base, kind)
        if kind[-1] == "file" and base and not base.get("file_notifications", True):
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
                pair(lambda d: d.get("latency", {}).get("p50_ms"), fmt_ms),
                pair(lambda d: d.get("latency", {}).get("p99_ms"), fmt_ms),
                pair(lambda d: d.get("latency", {}).get("max_ms"), fmt_ms),
                pair(lambda d: d.get("idle_cpu_per_1000_pct"), lambda v: with_unit(v, "%")),
                f"{watching.get('inotify_descriptors', DASH)} / {watching.get('watched_directories', DASH)}",
                watching.get("threads", DASH),
                fmt_ms((data.get("emulator_collections") or {}).get("longest_ms")),
            ]
        )
    return rows


def wake_phrase(lat: dict[str, Any]) -> str:
    """How much slower the same run's fixed piece of Python went just after a reply woke the
    process than back to back (measured beside the loopback floor), or ``""`` when not measured."""
    wake = (lat.get("loopback_floor") or {}).get("python_after_wake")
    if not wake:
        return ""
    return (
        f"a fixed piece of Python (one frame decoded, 100 small calls) took {wake['woken_p50_us']:.1f} µs "
        f"just after a reply woke the process, against {wake['hot_p50_us']:.1f} µs back to back "
        f"({wake['ratio']:.1f}{TIMES})"
    )


def _inside_warm(lat: dict[str, Any]) -> list[str]:
    """How far the warm figures move within the run, and how much of them the gateway's stand-in
    spent handling the change (when the run measured it)."""
    cases = (("warm", "with the idle gap"), ("warm_back_to_back", "back to back"))
    spread = [
        f"{label} {fmt_range_ms(blocks['p50_ms'])} ({len(blocks['p50_ms'])} "
        f"block{'s' if len(blocks['p50_ms']) != 1 else ''} of {blocks['samples']})"
        for key, label in cases
        if (blocks := (lat.get(key) or {}).get("blocks")) and blocks["p50_ms"]
    ]
    gateway = [
        f"{label} p50 {fmt_ms(share['p50_ms'])} (CPU {fmt_ms(share['cpu_p50_ms'])}), "
        f"p99 {fmt_ms(share['p99_ms'])}"
        for key, label in cases
        if (share := (lat.get(key) or {}).get("gateway"))
    ]
    lines = []
    if spread:
        lines.append(
            "The push source's warm p50 over each block of samples in turn: " + "; ".join(spread) + "."
        )
    if gateway:
        lines.append(
            "Of a warm change's round trip, the emulator's own handling of the change (in its process, "
            "from taking the frame to the return of the write of the ack and the decision) took "
            + "; ".join(gateway)
            + ". That part is the gateway's stand-in, not the provider: a real gateway's would replace it."
        )
    if wake := wake_phrase(lat):
        lines.append(
            f"Beside the loopback floor, {wake}. The client handles a change and its decision, and "
            "the emulator the change, right after such wakes."
        )
    return [" ".join(lines), ""] if lines else []


def _cores_sentence(lat: dict[str, Any]) -> str:
    """How the run placed the emulator and the client on the machine's CPUs."""
    if not lat.get("cores"):
        return (
            " The emulator and the triggers' process shared the CPUs (the machine gave this run one, "
            "or the code measured predates giving the emulator a CPU of its own)."
        )
    return (
        " The emulator runs on a CPU of its own and the triggers' process on the others; the row "
        f"'{SHARED}' is the push crowd again with both left to the operating system, which puts "
        "them on one core, where they take turns."
    )


def latency_section(lat: dict[str, Any], base: dict[str, Any] | None = None) -> list[str]:
    base = base or {}
    out = ["### 1. Change → event latency", ""]
    if base:
        out += ["Each cell: before → after (the earlier run is named under the target table).", ""]
    out += md_table(["source", "case", "samples", "p50", "p95", "p99", "max"], _source_rows(lat, base))
    out += _inside_warm(lat)
    crowd = _crowd_rows(lat, base)
    if crowd:
        out += [
            "Crowds: N triggers in one process, each source changing twice at random moments over 30 s "
            "(the second change decisive), at most 4 streams open at once; idle CPU is the waiting "
            "triggers' share of one core above the same process with none; the last columns are what "
            "watches the files (inotify descriptors / watched directories, and the process's threads). "
            "The emulator, in its own process, freezes what it holds before the changes begin, so its "
            "collector does not rescan the N streams' states inside the window; the last column is its "
            "longest remaining collector pause there, which every decision due meanwhile waits out."
            + _cores_sentence(lat),
            "",
        ]
        out += md_table(
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
                "emulator's longest GC pause",
            ],
            crowd,
        )
    rows = []
    for base in lat["poke_baselines"]:
        rows.append(
            [
                f"{base['poke_interval_s']:.0f} s",
                fmt_ms(base["p50_ms"]),
                fmt_ms(base["p99_ms"]),
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
    out += md_table(
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
        f"{fmt_ms(check['measured']['p50_ms'])} and p99 {fmt_ms(check['measured']['p99_ms'])} over "
        f"{check['measured']['n']} changes; the model gives {fmt_ms(check['model_p50_ms'])} and "
        f"{fmt_ms(check['model_p99_ms'])}.",
        "",
    ]
    return out
