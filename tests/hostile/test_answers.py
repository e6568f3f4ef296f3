"""Every answer the hook gives a person goes through the one gate (issue 54 item 5).

The Test button (``SystemZeroHook.test_connection``), ``airflow connections test`` (Airflow's CLI,
which prints the answer as ``rich`` markup) and the exception a task raises each show what a
gateway said. A scripted gateway puts the same hostile text — a forged log line, terminal escapes,
a bidirectional override, a lone surrogate, ``rich`` markup that hides a link or closes a tag
nobody opened, the API key itself and five thousand characters — into every field it can: the
``hello``'s ``stream_id``, ``request_id``, ``protocol``, ``rate_limit`` and limits, a first message
that is not a ``hello``, an upgrade refused with an error envelope and a ``Retry-After``, the
subprotocol it selects, an answer that is not HTTP. Each sink holds it only escaped, bounded and
without the key; the CLI neither breaks nor shows a hidden link.

Before, the Test button put ``hello.stream_id`` into its answer as it came: a newline, an escape,
a bidi override, 5,180 characters and the key in clear, in the UI that masks it everywhere else.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from airflow_provider_systemzero.compat import airflow_version
from airflow_provider_systemzero.hooks.systemzero import ANSWER_LIMIT, SystemZeroHook
from airflow_provider_systemzero.protocol.limits import Limits
from airflow_provider_systemzero.protocol.messages import PROTOCOL
from airflow_provider_systemzero.stream.exceptions import SystemZeroError
from tests.helpers.hostile import CONN_ID
from tests.helpers.hostile_gateway import KEY, REQUEST, HostileGateway, Peer

#: What a forged line of a log looks like, escapes, markup, the key, and a run no answer may hold.
FORGED = "\n[1999-01-01T00:00:00.000+0000] {taskinstance.py:1} INFO - Marking task as SUCCESS"
ESCAPES = "\x1b[2J\x1b]8;;http://evil.example/\x07\u202e\ud800\x00"
MARKUP = "[/bold][link=http://evil.example]Approved by SRE[/link]"
LONG = "A" * 5_180
#: What ``airflow connections test`` exits with when the test fails: 3.1 and 3.2 print "Connection
#: failed!" and exit 0 (3.1.8, 3.2.2 read), 3.3 exits 1.
CLI_FAILED = 1 if airflow_version() >= (3, 3, 0) else 0


def hostile(field: str, *, header: bool = False) -> str:
    """The hostile text for ``field``, named by the marker ``<field>`` so a sink shows it arrived (an
    HTTP header's: without what a header cannot carry)."""
    if header:
        return f"<{field}> {MARKUP} {KEY} " + "A" * 300
    return f"<{field}>{ESCAPES}{MARKUP}{FORGED}{KEY}{LONG}"


def marker(field: str) -> str:
    return f"<{field}>"


async def hello_strings(peer: Peer) -> None:
    """A ``hello`` whose every string is hostile, its limits and ``rate_limit`` with hostile keys."""
    peer.stream_id = hostile("stream_id")
    limits: dict[str, Any] = {**Limits().advertised(), hostile("limits key"): hostile("limits value")}
    await peer.send(
        {
            "type": "hello",
            "protocol": PROTOCOL,
            "request_id": hostile("hello.request_id"),
            "limits": limits,
            "rate_limit": {hostile("rate_limit key"): hostile("rate_limit value")},
        }
    )
    await peer.drain()


async def hello_protocol(peer: Peer) -> None:
    await peer.send(
        {"type": "hello", "protocol": hostile("protocol"), "request_id": "r", "limits": Limits().advertised()}
    )
    await peer.drain()


async def hello_limit(peer: Peer) -> None:
    limits: dict[str, Any] = {**Limits().advertised(), "max_duration_ms": hostile("limits.max_duration_ms")}
    await peer.send({"type": "hello", "protocol": PROTOCOL, "request_id": "r", "limits": limits})
    await peer.drain()


async def not_hello(peer: Peer) -> None:
    peer.stream_id = hostile("stream_id")
    await peer.error(hostile("envelope.type"), hostile("envelope.code"), hostile("envelope.message"))
    await peer.drain()


def refusal(status: int) -> tuple[int, dict[str, str], bytes]:
    """An upgrade refused with ``status``, a hostile envelope and a hostile ``Retry-After``."""
    envelope = {
        "error": {
            "type": hostile("refusal.type"),
            "code": hostile("refusal.code"),
            "message": hostile("refusal.message"),
        }
    }
    return status, {"Retry-After": hostile("Retry-After", header=True)}, json.dumps(envelope).encode()


class RawGateway:
    """A TCP server on loopback that answers every request with what ``answer`` makes of it."""

    def __init__(self, answer: Callable[[bytes], bytes]) -> None:
        self.answer = answer
        self.server: asyncio.Server | None = None

    @property
    def origin(self) -> str:
        assert self.server is not None
        return f"ws://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            writer.write(self.answer(head))
            await writer.drain()
            await asyncio.sleep(0.5)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> RawGateway:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


def hostile_subprotocol(head: bytes) -> bytes:
    """A ``101`` that selects a hostile subprotocol (the only one offered is System Zero's)."""
    key = next(
        line.split(b":", 1)[1].strip()
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"sec-websocket-key:")
    )
    accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
    protocol = hostile("subprotocol", header=True).encode()
    return (
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Accept: " + accept + b"\r\nSec-WebSocket-Protocol: " + protocol + b"\r\n\r\n"
    )


