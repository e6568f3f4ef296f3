"""The "Decision timeline" page: a decision history drawn as one HTML page, with no script.

Given the rows of a ``decisions`` XCom (or of an asset event), :func:`render_page` draws, for each
question, a chart of the probability (circles) and the confidence (diamonds) of every decision
over time, with the condition's bars across it, the markers (state changes, billed starts,
reconnects, the stream given back …) as vertical lines and the decision that ended the wait
ringed; then the table of the same rows, in the order they happened, each with why, in the words
of the task's log, and the state it was about as a person can follow it: its number in the wait
(``State #``, the state's generation, which goes on across streams) beside the gateway's
``state_version`` (which starts again with each stream). The chart is inline SVG built here, so
the page works in the sandboxed frame Airflow's UI shows plugin views in (no script runs there),
and each point and row carries its numbers as ``data-`` attributes. Every word it shows is
explained in the sensor's documentation (*Decision timeline*).

Pure: no Airflow, no FastAPI, no I/O; every text shown is escaped (answers and replies come from
the gateway).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Any

from airflow_provider_systemzero.decisions.timeline import (
    DISPOSITIONS,
    ENDING_DISPOSITIONS,
    MARKS,
    iso_time,
    parse_time,
)
from airflow_provider_systemzero.plugins.timeline_rows import drawable_stories, page_text

__all__ = ["Story", "data_text", "render_page"]

log = logging.getLogger(__name__)

#: The chart's size and the plot's margins, in SVG units.
WIDTH, HEIGHT = 960, 300
LEFT, RIGHT, TOP, BOTTOM = 56, 132, 24, 40
#: The shortest time span drawn (seconds): rows at one instant are drawn in the middle of it.
MIN_SPAN = 1.0
#: The share of the span left free before the first row and after the last.
PADDING = 0.04

#: Ring colour of the decision that ended the wait, by disposition.
_ENDING_COLOURS = {
    "fired": "#15803d",
    "decided": "#15803d",
    "review": "#b45309",
    "failed": "#b91c1c",
    "unmet": "#b91c1c",
    "skipped": "#6b7280",
}
#: What the table says for each marker kind.
_MARK_LABELS = {
    "state_change": "state changed",
    "billed_start": "billed start",
    "reconnect": "reconnect",
    "stream_opened": "stream opened",
    "stream_released": "stream given back",
    "hold_met": "hold rule met",
    "review_answered": "review answered",
    "review_outdated": "answer about a replaced state",
    "review_superseded": "review closed: state moved on",
    "review_timed_out": "review timed out",
}

_STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Liberation Sans",sans-serif;color:#1f2328;
margin:16px 20px;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:18px 0 6px}h3{font-size:14px;margin:12px 0 4px}
.sub{color:#57606a;margin:0 0 10px}.summary{margin:8px 0;padding:8px 12px;background:#f6f8fa;border-radius:6px}
.note{margin:8px 0;padding:8px 12px;background:#fff8c5;border-radius:6px}
svg.chart{display:block;max-width:100%;height:auto;border:1px solid #d0d7de;border-radius:6px;background:#fff}
.axis{stroke:#8c959f;stroke-width:1}.grid{stroke:#eaeef2;stroke-width:1}
.tick{font-size:11px;fill:#57606a}.label{font-size:11px}
.p-line{fill:none;stroke:#1f6feb;stroke-width:1.5;opacity:.55}
.c-line{fill:none;stroke:#d97706;stroke-width:1.5;opacity:.55}
circle.probability{fill:#1f6feb;stroke:#1f6feb;stroke-width:1.5}
path.confidence{fill:#d97706;stroke:#d97706;stroke-width:1.5}
g.other circle.probability,g.other path.confidence{fill:#fff}
line.bar{stroke-width:1.5;stroke-dasharray:6 4}.bar-probability{stroke:#1f6feb}.bar-confidence{stroke:#d97706}
.bar-policy{stroke:#6e7781;stroke-dasharray:2 3}
line.mark{stroke-width:1.2}.mark-state_change{stroke:#8c959f;stroke-dasharray:2 3}
.mark-billed_start{stroke:#15803d}.mark-reconnect{stroke:#cf222e;stroke-dasharray:5 3}
.mark-stream_opened,.mark-stream_released{stroke:#bf8700;stroke-dasharray:1 3}.mark-hold_met{stroke:#8250df}
.mark-other{stroke:#57606a;stroke-dasharray:1 2}
ul.legend{list-style:none;padding:0;margin:6px 0 0;display:flex;flex-wrap:wrap;gap:4px 18px;color:#57606a;font-size:12px}
ul.legend svg{vertical-align:middle;margin-right:4px}
table.rows{border-collapse:collapse;margin-top:12px;font-size:13px;width:100%}
table.rows th,table.rows td{border-bottom:1px solid #d0d7de;padding:4px 8px;text-align:left;vertical-align:top}
table.rows th{background:#f6f8fa;position:sticky;top:0}
table.rows tr.mark td{color:#57606a;background:#fbfbfc}
table.rows tr.ending td{background:#dafbe1}
td.num{text-align:right;font-variant-numeric:tabular-nums}code{font-size:12px}
"""


