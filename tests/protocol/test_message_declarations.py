"""Every message type is declared once; its encoding and decoding come from that declaration.

A round trip over every message type (values drawn across each field's range, optional fields
present and absent) must give back the same message and the same bytes, and a question's shape
is the same check whether it arrives in a frame or from a caller.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_systemzero.protocol import messages as m
from airflow_provider_systemzero.protocol.errors import (
    MAX_SERVER_DELAY_MS,
    ErrorEnvelope,
    LocalProtocolError,
    RemoteProtocolError,
    RetryHint,
)
from airflow_provider_systemzero.protocol.limits import ADVERTISED_BOUNDS, ADVERTISED_LIMITS, Limits

texts = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=8)
names = st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True)
safe_ints = st.integers(min_value=-(2**53 - 1), max_value=2**53 - 1)
positives = st.integers(min_value=1, max_value=2**53 - 1)
numbers = st.one_of(safe_ints, st.floats(allow_nan=False, allow_infinity=False))
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), numbers, texts),
    lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(texts, children, max_size=3)),
    max_leaves=6,
)
objects = st.dictionaries(texts, json_values, max_size=3)
states = st.one_of(texts, st.lists(json_values, max_size=3), objects)
keys = st.one_of(st.none(), texts)
attachments = st.lists(st.builds(m.Attachment, name=names, data=texts), max_size=2).map(tuple)
questions = st.one_of(
    st.builds(m.Question, type=texts, instructions=texts, options=st.none()),
    st.builds(m.Question, type=texts, instructions=texts, options=st.lists(texts, max_size=3).map(tuple)),
)
requests = st.builds(
    m.StreamRequest,
    model=texts,
    questions=st.dictionaries(names, questions, min_size=1, max_size=3).map(lambda d: tuple(d.items())),
    route=keys,
    mode=keys,
    prompt_cache_key=keys,
)
limits = st.fixed_dictionaries(
    {name: st.integers(*ADVERTISED_BOUNDS[name]) for name in ADVERTISED_LIMITS}
).map(lambda values: Limits(**values))
envelopes = st.builds(ErrorEnvelope, type=texts, code=texts, message=texts)
retries = st.builds(
    RetryHint,
    retryable=st.booleans(),
    retry_after_ms=st.one_of(st.none(), st.integers(0, MAX_SERVER_DELAY_MS)),
)
common = {"stream_id": texts, "seq": positives}
# the ranges of the numbers a server message carries (a value outside is refused)
versions = st.integers(1, m.MAX_STATE_VERSION)
some_versions = st.one_of(st.none(), st.integers(0, m.MAX_STATE_VERSION))
body_bytes = st.integers(0, Limits().max_decide_body_bytes)
statuses = st.integers(*m.HTTP_STATUSES)
dispatch_ms = st.one_of(
    st.none(), st.integers(0, m.MAX_DISPATCH_MS), st.floats(0, m.MAX_DISPATCH_MS, allow_nan=False)
)

MESSAGES: dict[type[Any], st.SearchStrategy[Any]] = {
    m.Start: st.builds(
        m.Start,
        event_id=texts,
        request=requests,
        state=states,
        decision_mode=texts,
        attachments=attachments,
        min_interval_ms=st.one_of(st.none(), safe_ints),
        idempotency_key=keys,
    ),
    m.AppendText: st.builds(m.AppendText, event_id=texts, text=texts, idempotency_key=keys),
    m.AppendItems: st.builds(
        m.AppendItems, event_id=texts, items=st.lists(json_values, max_size=3), idempotency_key=keys
    ),
    m.Replace: st.builds(
        m.Replace,
        event_id=texts,
        state=states,
        attachments=st.one_of(st.none(), attachments),
        idempotency_key=keys,
    ),
    m.AppendAttachments: st.builds(
        m.AppendAttachments, event_id=texts, attachments=attachments, idempotency_key=keys
    ),
    m.Decide: st.builds(m.Decide, state_version=safe_ints),
    m.Pong: st.builds(m.Pong, nonce=safe_ints),
    m.Hello: st.builds(
        m.Hello,
        **common,
        protocol=texts,
        request_id=texts,
        limits=limits,
        rate_limit=st.one_of(st.none(), objects),
    ),
    m.Ack: st.builds(
        m.Ack,
        **common,
        event_id=texts,
        state_version=versions,
        state_bytes=body_bytes,
        synthesized_body_bytes=body_bytes,
        scheduled=st.booleans(),
    ),
    m.Scheduled: st.builds(m.Scheduled, **common, state_version=versions, in_flight=st.booleans()),
    m.Decision: st.builds(
        m.Decision,
        **common,
        state_version=versions,
        covered_event_ids=st.lists(texts, max_size=3).map(tuple),
        reply=objects,
        request_id=texts,
        http_status=statuses,
        server_timing=json_values,
        latency_ms=dispatch_ms,
        rate_limit=json_values,
        queue_ms=dispatch_ms,
        decide_ms=dispatch_ms,
    ),
    m.Error: st.builds(
        m.Error,
        **common,
        event_id=keys,
        state_version=some_versions,
        http_status=st.one_of(st.none(), statuses),
        request_id=texts,
        fatal=st.booleans(),
        envelope=envelopes,
        retry=retries,
    ),
    m.Ping: st.builds(m.Ping, **common, nonce=safe_ints),
    m.Goodbye: st.builds(
        m.Goodbye,
        **common,
        reason=texts,
        state_version=some_versions,
        last_decision_state_version=some_versions,
        retry_after_ms=st.one_of(st.none(), st.integers(0, MAX_SERVER_DELAY_MS)),
    ),
}

CLIENT = (m.Start, m.AppendText, m.AppendItems, m.Replace, m.AppendAttachments, m.Decide, m.Pong)


def test_every_message_type_has_a_strategy() -> None:
    declared = set(m.ClientMessage.__args__) | set(m.ServerMessage.__args__)  # type: ignore[attr-defined]
    assert declared == set(MESSAGES)


@settings(max_examples=400, deadline=None)
@given(st.one_of(*MESSAGES.values()))
def test_every_message_round_trips_byte_for_byte(message: Any) -> None:
    text = m.encode_message(message)
    decode = m.decode_client_message if isinstance(message, CLIENT) else m.decode_server_message
    again = decode(text)
    assert again == message
    assert m.encode_message(again) == text
    assert next(iter(json.loads(text).items())) == ("type", message.TYPE)


def test_the_canonical_key_orders_are_the_public_examples() -> None:
    request = m.StreamRequest.build(
        model="m",
        questions={"c": {"type": "choice", "instructions": "Pick", "options": ["a"]}},
        route="direct",
        mode="fast",
        prompt_cache_key="k",
    )
    start = m.Start("evt_1", request, "s", "on_change", (m.Attachment("a", "data:,"),), 5, "key")
    data = json.loads(m.encode_message(start))
    assert list(data) == [
        "type",
        "event_id",
        "request",
        "decision_mode",
        "min_interval_ms",
        "idempotency_key",
    ]
    assert list(data["request"]) == [
        "model",
        "state",
        "questions",
        "attachments",
        "route",
        "mode",
        "prompt_cache_key",
    ]
    goodbye = json.loads(m.encode_message(m.Goodbye("s", 3, "shutdown", 2, None, 500)))
    assert goodbye["resume"] == {"supported": False, "action": "reconnect_and_replay", "retry_after_ms": 500}
    error = json.loads(
        m.encode_message(m.Error("s", 1, None, None, None, "r", False, ErrorEnvelope("t", "c", "x")))
    )
    assert list(error)[-1] == "error" and list(error["error"]) == ["envelope", "retry"]
    hello = json.loads(m.encode_message(m.Hello("s", 1, m.PROTOCOL, "r", Limits())))
    assert (
        tuple(hello["limits"]) == ADVERTISED_LIMITS and hello["limits"]["native_control_byte_burst"] == 1024
    )


def test_the_advertised_limits_are_marked_not_counted() -> None:
    assert ADVERTISED_LIMITS[0] == "max_duration_ms" and ADVERTISED_LIMITS[-1] == "native_control_byte_burst"
    assert "maximum_decision_interval_ms" not in ADVERTISED_LIMITS and len(ADVERTISED_LIMITS) == 24


def _frame_with(question: Any) -> str:
    return json.dumps(
        {
            "type": "start",
            "event_id": "evt_1",
            "decision_mode": "on_change",
            "request": {"model": "m", "state": "s", "questions": {"q": question}},
        }
    )


@pytest.mark.parametrize(
    ("question", "problem"),
    [
        (
            {"type": "choice", "instructions": "x", "options": ["a", 2]},
            "questions.q.options[1] must be a string",
        ),
        ({"type": 3, "instructions": "x"}, "questions.q.type must be a string, got number"),
        ({"instructions": "x"}, "questions.q is missing required field 'type'"),
        ({"type": "choice", "instructions": "x", "options": "ab"}, "questions.q.options must be an array"),
    ],
)
def test_a_question_shape_is_one_check_for_frames_and_callers(question: dict[str, Any], problem: str) -> None:
    with pytest.raises(RemoteProtocolError, match=problem.replace("[", r"\[").replace("]", r"\]")) as remote:
        m.decode_client_message(_frame_with(question))
    with pytest.raises(LocalProtocolError, match=problem.replace("[", r"\[").replace("]", r"\]")) as local:
        m.StreamRequest.build(model="m", questions={"q": question})
    assert remote.value.protocol_refusal and local.value.code == "invalid_question"
    assert local.value.field is not None and local.value.field.startswith("questions.q")


def test_an_unknown_question_key_is_a_rejection_in_a_frame_and_an_error_from_a_caller() -> None:
    question = {"type": "boolean", "instructions": "x", "colour": "red"}
    with pytest.raises(RemoteProtocolError, match=r"questions\.q\.colour is not a field") as remote:
        m.decode_client_message(_frame_with(question))
    assert remote.value.protocol_refusal is False and remote.value.code == "unknown_field"
    with pytest.raises(LocalProtocolError, match="unknown field 'colour'") as local:
        m.StreamRequest.build(model="m", questions={"q": question})
    assert local.value.field == "questions.q.colour"
