"""TLS verification is on by default: against a gateway on loopback with a certificate from a
private CA, the client refuses to talk without ``ca_bundle`` — before any HTTP byte, so the key is
never sent — and works with it; a certificate for another name is refused even with the bundle."""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from airflow_provider_systemzero.hooks.systemzero import SystemZeroHook
from airflow_provider_systemzero.identity import task_namespace
from airflow_provider_systemzero.protocol.messages import PROTOCOL
from airflow_provider_systemzero.stream import (
    DeadlineExceeded,
    StreamSettings,
    probe,
)
from airflow_provider_systemzero.triggers.decision import SystemZeroDecideTrigger
from tests.helpers import first_event, rebuilt
from tests.helpers.tls import KEY, REPLY, REQUEST, TLSGateway, make_pki, stream_to


@pytest.fixture
async def tls_gateway(tmp_path: Path) -> AsyncIterator[tuple[TLSGateway, Path]]:
    ca, cert, key = make_pki(tmp_path)
    async with TLSGateway(cert, key) as gateway:
        yield gateway, ca


async def test_without_ca_bundle_the_self_signed_gateway_is_refused_before_the_key_is_sent(
    tls_gateway: tuple[TLSGateway, Path],
) -> None:
    gateway, _ = tls_gateway
    with pytest.raises(DeadlineExceeded) as info:
        async with stream_to(gateway.origin):
            pass
    assert isinstance(info.value.last_error, ssl.SSLCertVerificationError)
    assert "certificate verify failed" in str(info.value)
    assert gateway.requests == []  # no HTTP request, so no Authorization header, ever reached the server
    with pytest.raises(ssl.SSLCertVerificationError):
        await probe(StreamSettings(gateway.origin, KEY))
    assert gateway.requests == []


async def test_with_the_ca_bundle_the_gateway_is_trusted(tls_gateway: tuple[TLSGateway, Path]) -> None:
    gateway, ca = tls_gateway
    async with stream_to(gateway.origin, ca_bundle=str(ca)) as stream:
        decision = await stream.decide(timeout=5)
    assert decision.reply_id == REPLY["id"]
    [headers] = gateway.requests
    assert headers["Authorization"] == f"Bearer {KEY}"
    assert (await probe(StreamSettings(gateway.origin, KEY, ca_bundle=str(ca)))).protocol == PROTOCOL


async def test_the_ca_bundle_from_the_connection_reaches_the_trigger(
    tls_gateway: tuple[TLSGateway, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    gateway, ca = tls_gateway
    connection: Callable[..., str] = lambda **extra: json.dumps(  # noqa: E731
        {"conn_type": "systemzero", "host": gateway.origin, "password": KEY, "extra": extra}
    )

    def trigger() -> SystemZeroDecideTrigger:
        return rebuilt(
            SystemZeroDecideTrigger(
                systemzero_conn_id="systemzero_tls",
                request=REQUEST,
                state="log\n",
                key_namespace=task_namespace("tls", "decide", "r", -1),
                deadline=time.time() + 1,
            )
        )

    monkeypatch.setenv("AIRFLOW_CONN_SYSTEMZERO_TLS", connection())
    refused = await first_event(trigger())  # retried until the task's deadline, never trusted
    assert refused["status"] == "timeout" and gateway.requests == []
    monkeypatch.setenv("AIRFLOW_CONN_SYSTEMZERO_TLS", connection(ca_bundle=str(ca)))
    trusted = await first_event(trigger())
    assert trusted["status"] == "success" and trusted["reply_id"] == REPLY["id"]
    ok, message = await asyncio.to_thread(SystemZeroHook("systemzero_tls").test_connection)
    assert ok, message


async def test_a_certificate_for_another_name_is_refused_even_with_the_bundle(tmp_path: Path) -> None:
    ca, cert, key = make_pki(tmp_path, names=("gateway.example",), ips=())
    async with TLSGateway(cert, key) as gateway:
        with pytest.raises(DeadlineExceeded) as info:
            async with stream_to(gateway.origin, ca_bundle=str(ca)):
                pass
    assert isinstance(info.value.last_error, ssl.SSLCertVerificationError)
    assert "IP address mismatch" in str(info.value.last_error) and gateway.requests == []