@dataclass(frozen=True)
class Story:
    """One history to draw.

    :param title: its heading (``None``: none, when the page has one story).
    :param rows: the history's plain JSON rows (a ``decisions`` XCom's value, whatever it holds:
        :func:`render_page` draws what it can and says what it could not).
    :param facts: lines shown above it (what ended it, who decided), already worded.
    """

    title: str | None
    rows: Any
    facts: Sequence[str] = field(default_factory=tuple)


def _epoch(row: Mapping[str, Any]) -> float | None:
    try:
        return parse_time(row.get("at"))
    except ValueError:
        return None


def _clock(at: float, *, with_date: bool = False, millis: bool = False) -> str:
    text = iso_time(at)  # 2026-09-21T14:02:00.123Z
    return (text[:10] + " " if with_date else "") + text[11 : 23 if millis else 19]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _shown(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def data_text(value: Any) -> str:
    """How a point or a row of the page writes a value in its ``data-`` attributes (``""`` for none,
    ``true``/``false``, numbers as ``%g``), unescaped.

    :param value: a row's value.
    """
    return "" if value is None else _shown(value)


def _attr(value: Any) -> str:
    """A value as a ``data-`` attribute, escaped."""
    return escape(data_text(value), quote=True)


class _Scale:
    """Time and share (0 to 1) to chart coordinates."""

    def __init__(self, start: float, end: float) -> None:
        span = max(end - start, MIN_SPAN)
        middle = (start + end) / 2
        half = span * (1 + 2 * PADDING) / 2
        self.start, self.end = middle - half, middle + half
        self.x0, self.x1 = LEFT, WIDTH - RIGHT
        self.y0, self.y1 = TOP, HEIGHT - BOTTOM  # y0: share 1, y1: share 0

    def x(self, at: float) -> float:
        return round(self.x0 + (at - self.start) / (self.end - self.start) * (self.x1 - self.x0), 2)

    def y(self, share: float) -> float:
        return round(self.y1 - min(max(share, 0.0), 1.0) * (self.y1 - self.y0), 2)


def _diamond(x: float, y: float, size: float = 5.0) -> str:
    return f"M{x} {y - size}L{x + size} {y}L{x} {y + size}L{x - size} {y}Z"


def _bars(condition: Mapping[str, Any] | None, question: str) -> list[tuple[str, str, float, str]]:
    """The condition's bars for ``question``: (css class, data name, value, label)."""
    if not condition or condition.get("question") != question:
        return []
    bars = []
    for key, kind, name in (
        ("min_probability", "probability", "min probability"),
        ("min_confidence", "confidence", "min confidence"),
    ):
        value = _number(condition.get(key))
        if value is not None:
            bars.append((f"bar-{kind}", key, value, f"{name} {value:g}"))
    policy = condition.get("policy")
    if isinstance(policy, Mapping):
        measure = str(policy.get("measure") or "confidence")
        for key, name in (("act_above", "act"), ("review_above", "review")):
            value = _number(policy.get(key))
            if value is not None:
                bars.append(("bar-policy", key, value, f"{name} ≥ {value:g} ({measure})"))
    return bars


def _tooltip(row: Mapping[str, Any]) -> str:
    parts = [
        f"{row.get('at')}",
        f"state #{_shown(row.get('generation'))} (stream version {_shown(row.get('state_version'))})",
        f"{row.get('question')} = {_shown(row.get('answer'))}",
        f"probability {_shown(row.get('probability'))}, confidence {_shown(row.get('confidence'))}",
        f"{row.get('disposition')}: {row.get('reason') or DISPOSITIONS.get(str(row.get('disposition')), '')}",
    ]
    return "\n".join(parts)


def _chart(
    rows: Sequence[Mapping[str, Any]],
    question: str,
    condition: Mapping[str, Any] | None,
    scale: _Scale,
    with_date: bool,
) -> str:
    """One question's chart (SVG)."""
    decisions = [(at, row) for at, row in _timed(rows) if row.get("kind") == "decision"]
    decisions = [(at, row) for at, row in decisions if row.get("question") == question]
    markers = [(at, row) for at, row in _timed(rows) if row.get("kind") not in ("decision", "condition")]
    # an answer other than the one waited for is hollow; an operator's policy waits for none
    watched = condition is not None and condition.get("question") == question and "expect" in condition
    expect = condition.get("expect") if condition is not None and watched else None
    out = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
        f'role="img" aria-label="{escape(question, quote=True)}: probability and confidence over time" '
        f'data-question="{escape(question, quote=True)}" data-x0="{scale.x0}" data-x1="{scale.x1}" '
        f'data-y0="{scale.y0}" data-y1="{scale.y1}" data-start="{scale.start}" data-end="{scale.end}">'
    ]
    for share in (0.0, 0.25, 0.5, 0.75, 1.0):
        y = scale.y(share)
        out.append(f'<line class="grid" x1="{scale.x0}" x2="{scale.x1}" y1="{y}" y2="{y}"/>')
        out.append(f'<text class="tick" x="{scale.x0 - 8}" y="{y + 4}" text-anchor="end">{share:g}</text>')
    out.append(f'<line class="axis" x1="{scale.x0}" x2="{scale.x1}" y1="{scale.y1}" y2="{scale.y1}"/>')
    out.append(f'<line class="axis" x1="{scale.x0}" x2="{scale.x0}" y1="{scale.y0}" y2="{scale.y1}"/>')
    fine = scale.end - scale.start < 10  # a span of seconds: the ticks say milliseconds
    for step in range(5):
        at = scale.start + (scale.end - scale.start) * step / 4
        x = scale.x(at)
        anchor = "start" if step == 0 else "end" if step == 4 else "middle"
        out.append(
            f'<text class="tick" x="{x}" y="{scale.y1 + 16}" text-anchor="{anchor}">'
            f"{_clock(at, with_date=with_date, millis=fine)}</text>"
        )
    out.append(
        f'<text class="tick" x="{(scale.x0 + scale.x1) / 2}" y="{HEIGHT - 6}" text-anchor="middle">'
        "time (UTC)</text>"
    )
    for css, key, value, label in _bars(condition, question):
        y = scale.y(value)
        out.append(
            f'<line class="bar {css}" data-bar="{key}" data-value="{value:g}" x1="{scale.x0}" '
            f'x2="{scale.x1}" y1="{y}" y2="{y}"><title>{escape(label)}</title></line>'
        )
        out.append(f'<text class="label" x="{scale.x1 + 6}" y="{y + 4}">{escape(label)}</text>')
    for at, row in markers:
        kind = str(row.get("kind"))
        x = scale.x(at)
        css = f"mark-{kind}" if kind in MARKS else "mark-other"
        details = ", ".join(
            f"{key} {_shown(value)}" for key, value in row.items() if key not in ("kind", "at")
        )
        title = f"{row.get('at')} {_MARK_LABELS.get(kind, kind)}" + (f" ({details})" if details else "")
        out.append(
            f'<line class="mark {css}" data-kind="{escape(kind, quote=True)}" data-at="{_attr(row.get("at"))}" '
            f'x1="{x}" x2="{x}" y1="{scale.y0}" y2="{scale.y1}"><title>{escape(title)}</title></line>'
        )
    for attribute, css in (("probability", "p-line"), ("confidence", "c-line")):
        # joined only through the answer waited for: another answer's numbers are about that answer
        points = [
            f"{scale.x(at)},{scale.y(value)}"
            for at, row in decisions
            if (value := _number(row.get(attribute))) is not None
            and not (watched and row.get("answer") != expect)
        ]
        if len(points) > 1:
            out.append(f'<polyline class="{css}" points="{" ".join(points)}"/>')
    for at, row in decisions:
        x = scale.x(at)
        probability, confidence = _number(row.get("probability")), _number(row.get("confidence"))
        disposition = str(row.get("disposition"))
        other = watched and row.get("answer") != expect
        out.append(
            f'<g class="decision{" other" if other else ""}" data-at="{_attr(row.get("at"))}" '
            f'data-version="{_attr(row.get("state_version"))}" data-answer="{_attr(row.get("answer"))}" '
            f'data-probability="{_attr(probability)}" data-confidence="{_attr(confidence)}" '
            f'data-disposition="{escape(disposition, quote=True)}" data-x="{x}">'
            f"<title>{escape(_tooltip(row))}</title>"
        )
        if probability is not None:
            out.append(f'<circle class="probability" cx="{x}" cy="{scale.y(probability)}" r="4.5"/>')
        if confidence is not None:
            out.append(f'<path class="confidence" d="{_diamond(x, scale.y(confidence))}"/>')
        if disposition in ENDING_DISPOSITIONS:
            colour = _ENDING_COLOURS.get(disposition, "#15803d")
            y = scale.y(probability if probability is not None else confidence or 0.0)
            out.append(
                f'<circle class="ending" data-disposition="{escape(disposition, quote=True)}" cx="{x}" '
                f'cy="{y}" r="10" fill="none" stroke="{colour}" stroke-width="2.5"/>'
            )
            out.append(
                f'<line x1="{x}" x2="{x}" y1="{scale.y0}" y2="{scale.y1}" stroke="{colour}" stroke-width="1"/>'
            )
            out.append(
                f'<text class="label" x="{x}" y="{scale.y0 - 8}" text-anchor="middle" fill="{colour}">'
                f"{escape(disposition)}</text>"
            )
        out.append("</g>")
    out.append("</svg>")
    return "".join(out)


