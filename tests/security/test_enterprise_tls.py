"""TLS as companies run it behind firewalls: a client certificate (mutual TLS) from the
connection's extras, and ``ca_bundle`` trusted for an ``https://`` proxy as well as for the
gateway. Against a loopback gateway that requires a client certificate from a private CA of its
own, and a CONNECT proxy on loopback that speaks TLS with a certificate from the gateway's CA.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import socket
import ssl
import threading
import time
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from websockets.asyncio.server import ServerConnection

from airflow_provider_systemzero.hooks.systemzero import SystemZeroHook
from airflow_provider_systemzero.identity import task_namespace
from airflow_provider_systemzero.stream import DeadlineExceeded, StreamSettings
from airflow_provider_systemzero.stream.exceptions import SystemZeroValidationError
from airflow_provider_systemzero.stream.tls import load_tls
from airflow_provider_systemzero.triggers.decision import SystemZeroDecideTrigger
from tests.helpers import first_event, rebuilt
from tests.helpers.loopback_proxy import LoopbackProxy
from tests.helpers.tls import KEY, REPLY, REQUEST, TLSGateway, make_ca, make_pki, stream_to

CLIENT_NAME = "systemzero test client"


def make_client_pki(directory: Path, *, encrypt: bytes | None = None) -> tuple[Path, Path, Path]:
    """A CA for clients and a client certificate it signed: (client-ca.pem, client.pem, client.key)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key, ca = make_ca("systemzero client CA")
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CLIENT_NAME)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(encrypt) if encrypt else serialization.NoEncryption()
    )
    paths = directory / "client-ca.pem", directory / "client.pem", directory / "client.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    )
    return paths


class MutualTLSGateway(TLSGateway):
    """A wss:// gateway that requires a client certificate from ``client_ca`` and records its name."""

    def __init__(self, cert: Path, key: Path, client_ca: Path) -> None:
        super().__init__(cert, key)
        self.context.verify_mode = ssl.CERT_REQUIRED
        self.context.load_verify_locations(client_ca)
        self.clients: list[str] = []

    async def handler(self, ws: ServerConnection) -> None:
        peer = ws.transport.get_extra_info("peercert") or {}
        self.clients += [
            value for rdn in peer.get("subject", ()) for name, value in rdn if name == "commonName"
        ]
        await super().handler(ws)


@pytest.fixture
async def mutual(tmp_path: Path) -> AsyncIterator[tuple[MutualTLSGateway, Path, Path, Path]]:
    ca, cert, key = make_pki(tmp_path)
    client_ca, client_cert, client_key = make_client_pki(tmp_path)
    async with MutualTLSGateway(cert, key, client_ca) as gateway:
        yield gateway, ca, client_cert, client_key


async def test_mutual_tls_presents_the_client_certificate_from_the_extras(
    mutual: tuple[MutualTLSGateway, Path, Path, Path],
) -> None:
    gateway, ca, client_cert, client_key = mutual
    async with stream_to(
        gateway.origin, ca_bundle=str(ca), client_cert=str(client_cert), client_key=str(client_key)
    ) as stream:
        decision = await stream.decide(timeout=5)
    assert decision.reply_id == REPLY["id"] and gateway.clients == [CLIENT_NAME]


async def test_without_a_client_certificate_the_gateway_refuses_and_no_request_is_sent(
    mutual: tuple[MutualTLSGateway, Path, Path, Path],
) -> None:
    gateway, ca, _, _ = mutual
    with pytest.raises(DeadlineExceeded):
        async with stream_to(gateway.origin, ca_bundle=str(ca)):
            pass
    assert gateway.requests == [] and gateway.clients == []


