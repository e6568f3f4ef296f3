"""Strict decoding, canonical encoding, retry hints and the upgrade rules."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_provider_systemzero.protocol import (
    ErrorEnvelope,
    Limits,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    RetryHint,
    decode_client_message,
    decode_server_message,
    encode_message,
)
from airflow_provider_systemzero.protocol.gateway import GatewaySession
from airflow_provider_systemzero.protocol.upgrade import check_upgrade, stream_capacity, stream_url

SID = "szws_" + "d" * 32


def server(kind: str, **fields: Any) -> str:
    return json.dumps({"type": kind, "stream_id": SID, "seq": 2, **fields})


@pytest.mark.parametrize(
    ("frame", "field"),
    [
        (
            server(
                "ack",
                event_id="evt_1",
                state_version=1,
                state_bytes=1,
                synthesized_body_bytes=1,
                scheduled="no",
            ),
            "scheduled",
        ),
        (
            server(
                "ack",
                event_id="evt_1",
                state_version=1,
                state_bytes=1.5,
                synthesized_body_bytes=1,
                scheduled=True,
            ),
            "state_bytes",
        ),
        (server("ping", nonce="1"), "nonce"),
        (server("scheduled", state_version=0, in_flight=False), "state_version"),
        (json.dumps({"type": "ping", "seq": 1, "nonce": 1}), "stream_id"),
        (
            server(
                "decision", state_version=1, covered_event_ids=[1], reply={}, request_id="r", http_status=200
            ),
            "covered_event_ids",
        ),
        (
            server(
                "error",
                event_id=None,
                state_version=None,
                http_status=None,
                request_id="r",
                fatal=False,
                error={
                    "envelope": {"error": {"type": "x", "code": 5, "message": "m"}},
                    "retry": {"retryable": False, "retry_after_ms": None},
                },
            ),
            "error.envelope.error.code",
        ),
        (
            server(
                "goodbye",
                reason="shutdown",
                state_version=1,
                last_decision_state_version=None,
                resume={"retry_after_ms": -1},
            ),
            "retry_after_ms",
        ),
        (
            server("hello", protocol="p", request_id="r", limits={"max_duration_ms": 1}),
            "limits.idle_timeout_ms",
        ),
        (server("telepathy"), "type"),
    ],
)
def test_server_frames_are_decoded_strictly(frame: str, field: str) -> None:
    with pytest.raises(RemoteProtocolError) as info:
        decode_server_message(frame)
    assert info.value.field == field and info.value.protocol_refusal


@pytest.mark.parametrize("frame", [b"\x00binary", "{", "null", "[]", '{"type": 1}'])
def test_frames_that_are_not_json_objects_are_refused(frame: Any) -> None:
    for decode in (decode_client_message, decode_server_message):
        with pytest.raises(
            RemoteProtocolError, match=r"binary frames|not valid JSON|not an object|no string 'type'"
        ):
            decode(frame)


def test_every_server_message_round_trips_through_a_real_session() -> None:
    g = GatewaySession(stream_id=SID, now=0, limits=Limits(heartbeat_interval_ms=1))
    g.receive_text(
        json.dumps(
            {
                "type": "start",
                "event_id": "evt_1",
                "decision_mode": "on_change",
                "request": {
                    "model": "m",
                    "state": [1],
                    "questions": {"c": {"type": "choice", "instructions": "Pick", "options": ["a", "b"]}},
                },
            }
        ),
        0,
    )
    g.tick(0.001)
    for action in g.actions() + g.begin_shutdown(0.002, 100):
        message = getattr(action, "message", None)
        if message is not None:
            text = encode_message(message)
            assert (
                decode_server_message(text) == message and encode_message(decode_server_message(text)) == text
            )


def test_client_messages_reject_unknown_fields_server_messages_tolerate_them() -> None:
    with pytest.raises(RemoteProtocolError, match=r"pong\.colour is not a field") as caught:
        decode_client_message(json.dumps({"type": "pong", "nonce": 1, "colour": "red"}))
    assert (
        caught.value.protocol_refusal is False
        and caught.value.code == "unknown_field"
        and caught.value.field == "colour"
    )
    # a mistyped field still makes it a refusal, whatever else is wrong
    with pytest.raises(RemoteProtocolError) as caught:
        decode_client_message(json.dumps({"type": "pong", "nonce": "1", "colour": "red"}))
    assert caught.value.protocol_refusal is True
    assert decode_server_message(server("ping", nonce=3, colour="red")).nonce == 3


def test_protocol_error_is_abstract_and_errors_name_fields() -> None:
    with pytest.raises(TypeError):
        ProtocolError("x", code="c")
    err = LocalProtocolError("field x is bad: rule", code="c", field="x")
    assert isinstance(err, ValueError) and err.field == "x" and "rule" in str(err)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"Retry-After-Ms": "1500", "Retry-After": "9"}, 1500),
        ({"retry-after": "2"}, 2000),
        ({"Retry-After": "0.25"}, 250),
        ({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, None),
        ({"Retry-After-Ms": "soon", "Retry-After": "1"}, 1000),
        ({}, None),
    ],
)
def test_retry_after_ms_beats_retry_after(headers: dict[str, str], expected: int | None) -> None:
    assert RetryHint.delay_from_headers(headers) == expected
    assert RetryHint.from_headers(headers, retryable=True) == RetryHint(True, expected)


def test_envelope_round_trip() -> None:
    env = ErrorEnvelope("rate_limit_error", "rate_limited", "slow down")
    assert ErrorEnvelope.from_dict(env.to_dict()) == env


@pytest.mark.parametrize(
    ("origin", "url"),
    [
        ("https://api.example.com", "wss://api.example.com/v1/system-zero/stream"),
        ("wss://api.example.com:8443/", "wss://api.example.com:8443/v1/system-zero/stream"),
        ("api.example.com", "wss://api.example.com/v1/system-zero/stream"),
        ("ws://127.0.0.1:9000", "ws://127.0.0.1:9000/v1/system-zero/stream"),
        ("http://localhost:9000", "ws://localhost:9000/v1/system-zero/stream"),
        ("ws://[::1]:9000", "ws://[::1]:9000/v1/system-zero/stream"),
    ],
)
def test_stream_url(origin: str, url: str) -> None:
    assert stream_url(origin) == url


@pytest.mark.parametrize(
    ("origin", "message"),
    [
        ("ws://api.example.com", "plaintext ws:// is allowed only to a loopback host"),
        ("http://10.0.0.5:80", "plaintext http:// is allowed only to a loopback host"),
        ("wss://user:secret@api.example.com", "must not contain credentials"),
        ("wss://api.example.com/v1", "must not contain a path"),
        ("wss://api.example.com?x=1", "must not contain a query"),
        ("wss://api.example.com#frag", "must not contain a fragment"),
        ("ftp://api.example.com", "scheme 'ftp' is not supported"),
        ("", "is empty"),
    ],
)
def test_bad_origins_are_refused(origin: str, message: str) -> None:
    with pytest.raises(LocalProtocolError, match=message) as info:
        stream_url(origin)
    assert "secret" not in str(info.value)


GOOD = {"Sec-WebSocket-Protocol": "system-zero.stream.v1", "Authorization": "Bearer k"}


@pytest.mark.parametrize(
    ("path", "headers", "status", "code"),
    [
        ("/v1/system-zero/stream/", GOOD, 404, "not_found"),
        ("/v1/other", GOOD, 404, "not_found"),
        ("/v1/system-zero/stream?x=1", GOOD, 400, "query_not_allowed"),
        ("/v1/system-zero/stream", {**GOOD, "Origin": "https://x"}, 403, "browser_context_forbidden"),
        ("/v1/system-zero/stream", {**GOOD, "Cookie": "a=b"}, 403, "browser_context_forbidden"),
        (
            "/v1/system-zero/stream",
            {**GOOD, "Sec-WebSocket-Extensions": "permessage-deflate"},
            400,
            "compression_not_supported",
        ),
        (
            "/v1/system-zero/stream",
            {**GOOD, "Sec-WebSocket-Protocol": "system-zero.stream.v1, other"},
            400,
            "unsupported_protocol",
        ),
        ("/v1/system-zero/stream", {"Authorization": "Bearer k"}, 400, "unsupported_protocol"),
        ("/v1/system-zero/stream", {**GOOD, "Authorization": "Basic k"}, 401, "missing_credentials"),
        ("/v1/system-zero/stream", {**GOOD, "Authorization": "Bearer nope"}, 401, "invalid_api_key"),
    ],
)
def test_upgrade_refusals(path: str, headers: dict[str, str], status: int, code: str) -> None:
    refusal = check_upgrade(path, headers, known_key=lambda key: key == "k")
    assert not isinstance(refusal, str)
    assert (refusal.status, refusal.envelope.code) == (status, code)


def test_upgrade_accepted_and_capacity() -> None:
    assert check_upgrade("/v1/system-zero/stream", GOOD, known_key=lambda key: key == "k") == "k"
    assert [stream_capacity(n) for n in (0, 1, 2, 3, 8, 9)] == [1, 1, 1, 1, 4, 4]