_LEGEND = (
    '<ul class="legend">'
    '<li><svg width="12" height="12"><circle cx="6" cy="6" r="4.5" fill="#1f6feb"/></svg>probability</li>'
    '<li><svg width="12" height="12"><path d="M6 1L11 6L6 11L1 6Z" fill="#d97706"/></svg>confidence</li>'
    '<li><svg width="12" height="12"><circle cx="6" cy="6" r="4.5" fill="#fff" stroke="#1f6feb" '
    'stroke-width="1.5"/></svg>hollow: another answer than the one waited for (its own numbers)</li>'
    '<li><svg width="22" height="12"><line x1="0" x2="22" y1="6" y2="6" stroke="#d97706" '
    'stroke-dasharray="6 4" stroke-width="1.5"/></svg>the condition\'s bars</li>'
    '<li><svg width="22" height="12"><circle cx="11" cy="6" r="5" fill="none" stroke="#15803d" '
    'stroke-width="2"/></svg>the decision that ended the wait</li>'
    '<li><svg width="10" height="12"><line x1="5" x2="5" y1="0" y2="12" stroke="#8c959f" '
    'stroke-dasharray="2 3"/></svg>state changed</li>'
    '<li><svg width="10" height="12"><line x1="5" x2="5" y1="0" y2="12" stroke="#15803d"/></svg>billed start</li>'
    '<li><svg width="10" height="12"><line x1="5" x2="5" y1="0" y2="12" stroke="#cf222e" '
    'stroke-dasharray="5 3"/></svg>reconnect</li>'
    '<li><svg width="10" height="12"><line x1="5" x2="5" y1="0" y2="12" stroke="#bf8700" '
    'stroke-dasharray="1 3"/></svg>stream opened / given back</li>'
    '<li><svg width="10" height="12"><line x1="5" x2="5" y1="0" y2="12" stroke="#8250df"/></svg>hold rule met</li>'
    "</ul>"
)


