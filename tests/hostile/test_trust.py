"""What the gateway says is not trusted (issue 24 items 9 and 10, and issue 23's metric tags).

A redirect is refused with a clear error (the key never follows it); a key echoed back is in no
log line, exception or metric tag; server text (``stream_id``, goodbye reasons, error messages,
close reasons) is escaped and bounded before it is logged, so a newline forges no log line;
metric tags come from a closed set that passes Airflow's metric-name validation.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

import pytest

from airflow_provider_systemzero.observability import AirflowStreamObserver, reason_tag
from airflow_provider_systemzero.stream.exceptions import SystemZeroError, UpgradeRefused
from tests.helpers.hostile_gateway import (
    KEY,
    REQUEST,
    HostileGateway,
    Peer,
    Raw,
    decide_and_fail,
    encode,
    reply,
)

FORGED = "\n2026-01-01 00:00:00 [error] forged line"


def _everything_logged(caplog: pytest.LogCaptureFixture) -> str:
    """What the client logged (the test gateway's own ``websockets.server`` records are not the client's)."""
    return "\n".join(r.getMessage() for r in caplog.records if not r.name.startswith("websockets.server"))


class RecordingStats:
    """Stands in for Airflow's stats: keeps every tag set emitted."""

    def __init__(self) -> None:
        self.tags: list[dict[str, str]] = []

    def incr(self, name: str, value: int = 1, *, tags: dict[str, str]) -> None:
        self.tags.append(tags)

    def timing(self, name: str, value: float, *, tags: dict[str, str]) -> None:
        self.tags.append(tags)

    def gauge(self, name: str, value: float) -> None:
        pass


async def test_a_redirect_is_refused_with_a_clear_error(
    gateway: Callable[..., HostileGateway], connect: Callable[..., Any]
) -> None:
    elsewhere = gateway(Peer.open)  # a gateway that would take the key
    gw = gateway(respond=(302, {"Location": elsewhere.origin + "/v1/system-zero/stream"}, b""))
    with pytest.raises(UpgradeRefused) as caught:
        async with asyncio.timeout(20):
            async with connect(gw).stream(REQUEST, state="log\n", open_deadline=15):
                pass
    assert caught.value.status == 302 and not caught.value.retryable
    assert "redirect" in str(caught.value) and "API origin" in str(caught.value)
    assert elsewhere.upgrades == 0 and gw.upgrades == 1  # never followed, never retried


async def test_a_key_echoed_back_appears_in_no_log_exception_or_tag(
    gateway: Callable[..., HostileGateway], connect: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    async def echo_the_key(peer: Peer) -> None:
        await peer.open()
        await peer.recv()  # decide
        await peer.error("invalid_request_error", f"bad_{KEY}", KEY, http_status=400)
        await peer.goodbye(KEY)
        await peer.ws.close(4000, KEY[:20])

    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="websockets")
    stats = RecordingStats()
    observer = AirflowStreamObserver("on_request", stats=stats)
    with pytest.raises(SystemZeroError) as caught:
        async with asyncio.timeout(20):
            async with connect(gateway(echo_the_key)).stream(
                REQUEST, decision_mode="on_request", state="log\n", open_deadline=10, observer=observer
            ) as stream:
                await stream.decide(timeout=10)
    assert KEY not in str(caught.value) and KEY not in repr(caught.value)
    assert KEY not in _everything_logged(caplog)
    assert stats.tags and KEY not in json.dumps(stats.tags)


#: The key as a JSON string literal that spells every other character as ``\\uXXXX``: the same
#: string once decoded, but not the same text.
ESCAPED_KEY = Raw('"' + "".join(f"\\u{ord(c):04X}" if i % 2 else c for i, c in enumerate(KEY)) + '"')


