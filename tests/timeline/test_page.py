"""The "Decision timeline" page drawn from rows alone: points, bars, markers, the ending decision,
one chart per question, the table, and nothing the gateway says reaching the page unescaped."""

from __future__ import annotations

from typing import Any

from airflow_provider_systemzero.decisions.conditions import DecisionCondition
from airflow_provider_systemzero.decisions.policy import DecisionPolicy
from airflow_provider_systemzero.decisions.timeline import MARKS, DecisionTimeline
from airflow_provider_systemzero.plugins.timeline_page import Story, render_page
from tests.helpers import decision_result
from tests.helpers.timeline_page import PageParts, check_chart_against

T0 = 1_790_000_000.0


def _page(rows: list[dict[str, Any]]) -> PageParts:
    return PageParts(
        render_page(heading="Dag d · run r · task t", subtitle="try 1", stories=[Story(None, rows)])
    )


def _rows() -> list[dict[str, Any]]:
    policy = DecisionPolicy(act_above=0.85, review_above=0.6, below="wait").to_dict()
    timeline = DecisionTimeline()
    timeline.watching(DecisionCondition("ready", min_probability=0.5, policy=policy).to_dict())
    steps = [(False, 0.9, 0.8, "waiting"), (True, 0.7, 0.62, "waiting"), (True, 0.95, 0.9, "fired")]
    for version, (decision, probability, confidence, disposition) in enumerate(steps, start=1):
        at = T0 + 60 * version
        timeline.mark("state_change", at - 20, state_version=version)
        timeline.mark("billed_start", at - 10, state_version=version)
        timeline.decision(
            decision_result(version, ready=(decision, probability, confidence)),
            question="ready",
            at=at,
            disposition=disposition,
            state_key=f"{version:064x}",
            state_bytes=10 * version,
            billed=True,
        )
    timeline.mark("reconnect", T0 + 130, close_code=1012)
    timeline.mark("stream_released", T0 + 135)
    return timeline.to_list()


def test_every_decision_is_a_point_at_its_time_and_numbers_and_a_row_of_the_table() -> None:
    rows = _rows()
    page = _page(rows)
    assert check_chart_against(page, rows) == 3
    other, *_ = page.having("g", "decision")
    assert "other" in other["class"].split()  # "false" is not the answer waited for: hollow


def test_the_conditions_bars_are_drawn_across_the_chart() -> None:
    page = _page(_rows())
    bars = {(bar["data-bar"], bar["data-value"]) for bar in page.having("line", "bar")}
    assert bars == {("min_probability", "0.5"), ("act_above", "0.85"), ("review_above", "0.6")}


def test_each_marker_is_a_line_at_its_time_and_a_row_of_the_table() -> None:
    rows = _rows()
    page = _page(rows)
    markers = [row for row in rows if row["kind"] in MARKS]
    lines = page.having("line", "mark")
    assert [(line["data-kind"], line["data-at"]) for line in lines] == [
        (row["kind"], row["at"]) for row in markers
    ]
    assert [r["data-kind"] for r in page.having("tr", "mark")] == [row["kind"] for row in markers]
    (ring,) = page.having("circle", "ending")
    assert ring["data-disposition"] == "fired"


def test_an_operator_gets_one_chart_per_question() -> None:
    timeline = DecisionTimeline()
    decision = decision_result(1, ready=(True, 0.9, 0.8), urgent=(False, 0.7, 0.6))
    for question in ("ready", "urgent"):
        timeline.decision(decision, question=question, at=T0, disposition="decided")
    rows = timeline.to_list()
    page = _page(rows)
    assert [svg["data-question"] for svg in page.having("svg", "chart")] == ["ready", "urgent"]
    assert len(page.having("circle", "ending")) == 2
    assert [r["data-answer"] for r in page.having("tr", "decision")] == ["true", "false"]


def test_a_wait_that_did_not_end_says_what_the_last_decision_was() -> None:
    rows = [row for row in _rows() if row.get("disposition") != "fired"]
    text = " ".join(_page(rows).text)
    assert "No decision ended the wait. The last one, at" in text
    assert "did not meet the condition: the wait went on" in text


def test_nothing_the_gateway_says_reaches_the_page_unescaped() -> None:
    row = {
        "kind": "decision",
        "at": "2026-09-21T14:13:20.000Z",
        "question": "tier</title><script>alert(1)</script>",
        "answer": '<img src=x onerror="alert(1)">',
        "probability": 0.5,
        "confidence": 0.5,
        "state_version": 1,
        "state": "</code><a href=//evil>approve</a>",
        "disposition": "decided",
    }
    marker = {"kind": "lease_moved", "at": "2026-09-21T14:13:21.000Z", "to": "<b>x</b>"}
    html = render_page(heading="<i>h</i>", subtitle="s", stories=[Story("<u>t</u>", [row, marker])])
    for raw in ("<img", "<script", "<a href", "<b>", "<i>", "<u>"):
        assert raw not in html
    parts = PageParts(html)
    assert {tag for tag, _ in parts.elements} <= {
        "html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "p", "br", "section", "svg", "line",
        "text", "g", "circle", "path", "polyline", "ul", "li", "table", "thead", "tbody", "tr", "th", "td",
        "span", "code",
    }  # fmt: skip


def test_a_page_without_rows_says_so_and_draws_nothing() -> None:
    page = PageParts(render_page(heading="h", subtitle="s", stories=[], notes=["no history here"]))
    assert page.having("svg", "chart") == [] and "no history here" in " ".join(page.text)
