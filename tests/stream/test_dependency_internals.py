"""What the package reads of websockets' and asyncio's undocumented state
(``dependency_internals.py``): each shortcut passes its check on the releases the package is
tested on, and where a check fails the public path serves instead — the emulator then reads a
connection's close frames once it is closed, and a lost connection's transport is left to the
collector."""

from __future__ import annotations

import asyncio
import gc
import importlib
import sys
import weakref
from collections.abc import Iterator
from types import ModuleType

import pytest
import websockets
from websockets.frames import Close
from websockets.protocol import Protocol, Side, State

from airflow_provider_systemzero import dependency_internals
from airflow_provider_systemzero.emulator import connection as emulator_connection
from airflow_provider_systemzero.stream import Backoff
from tests.helpers.stream import EmulatorFactory, make_stream


def test_every_shortcut_passes_its_check_on_the_releases_the_package_is_tested_on() -> None:
    """The matrix runs websockets 17.0 and 17.4 on Python 3.11–3.13: a release that changes what a
    shortcut reads fails here, while a user of it gets the public path."""
    assert dependency_internals.SHORTCUTS == {"close_frames": None, "release_transport": None}


@pytest.fixture
def unchecked_websockets(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The module as imported next to a websockets release it was not checked against (18.0),
    and in use by the emulator."""
    monkeypatch.setattr(websockets, "__version__", "18.0")
    module = importlib.reload(dependency_internals)
    try:
        monkeypatch.setattr(emulator_connection, "close_frames", module.close_frames)
        yield module
    finally:
        monkeypatch.undo()
        importlib.reload(dependency_internals)


def _close_received(protocol: Protocol) -> None:
    """A client's masked close frame (1000) and the end of its stream, received."""
    protocol.receive_data(b"\x88\x82abcd" + bytes(b ^ m for b, m in zip(b"\x03\xe8", b"ab", strict=True)))
    protocol.receive_eof()


def test_close_frames_reads_a_connection_still_closing_and_one_closed() -> None:
    protocol = Protocol(Side.SERVER)
    assert dependency_internals.close_frames(protocol) == (None, None)
    protocol.send_close(1009, "too big")
    assert protocol.state is State.CLOSING
    assert dependency_internals.close_frames(protocol) == (Close(1009, "too big"), None)
    _close_received(protocol)
    assert protocol.state is State.CLOSED
    assert dependency_internals.close_frames(protocol) == (Close(1009, "too big"), Close(1000, ""))


def test_a_websockets_release_not_checked_reads_the_close_frames_only_once_closed(
    unchecked_websockets: ModuleType,
) -> None:
    assert unchecked_websockets.SHORTCUTS["close_frames"] == "websockets 18.0 is not a 17.x release"
    protocol = Protocol(Side.SERVER)
    protocol.send_close(1000, "done")
    assert unchecked_websockets.close_frames(protocol) == (None, None)  # closing: not read
    _close_received(protocol)
    assert unchecked_websockets.close_frames(protocol) == (Close(1000, "done"), Close(1000, ""))


@pytest.mark.parametrize("path", ["shortcut", "public"])
async def test_the_emulator_counts_each_close_on_either_path(
    path: str, request: pytest.FixtureRequest, make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    """The example exchange over loopback, with the emulator reading the close frames of a
    connection still closing, and without (as where the check fails): the same decisions, the
    close counted once with its code, the account's stream given back."""
    if path == "public":
        request.getfixturevalue("unchecked_websockets")
    emu = await make_emulator()
    async with make_stream(emu, fast_backoff, idempotency_key="example-state-1") as stream:
        await stream.append_text("Job is ready.\n", idempotency_key="example-state-2")
        decision = await stream.decide(timeout=10)
        assert decision.answer("ready").decision is True and decision.state_version == 2
    await emu.wait_for(lambda e: e.stats.streams_open == 0 and not e.reserved_streams, timeout=10)
    assert emu.stats.closes_by_code == {1000: 1}


class _Releasing(asyncio.Protocol):
    """A client protocol that calls :func:`release_transport` when its connection is lost."""

    def __init__(self) -> None:
        self.transport: asyncio.BaseTransport | None = None
        self.lost = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        dependency_internals.release_transport(self.transport)
        self.transport = None
        self.lost.set_result(None)


async def _lost_transports() -> list[weakref.ref[asyncio.BaseTransport]]:
    """Two loopback connections lost, one aborted here and one closed by the peer: weak
    references to their transports, taken with the collector off."""
    server = await asyncio.start_server(lambda _reader, writer: writer.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    refs = []
    try:
        for aborted in (True, False):
            transport, protocol = await asyncio.get_running_loop().create_connection(
                _Releasing, "127.0.0.1", port
            )
            refs.append(weakref.ref(transport))
            if aborted:
                transport.abort()
            await asyncio.wait_for(protocol.lost, 10)
            del transport, protocol
            await asyncio.sleep(0)  # the transport's own end of the loss runs in a callback
    finally:
        server.close()
    return refs


@pytest.mark.parametrize("path", ["shortcut", "public"])
async def test_a_lost_transport_is_freed_by_reference_counting_or_by_the_collector(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the shortcut (Python 3.11) or ``close()`` (3.12 and later) a lost connection's
    transport is freed at once; on 3.11 without the shortcut (its check failed) the collector
    frees it."""
    if path == "public":
        monkeypatch.setattr(dependency_internals, "_CLEAR_BY_HAND", False)
    gc.disable()
    try:
        refs = await _lost_transports()
        left = [ref for ref in refs if ref() is not None]
    finally:
        gc.enable()
    needs_collector = path == "public" and sys.version_info < (3, 12)
    assert len(left) == (2 if needs_collector else 0)
    gc.collect()
    assert all(ref() is None for ref in refs)


def test_release_transport_drops_only_the_method_a_transport_keeps_of_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dependency_internals, "_CLEAR_BY_HAND", True)

    class Transport(asyncio.Transport):
        def _read_ready__data_received(self) -> None: ...

        def is_closing(self) -> bool:
            return True

        def close(self) -> None:
            self.closed = True

    class Other:
        def write(self) -> None: ...

    transport, other = Transport(), Transport()
    transport._read_ready_cb = transport._read_ready__data_received  # type: ignore[attr-defined]
    other._read_ready_cb = Other().write  # type: ignore[attr-defined]  # not its own: kept
    dependency_internals.release_transport(transport)
    dependency_internals.release_transport(other)
    assert transport._read_ready_cb is None and transport.closed  # type: ignore[attr-defined]
    assert other._read_ready_cb is not None  # type: ignore[attr-defined]
    dependency_internals.release_transport(None)  # nothing to release
