"""A gateway on loopback behind TLS with a certificate from a private CA, and a stream to it."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from websockets.asyncio.server import Server, ServerConnection, serve

from airflow_provider_systemzero.protocol.messages import PROTOCOL
from airflow_provider_systemzero.stream import (
    Backoff,
    DecisionStream,
    StreamSettings,
)
from tests.helpers.mini_gateway import serve_session

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

    async def handler(self, ws: ServerConnection) -> None:
        """Serve one connection (a subclass may look at it first)."""
        await serve_session(ws, "szws_" + "7" * 32, REPLY)

    async def __aenter__(self) -> TLSGateway:
        def record(_connection: ServerConnection, request: Any) -> None:
            self.requests.append(dict(request.headers.raw_items()))

        self.server = await serve(
            self.handler,
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


def stream_to(origin: str, **settings: Any) -> DecisionStream:
    """A stream on request to ``origin`` with the test key, a short backoff and a short open deadline."""
    return DecisionStream(
        StreamSettings(origin, KEY, **settings),
        REQUEST,
        state="log\n",
        decision_mode="on_request",
        identity="tls",
        backoff=Backoff(base=0.02, cap=0.05),
        open_deadline=1.0,
    )
