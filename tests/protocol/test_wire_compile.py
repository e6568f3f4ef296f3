"""The compiled encoders and fast decoders (protocol/wire_compile.py) say exactly what the
interpreter of the declarations says: the same bytes for every message, and for every object a
decoder reads — valid, mistyped, missing a field, carrying an unknown one — the same message or
the same refusal (message, code, field, kind)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_systemzero.protocol import messages as m
from airflow_provider_systemzero.protocol import wire
from airflow_provider_systemzero.protocol.errors import ProtocolError
from tests.protocol.test_message_declarations import CLIENT, MESSAGES


class _Interpreted(dict):  # type: ignore[type-arg]
    """A cache that never has a compiled function: every call interprets the declaration."""

    def __missing__(self, key: Any) -> None:
        return None


@contextlib.contextmanager
def interpreted() -> Iterator[None]:
    saved = wire._ENCODERS, wire._DECODERS
    wire._ENCODERS, wire._DECODERS = _Interpreted(), _Interpreted()
    try:
        yield
    finally:
        wire._ENCODERS, wire._DECODERS = saved


def _outcome(text: str, client: bool) -> Any:
    decode = m.decode_client_message if client else m.decode_server_message
    try:
        return ("message", decode(text))
    except ProtocolError as exc:
        return (
            "refused",
            type(exc),
            exc.message,
            exc.code,
            exc.field,
            getattr(exc, "protocol_refusal", None),
        )


#: Values of every JSON type, to put where a field expects one type.
_WRONG = [None, True, 0, -1, 1.5, "x", "", [], ["x"], [1], {}, {"k": 1}]


def _variants(data: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The object as it is, then with each key dropped, each value replaced by a value of each JSON
    type, and with an unknown key added."""
    yield data
    for key in data:
        if key == "type":
            continue
        yield {k: v for k, v in data.items() if k != key}
        for value in _WRONG:
            yield {**data, key: value}
    yield {**data, "surplus": 1}


@settings(max_examples=300, deadline=None)
@given(st.one_of(*MESSAGES.values()))
def test_compiled_and_interpreted_codecs_agree(message: Any) -> None:
    with interpreted():
        expected_text = m.encode_message(message)
    assert m.encode_message(message) == expected_text
    client = isinstance(message, CLIENT)
    for variant in _variants(json.loads(expected_text)):
        text = json.dumps(variant)
        with interpreted():
            expected = _outcome(text, client)
        assert _outcome(text, client) == expected, text


@pytest.mark.parametrize("cls", sorted(MESSAGES, key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_the_flat_messages_are_compiled(cls: type) -> None:
    """The messages of a stream's steady state take the compiled path (the nested ones are read by
    the interpreter: their fields sit in objects of their own)."""
    nested = {m.Start, m.Error, m.Goodbye, m.Hello, m.AppendAttachments}
    encoder = wire.compile_encoder(cls, wire._plan(cls).slots)
    decoder = wire.compile_decoder(cls, wire._plan(cls).slots, allowed=None, string_array=wire.StringTuple)
    assert (encoder is None) == (cls in {m.Start, m.Error, m.Goodbye})
    assert (decoder is None) == (cls in nested)
