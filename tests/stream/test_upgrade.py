"""The upgrade and contract breaches, against a small loopback gateway that can misbehave."""

from __future__ import annotations

import json
import logging
import time

import pytest

from airflow_provider_systemzero.stream import (
    AuthenticationFailed,
    Backoff,
    DeadlineExceeded,
    DecisionStream,
    ProtocolViolation,
    StreamSettings,
    SystemZeroError,
    UpgradeRefused,
    probe,
)
from tests.helpers.mini_gateway import MiniGateway
from tests.helpers.stream import QUESTIONS, SECRET_KEY

REQUEST = {"model": "m", "questions": QUESTIONS}


def open_stream(gw: MiniGateway, backoff: Backoff, **kwargs: object) -> DecisionStream:
    kwargs.setdefault("open_deadline", 10)
    return DecisionStream(
        StreamSettings(gw.origin, SECRET_KEY),
        REQUEST,
        state="log\n",
        decision_mode="on_request",
        identity="upgrade-test",
        backoff=backoff,
        **kwargs,
    )  # type: ignore[arg-type]


async def test_the_upgrade_request_carries_exactly_the_contract_headers(fast_backoff: Backoff) -> None:
    async with MiniGateway() as gw, open_stream(gw, fast_backoff) as stream:
        decision = await stream.decide(timeout=10)
    assert decision.decisions() == {"ready": True}
    [headers] = gw.requests
    assert headers["Authorization"] == f"Bearer {SECRET_KEY}"
    assert headers.get_all("Sec-WebSocket-Protocol") == ["system-zero.stream.v1"]
    for forbidden in ("Origin", "Cookie", "Sec-WebSocket-Extensions"):
        assert forbidden not in headers
    assert headers["User-Agent"].startswith("airflow-provider-systemzero/")


async def test_a_server_without_the_subprotocol_is_refused_at_once(fast_backoff: Backoff) -> None:
    async with MiniGateway(select_subprotocol=False) as gw:
        with pytest.raises(
            ProtocolViolation, match=r"did not select the system-zero\.stream\.v1 subprotocol"
        ):
            async with open_stream(gw, fast_backoff):
                pass
        assert gw.connections == 1
        with pytest.raises(ProtocolViolation, match="subprotocol"):
            await probe(StreamSettings(gw.origin, SECRET_KEY))


@pytest.mark.parametrize(
    ("status", "code", "error", "fix"),
    [
        (401, "invalid_api_key", AuthenticationFailed, "password field"),
        (403, "browser_context_forbidden", AuthenticationFailed, "Origin or Cookie"),
        (400, "compression_not_supported", UpgradeRefused, "disable WebSocket compression"),
        (404, "not_found", UpgradeRefused, "bare API origin"),
    ],
)
async def test_non_retryable_refusals_raise_at_once(
    fast_backoff: Backoff, status: int, code: str, error: type[UpgradeRefused], fix: str
) -> None:
    body = json.dumps({"error": {"type": "authentication_error", "code": code, "message": "no"}}).encode()
    async with MiniGateway(refuse=(status, {"Content-Type": "application/json"}, body)) as gw:
        started = time.monotonic()
        with pytest.raises(error) as info:
            async with open_stream(gw, Backoff(base=5, cap=5)):
                pass
        assert time.monotonic() - started < 2  # no backoff: raised on the first refusal
        assert gw.connections == 0 and len(gw.requests) == 1
    assert (
        info.value.status == status and info.value.envelope is not None and info.value.envelope.code == code
    )
    assert fix in str(info.value) and SECRET_KEY not in str(info.value)


async def test_retryable_refusals_honour_retry_after_ms_until_the_deadline() -> None:
    body = json.dumps(
        {"error": {"type": "overloaded_error", "code": "maintenance", "message": "later"}}
    ).encode()
    refuse = (503, {"Retry-After-Ms": "300", "Retry-After": "9"}, body)  # Retry-After-Ms wins
    async with MiniGateway(refuse=refuse) as gw:
        stream = open_stream(gw, Backoff(base=0.01, cap=0.02), open_deadline=1.5)
        with pytest.raises(DeadlineExceeded) as info:
            async with stream:
                pass
    assert isinstance(info.value.last_error, UpgradeRefused) and info.value.last_error.status == 503
    assert 3 <= len(gw.requests) <= 6  # ~1.5 s / 0.3 s, never faster than the server asked
    assert stream.reconnects and all(r.server_delay == 0.3 and r.waited >= 0.3 for r in stream.reconnects)
    assert all(r.reason == "upgrade_refused:503" and r.close_code is None for r in stream.reconnects)


async def test_a_peer_that_breaks_the_protocol_is_retried_then_reported(fast_backoff: Backoff) -> None:
    async with MiniGateway(first_frame='{"type":"ack"}') as gw:
        with pytest.raises(ProtocolViolation, match="broke the stream protocol") as info:
            async with open_stream(gw, fast_backoff):
                pass
        assert gw.connections == 3  # a passing glitch is retried; a broken peer is reported
    assert isinstance(info.value, SystemZeroError)


async def test_binary_frames_are_a_protocol_violation(fast_backoff: Backoff) -> None:
    async with MiniGateway(first_frame=b"\x00\x01") as gw:
        with pytest.raises(ProtocolViolation, match="binary frames"):
            async with open_stream(gw, fast_backoff):
                pass
        assert gw.connections == 3


async def test_a_gateway_that_closes_normally_before_start_is_not_hammered() -> None:
    async with MiniGateway(close_after_hello=1000) as gw:
        stream = open_stream(gw, Backoff(base=0.05, cap=0.1), open_deadline=1.0)
        with pytest.raises(DeadlineExceeded):
            async with stream:
                pass
    assert 3 <= gw.connections <= 40  # backed off (~0.05 s apart), not a tight reconnect loop
    assert all(r.close_code == 1000 and r.reason == "close" for r in stream.reconnects)


async def test_unreachable_gateway_is_retried_until_the_deadline(fast_backoff: Backoff) -> None:
    async with MiniGateway() as gw:
        origin = gw.origin
    stream = DecisionStream(
        StreamSettings(origin, SECRET_KEY),
        REQUEST,
        decision_mode="on_request",
        backoff=fast_backoff,
        open_deadline=0.5,
    )
    with pytest.raises(DeadlineExceeded, match=r"did not open within 0\.5 s") as info:
        async with stream:
            pass
    assert isinstance(info.value.last_error, OSError)
    assert len(stream.reconnects) >= 2 and all(r.reason == "network" for r in stream.reconnects)


async def test_no_log_line_carries_the_key(fast_backoff: Backoff, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        async with MiniGateway() as gw, open_stream(gw, fast_backoff) as stream:
            await stream.append_text("more\n")
            await stream.decide(timeout=10)
    client_records = [
        r for r in caplog.records if not r.name.startswith("websockets.server")
    ]  # the test server's
    assert any("Authorization" in r.getMessage() for r in client_records)  # websockets did log the headers …
    assert all(SECRET_KEY not in r.getMessage() for r in client_records)  # … without the key
    assert SECRET_KEY not in repr(stream)
