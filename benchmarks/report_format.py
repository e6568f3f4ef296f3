"""How the results pages write a figure: numbers, milliseconds, tables, and where each latency
figure is found in a run's results (:mod:`benchmarks.report` and :mod:`benchmarks.report_targets`)."""

from __future__ import annotations

import math
from typing import Any

__all__ = [
    "DASH",
    "FIGURES",
    "FIGURE_PATHS",
    "MET",
    "MISSED",
    "TIMES",
    "fmt_duration",
    "fmt_ms",
    "fmt_num",
    "fmt_range_ms",
    "latency_figure",
    "md_table",
    "with_unit",
]

MET = "met"


#: En dash and multiplication sign, spelled as escapes to keep the source ASCII-unambiguous.
DASH = "\u2013"


TIMES = "\u00d7"


MISSED = "**missed**"


def fmt_num(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return DASH
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def fmt_ms(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return DASH
    if value >= 10_000:
        return f"{value / 1000:,.1f} s"
    return f"{value:,.1f} ms"


def fmt_range_ms(values: list[float]) -> str:
    """``low–high`` in milliseconds (:func:`fmt_ms`), or the one value when they read the same."""
    low, high = fmt_ms(min(values)), fmt_ms(max(values))
    return low if low == high else f"{low}{DASH}{high}"


def md_table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return [*lines, ""]


def fmt_duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


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
FIGURE_PATHS = {
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


def at_path(results: Any, path: str | tuple[str, ...]) -> Any:
    """``results[path]``, or along a path of keys; ``None`` where a key is missing."""
    value = results
    for key in (path,) if isinstance(path, str) else path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def latency_figure(lat: dict[str, Any], name: str) -> Any:
    return at_path(lat, FIGURE_PATHS[name])


def with_unit(value: Any, unit: str) -> str:
    if value is None:
        return DASH
    if unit == "ms":
        return fmt_ms(value)
    if unit == "%":
        return f"{value:.2f} %"
    return fmt_num(value)
