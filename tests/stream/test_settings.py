"""StreamSettings, request building, derived cache keys and the exception tree (no network)."""

from __future__ import annotations

import copy
import logging
import pickle
import weakref

import pytest

from airflow_provider_systemzero.protocol import LocalProtocolError, StreamRequest, keys
from airflow_provider_systemzero.protocol.errors import ErrorEnvelope, RetryHint
from airflow_provider_systemzero.stream import (
    AuthenticationFailed,
    DeadlineExceeded,
    DecisionFailed,
    ProtocolViolation,
    StreamClosed,
    StreamRejected,
    StreamSettings,
    SystemZeroError,
    SystemZeroValidationError,
    UpgradeRefused,
    build_request,
    derive_prompt_cache_key,
)
from airflow_provider_systemzero.stream.connection import _RedactingLogger, connect_options
from tests.helpers.stream import QUESTIONS, SECRET_KEY


def settings(**kwargs: object) -> StreamSettings:
    values: dict[str, object] = {"origin": "api.example.com", "api_key": SECRET_KEY}
    values.update(kwargs)
    return StreamSettings(**values)  # type: ignore[arg-type]


def test_the_key_is_never_shown_or_serialised() -> None:
    s = settings()
    assert SECRET_KEY not in repr(s) and SECRET_KEY not in str(s) and SECRET_KEY not in f"{s}"
    with pytest.raises(TypeError, match="cannot be serialised"):
        pickle.dumps(s)
    with pytest.raises(TypeError, match="cannot be serialised"):
        copy.deepcopy(s)


@pytest.mark.parametrize(
    ("origin", "url"),
    [
        ("api.example.com", "wss://api.example.com/v1/system-zero/stream"),
        ("https://api.example.com", "wss://api.example.com/v1/system-zero/stream"),
        ("wss://api.example.com:8443/", "wss://api.example.com:8443/v1/system-zero/stream"),
        ("ws://127.0.0.1:9000", "ws://127.0.0.1:9000/v1/system-zero/stream"),
        ("http://localhost:9000", "ws://localhost:9000/v1/system-zero/stream"),
    ],
)
def test_the_stream_url_is_exact(origin: str, url: str) -> None:
    assert settings(origin=origin).url == url


@pytest.mark.parametrize(
    ("origin", "message"),
    [
        ("ws://api.example.com", "only to a loopback host"),
        ("wss://user:pw@api.example.com", "must not contain credentials"),
        ("wss://api.example.com/?x=1", "query string"),
        ("wss://api.example.com/v1/system-zero/stream", "must not contain a path"),
        ("ftp://api.example.com", "not supported"),
        ("", "is empty"),
    ],
)
def test_bad_origins_are_refused_before_connecting(origin: str, message: str) -> None:
    with pytest.raises(SystemZeroValidationError, match=message) as info:
        settings(origin=origin, conn_id="sz_prod")
    assert "sz_prod" in str(info.value) and info.value.field == "host"


@pytest.mark.parametrize(
    ("key", "message"),
    [("", "is empty"), ("  ", "is empty"), ("a b", "spaces"), ("k\r\nX-Evil: 1", "control")],
)
def test_bad_keys_are_refused_without_echoing_them(key: str, message: str) -> None:
    with pytest.raises(SystemZeroValidationError, match=message) as info:
        settings(api_key=key)
    assert info.value.field == "password"
    if key.strip():
        assert key not in str(info.value)


def test_connect_options_follow_the_upgrade_contract() -> None:
    s = settings(proxy=None)
    from airflow_provider_systemzero.protocol import Limits

    options = connect_options(s, Limits())
    assert options["additional_headers"] == {"Authorization": f"Bearer {SECRET_KEY}"}
    assert options["subprotocols"] == ["system-zero.stream.v1"]
    assert options["compression"] is None and options["origin"] is None
    assert options["proxy"] is None  # never the environment's proxies
    assert options["max_size"] >= Limits().max_message_bytes
    assert options["ping_interval"] == 10 and options["ping_timeout"] == 10
    assert connect_options(settings(proxy="http://proxy:3128"), Limits())["proxy"] == "http://proxy:3128"


def test_websockets_debug_logs_are_redacted(caplog: pytest.LogCaptureFixture) -> None:
    adapter = _RedactingLogger(logging.getLogger("websockets.client"), SECRET_KEY)
    with caplog.at_level(logging.DEBUG, logger="websockets.client"):
        adapter.debug("> %s: %s", "Authorization", f"Bearer {SECRET_KEY}")
    assert caplog.records and SECRET_KEY not in caplog.text and "Bearer ***" in caplog.text