async def test_the_client_certificate_and_key_in_one_file_from_the_connection(
    mutual: tuple[MutualTLSGateway, Path, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gateway, ca, client_cert, client_key = mutual
    both = tmp_path / "client-both.pem"
    both.write_bytes(client_cert.read_bytes() + client_key.read_bytes())
    monkeypatch.setenv(
        "AIRFLOW_CONN_SYSTEMZERO_MTLS",
        json.dumps(
            {
                "conn_type": "systemzero",
                "host": gateway.origin,
                "password": KEY,
                "extra": {"ca_bundle": str(ca), "client_cert": str(both)},
            }
        ),
    )
    ok, message = await asyncio.to_thread(SystemZeroHook("systemzero_mtls").test_connection)
    assert ok, message
    assert gateway.clients == [CLIENT_NAME]


def test_a_key_of_another_certificate_or_an_encrypted_one_is_refused_naming_the_field(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _, cert, _ = make_client_pki(tmp_path / "a")
    _, _, other_key = make_client_pki(tmp_path / "b")
    with pytest.raises(SystemZeroValidationError) as mismatch:
        load_tls(
            StreamSettings("wss://api.example.com", KEY, client_cert=str(cert), client_key=str(other_key))
        )
    assert mismatch.value.field == "client_key" and "does not belong to the client certificate" in str(
        mismatch.value
    )
    assert str(other_key) in str(mismatch.value)
    (tmp_path / "c").mkdir()
    _, cert, encrypted = make_client_pki(tmp_path / "c", encrypt=b"hunter2-passphrase")
    with pytest.raises(SystemZeroValidationError) as locked:
        load_tls(
            StreamSettings("wss://api.example.com", KEY, client_cert=str(cert), client_key=str(encrypted))
        )
    assert locked.value.field == "client_key" and "encrypted" in str(locked.value)
    with pytest.raises(SystemZeroValidationError) as alone:
        StreamSettings("wss://api.example.com", KEY, client_key=str(encrypted))
    assert alone.value.field == "client_cert"


class ConnectProxy(LoopbackProxy):
    """An HTTPS CONNECT proxy on loopback that records each request head."""

    def __init__(self, cert: Path, key: Path) -> None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        super().__init__(context)
        self.heads: list[bytes] = []

    @property
    def url(self) -> str:
        return f"https://localhost:{self.port}"

    async def negotiate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int | None:
        head = await reader.readuntil(b"\r\n\r\n")
        self.heads.append(head)
        method, target, _ = head.split(b"\r\n")[0].decode().split(" ")
        host, port = target.rsplit(":", 1)
        return int(port) if method == "CONNECT" and host in ("127.0.0.1", "localhost") else None

    async def established(self, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")


async def test_ca_bundle_trusts_an_https_proxy_too(tmp_path: Path) -> None:
    ca, cert, key = make_pki(tmp_path)
    async with TLSGateway(cert, key) as gateway, ConnectProxy(cert, key) as proxy:
        async with stream_to(gateway.origin, ca_bundle=str(ca), proxy=proxy.url) as stream:
            decision = await stream.decide(timeout=5)
        assert decision.reply_id == REPLY["id"]
        assert len(proxy.heads) == 1 and proxy.heads[0].startswith(b"CONNECT 127.0.0.1:")
        assert KEY.encode() not in proxy.heads[0]  # the key went inside the gateway's TLS only
        assert len(gateway.requests) == 1


async def test_an_https_proxy_outside_the_bundle_is_refused_before_the_connect(tmp_path: Path) -> None:
    """The control: a proxy whose certificate the bundle does not vouch for is not trusted."""
    (tmp_path / "gw").mkdir()
    (tmp_path / "proxy").mkdir()
    ca, cert, key = make_pki(tmp_path / "gw")
    _, proxy_cert, proxy_key = make_pki(tmp_path / "proxy")  # another CA
    async with TLSGateway(cert, key) as gateway, ConnectProxy(proxy_cert, proxy_key) as proxy:
        with pytest.raises(DeadlineExceeded) as info:
            async with stream_to(gateway.origin, ca_bundle=str(ca), proxy=proxy.url):
                pass
    assert isinstance(info.value.last_error, ssl.SSLCertVerificationError)
    assert proxy.heads == [] and gateway.requests == []


class OpenSSLGateway:
    """A TLS server on loopback as nginx or envoy run one: blocking OpenSSL on a thread of its own,
    which sends its TLS alert before it closes (asyncio's TLS server closes without one). Every
    handshake it takes fails here: it requires a client certificate from ``client_ca``, or speaks
    only the TLS versions up to ``maximum_version``.

    :param cert: its certificate.
    :param key: the certificate's key.
    :param client_ca: the CA of the client certificates it requires (``None``: none required).
    :param maximum_version: the newest TLS version it speaks.
    """

    def __init__(
        self,
        cert: Path,
        key: Path,
        *,
        client_ca: Path | None = None,
        maximum_version: ssl.TLSVersion | None = None,
    ) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(cert, key)
        if client_ca is not None:
            self.context.verify_mode = ssl.CERT_REQUIRED
            self.context.load_verify_locations(client_ca)
        if maximum_version is not None:
            with warnings.catch_warnings():  # the old versions are deprecated: that is the point
                warnings.simplefilter("ignore", DeprecationWarning)
                self.context.set_ciphers("DEFAULT:@SECLEVEL=0")
                self.context.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
                self.context.maximum_version = maximum_version
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.refusals: list[str] = []
        self.requests = 0

    @property
    def origin(self) -> str:
        return f"wss://127.0.0.1:{self.listener.getsockname()[1]}"

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return  # closed
            with connection:
                try:
                    with self.context.wrap_socket(connection, server_side=True) as tls:
                        if tls.recv(65536):
                            self.requests += 1
                except (ssl.SSLError, OSError) as exc:
                    self.refusals.append(str(getattr(exc, "reason", None) or exc))

    def __enter__(self) -> OpenSSLGateway:
        threading.Thread(target=self._serve, name="openssl-gateway", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.listener.close()


def _tls_connection(monkeypatch: pytest.MonkeyPatch, origin: str, ca: Path) -> SystemZeroHook:
    monkeypatch.setenv(
        "AIRFLOW_CONN_SYSTEMZERO_MTLS",
        json.dumps(
            {
                "conn_type": "systemzero",
                "host": origin,
                "password": KEY,
                "extra": {"ca_bundle": str(ca), "model": "m", "open_timeout": 2},
            }
        ),
    )
    return SystemZeroHook("systemzero_mtls")


async def _trigger_event() -> dict[str, Any]:
    """What the deferrable operator's trigger ends with, its deadline a few seconds away."""
    return await first_event(
        rebuilt(
            SystemZeroDecideTrigger(
                systemzero_conn_id="systemzero_mtls",
                request=REQUEST,
                state="log\n",
                key_namespace=task_namespace("mtls", "decide", "r", -1),
                deadline=time.time() + 3,
            )
        ),
        within=30,
    )


@pytest.mark.parametrize("version", ["TLS 1.3", "TLS 1.2"])
async def test_a_gateway_that_requires_a_client_certificate_says_so_when_none_is_set(
    version: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 54 item 7: the Test button and the trigger name the client certificate and its extra,
    not "did not answer as a WebSocket server … check host and port". TLS 1.3 ends the connection
    right after the handshake (its certificate_required alert is lost to the reset that follows);
    TLS 1.2 sends a handshake_failure alert."""
    ca, cert, key = make_pki(tmp_path)
    client_ca, _, _ = make_client_pki(tmp_path)
    newest = ssl.TLSVersion.TLSv1_2 if version == "TLS 1.2" else None
    with OpenSSLGateway(cert, key, client_ca=client_ca, maximum_version=newest) as gateway:
        hook = _tls_connection(monkeypatch, gateway.origin, ca)
        ok, button = await asyncio.to_thread(hook.test_connection)
        event = await _trigger_event()
    assert not ok
    assert gateway.requests == 0 and gateway.refusals, gateway.refusals  # nothing was ever answered
    for said in (button, event["message"]):
        assert "client certificate (mutual TLS)" in said and "client_cert extra" in said, said
        assert "did not answer as a WebSocket server" not in said
    assert event["status"] == "timeout", event


async def test_asyncios_tls_gateway_that_requires_a_client_certificate_says_so_too(
    mutual: tuple[MutualTLSGateway, Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gateway that sends no alert at all (asyncio's TLS server closes without one)."""
    gateway, ca, _, _ = mutual
    ok, button = await asyncio.to_thread(_tls_connection(monkeypatch, gateway.origin, ca).test_connection)
    assert not ok and "ended the connection right after the TLS handshake" in button, button
    assert "client_cert extra" in button and gateway.requests == []


async def test_a_gateway_that_refuses_the_tls_version_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gateway that speaks TLS 1.1 at most answers this client (TLS 1.2 and 1.3) with a
    protocol_version alert: named, with the fix at the gateway."""
    ca, cert, key = make_pki(tmp_path)
    with OpenSSLGateway(cert, key, maximum_version=ssl.TLSVersion.TLSv1_1) as gateway:
        hook = _tls_connection(monkeypatch, gateway.origin, ca)
        ok, button = await asyncio.to_thread(hook.test_connection)
        event = await _trigger_event()
    assert not ok and gateway.requests == 0
    for said in (button, event["message"]):
        assert "(TLSV1_ALERT_PROTOCOL_VERSION): the gateway refused this client's TLS version" in said, said
        assert "must accept TLS 1.2 or newer" in said
