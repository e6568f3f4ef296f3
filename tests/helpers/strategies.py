"""Hypothesis strategies for frames on the wire, in both directions.

Every strategy mixes the shapes a broken or hostile peer can send: valid messages (often ones
that fit the conversation so far, to reach deep states), the same with one field dropped,
replaced by a value of another type or a huge number, unknown fields and types, truncated text,
non-JSON, non-objects, and binary frames (``bytes``).
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from airflow_provider_systemzero.protocol.limits import ADVERTISED_LIMITS, Limits
from airflow_provider_systemzero.protocol.messages import PROTOCOL

STREAM_ID = "szws_" + "f" * 32
QUESTIONS = {"ready": {"type": "boolean", "instructions": "Is the job ready?"}}
REPLY = {
    "id": "szd_" + "a" * 32,
    "model": "m",
    "served_by": "s",
    "created": 1,
    "answers": {
        "ready": {
            "type": "boolean",
            "probability": 0.9,
            "confidence": 0.9,
            "decision": True,
            "alternatives": [{"decision": False, "confidence": 0.1}],
            "calibrated": False,
        }
    },
    "usage": {"input_tokens": 1},
}

#: Numbers a parser must survive: zero, negatives, floats, huge integers, floats at the edge.
huge_numbers = st.sampled_from(
    [0, -1, 1, 2**31, 2**63, -(2**63), 2**64 + 1, 10**40, 1e308, -1e308, 0.5, 1.7976931348623157e308]
)
text_values = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    huge_numbers,
    text_values,
    st.floats(allow_nan=False, allow_infinity=False),
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(text_values, children, max_size=3)
    ),
    max_leaves=8,
)

event_ids = st.sampled_from(["evt_1", "evt_2", "evt_3", "evt_0", "evt_01", "evt_-1", "evt_x", "", "EVT_1"])
versions = st.one_of(st.integers(min_value=0, max_value=4), huge_numbers)
http_statuses = st.sampled_from([None, 200, 400, 401, 409, 422, 429, 500, 503, 529, 99, 1000])
envelopes = st.one_of(
    st.builds(
        lambda t, c: {"error": {"type": t, "code": c, "message": "m"}},
        st.sampled_from(
            [
                "rate_limit_error",
                "overloaded_error",
                "idempotency_error",
                "api_error",
                "invalid_request_error",
                "authentication_error",
                "brand_new_error",
            ]
        ),
        st.sampled_from(
            [
                "rate_limited",
                "overloaded",
                "maintenance",
                "idempotency_conflict",
                "idempotency_key_reused",
                "stale_state_version",
                "shutting_down",
                "event_rate_limited",
                "too_many_pending_events",
                "decide_not_allowed",
                "start_required",
                "invalid_message",
                "whatever",
            ]
        ),
    ),
    json_values,
)
retries = st.one_of(
    st.fixed_dictionaries(
        {"retryable": st.booleans(), "retry_after_ms": st.one_of(st.none(), st.integers(0, 500))}
    ),
    json_values,
)


def _limits(values: dict[str, Any] | None = None) -> dict[str, Any]:
    limits = Limits(heartbeat_interval_ms=60_000, pong_timeout_ms=60_000).advertised()
    limits.update(values or {})
    return limits


odd_limits = st.dictionaries(
    st.sampled_from(ADVERTISED_LIMITS), st.one_of(huge_numbers, json_scalars), max_size=3
)


def _server(kind: str, seq: int, **fields: Any) -> dict[str, Any]:
    return {"type": kind, "stream_id": STREAM_ID, "seq": seq, **fields}


@st.composite
def valid_server_messages(draw: st.DrawFn) -> dict[str, Any]:
    """A well-formed server message whose values may or may not fit the conversation."""
    seq = draw(st.integers(min_value=1, max_value=50))
    kind = draw(st.sampled_from(["hello", "ack", "scheduled", "decision", "error", "ping", "goodbye"]))
    if kind == "hello":
        return _server(
            "hello",
            seq,
            protocol=draw(st.sampled_from([PROTOCOL, "other.v2"])),
            request_id="r",
            limits=_limits(),
            rate_limit=None,
        )
    if kind == "ack":
        return _server(
            "ack",
            seq,
            event_id=draw(event_ids),
            state_version=draw(st.integers(1, 4)),
            state_bytes=draw(st.integers(0, 100)),
            synthesized_body_bytes=draw(st.integers(0, 400)),
            scheduled=draw(st.booleans()),
        )
    if kind == "scheduled":
        return _server("scheduled", seq, state_version=draw(st.integers(1, 4)), in_flight=draw(st.booleans()))
    if kind == "decision":
        reply = draw(
            st.one_of(
                st.just(REPLY),
                st.dictionaries(text_values, json_values, max_size=3),
                st.just({"answers": {"ready": "yes"}}),
                st.just({"answers": []}),
            )
        )
        return _server(
            "decision",
            seq,
            state_version=draw(st.integers(1, 4)),
            covered_event_ids=draw(st.lists(event_ids, max_size=3)),
            reply=reply,
            request_id="r",
            http_status=200,
            server_timing=None,
            latency_ms=None,
            rate_limit=None,
            queue_ms=0,
            decide_ms=draw(st.one_of(st.integers(0, 10), huge_numbers)),
        )
    if kind == "error":
        return _server(
            "error",
            seq,
            event_id=draw(st.one_of(st.none(), event_ids)),
            state_version=draw(st.one_of(st.none(), st.integers(1, 4))),
            http_status=draw(http_statuses),
            request_id="r",
            fatal=draw(st.booleans()),
            error={"envelope": draw(envelopes), "retry": draw(retries)},
        )
    if kind == "ping":
        return _server("ping", seq, nonce=draw(st.one_of(st.integers(0, 5), huge_numbers)))
    return _server(
        "goodbye",
        seq,
        reason=draw(
            st.sampled_from(
                ["shutdown", "idle_timeout", "max_duration", "overload", "event_limit", "new_reason"]
            )
        ),
        state_version=draw(st.one_of(st.none(), st.integers(1, 4))),
        last_decision_state_version=None,
        resume={
            "supported": False,
            "action": "reconnect_and_replay",
            "retry_after_ms": draw(st.one_of(st.none(), st.integers(0, 300), huge_numbers)),
        },
    )


@st.composite
def mutated(draw: st.DrawFn, messages: st.SearchStrategy[dict[str, Any]]) -> dict[str, Any]:
    """A message with one field dropped, retyped, set to a huge number, or an unknown field/type."""
    message = dict(draw(messages))
    how = draw(
        st.sampled_from(["drop", "retype", "huge", "unknown_field", "unknown_type", "no_type", "odd_limits"])
    )
    names = sorted(message)
    name = draw(st.sampled_from(names))
    if how == "drop":
        message.pop(name)
    elif how == "retype":
        message[name] = draw(json_values)
    elif how == "huge":
        message[name] = draw(huge_numbers)
    elif how == "unknown_field":
        message[draw(text_values)] = draw(json_values)
    elif how == "unknown_type":
        message["type"] = draw(st.sampled_from(["", "hello2", "Ack", "pong", "start", "decide", "💥"]))
    elif how == "no_type":
        message.pop("type", None)
    elif "limits" in message:
        message["limits"] = _limits(draw(odd_limits))
    return message


def _encode(message: Any) -> str:
    return json.dumps(message, ensure_ascii=False)


@st.composite
def truncated(draw: st.DrawFn, messages: st.SearchStrategy[dict[str, Any]]) -> str:
    """A message cut short."""
    text = _encode(draw(messages))
    return text[: draw(st.integers(min_value=0, max_value=max(0, len(text) - 1)))]


garbage = st.one_of(
    st.sampled_from(
        [
            "",
            " ",
            "null",
            "[]",
            "42",
            '"hello"',
            "{",
            "}",
            "{}",
            '{"type": 1}',
            '{"type": null}',
            "NaN",
            "[" * 5000 + "]" * 5000,
            '{"type":"hello","seq":' + "9" * 5000 + "}",
            "\ufeff{}",
            '{"a":' * 3000 + "1" + "}" * 3000,
        ]
    ),
    text_values,
)
binary = st.binary(max_size=16)


def frames_from(messages: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[str | bytes]:
    """Text frames (valid, mutated, truncated, garbage) and binary frames."""
    return st.one_of(
        messages.map(_encode), mutated(messages).map(_encode), truncated(messages), garbage, binary
    )


server_frames = frames_from(valid_server_messages())


# ------------------------------------------------------------------------------------ client → server


@st.composite
def valid_client_messages(draw: st.DrawFn) -> dict[str, Any]:
    """A well-formed client message whose values may or may not fit the conversation."""
    kind = draw(
        st.sampled_from(
            ["start", "append_text", "append_items", "replace", "append_attachments", "decide", "pong"]
        )
    )
    key = draw(st.one_of(st.none(), st.sampled_from(["k1", "k2", " k ", "", "x" * 300, "ключ"])))
    base: dict[str, Any] = {"type": kind}
    if kind == "start":
        state = draw(st.one_of(text_values, st.lists(json_scalars, max_size=3), st.just({"a": 1})))
        request = {
            "model": draw(st.sampled_from(["m", "", "x" * 300])),
            "state": state,
            "questions": draw(
                st.one_of(st.just(QUESTIONS), st.just({}), st.just({"9bad": QUESTIONS["ready"]}))
            ),
            "prompt_cache_key": "p",
        }
        if draw(st.booleans()):
            request["route"], request["mode"] = draw(
                st.sampled_from([("committee", "deliberate"), ("direct", "fast"), ("x", "y")])
            )
        base.update(
            event_id=draw(event_ids),
            request=request,
            decision_mode=draw(st.sampled_from(["on_change", "on_request", "sometimes"])),
            min_interval_ms=draw(st.one_of(st.none(), st.integers(-1, 70_000))),
        )
    elif kind == "append_text":
        base.update(event_id=draw(event_ids), text=draw(text_values))
    elif kind == "append_items":
        base.update(event_id=draw(event_ids), items=draw(st.lists(json_scalars, max_size=3)))
    elif kind == "replace":
        base.update(
            event_id=draw(event_ids), state=draw(st.one_of(text_values, st.lists(json_scalars, max_size=2)))
        )
        if draw(st.booleans()):
            base["attachments"] = draw(
                st.sampled_from(
                    [
                        [],
                        [{"name": "a", "data": "data:text/plain;base64,aGk="}],
                        [{"name": "1", "data": "nope"}],
                    ]
                )
            )
    elif kind == "append_attachments":
        base.update(
            event_id=draw(event_ids),
            attachments=draw(
                st.sampled_from(
                    [
                        [{"name": "a", "data": "data:text/plain;base64,aGk="}],
                        [],
                        [{"name": "a", "data": "x"}] * 2,
                    ]
                )
            ),
        )
    elif kind == "decide":
        base.update(state_version=draw(versions))
    else:
        base.update(nonce=draw(st.one_of(st.integers(0, 5), huge_numbers)))
    if kind not in ("decide", "pong") and key is not None:
        base["idempotency_key"] = key
    return base


client_frames = frames_from(valid_client_messages())