def _timed(rows: Sequence[Mapping[str, Any]]) -> list[tuple[float, Mapping[str, Any]]]:
    """The rows with a readable time, in time order (a row without one is not drawn)."""
    timed = [(at, row) for row in rows if (at := _epoch(row)) is not None]
    return sorted(timed, key=lambda item: item[0])


#: The table's columns: (heading, what it means, shown on hover).
_COLUMNS: tuple[tuple[str, str], ...] = (
    ("Time (UTC)", "when the wait recorded it, to the millisecond"),
    ("Event", "a decision, or what happened around the decisions"),
    ("Question", "the question the decision answered"),
    (
        "State #",
        "the state's number in this wait: each different state the source gave counts one more (its "
        "generation), across the streams the wait opened and gave back",
    ),
    ("Stream version", "the gateway's state version: it starts again at 1 with each stream"),
    ("State", "the state's size and the start of its SHA-256 (its content only with capture_content)"),
    ("Answer", "the model's answer"),
    ("Probability", "the model's probability for the answer"),
    ("Confidence", "the model's confidence in the answer"),
    ("Billed", "billed, or replayed: the original reply again, at no cost"),
    ("Current", "current: about the state the source held then; superseded: about one it had left"),
    ("Watch did", "what the wait did with the decision"),
    ("Why", "why, in the words of the task's log"),
)


