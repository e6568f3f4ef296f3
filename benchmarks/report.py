"""The results as Markdown: ``benchmarks/results/latest.md``, every figure of one run (the written page
``docs/benchmarks-results.md`` takes its runs of record from it).

Everything here is computed from the JSON document of one run; the explanation of a missed
target quotes that run's own numbers.
"""

from __future__ import annotations

import math
from typing import Any

from benchmarks import sharing, watchers
from benchmarks.report_format import (
    DASH,
    TIMES,
    fmt_duration,
    fmt_ms,
    fmt_num,
    md_table,
)
from benchmarks.report_latency import SHARED, latency_section
from benchmarks.report_scale import ceiling_section, density_section, fleet_section, waiting_section
from benchmarks.report_targets import target_rows, waiting_target_rows

__all__ = ["render", "summary"]


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
    return md_table(["Machine", ""], rows)


def _instructions(counted: dict[str, Any] | None, before: dict[str, Any] | None, client: str) -> str:
    """A client's instructions per cold change, in millions (before → after with a baseline)."""
    now = (counted or {}).get(client)
    if now is None:
        return DASH
    after = f"{now['instructions_per_change'] / 1e6:.2f} M"
    then = (before or {}).get(client)
    return after if then is None else f"{then['instructions_per_change'] / 1e6:.2f} M → {after}"


def _cold(cold: dict[str, Any], base: dict[str, Any] | None = None) -> list[str]:
    """The CPU of one cold change (:mod:`benchmarks.cold_cost`): what each change of a crowd costs,
    and its instruction count (:mod:`benchmarks.instructions`) when valgrind counted it."""
    provider, alone = cold["provider"], cold["websockets_alone"]
    counted, before = cold.get("instructions"), (base or {}).get("instructions")
    clients = [
        ("provider", "the provider's trigger, run by Airflow's `TriggerRunner`", provider),
        (
            "stream_alone",
            "the hook's stream alone: entered, first decision, closed",
            cold.get("stream_alone"),
        ),
        ("websockets_alone", "websockets' client alone: connect, `hello`, `start`, decision, close", alone),
    ]
    header = ["client", "client CPU per change", "emulator CPU per change", "streams opened"]
    if counted:
        header.append("client instructions per change" + (" (before → after)" if before else ""))
    rows = [
        [name, fmt_ms(data["cpu_ms"]), fmt_ms(data["emulator_cpu_ms"]), fmt_num(data["streams_opened"])]
        + ([_instructions(counted, before, key)] if counted else [])
        for key, name, data in clients
        if data is not None
    ]
    ratio = cold.get("provider_vs_websockets")
    counting = []
    if counted:
        changes = next(iter(counted.values()))["changes"]
        counting = [
            f"Instructions: valgrind's callgrind counted the client process's user-space instructions "
            f"over {changes} more cold changes per client (the trigger's harness polling taken out), "
            "switched on for the measured changes only (`python -m benchmarks.instructions`). Unlike "
            f"CPU time, which moves 10{DASH}15 % between runs on a virtual machine, the count is the same "
            "from run to run, so it shows the provider's own work changing"
            + (f", against commit `{base.get('commit')}` before." if before and base.get("commit") else ".")
            + " It leaves out the kernel's work for the system calls and the emulator.",
            "",
        ]
    return [
        "### CPU of one cold change",
        "",
        f"{cold['n']} cold changes per client, one at a time. The trigger's go to a dormant trigger (a "
        "progress line: it opens a stream, replays its state, takes the decision and gives the stream "
        f"back {cold['lease_after_s'] * 1000:.0f} ms later); the other two clients each open a "
        "connection about a new state, take its decision and close"
        + (
            f", {cold['lease_after_s'] * 1000:.0f} ms apart like the trigger's changes (a process "
            "idle between changes, as in a crowd, finds its caches cold; back to back the same "
            "exchange costs less)"
            if cold.get("spaced")
            else ""
        )
        + ". Client CPU is the benchmark process's, less its "
        f"own polling and idling ({fmt_ms(provider['harness_polls_ms'])} per trigger change, measured "
        "alone); the emulator's is its own process's. In a crowd every change is cold: this, times "
        "the change rate, is the CPU the slowest changes queue behind.",
        "",
        *md_table(header, rows),
        *(
            [
                f"The provider spends {ratio:.1f}{TIMES} the client CPU of websockets alone per cold change.",
                "",
            ]
            if ratio
            else []
        ),
        *counting,
    ]


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
    out += md_table(["log", "case", "distinct states", "billed", "replayed (unbilled)", "added"], rows)
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
    out += md_table(
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
        out += md_table(["knobs", "billed", "READY decided after"], rows)
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
        ["event after the writer stopped", fmt_ms(ing["catch_up_s"] * 1000)],
        ["trigger process CPU", f"{ing['trigger_cpu_pct']:.0f} % of a core"],
        [
            "longest event-loop stall",
            f"{fmt_ms(stalls['longest_ms'])} (without GC {fmt_ms(stalls['longest_without_gc_ms'])})",
        ],
    ]
    out += md_table(["", ""], rows)
    return out


