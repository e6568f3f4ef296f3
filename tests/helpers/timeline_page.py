"""Reading the "Decision timeline" page back in tests: its chart's points, bars and markers, its
table's rows, and the checks that the chart draws exactly the rows of a ``decisions`` XCom."""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Any

from airflow_provider_systemzero.decisions.timeline import parse_time
from airflow_provider_systemzero.plugins.timeline_page import data_text as shown


class PageParts(HTMLParser):
    """Every element of a page, as ``(tag, attributes)``, in document order."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, {name: value or "" for name, value in attrs}))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def having(self, tag: str, css: str) -> list[dict[str, str]]:
        """The attributes of each ``tag`` whose class list holds ``css``."""
        return [
            attrs for name, attrs in self.elements if name == tag and css in attrs.get("class", "").split()
        ]

    def after(self, first: dict[str, str], tag: str) -> dict[str, str] | None:
        """The first ``tag`` element after the element ``first`` (a point's circle or diamond)."""
        seen = False
        for name, attrs in self.elements:
            if attrs is first:
                seen = True
            elif seen and name == tag:
                return attrs
            elif seen and name == "g":
                return None
        return None


def check_chart_against(page: PageParts, rows: list[dict[str, Any]], question: str = "ready") -> int:
    """The chart of ``question`` draws one point per decision row, at its time, with its numbers at
    the height the chart's own scale gives them, and the table lists every row: returns the points.
    """
    (svg,) = [attrs for attrs in page.having("svg", "chart") if attrs.get("data-question") == question]
    x0, x1, y0, y1 = (float(svg[key]) for key in ("data-x0", "data-x1", "data-y0", "data-y1"))
    start, end = float(svg["data-start"]), float(svg["data-end"])
    decisions = [row for row in rows if row["kind"] == "decision" and row["question"] == question]
    points = page.having("g", "decision")
    assert len(points) == len(decisions), (points, decisions)
    for point, row in zip(points, decisions, strict=True):
        assert point["data-at"] == row["at"]
        assert point["data-version"] == shown(row["state_version"])
        assert point["data-probability"] == shown(row["probability"])
        assert point["data-confidence"] == shown(row["confidence"])
        assert point["data-disposition"] == row["disposition"]
        at = parse_time(row["at"])
        assert abs(float(point["data-x"]) - (x0 + (at - start) / (end - start) * (x1 - x0))) < 0.05
        circle = page.after(point, "circle")
        assert circle is not None and "probability" in circle["class"]
        assert abs(float(circle["cy"]) - (y1 - row["probability"] * (y1 - y0))) < 0.05
    table = page.having("tr", "decision")
    assert [(r["data-version"], r["data-disposition"]) for r in table] == [
        (shown(row["state_version"]), row["disposition"]) for row in rows if row["kind"] == "decision"
    ]
    return len(points)