def _marker_why(row: Mapping[str, Any]) -> str:
    """A marker's row in words: what happened, with its details."""
    kind = str(row.get("kind"))
    rest = {
        key: value for key, value in row.items() if key not in ("kind", "at", "generation", "state_version")
    }
    if kind == "state_change":
        text = "the source gave a new state"
        if rest.pop("withheld", None) is True:
            text += "; withheld: it holds nothing to decide yet (a file without content), so it was not sent"
    elif kind == "reconnect":
        reason, code = rest.pop("reason", None), rest.pop("close_code", None)
        text = "the stream reconnected" + (f" after {_shown(reason)}" if reason is not None else "")
        text += (f" (close code {_shown(code)})" if code is not None else "") + " and replayed the state"
    elif kind == "stream_released":
        reason = rest.pop("reason", None)
        text = "the stream was given back" + (f": {_shown(reason)}" if reason is not None else "")
    else:
        text = MARKS.get(kind, kind)
    details = ", ".join(f"{key} {_shown(value)}" for key, value in rest.items())
    return text + (f" ({details})" if details else "")


def _numbered(rows: Sequence[tuple[float, Mapping[str, Any]]]) -> list[Any]:
    """Each row's State #: a decision's and a state change's own generation; a billed start's is
    the one of the decision it started (the next decision of its stream version), a hold rule's
    the one of the decision it ended (the last of its stream version)."""
    numbers: list[Any] = [row.get("generation") for _, row in rows]
    for index, (_, row) in enumerate(rows):
        kind, version = row.get("kind"), row.get("state_version")
        if numbers[index] is not None or version is None:
            continue
        if kind == "billed_start":
            later = range(index + 1, len(rows))
        elif kind == "hold_met":
            later = range(index - 1, -1, -1)
        else:
            continue
        for other in later:
            found = rows[other][1]
            if found.get("kind") == "decision" and found.get("state_version") == version:
                numbers[index] = found.get("generation")
                break
    return numbers