def not_http(head: bytes) -> bytes:
    return hostile("not http").encode("utf-8", "surrogatepass") + b"\r\n\r\n"


@dataclass(frozen=True)
class Case:
    """A gateway, what the Test button says of it, and the fields that must reach each sink.

    :param gateway: a scripted gateway (a ``Peer`` script, a refusal) or a raw one.
    :param ok: whether the Test button succeeds.
    :param fields: the fields whose marker the Test button's answer (and the CLI's, on a failure)
        shows.
    :param raised: the fields whose marker the task's exception shows.
    :param markup: the CLI's failure shows the field's ``rich`` markup (as text).
    """

    gateway: Callable[[Peer], Awaitable[None]] | tuple[int, dict[str, str], bytes] | Callable[[bytes], bytes]
    ok: bool
    fields: tuple[str, ...]
    raised: tuple[str, ...] = ()
    markup: bool = False


CASES = {
    "hello's strings": Case(hello_strings, True, ("stream_id",)),
    "hello's protocol": Case(hello_protocol, False, ("protocol",), ("protocol",)),
    "a limit of hello": Case(
        hello_limit, False, ("limits.max_duration_ms",), ("limits.max_duration_ms",), markup=True
    ),
    "a first message that is not hello": Case(not_hello, False, ()),
    "an upgrade refused (401)": Case(
        refusal(401), False, ("refusal.type", "refusal.code", "refusal.message"), ("refusal.message",), True
    ),
    "an upgrade refused (400)": Case(
        refusal(400), False, ("refusal.type", "refusal.code", "refusal.message"), ("refusal.message",), True
    ),
    "a hostile subprotocol": Case(hostile_subprotocol, False, ("subprotocol",), ("subprotocol",), True),
    "an answer that is not HTTP": Case(not_http, False, ()),
}


def assert_clean(text: str, sink: str, *, limit: int = ANSWER_LIMIT) -> None:
    """The key nowhere, nothing that is not printable but the sink's own line breaks, no forged
    line, bounded."""
    assert KEY not in text, f"{sink}: the key in clear"
    for line in text.splitlines():
        assert line.isprintable(), f"{sink}: {line[:160]!r}"
        assert not line.lstrip().startswith("[1999-"), f"{sink}: a forged line"
        assert len(line) <= limit, f"{sink}: {len(line)} characters"


def cli_test(capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``airflow connections test`` of the hook's connection, by Airflow's own command: its exit
    code and what it printed."""
    from airflow.cli.commands.connection_command import connections_test

    capsys.readouterr()
    try:
        connections_test(argparse.Namespace(conn_id=CONN_ID, verbose=False))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capsys.readouterr().out


@pytest.mark.parametrize("name", list(CASES))
async def test_every_gateway_field_reaches_every_answer_only_through_the_gate(
    name: str,
    gateway: Callable[..., HostileGateway],
    connect: Callable[..., SystemZeroHook],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    case = CASES[name]
    monkeypatch.setenv("AIRFLOW__CORE__TEST_CONNECTION", "Enabled")
    async with CaseGateway(case, gateway) as gw:
        hook = connect(gw)
        ok, button = await asyncio.to_thread(hook.test_connection)
        code, printed = await asyncio.to_thread(cli_test, capsys)
        with pytest.raises(SystemZeroError) as raised:
            await asyncio.to_thread(hook.decide, REQUEST, "log\n", timeout=4)
    assert ok is case.ok, button
    assert_clean(button, "the Test button")
    assert "\n" not in button
    for field in case.fields:
        assert marker(field) in button, (field, button)
    # Airflow's CLI prints the answer as rich markup: it must neither break nor hide a link
    assert code == (0 if case.ok else CLI_FAILED), printed
    assert_clean(printed, "airflow connections test")
    if not case.ok:
        for field in case.fields:
            assert marker(field) in printed, (field, printed)
    if case.markup:  # printed as it came: no tag closed, no link hidden behind "Approved by SRE"
        assert MARKUP in printed, printed
    exception = f"{raised.value}\n{raised.value!r}"
    assert_clean(exception.replace("\n", " ", 1), "the task's exception", limit=4 * ANSWER_LIMIT)
    for field in case.raised:
        assert marker(field) in exception, (field, exception)


class CaseGateway:
    """The case's gateway, started for the test: a scripted one or a raw one."""

    def __init__(self, case: Case, gateway: Callable[..., HostileGateway]) -> None:
        self.case = case
        self.make = gateway
        self.raw: RawGateway | None = None

    async def __aenter__(self) -> Any:
        made = self.case.gateway
        if isinstance(made, tuple):
            return self.make(respond=made)
        if made in (hostile_subprotocol, not_http):
            self.raw = RawGateway(made)  # type: ignore[arg-type]
            return await self.raw.__aenter__()
        return self.make(made)

    async def __aexit__(self, *exc: object) -> None:
        if self.raw is not None:
            await self.raw.__aexit__(*exc)