def _core(cor: dict[str, Any]) -> list[str]:
    out = ["### 5. Protocol core", ""]
    rows = [
        [r["message"], r["bytes"], f"{r['encode_us']:.1f} µs", f"{r['decode_us']:.1f} µs"]
        for r in cor["codec"]
    ]
    out += md_table(["message", "bytes", "encode", "decode"], rows)
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
    out += md_table(
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
        out += md_table(
            ["state bytes", "client, all of it", "body + key", "concatenation", "planning", "the rest"], rows
        )
    return out


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
        f"{fmt_duration(doc['duration_s'])}.",
        "",
    ]
    lines += _machine(doc)
    rows, missed = target_rows(doc)
    lines += ["### Targets", ""]
    lines += md_table(["scenario", "target", "result", ""], rows)
    baseline = doc.get("baseline")
    if baseline:
        lines += [
            f"Before → after: the latency figures' 'before' is a run of commit `{baseline.get('commit')}` "
            f"on {str(baseline.get('started_at'))[:10]} (load average "
            f"{(baseline.get('load_average') or [math.nan])[0]:.1f}), where a file source polled.",
            "",
        ]
        lat = doc["results"].get("latency") or {}
        if lat.get("cores") and "cores" not in (baseline.get("latency") or {}):
            cores = lat["cores"]
            lines += [
                f"That run let the emulator share the client's cores; this one gave the emulator CPU "
                f"{cores['emulator'][0]} and the client the others ({', '.join(map(str, cores['measured']))}), "
                "as a remote gateway would not take the triggerer's CPU. So part of a latency row's "
                f"change is the setting: the rows '{SHARED}' in the tables below measure this code the "
                "way the 'before' was measured.",
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
    waiting_rows = waiting_target_rows(doc)
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
        appends = (baseline or {}).get("append_from")
        if appends and origin and appends.get("commit") != origin.get("commit"):
            lines += [
                f"The append rows' 'before' is a run of commit `{appends.get('commit')}` "
                f"({str(appends.get('started_at'))[:16].replace('T', ' ')} UTC).",
                "",
            ]
        lines += md_table(["figure", "target", "before", "after", ""], waiting_rows)
        then_groups = ((baseline or {}).get("waiting") or {}).get("groups", [])
        combined = bool(then_groups) and not any("startup_stall_ms" in g for g in then_groups)
        lines += [
            "The stall rows cover one phase each (scenario 6 below): *while 5,000 triggers wait* is a 5 s "
            "window in which the loop runs one full collection, as the collector does whenever its "
            "threshold trips; *while they start* runs from the first trigger handed over until all have "
            "had their first decision."
            + (
                " 'Before' had one figure for both, and its longest stall was in start-up in every run, "
                "so it is shown on the start-up rows."
                if combined
                else ""
            ),
            "",
        ]
    res = doc["results"]
    for name, section in (
        ("latency", latency_section),
        ("cold", _cold),
        ("density", density_section),
        ("billing", _billing),
        ("ingest", _ingest),
        ("core", _core),
        ("waiting", waiting_section),
        ("fleet", fleet_section),
        ("ceiling", ceiling_section),
        ("sharing", sharing.section),
        ("watchers", watchers.section),
    ):
        data = res.get(name)
        if data is None:
            continue
        if "error" in data:
            lines += [f"### {name}", "", f"This scenario failed: `{data['error']}`.", ""]
            continue
        if name == "latency":
            lines += latency_section(data, (doc.get("baseline") or {}).get("latency"))
        elif name == "ceiling":
            lines += ceiling_section(data, res.get("fleet"))
        elif name == "cold":
            baseline = doc.get("baseline") or {}
            lines += _cold(data, {**(baseline.get("cold") or {}), **(baseline.get("cold_from") or {})})
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
    rows, missed = target_rows(doc)
    width = max((len(r[1]) for r in rows), default=10)
    text = [f"{r[1]:<{width}}  {r[2]}  [{r[3].strip('*')}]" for r in rows]
    text += [
        f"{r[0]}: {r[2]} -> {r[3]} (target {r[1]}) [{r[4].strip('*') or '-'}]"
        for r in waiting_target_rows(doc)
    ]
    return "\n".join(text + [f"missed: {m}" for m in missed])