def _table(rows: Sequence[tuple[float, Mapping[str, Any]]], questions: Sequence[str], with_date: bool) -> str:
    """The table of the same rows, in the order they happened."""
    many = len(questions) > 1
    columns = [column for column in _COLUMNS if many or column[0] != "Question"]
    out = [
        '<table class="rows"><thead><tr>',
        *(
            f'<th title="{escape(meaning, quote=True)}">{escape(heading)}</th>'
            for heading, meaning in columns
        ),
        "</tr></thead><tbody>",
    ]
    numbers = _numbered(rows)
    for (at, row), number in zip(rows, numbers, strict=True):
        kind = str(row.get("kind"))
        when = escape(_clock(at, with_date=with_date, millis=True))
        state_number = "—" if number is None else f"#{escape(_shown(number))}"
        if kind == "decision":
            disposition = str(row.get("disposition"))
            css = "decision ending" if disposition in ENDING_DISPOSITIONS else "decision"
            size, digest = row.get("state_bytes"), row.get("state_hash")
            state = (f"{size} bytes" if size is not None else "") + (
                f", sha256 <code>{escape(str(digest)[:12])}…</code>" if digest else ""
            )
            if row.get("state") is not None:
                state += f'<br><code title="the newest end of the state">{escape(str(row["state"]))}</code>'
            billed = {True: "billed", False: "replayed", None: "not known"}.get(
                row.get("billed"), "not known"
            )
            why = row.get("reason") or DISPOSITIONS.get(disposition, "")
            cells = [
                when,
                "decision",
                *([escape(str(row.get("question")))] if many else []),
                state_number,
                escape(_shown(row.get("state_version"))),
                state or "—",
                escape(_shown(row.get("answer"))),
                escape(_shown(row.get("probability"))),
                escape(_shown(row.get("confidence"))),
                billed,
                "current" if row.get("current", True) else "superseded",
                f'<span title="{escape(DISPOSITIONS.get(disposition, ""), quote=True)}">{escape(disposition)}</span>',
                escape(str(why)),
            ]
            figures = {3 + many, 4 + many, 7 + many, 8 + many}  # state #, version, probability, confidence
            attributes = (
                f' data-version="{_attr(row.get("state_version"))}" data-answer="{_attr(row.get("answer"))}"'
                f' data-generation="{_attr(number)}"'
                f' data-probability="{_attr(row.get("probability"))}"'
                f' data-confidence="{_attr(row.get("confidence"))}"'
                f' data-disposition="{escape(disposition, quote=True)}"'
            )
        else:
            css = "mark"
            cells = [when, escape(_MARK_LABELS.get(kind, kind)), *([""] if many else [])]
            cells += [state_number, escape(_shown(row.get("state_version"))), "", "", "", "", "", "", ""]
            cells.append(escape(_marker_why(row)))
            figures = {3 + many, 4 + many}
            attributes = f' data-generation="{_attr(number)}"'
        out.append(
            f'<tr class="{css}" data-kind="{escape(kind, quote=True)}" data-at="{_attr(row.get("at"))}"{attributes}>'
        )
        out.extend(
            f'<td class="num">{cell}</td>' if index in figures else f"<td>{cell}</td>"
            for index, cell in enumerate(cells)
        )
        out.append("</tr>")
    out.append("</tbody></table>")
    out.append(
        '<p class="sub">State # counts the different states the source gave during the wait, across '
        "streams; Stream version is the gateway's own count, which starts again with each stream. "
        "Rows of the same millisecond are in the order they happened. Hover a heading for what it "
        "means; the sensor's documentation (Decision timeline) explains every word here.</p>"
    )
    return "".join(out)


