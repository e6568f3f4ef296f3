"""The one function a gateway's text passes through (``protocol/untrusted.py``), as a pure
function: what it lets through, what it changes, and that ``safe_text`` is the identity on what it
already let through."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_systemzero.protocol.untrusted import MAX_TEXT, safe_text

#: Any text, surrogates and unassigned code points included.
ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=400)


@settings(max_examples=500, deadline=None)
@given(ANY_TEXT, st.integers(1, 300))
def test_safe_text_always_gives_printable_bounded_text_and_is_the_identity_on_it(
    text: str, limit: int
) -> None:
    shown = safe_text(text, limit)
    assert shown.isprintable()
    assert len(shown) <= limit
    assert safe_text(shown, limit) == shown
    if text.isprintable() and len(text) <= limit:
        assert shown == text
    elif text.isprintable():
        assert shown == text[: limit - 1] + "…"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("a\nINFO - forged", "a\\nINFO - forged"),
        ("\r\t", "\\r\\t"),
        ("\x1b[2J\x07\x00\x7f", "\\x1b[2J\\x07\\x00\\x7f"),
        ("\x85", "\\x85"),  # a C1 control: NEL, a line break to some terminals
        ("abc\u202etxt.exe", "abc\\u202etxt.exe"),  # right-to-left override
        ("\u2066\u2069\u200e\u061c", "\\u2066\\u2069\\u200e\\u061c"),  # isolates, marks
        ("\u2028\u2029", "\\u2028\\u2029"),  # line and paragraph separators
        ("\ufeff\u200b", "\\ufeff\\u200b"),  # byte order mark, zero width space
        ("\ud800", "\\ud800"),  # a lone surrogate: no UTF-8 store accepts it
        ("\U000e0041", "\\U000e0041"),  # a tag character
        ("é ü 日本 ` * [x](y) <b> \\", "é ü 日本 ` * [x](y) <b> \\"),  # printable: as it is
    ],
)
def test_safe_text_escapes_what_is_not_printable_and_keeps_what_is(text: str, shown: str) -> None:
    assert safe_text(text) == shown


def test_safe_text_cuts_on_whole_escapes_and_marks_the_cut() -> None:
    assert safe_text("A" * 20_000) == "A" * (MAX_TEXT - 1) + "…"
    assert safe_text("a" * 10 + "\x1b", 12) == "a" * 10 + "…"  # "\\x1b" would not fit whole
    assert safe_text("a" * 8 + "\x1b", 12) == "a" * 8 + "\\x1b"  # it fits: nothing is cut
    assert safe_text("\n" * 1_000_000, 7) == "\\n\\n\\n…"  # a huge value costs the limit, not its size
    with pytest.raises(ValueError, match="at least 1"):
        safe_text("\n", 0)
