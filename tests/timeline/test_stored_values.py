"""Nothing stored can break the "Decision timeline" page (issue 54 item 2).

The page draws whatever Airflow holds in a ``decisions`` XCom: the rows this provider writes, rows
an older version wrote (a billed start back-dated to year 1 by a gateway's ``queue_ms`` of 6.4e13),
and anything else a task pushed under that key. It draws what it can and says what it could not.
Before, a marker in year 1 made the page pad its axis before year 1 and answer 500 from then on;
an integer of 400 digits, ``NaN`` or a lone surrogate broke it too.
"""

from __future__ import annotations

import datetime
import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_systemzero.decisions.timeline import DecisionTimeline
from airflow_provider_systemzero.plugins.timeline_page import Story, render_page
from tests.helpers import decision_result
from tests.helpers.timeline_page import PageParts, check_chart_against

T0 = 1_790_000_000.0
#: What the page says when drawing a history failed anyway (it must never come to that).
BROKEN = "could not be drawn (the API server"


def _history() -> list[dict[str, Any]]:
    """Two decisions and their markers, as the provider writes them."""
    timeline = DecisionTimeline()
    timeline.watching({"question": "ready", "expect": True, "min_confidence": 0.8})
    for version, ready in ((1, False), (2, True)):
        timeline.mark("billed_start", T0 + version - 0.5, state_version=version)
        timeline.decision(
            decision_result(version, ready=(ready, 0.9, 0.9)),
            question="ready",
            at=T0 + version,
            disposition="fired" if ready else "waiting",
            billed=True,
        )
    return timeline.to_list()


def _render(rows: Any) -> str:
    html = render_page(heading="Dag d · run r · task t", subtitle="try 1", stories=[Story(None, rows)])
    html.encode("utf-8")  # what the response sends: a lone surrogate cannot be encoded
    assert BROKEN not in html
    return html


def _notes(html: str) -> list[str]:
    """What the page says it could not draw."""
    return [text for text in PageParts(html).text if text.startswith("The history:")]


def test_a_billed_start_stored_in_year_one_is_said_not_drawn() -> None:
    rows = _history()
    stored = [*rows, {"kind": "billed_start", "at": "0001-01-01T00:00:00.000Z", "state_version": 3}]
    html = _render(stored)
    assert check_chart_against(PageParts(html), rows) == 2  # the decisions, on an axis of their own
    (note,) = _notes(html)
    assert note == (
        "The history: 1 row not drawn: no time from 1970 to 9999 in 'at' (the first: "
        "'0001-01-01T00:00:00.000Z')."
    )
    ticks = [text for text in PageParts(html).text if text.startswith("0001") or text.startswith("2026")]
    assert ticks and not any(tick.startswith("0001") for tick in ticks)


def test_what_is_not_a_row_is_counted_and_the_rest_is_drawn() -> None:
    rows = _history()
    stored = [1, "x", None, {"kind": 5}, {"at": rows[1]["at"]}, {"kind": "decision", "at": "soon"}, *rows]
    html = _render(stored)
    assert check_chart_against(PageParts(html), rows) == 2
    assert _notes(html) == [
        "The history: 5 rows not drawn: not an object with a text 'kind' (the first: 1).",
        "The history: 1 row not drawn: no time from 1970 to 9999 in 'at' (the first: 'soon').",
    ]


def test_numbers_no_chart_can_place_are_shown_as_none_and_said() -> None:
    rows = _history()
    decision = rows[-1]
    stored = [
        *rows[:-1],
        {**decision, "probability": 10**400, "confidence": math.nan, "state_version": 10**30},
    ]
    html = _render(stored)
    (point,) = [p for p in PageParts(html).having("g", "decision") if p["data-disposition"] == "fired"]
    assert point["data-probability"] == point["data-confidence"] == point["data-version"] == ""
    assert _notes(html) == [
        "The history: 3 numbers shown as none: not a finite number a chart can place (the first: "
        + "1"
        + "0" * 58
        + "…)."
    ]


def test_a_value_that_is_not_a_list_of_rows_is_said() -> None:
    html = _render({"decisions": "old"})
    assert _notes(html) == [
        "The history: 1 row not drawn: not an object with a text 'kind' (the first: {'decisions': 'old'})."
    ]


#: Values a stored history may hold besides plain JSON: what Airflow's serializer reads back (dates,
#: tuples, sets), numbers no chart can place, text no page can encode, keys that are not text.
odd_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=10**300, max_value=10**400),
    st.floats(),
    st.text(max_size=20),
    st.sampled_from(["\ud800", "x" * 5_000, "0001-01-01T00:00:00Z", "9999-12-31T23:59:59+14:00", "\u202e"]),
    st.datetimes(timezones=st.just(datetime.UTC)),
)
odd_values = st.recursive(
    odd_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.tuples(children, children),
        st.dictionaries(st.one_of(st.text(max_size=5), st.integers()), children, max_size=3),
    ),
    max_leaves=10,
)
FIELDS = (
    "question",
    "answer",
    "probability",
    "confidence",
    "state_version",
    "state_bytes",
    "state_hash",
    "billed",
    "current",
    "disposition",
    "state",
    "expect",
    "min_probability",
    "min_confidence",
    "policy",
)
times = st.one_of(
    st.floats(min_value=T0 - 1e4, max_value=T0 + 1e4).map(
        lambda at: datetime.datetime.fromtimestamp(at, datetime.UTC).isoformat()
    ),
    odd_scalars,
)
rows = st.one_of(
    odd_values,
    st.fixed_dictionaries(
        {
            "kind": st.sampled_from(["decision", "condition", "billed_start", "reconnect", "other"]),
            "at": times,
        },
        optional=dict.fromkeys(FIELDS, odd_values),
    ),
    st.fixed_dictionaries(
        {"kind": st.just("condition"), "question": st.text(max_size=3)},
        optional={
            "policy": st.dictionaries(st.sampled_from(["act_above", "review_above", "measure"]), odd_values)
        },
    ),
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.lists(rows, max_size=8), odd_values))
def test_any_value_airflow_can_hold_is_drawn_or_said(stored: Any) -> None:
    html = _render(stored)
    page = PageParts(html)
    assert "Decision timeline" in page.text
    drawn = len(page.having("g", "decision"))
    assert drawn <= (len(stored) if isinstance(stored, list) else 0)


def test_a_long_history_draws_its_newest_rows_and_says_so() -> None:
    timeline = DecisionTimeline(limit=3_000)
    for index in range(2_000):
        timeline.mark("reconnect", T0 + index)
    html = _render(timeline.to_list())
    assert _notes(html) == ["The history: 1000 older rows not drawn: the page draws the newest 1000."]
    assert len(PageParts(html).having("tr", "mark")) == 1_000