def _summary(rows: Sequence[tuple[float, Mapping[str, Any]]]) -> str:
    """What ended the wait, and what the decisions cost, in one paragraph."""
    decisions = [row for _, row in rows if row.get("kind") == "decision"]
    if not decisions:
        return "No decision was recorded."
    billed = sum(1 for row in decisions if row.get("billed") is True)
    replayed = sum(1 for row in decisions if row.get("billed") is False)
    count = f"{len(decisions)} decision{'s' if len(decisions) != 1 else ''} ({billed} billed, {replayed} replayed)"
    ending = [row for row in decisions if row.get("disposition") in ENDING_DISPOSITIONS]
    row = ending[-1] if ending else decisions[-1]
    state = f"state #{_shown(row.get('generation'))} (stream version {_shown(row.get('state_version'))})"
    if row.get("generation") is None:
        state = f"stream version {_shown(row.get('state_version'))}"
    said = (
        f"{row.get('question')} = {_shown(row.get('answer'))} (probability {_shown(row.get('probability'))}, "
        f"confidence {_shown(row.get('confidence'))}) about {state}"
    )
    if ending:
        lead = f"{row.get('at')}: {said} — {DISPOSITIONS.get(str(row.get('disposition')), 'ended the wait')}."
    else:
        lead = (
            f"No decision ended the wait. The last one, at {row.get('at')}, {said}, "
            f"{DISPOSITIONS.get(str(row.get('disposition')), '')}."
        )
    return f"{escape(lead)} {escape(count)}."


def _story(story: Story) -> str:
    timed = _timed(story.rows)
    conditions = [row for row in story.rows if row.get("kind") == "condition"]
    condition = conditions[-1] if conditions else None
    questions = list(
        dict.fromkeys(str(row.get("question")) for _, row in timed if row.get("kind") == "decision")
    ) or ([str(condition["question"])] if condition and condition.get("question") else [])
    out = [
        f'<section class="story"><h2>{escape(story.title)}</h2>' if story.title else '<section class="story">'
    ]
    out.append(f'<p class="summary">{_summary(timed)}</p>')
    out.extend(f'<p class="summary">{escape(fact)}</p>' for fact in story.facts)
    if condition is not None and "expect" in condition:
        waited = _shown(condition.get("expect"))
        out.append(
            f'<p class="sub">Waiting for <code>{escape(str(condition.get("question")))}</code> = {escape(waited)}</p>'
        )
    elif condition is not None:  # an operator's: the policy that acted on its answer
        out.append(
            f'<p class="sub">The policy of <code>{escape(str(condition.get("question")))}</code>: its bars '
            "are drawn across the chart</p>"
        )
    if timed:
        scale = _Scale(timed[0][0], timed[-1][0])
        with_date = scale.end - scale.start >= 86_400
        for question in questions:
            if len(questions) > 1:
                out.append(f"<h3>{escape(question)}</h3>")
            out.append(_chart(story.rows, question, condition, scale, with_date))
        out.append(_LEGEND)
        out.append(_table(timed, questions, with_date))
    out.append("</section>")
    return "".join(out)


def _drawn(story: Story) -> str:
    """:func:`_story`, or a note when drawing it failed (a bug: the page still answers)."""
    try:
        return _story(story)
    except Exception:
        log.exception("the decision timeline could not draw a history")
        return (
            '<section class="story"><p class="note">This history could not be drawn (the API server\'s '
            "log says why); its rows are in the task's 'decisions' XCom.</p></section>"
        )


def render_page(*, heading: str, subtitle: str, stories: Sequence[Story], notes: Sequence[str] = ()) -> str:
    """The whole page.

    :param heading: the task instance (or run) it is about, shown under the title.
    :param subtitle: one more line (the try, where the history comes from).
    :param stories: the histories to draw (one per task try, or one per asset event).
    :param notes: what the reader must know first (no history, a version's limits), worded.
    """
    # what Airflow stored, made safe to draw first: nothing stored can break the page
    stories, dropped = drawable_stories(stories)
    heading, subtitle = page_text(heading), page_text(subtitle)
    body = [
        "<h1>Decision timeline</h1>",
        f'<p class="sub">{escape(heading)}<br>{escape(subtitle)}</p>',
        *(f'<p class="note">{escape(page_text(note))}</p>' for note in [*notes, *dropped]),
        *(_drawn(story) for story in stories),
    ]
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>Decision timeline · {escape(heading)}</title><style>{_STYLE}</style></head>"
        f"<body>{''.join(body)}</body></html>"
    )
