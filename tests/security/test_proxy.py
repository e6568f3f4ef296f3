"""No proxy is taken from the environment: with every ``*_PROXY`` variable pointing at a trap, the
client still connects straight to the gateway — unless the connection's ``proxy`` extra names
one. Two controls prove the trap works: websockets' own default (``proxy=True``) walks into it,
and so does the client when the connection configures it."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator

import pytest
from websockets.asyncio.client import connect

from airflow_provider_systemzero.emulator import Emulator
from airflow_provider_systemzero.identity import task_namespace
from airflow_provider_systemzero.protocol.messages import PROTOCOL
from airflow_provider_systemzero.stream import DecisionStream, StreamSettings, SystemZeroError
from airflow_provider_systemzero.triggers.decision import SystemZeroDecideTrigger
from tests.helpers import first_event, rebuilt
from tests.helpers.faults import ReadyDecider
from tests.helpers.loopback_proxy import LoopbackProxy

KEY = "sz-proxy-test-0123456789"
REQUEST = {"model": "m", "questions": {"ready": {"type": "boolean", "instructions": "Is the job ready?"}}}
PROXY_VARIABLES = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "WS_PROXY", "WSS_PROXY", "SOCKS_PROXY")


class Trap:
    """A TCP listener that records every connection's first bytes and hangs up."""

    def __init__(self) -> None:
        self.seen: list[bytes] = []
        self.server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(2):
                self.seen.append(await reader.read(200))
        except TimeoutError:
            self.seen.append(b"")
        writer.close()

    async def __aenter__(self) -> Trap:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


@pytest.fixture
async def trap(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Trap]:
    async with Trap() as trap:
        for name in ("NO_PROXY", "no_proxy"):
            monkeypatch.delenv(name, raising=False)
        for name in PROXY_VARIABLES:
            monkeypatch.setenv(name, trap.url)
            monkeypatch.setenv(name.lower(), trap.url)
        yield trap


async def test_environment_proxies_are_ignored_unless_configured(
    trap: Trap, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with Emulator(api_keys={KEY: 8}, decider=ReadyDecider()) as emu:
        # control: websockets' default honours the environment and walks into the trap
        with pytest.raises(Exception):  # noqa: B017 - whatever the trap's hang-up becomes
            async with connect(emu.url, proxy=True, open_timeout=2):
                pass
        await emu.wait_for(lambda _: len(trap.seen) == 1)
        assert trap.seen[0].startswith(b"CONNECT 127.0.0.1:") and emu.handshakes == []

        # the client, through the operator's trigger: straight to the gateway
        monkeypatch.setenv(
            "AIRFLOW_CONN_SYSTEMZERO_PROXY",
            json.dumps({"conn_type": "systemzero", "host": emu.origin, "password": KEY}),
        )
        payload = await first_event(
            rebuilt(
                SystemZeroDecideTrigger(
                    systemzero_conn_id="systemzero_proxy",
                    request=REQUEST,
                    state="READY\n",
                    key_namespace=task_namespace("proxy", "decide", "r", -1),
                    deadline=time.time() + 10,
                )
            )
        )
        assert payload["status"] == "success"
        assert len(trap.seen) == 1 and len(emu.handshakes) == 1  # the trap saw nothing new

        # control: a proxy the connection names is used (it is the trap here, so nothing gets through)
        with pytest.raises(SystemZeroError):
            async with DecisionStream(
                StreamSettings(emu.origin, KEY, proxy=trap.url, open_timeout=1),
                REQUEST,
                decision_mode="on_request",
                identity="proxy",
                open_deadline=0.5,
            ):
                pass
        assert len(trap.seen) >= 2 and trap.seen[1].startswith(b"CONNECT 127.0.0.1:")
        assert len(emu.handshakes) == 1
        assert all(PROTOCOL.encode() not in seen for seen in trap.seen)


class Socks5Proxy(LoopbackProxy):
    """A SOCKS5 proxy on loopback (RFC 1928, with RFC 1929 user and password) that records, per
    connection, the credentials and the destination it was asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[tuple[bytes, bytes, int, bytes]] = []  # user, password, address type, address

    def url(self, scheme: str, user: str, password: str) -> str:
        return f"{scheme}://{user}:{password}@127.0.0.1:{self.port}"

    async def negotiate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int | None:
        _, count = await reader.readexactly(2)
        if 2 not in await reader.readexactly(count):  # user and password
            return None
        writer.write(b"\x05\x02")
        _, size = await reader.readexactly(2)
        user = await reader.readexactly(size)
        password = await reader.readexactly((await reader.readexactly(1))[0])
        writer.write(b"\x01\x00")
        _, command, _, kind = await reader.readexactly(4)
        if kind == 1:
            address = await reader.readexactly(4)
            host = socket.inet_ntop(socket.AF_INET, address)
        elif kind == 4:
            address = await reader.readexactly(16)
            host = socket.inet_ntop(socket.AF_INET6, address)
        else:
            address = await reader.readexactly((await reader.readexactly(1))[0])
            host = address.decode()
        port = int.from_bytes(await reader.readexactly(2), "big")
        self.asked.append((user, password, kind, address))
        return port if command == 1 and host in ("127.0.0.1", "localhost") else None

    async def established(self, writer: asyncio.StreamWriter) -> None:
        writer.write(b"\x05\x00\x00\x01" + bytes(6))


@pytest.mark.parametrize(
    ("scheme", "kind", "address"), [("socks5", 1, b"\x7f\x00\x00\x01"), ("socks5h", 3, b"localhost")]
)
async def test_a_socks5_proxy_carries_the_stream(scheme: str, kind: int, address: bytes) -> None:
    """With python-socks installed, ``socks5://`` sends the gateway's address the client resolved
    (off the loop's executor), ``socks5h://`` sends its name for the proxy to resolve."""
    pytest.importorskip("python_socks", reason="the SOCKS path needs python-socks (the test extra has it)")
    async with Emulator(api_keys={KEY: 8}, decider=ReadyDecider()) as emu, Socks5Proxy() as proxy:
        origin = emu.origin.replace("127.0.0.1", "localhost")
        async with DecisionStream(
            StreamSettings(origin, KEY, proxy=proxy.url(scheme, "corp", "pw-socks"), open_timeout=5),
            REQUEST,
            state="READY\n",
            decision_mode="on_request",
            identity="socks",
            open_deadline=10,
        ) as stream:
            decision = await stream.decide(timeout=10)
    assert decision.answers["ready"].decision is True
    assert proxy.asked == [(b"corp", b"pw-socks", kind, address)]
