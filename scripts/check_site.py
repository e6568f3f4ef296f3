"""Checks a built documentation site: every API reference page renders documented objects.

mkdocstrings renders a page whose module cannot be imported, or whose members are all filtered
out, as a heading with nothing under it; ``mkdocs build --strict`` does not notice. This does.

Usage: ``python scripts/check_site.py SITE_DIR``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

#: The smallest number of documented objects (classes, functions, attributes) a reference page has.
MIN_OBJECTS = 1


def empty_reference_pages(site: Path) -> list[str]:
    """The reference pages of ``site`` that render fewer than :data:`MIN_OBJECTS` objects.

    :param site: the built site's directory.
    """
    empty = []
    for page in sorted((site / "reference").rglob("index.html")):
        if page.parent == site / "reference":
            continue  # the overview page is prose
        html = page.read_text(encoding="utf-8")
        if len(re.findall(r'class="doc doc-(?:object|heading)', html)) < MIN_OBJECTS:
            empty.append(str(page.parent.relative_to(site)))
    return empty


def main(argv: list[str]) -> int:
    """Entry point; returns the exit code."""
    site = Path(argv[0] if argv else ".cache/site")
    empty = empty_reference_pages(site)
    if empty:
        print(f"error: API reference pages render no documented object: {', '.join(empty)}", file=sys.stderr)
        return 1
    count = sum(1 for _ in (site / "reference").rglob("index.html")) - 1
    print(f"{count} API reference pages render their objects")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
