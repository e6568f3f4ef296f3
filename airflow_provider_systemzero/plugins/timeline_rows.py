"""What the "Decision timeline" page draws from a stored history, whatever the history holds.

A ``decisions`` XCom (or an asset event's payload) is whatever Airflow stored: the rows this
provider wrote, rows an older version wrote, or anything else a task pushed under that key —
values of the wrong type, missing keys, numbers no chart can place (``NaN``, 1e308, an integer of
400 digits), a time in year 1, megabytes of text. :func:`drawable` is the step at the entry of the
page that makes a history safe to draw, and says what it could not draw:

* a row that is not an object with a text ``kind`` is left out;
* a row other than the condition without a time the page can place is left out: ISO 8601 text
  (or epoch seconds, or a ``datetime`` as Airflow's serializer may read one back) from 1970 to
  the end of year 9999 (:data:`~airflow_provider_systemzero.timestamps.EARLIEST` …
  :data:`~airflow_provider_systemzero.timestamps.LATEST`); a time that is drawn is written again
  as the history writes it (UTC, to the millisecond);
* only the newest :data:`MAX_ROWS` rows are drawn;
* in a row kept, every key is text; every number is finite (an integer within ±(2**53 - 1)),
  else it shows as none; every text is at most :data:`MAX_TEXT` characters, keeps its line breaks
  and has what else is not printable escaped (a lone surrogate, which no page can encode,
  included); an object is kept only in the condition (its ``policy``), one level deep; a value
  of another kind shows as its JSON text, bounded.

Each kind of thing left out or changed is one sentence of the notes the page shows above the
history, so the reader knows what the chart does not show. Pure: no Airflow, no I/O.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_systemzero.decisions.timeline import HISTORY_LIMIT, parse_time
from airflow_provider_systemzero.protocol.messages import MAX_SAFE_INTEGER
from airflow_provider_systemzero.protocol.untrusted import safe_text
from airflow_provider_systemzero.timestamps import EARLIEST, LATEST, iso_time

__all__ = ["MAX_ROWS", "MAX_TEXT", "Drawable", "drawable", "drawable_stories", "page_text", "plain"]

#: The most rows of one history the page draws (the newest): a full history holds the condition,
#: :data:`~airflow_provider_systemzero.decisions.timeline.HISTORY_LIMIT` decisions and as many
#: markers; an older or merged one may hold a few more.
MAX_ROWS = 5 * HISTORY_LIMIT
#: The most characters of a text the page shows.
MAX_TEXT = 500
#: How many examples of a value left out a note quotes.
_QUOTED = 60


@dataclass
class Drawable:
    """A history made safe to draw (:func:`drawable`).

    :param rows: the rows the page draws, the condition first, then in time order.
    :param notes: what could not be drawn, one sentence per kind of problem.
    """

    rows: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)


def _shown(value: Any) -> str:
    """A value left out, as a note quotes it (bounded, printable)."""
    try:
        text = repr(value)
    except Exception:  # a repr that fails (an integer past Python's digit limit …)
        text = f"a {type(value).__name__}"
    return safe_text(text, _QUOTED)


class _Findings:
    """What :func:`drawable` found, by kind: a count and the first example."""

    def __init__(self) -> None:
        self._found: dict[str, tuple[int, str]] = {}

    def add(self, kind: str, example: str) -> None:
        count, first = self._found.get(kind, (0, example))
        self._found[kind] = (count + 1, first)

    def notes(self, where: str) -> list[str]:
        """One sentence per kind found, naming the history (``where``)."""
        out = []
        for kind, (count, example) in self._found.items():
            many = "" if count == 1 else "s"
            sentence = {
                "not a row": f"{count} row{many} not drawn: not an object with a text 'kind' (the first: {example})",
                "no time": f"{count} row{many} not drawn: no time from 1970 to 9999 in 'at' (the first: {example})",
                "too many": f"{count} older row{many} not drawn: the page draws the newest {MAX_ROWS}",
                "number": f"{count} number{many} shown as none: not a finite number a chart can place "
                f"(the first: {example})",
                "text": f"{count} text{many} shortened to {MAX_TEXT} characters or with characters that are not "
                f"printable escaped (the first: {example})",
                "value": f"{count} value{many} of another kind shown as JSON text (the first: {example})",
            }[kind]
            out.append(f"{where}: {sentence}.")
        return out


def _text(value: str, found: _Findings | None) -> str:
    """A text as the page shows it: at most :data:`MAX_TEXT` characters (``…`` ends a cut one),
    every character that is not printable escaped but line breaks and tabs (a state's preview
    keeps its lines; a lone surrogate, which no page can encode, becomes ``\\ud800``)."""
    shown = value if len(value) <= MAX_TEXT else value[: MAX_TEXT - 1] + "…"
    if not shown.isprintable():
        shown = "".join(c if c.isprintable() or c in "\n\t" else safe_text(c) for c in shown)
    if shown != value and found is not None:
        found.add("text", safe_text(value, _QUOTED))
    return shown


def _scalar(value: Any, found: _Findings | None, *, nested: bool) -> Any:
    """``value`` as the page may hold it (see the module's description)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            return value
        if found is not None:
            found.add("number", _shown(value))
        return None
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        if found is not None:
            found.add("number", _shown(value))
        return None
    if isinstance(value, str):
        return _text(value, found)
    if nested and isinstance(value, Mapping):
        return {_key(key, found): _scalar(item, found, nested=False) for key, item in value.items()}
    try:
        text = json.dumps(value, default=str, sort_keys=True)
    except (TypeError, ValueError, RecursionError):  # a loop, a key JSON cannot hold, too deep
        text = f"a {type(value).__name__}"
    if found is not None:
        found.add("value", safe_text(text, _QUOTED))
    return safe_text(text, MAX_TEXT)


def _key(key: Any, found: _Findings | None) -> str:
    return _text(key, found) if isinstance(key, str) else safe_text(_shown(key), MAX_TEXT)


def plain(value: Any) -> Any:
    """One stored value (a ``decision`` record, a ``usage`` XCom, a payload's field) as the page
    may hold it: an object one level deep of finite numbers and bounded, printable text.

    :param value: what Airflow stored.
    """
    return _scalar(value, None, nested=True)


def _epoch(at: Any) -> float | None:
    """A row's ``at`` as epoch seconds from 1970 to 9999, or ``None``: ISO 8601 text, or (as a
    history may have been written by hand) epoch seconds."""
    if isinstance(at, int | float) and not isinstance(at, bool):
        epoch: float = at if isinstance(at, float) else float(at) if abs(at) <= MAX_SAFE_INTEGER else math.nan
    elif isinstance(at, datetime.datetime):  # as Airflow's serializer may read a time back
        try:
            epoch = (at if at.tzinfo is not None else at.replace(tzinfo=datetime.UTC)).timestamp()
        except (ValueError, OverflowError):
            return None
    else:
        try:
            epoch = parse_time(at)
        except (ValueError, TypeError, OverflowError):
            return None
    return epoch if EARLIEST <= epoch <= LATEST else None


def drawable(rows: Any, *, where: str = "The history") -> Drawable:
    """The rows of a stored history the page can draw, and what it could not (see the module's
    description).

    :param rows: what Airflow stored (a list of rows, or anything else).
    :param where: how the notes name the history (``The history``, ``Asset event of …``).
    """
    found = _Findings()
    if not isinstance(rows, Sequence) or isinstance(rows, str | bytes):
        found.add("not a row", _shown(rows))
        return Drawable([], found.notes(where))
    conditions: list[dict[str, Any]] = []
    timed: list[tuple[float, int, dict[str, Any]]] = []
    for index, row in enumerate(rows):
        kind = row.get("kind") if isinstance(row, Mapping) else None
        if not isinstance(kind, str):
            found.add("not a row", _shown(row))
            continue
        if kind == "condition":
            conditions.append(_row(row, found, nested=True))
            continue
        at = row.get("at")
        epoch = _epoch(at)
        if epoch is None:
            found.add("no time", _shown(at))
            continue
        timed.append((epoch, index, {**_row(row, found), "at": iso_time(epoch)}))
    timed.sort(key=lambda item: (item[0], item[1]))
    if len(timed) > MAX_ROWS:
        for _ in range(len(timed) - MAX_ROWS):
            found.add("too many", "")
        timed = timed[-MAX_ROWS:]
    return Drawable([*conditions[-1:], *(row for _, _, row in timed)], found.notes(where))


def _row(row: Mapping[Any, Any], found: _Findings, *, nested: bool = False) -> dict[str, Any]:
    """A row's keys as text and its values as the page may hold them; an object one level deep only
    in the condition (its ``policy``), a plain value everywhere else."""
    return {_key(key, found): _scalar(value, found, nested=nested) for key, value in row.items()}


def drawable_stories(stories: Sequence[Any]) -> tuple[list[Any], list[str]]:
    """The histories of a page made safe to draw (:func:`drawable`), each ``Story``'s facts
    bounded, and the notes saying what could not be drawn.

    :param stories: the page's stories (``title``, ``rows``, ``facts``).
    :return: the stories to draw, and the notes.
    """
    drawn, notes = [], []
    for story in stories:
        title = None if story.title is None else _text(str(story.title), None)
        rows = drawable(story.rows, where=title or "The history")
        facts = [_text(str(fact), None) for fact in story.facts]
        drawn.append(dataclasses.replace(story, title=title, rows=rows.rows, facts=facts))
        notes += rows.notes
    return drawn, notes


def page_text(value: Any) -> str:
    """A line of the page that is no history's (its heading, a note): text, bounded, printable.

    :param value: the line.
    """
    return _text(str(value), None)
