"""TLS verification is on by default: against a gateway on loopback with a certificate from a
private CA, the client refuses to talk without ``ca_bundle`` — before any HTTP byte, so the key is
never sent — and works with it; a certificate for another name is refused even with the bundle."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import ssl
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from websockets.asyncio.server import Server, ServerConnection, serve

from airflow_provider_systemzero.hooks.systemzero import SystemZeroHook
from airflow_provider_systemzero.identity import task_namespace
from airflow_provider_systemzero.protocol.messages import PROTOCOL
from airflow_provider_systemzero.stream import (
    Backoff,
    DeadlineExceeded,
    DecisionStream,
    StreamSettings,
    probe,
)
from airflow_provider_systemzero.triggers.decision import SystemZeroDecideTrigger
from tests.faults.harness import first_event, rebuilt
from tests.stream.mini_gateway import serve_session

KEY = "sz-tls-test-0123456789abcdef"
REQUEST = {"model": "m", "questions": {"ready": {"type": "boolean", "instructions": "Is the job ready?"}}}
REPLY = {
    "id": "szd_" + "c" * 32,
    "answers": {"ready": {"type": "boolean", "decision": True, "probability": 0.9, "confidence": 0.9}},
}


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


#: What a CA's key may sign, as real CAs declare it: Python 3.13 verifies with VERIFY_X509_STRICT,
#: which refuses a CA without it.
CA_KEY_USAGE = x509.KeyUsage(
    digital_signature=True,
    key_cert_sign=True,
    crl_sign=True,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    encipher_only=False,
    decipher_only=False,
)


def make_ca(common_name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A private CA as real ones issue them (its key usage and key identifier declared: Python 3.13
    verifies with VERIFY_X509_STRICT): (its key, its certificate)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(CA_KEY_USAGE, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return ca_key, ca


def make_pki(
    directory: Path, *, names: tuple[str, ...] = ("localhost",), ips: tuple[str, ...] = ("127.0.0.1",)
) -> tuple[Path, Path, Path]:
    """A private CA and a server certificate it signed: (ca.pem, server.pem, server.key)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key, ca = make_ca("systemzero test CA")
    key = ec.generate_private_key(ec.SECP256R1())
    alt_names: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
    alt_names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(names[0]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return paths


class TLSGateway:
    """A wss:// gateway on loopback: the core's GatewaySession behind a TLS listener."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(cert, key)
        self.requests: list[dict[str, str]] = []
        self.server: Server | None = None

    @property
    def origin(self) -> str:
        assert self.server is not None
        return f"wss://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _handler(self, ws: ServerConnection) -> None:
        await serve_session(ws, "szws_" + "7" * 32, REPLY)

    async def __aenter__(self) -> TLSGateway:
        def record(_connection: ServerConnection, request: Any) -> None:
            self.requests.append(dict(request.headers.raw_items()))

        self.server = await serve(
            self._handler,
            "127.0.0.1",
            0,
            ssl=self.context,
            compression=None,
            process_request=record,
            select_subprotocol=lambda _c, offered: PROTOCOL if PROTOCOL in offered else None,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


@pytest.fixture
async def tls_gateway(tmp_path: Path) -> AsyncIterator[tuple[TLSGateway, Path]]:
    ca, cert, key = make_pki(tmp_path)
    async with TLSGateway(cert, key) as gateway:
        yield gateway, ca


def stream_to(origin: str, **settings: Any) -> DecisionStream:
    return DecisionStream(
        StreamSettings(origin, KEY, **settings),
        REQUEST,
        state="log\n",
        decision_mode="on_request",
        identity="tls",
        backoff=Backoff(base=0.02, cap=0.05),
        open_deadline=1.0,
    )


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
