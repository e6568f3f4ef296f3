"""The refusal table of WIRE.md §1 as pure functions: check_upgrade, capacity and maintenance."""

from __future__ import annotations

import json

import pytest

from airflow_provider_systemzero.protocol import PROTOCOL
from airflow_provider_systemzero.protocol.upgrade import (
    STREAM_PATH,
    UpgradeRefusal,
    capacity_refusal,
    check_upgrade,
    maintenance_refusal,
    stream_capacity,
)

GOOD = {"Authorization": "Bearer demo", "Sec-WebSocket-Protocol": PROTOCOL}


def known(key: str) -> bool:
    return key == "demo"


@pytest.mark.parametrize(
    ("path", "headers", "status", "code"),
    [
        ("/v1/system-zero/stream/", GOOD, 404, "not_found"),
        ("/v1/other", GOOD, 404, "not_found"),
        (STREAM_PATH + "?a=1", GOOD, 400, "query_not_allowed"),
        (STREAM_PATH + "?", GOOD, 400, "query_not_allowed"),
        (STREAM_PATH, {**GOOD, "Origin": "https://x"}, 403, "browser_context_forbidden"),
        (STREAM_PATH, {**GOOD, "Cookie": "a=b"}, 403, "browser_context_forbidden"),
        (
            STREAM_PATH,
            {**GOOD, "Sec-WebSocket-Extensions": "permessage-deflate"},
            400,
            "compression_not_supported",
        ),
        (STREAM_PATH, {"Authorization": "Bearer demo"}, 400, "unsupported_protocol"),
        (STREAM_PATH, {**GOOD, "Sec-WebSocket-Protocol": f"{PROTOCOL}, other"}, 400, "unsupported_protocol"),
        (STREAM_PATH, {"Sec-WebSocket-Protocol": PROTOCOL}, 401, "missing_credentials"),
        (STREAM_PATH, {**GOOD, "Authorization": "Basic ZGVtbzo="}, 401, "missing_credentials"),
        (STREAM_PATH, {**GOOD, "Authorization": "Bearer nope"}, 401, "invalid_api_key"),
    ],
)
def test_check_upgrade_refusals(path: str, headers: dict[str, str], status: int, code: str) -> None:
    refusal = check_upgrade(path, headers, known_key=known)
    assert isinstance(refusal, UpgradeRefusal)
    assert (refusal.status, refusal.envelope.code) == (status, code)
    assert refusal.retry_after_s is None
    assert refusal.headers() == {"Content-Type": "application/json"}


def test_check_upgrade_accepts_and_returns_the_key() -> None:
    assert check_upgrade(STREAM_PATH, GOOD, known_key=known) == "demo"


@pytest.mark.parametrize(
    ("max_concurrent", "capacity"), [(0, 1), (1, 1), (2, 1), (3, 1), (8, 4), (9, 4), (10, 5)]
)
def test_stream_capacity(max_concurrent: int, capacity: int) -> None:
    assert stream_capacity(max_concurrent) == capacity


def test_capacity_refusal_is_429_with_retry_after() -> None:
    refusal = capacity_refusal(4, retry_after_s=2)
    assert refusal.status == 429
    assert refusal.envelope.type == "rate_limit_error"
    assert refusal.envelope.code == "stream_capacity"
    assert "4 streams" in refusal.envelope.message
    assert refusal.headers() == {"Content-Type": "application/json", "Retry-After": "2"}
    assert json.loads(refusal.body()) == refusal.envelope.to_dict()


def test_maintenance_refusal_is_503_with_retry_after() -> None:
    refusal = maintenance_refusal(retry_after_s=1)
    assert refusal.status == 503
    assert refusal.envelope.code == "maintenance"
    assert refusal.headers()["Retry-After"] == "1"
    body = refusal.body()
    assert (
        body
        == '{"error":{"type":"overloaded_error","code":"maintenance","message":"'
        + refusal.envelope.message
        + '"}}'
    )