async def test_a_key_echoed_back_json_escaped_is_removed_too(
    gateway: Callable[..., HostileGateway], connect: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    async def echo_it_escaped(peer: Peer) -> None:
        await peer.open()
        while (await peer.recv())["type"] != "decide":
            pass
        await peer.send({"type": "scheduled", "state_version": 1, "in_flight": False})
        await peer.decision(1, reply={**reply(), "model": ESCAPED_KEY}, request_id=ESCAPED_KEY)
        await peer.drain()

    caplog.set_level(logging.DEBUG)
    async with asyncio.timeout(20):
        async with connect(gateway(echo_it_escaped)).stream(
            REQUEST, decision_mode="on_request", state="log\n", open_deadline=10
        ) as stream:
            result = await stream.decide(timeout=10)
    assert result.reply["model"] == "***" and result.request_id == "***"
    assert KEY not in repr(result) and KEY not in json.dumps(result.reply)
    assert KEY not in _everything_logged(caplog)


async def test_a_key_echoed_back_json_escaped_in_a_refused_upgrade_is_removed(
    gateway: Callable[..., HostileGateway], connect: Callable[..., Any]
) -> None:
    body = encode(
        {"error": {"type": "authentication_error", "code": "invalid_api_key", "message": ESCAPED_KEY}}
    )
    gw = gateway(respond=(401, {"Content-Type": "application/json"}, body.encode()))
    with pytest.raises(SystemZeroError) as caught:
        async with asyncio.timeout(20):
            async with connect(gw).stream(REQUEST, state="log\n", open_deadline=15):
                pass
    assert "***" in str(caught.value) and KEY not in str(caught.value) and KEY not in repr(caught.value)


async def test_server_text_forges_no_log_line(
    gateway: Callable[..., HostileGateway], connect: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    async def newlines(peer: Peer) -> None:
        peer.stream_id = "szws_" + FORGED
        await peer.open()
        await peer.recv()
        await peer.error(
            "api_error",
            "x" + FORGED,
            "down" + FORGED,
            http_status=503,
            fatal=True,
            retryable=True,
            retry_after_ms=10,
        )
        await peer.goodbye("maintenance" + FORGED + "x" * 10_000, retry_after_ms=10)
        await peer.ws.close(1013, FORGED[:60])

    caplog.set_level(logging.DEBUG, logger="airflow_provider_systemzero")
    await decide_and_fail(connect(gateway(newlines)), decide_timeout=3)
    for record in caplog.records:
        assert "\n" not in record.getMessage(), record.getMessage()
        assert len(record.getMessage()) < 2_000
    assert any("forged line" in record.getMessage() for record in caplog.records)  # escaped, still readable


@pytest.mark.parametrize(
    ("reason", "tag"),
    [
        ("goodbye:shutdown", "goodbye.shutdown"),
        ("goodbye:other", "goodbye.other"),
        ("goodbye:" + FORGED, "goodbye.other"),
        ("upgrade_refused:429", "upgrade_refused"),
        ("write_timeout", "write_timeout"),
        ("made_up", "other"),
    ],
)
def test_reconnect_reason_tags_come_from_a_closed_set_airflow_accepts(reason: str, tag: str) -> None:
    try:  # Airflow 3.2+ keeps the metric-name validator in the Task SDK, 3.1 in airflow.metrics
        from airflow.sdk._shared.observability.metrics.validators import ALLOWED_CHARACTERS
    except ImportError:
        validators = pytest.importorskip("airflow.metrics.validators")
        ALLOWED_CHARACTERS = validators.ALLOWED_CHARACTERS

    assert reason_tag(reason) == tag
    assert set(f"systemzero.reconnects,reason={tag}") <= {*ALLOWED_CHARACTERS, ",", "="}


@pytest.mark.parametrize(
    ("secret", "spelled"),
    [
        (KEY, KEY),
        (KEY, "".join(f"\\u{ord(c):04x}" for c in KEY)),  # every character, lower-case hex
        (KEY, KEY[:2] + "\\u002D" + KEY[3:]),  # one character, upper-case hex
        ('k"e\\y/1', 'k\\"e\\\\y\\/1'),  # the short escapes
        ('k"e\\y/1', "k\\u0022e\\u005cy/1"),
    ],
)
def test_scrub_removes_every_json_spelling_of_the_key(secret: str, spelled: str) -> None:
    from airflow_provider_systemzero.stream.untrusted import scrub

    text = f'{{"message": "echo {spelled} echo"}}'
    assert json.loads(text)["message"] == f"echo {secret} echo"  # the same string, once decoded
    assert json.loads(scrub(text, secret))["message"] == "echo *** echo"