def test_derived_prompt_cache_keys_are_deterministic() -> None:
    a = derive_prompt_cache_key("team-a", "dag.task")
    assert a == derive_prompt_cache_key("team-a", "dag.task")
    assert a.startswith("team-a-") and len(a) == len("team-a-") + 32
    assert a != derive_prompt_cache_key("team-a", "dag.other")
    assert derive_prompt_cache_key(None, "x").startswith("airflow-systemzero-")
    with pytest.raises(LocalProtocolError, match="prompt_cache_key_prefix") as info:
        derive_prompt_cache_key("p" * 240, "x")
    assert info.value.field == "prompt_cache_key_prefix"
    # through the stream's request, the same refusal is the stream's validation error
    with pytest.raises(SystemZeroValidationError, match=r"^prompt_cache_key_prefix 'ppp") as built:
        build_request(
            {"questions": QUESTIONS}, settings(default_model="m", prompt_cache_key_prefix="p" * 240)
        )
    assert built.value.field == "prompt_cache_key_prefix"


def test_the_prompt_cache_key_rule_is_written_once() -> None:
    """The stream client's name is the core's function, not a second definition of the rule."""
    assert derive_prompt_cache_key is keys.derive_prompt_cache_key


def test_build_request_fills_the_model_and_an_explicit_cache_key() -> None:
    s = settings(default_model="model-a", prompt_cache_key_prefix="pfx")
    request = build_request({"questions": QUESTIONS}, s, identity="dag.task")
    assert request.model == "model-a"
    assert request.prompt_cache_key == derive_prompt_cache_key("pfx", "dag.task")
    # without an identity the key still never depends on the process: it hashes the request
    assert (
        build_request({"questions": QUESTIONS}, s).prompt_cache_key
        == build_request({"questions": QUESTIONS}, s).prompt_cache_key
    )
    explicit = build_request({"model": "m", "questions": QUESTIONS, "prompt_cache_key": "mine"}, s)
    assert explicit.model == "m" and explicit.prompt_cache_key == "mine"
    typed = StreamRequest.build(model="m", questions=QUESTIONS)
    assert build_request(typed, s, identity="i").prompt_cache_key == derive_prompt_cache_key("pfx", "i")


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        ({"questions": QUESTIONS}, "set the 'model' extra of connection 'sz_prod'"),
        ({"model": "m", "questions": QUESTIONS, "state": "x"}, "pass the state with state="),
        ({"model": "m", "questions": {}}, "at least one question"),
        ({"model": "m", "questions": {"1bad": {"type": "boolean", "instructions": "x"}}}, "question name"),
        ("not a request", "must be a StreamRequest or a dict"),
    ],
)
def test_build_request_refuses_bad_requests(request_: object, message: str) -> None:
    with pytest.raises(SystemZeroValidationError, match=message):
        build_request(request_, settings(conn_id="sz_prod"))  # type: ignore[arg-type]


def test_every_error_is_a_system_zero_error_with_a_helpful_message() -> None:
    envelope = ErrorEnvelope("rate_limit_error", "stream_capacity", "full")
    errors = [
        SystemZeroValidationError("bad", code="c", field="f"),
        UpgradeRefused(429, envelope, 1000, url="wss://h/v1/system-zero/stream"),
        AuthenticationFailed(401, ErrorEnvelope("authentication_error", "invalid_api_key", "no"), None),
        DecisionFailed(
            503, ErrorEnvelope("overloaded_error", "overloaded", "busy"), RetryHint(True, 50), True
        ),
        StreamRejected(ErrorEnvelope("invalid_request_error", "decide_body_too_large", "big"), "evt_2"),
        ProtocolViolation("bad frame"),
        StreamClosed(1008, "start_timeout"),
        DeadlineExceeded("late", last_error=OSError("refused")),
    ]
    for error in errors:
        assert isinstance(error, SystemZeroError) and str(error)
    validation = errors[0]
    assert isinstance(validation, LocalProtocolError) and isinstance(validation, ValueError)
    assert isinstance(errors[-1], TimeoutError) and "refused" in str(errors[-1])
    assert "password field" in str(errors[2]) and errors[2].status == 401
    assert errors[1].retryable and not errors[2].retryable
    assert "retry after 1000 ms" in str(errors[1])
    assert "after 50 ms" in str(errors[3]) and errors[3].retryable


def test_equal_settings_read_by_many_waits_are_one_object_and_a_changed_connection_is_not_shared() -> None:
    from airflow_provider_systemzero.stream.settings import shared_settings

    first = shared_settings(StreamSettings("ws://127.0.0.1:9", "key-one", conn_id="shared"))
    again = shared_settings(StreamSettings("ws://127.0.0.1:9", "key-one", conn_id="shared"))
    assert again is first  # the waits on one connection keep one copy
    rotated = shared_settings(StreamSettings("ws://127.0.0.1:9", "key-two", conn_id="shared"))
    assert rotated is not first and rotated.api_key == "key-two"  # a new key is never swapped for the old
    gone = weakref.ref(first)
    del first, again
    assert gone() is None  # the process keeps none once no wait holds it (and no key with it)
