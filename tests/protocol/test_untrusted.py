"""The one function a gateway's text passes through (``protocol/untrusted.py``) and the check that
a reply can be stored (``protocol/reply.py``), as pure functions: what they let through, what they
change, and that ``safe_text`` is the identity on what it already let through."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_systemzero.protocol.errors import RemoteProtocolError
from airflow_provider_systemzero.protocol.messages import Decision, Question
from airflow_provider_systemzero.protocol.reply import (
    MAX_REPLY_DEPTH,
    RESERVED_KEYS,
    DecisionResult,
    storable_reply,
)
from airflow_provider_systemzero.protocol.untrusted import MAX_TEXT, safe_text
from tests.helpers import nested

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


# ------------------------------------------------------------------------------------ storable


def test_a_reply_may_nest_as_deep_as_the_limit_and_no_deeper() -> None:
    storable_reply(nested(MAX_REPLY_DEPTH))
    with pytest.raises(RemoteProtocolError) as caught:
        storable_reply(nested(MAX_REPLY_DEPTH + 1))
    assert caught.value.code == "unstorable_reply" and caught.value.field == "reply"
    assert f"deeper than {MAX_REPLY_DEPTH} levels" in str(caught.value)


def test_every_string_of_a_reply_keys_included_is_made_safe() -> None:
    value = {"a\nb": ["\x1b", {"c": "d\u202e", "n": 1.5, "t": True, "z": None}], "k": "x" * 300}
    assert storable_reply(value) == {
        "a\\nb": ["\\x1b", {"c": "d\\u202e", "n": 1.5, "t": True, "z": None}],
        "k": "x" * (MAX_TEXT - 1) + "…",
    }
    plain = {"id": "szd_" + "0" * 32, "answers": {"ready": {"decision": True, "confidence": 0.9}}}
    assert storable_reply(plain) == plain and storable_reply(plain) is not plain


def test_a_reply_nested_far_too_deep_is_refused_without_recursion() -> None:
    value: list[Any] = []
    for _ in range(200_000):
        value = [value]
    with pytest.raises(RemoteProtocolError, match="deeper than"):
        storable_reply({"context": value})


@pytest.mark.parametrize("key", sorted(RESERVED_KEYS))
def test_a_key_airflows_serializer_reserves_is_refused_wherever_it_is(key: str) -> None:
    with pytest.raises(RemoteProtocolError) as caught:
        storable_reply({"context": {"list": [{key: "builtins.dict"}]}})
    assert caught.value.code == "unstorable_reply"
    assert caught.value.field == "reply.context.list[0]" and repr(key) in str(caught.value)


QUESTIONS = (("ready", Question("boolean", "Is it ready?")), ("tier", Question("choice", "?", ("a\nb", "c"))))


def _decision(
    reply: dict[str, Any], covered: tuple[str, ...] = ("evt_1",), request_id: str = "req"
) -> Decision:
    return Decision("szws_" + "0" * 32, 2, 1, covered, reply, request_id)


def test_a_decision_holds_the_gateways_strings_only_made_safe() -> None:
    reply = {
        "id": "szd_\nforged",
        "model": "m\x1b[2J",
        "context": {"note\n": "x" * 500},
        "answers": {
            "ready": {
                "decision": True,
                "calibration_version": "v\u202e1",
                "alternatives": [{"decision": "\n"}],
            },
            "tier": {"decision": "a\nb", "alternatives": [{"decision": "c"}]},
        },
    }
    message = _decision(reply, ("evt_1\n",), "req\n" + "r" * 500)
    result = DecisionResult.from_message(message, QUESTIONS)
    assert result.reply_id == "szd_\\nforged" and result.model == "m\\x1b[2J"
    assert result.reply["context"] == {"note\\n": "x" * (MAX_TEXT - 1) + "…"}
    assert result.answer("ready").calibration_version == "v\\u202e1"
    assert result.answer("ready").alternatives == ({"decision": "\\n"},)
    assert result.answer("tier").decision == "a\nb"  # checked against the caller's own option: kept
    assert result.request_id == "req\\n" + "r" * (MAX_TEXT - 6) + "…"
    assert result.covered_event_ids == ("evt_1\\n",)
    assert reply["id"] == "szd_\nforged"  # the message itself is left as it was decoded
    unchecked = DecisionResult.from_message(message)  # read leniently: no option was checked
    assert unchecked.answer("tier").decision == "a\\nb"


def test_a_decision_whose_reply_cannot_be_stored_is_refused_even_read_leniently() -> None:
    with pytest.raises(RemoteProtocolError, match="deeper than"):
        DecisionResult.from_message(_decision(nested(MAX_REPLY_DEPTH + 1)))
