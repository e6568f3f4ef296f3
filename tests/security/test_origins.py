"""Where the key may go: ``wss://`` (or ``https://``) origins, and plaintext ``ws://`` only to a
loopback host; never an origin with credentials, a query or a fragment. A refused origin fails
before any connection is attempted, and the message names the fix without echoing a secret."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_provider_systemzero.hooks.systemzero import SystemZeroHook
from airflow_provider_systemzero.identity import task_namespace
from airflow_provider_systemzero.stream import StreamSettings, SystemZeroValidationError
from airflow_provider_systemzero.stream import connection as stream_connection
from airflow_provider_systemzero.triggers.decision import SystemZeroDecideTrigger
from tests.helpers import first_event, rebuilt

KEY = "sz-origin-test-0123456789"
PASSWORD = "hunter2-in-the-url"


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any connection attempt fails the test: refusals must happen before the network."""

    def connect(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a connection was attempted: {args}")

    monkeypatch.setattr(stream_connection, "connect", connect)


@pytest.mark.parametrize(
    "origin",
    [
        "ws://api.example.com",
        "http://api.example.com",
        "ws://10.0.0.7:8765",
        "ws://203.0.113.10",
        "ws://0.0.0.0:8765",
        "ws://127.0.0.1.nip.io",
        "ws://localhost.example.com",
        "ws://[::ffff:7f00:1]",
    ],
)
def test_plaintext_is_refused_for_any_host_but_loopback(origin: str) -> None:
    with pytest.raises(SystemZeroValidationError, match="loopback") as info:
        StreamSettings(origin, KEY)
    assert info.value.code == "insecure_origin" and info.value.field == "host"


@pytest.mark.parametrize(
    ("origin", "url"),
    [
        ("ws://127.0.0.1:8765", "ws://127.0.0.1:8765/v1/system-zero/stream"),
        ("ws://localhost:8765", "ws://localhost:8765/v1/system-zero/stream"),
        ("ws://[::1]:8765", "ws://[::1]:8765/v1/system-zero/stream"),
        ("https://api.example.com", "wss://api.example.com/v1/system-zero/stream"),
        ("api.example.com", "wss://api.example.com/v1/system-zero/stream"),
    ],
)
def test_tls_origins_and_loopback_plaintext_are_accepted(origin: str, url: str) -> None:
    assert StreamSettings(origin, KEY).url == url


@pytest.mark.parametrize(
    "origin",
    [
        f"wss://user:{PASSWORD}@api.example.com",
        f"wss://:{PASSWORD}@api.example.com",
        "wss://user@api.example.com",
        f"ws://user:{PASSWORD}@127.0.0.1:8765",
        f"wss://api.example.com?key={PASSWORD}",
        "wss://api.example.com/?",
        "wss://api.example.com?",
        f"wss://api.example.com#{PASSWORD}",
        "wss://api.example.com/#",
        "wss://api.example.com#",
    ],
)
def test_credentials_query_and_fragment_are_refused_without_echo(origin: str) -> None:
    with pytest.raises(SystemZeroValidationError) as info:
        StreamSettings(origin, KEY)
    assert info.value.code == "invalid_origin" and info.value.field == "host"
    assert PASSWORD not in str(info.value) and KEY not in str(info.value)


async def test_a_refused_origin_ends_the_operator_with_a_clear_configuration_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_SYSTEMZERO_ORIGIN",
        json.dumps(
            {"conn_type": "systemzero", "host": f"ws://user:{PASSWORD}@gateway.example.com", "password": KEY}
        ),
    )
    payload = await first_event(
        rebuilt(
            SystemZeroDecideTrigger(
                systemzero_conn_id="systemzero_origin",
                request={
                    "model": "m",
                    "questions": {"ready": {"type": "boolean", "instructions": "Is the job ready?"}},
                },
                state="x",
                key_namespace=task_namespace("o", "t", "r", -1),
            )
        )
    )
    assert (payload["status"], payload["error_type"], payload["field"]) == ("error", "validation", "host")
    assert PASSWORD not in json.dumps(payload) and KEY not in json.dumps(payload)
    with pytest.raises(SystemZeroValidationError):
        SystemZeroHook("systemzero_origin").get_settings()
