"""The server's ``hello`` does not set the client's own safety limits (issue 24 item 7).

Every advertised limit is clamped to the public document's bounds: a huge ``max_message_bytes``
lets no oversized frame in (the frame is a protocol violation), zero or huge liveness timers do
not switch the dead-connection checks off, and one gateway's ``max_streams_per_process=1`` holds
for that gateway only — not for the others, and not for good.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from airflow_provider_systemzero.protocol.errors import RemoteProtocolError
from airflow_provider_systemzero.protocol.limits import ADVERTISED_BOUNDS, ADVERTISED_LIMITS, Limits
from airflow_provider_systemzero.stream import StreamSettings, default_capacity
from airflow_provider_systemzero.stream.connection import connect_options
from airflow_provider_systemzero.stream.exceptions import ProtocolViolation
from tests.helpers.hostile_gateway import KEY, REQUEST, HostileGateway, Peer

DOCUMENT = Limits()


def test_every_advertised_limit_is_clamped_to_the_documents_bounds() -> None:
    huge = Limits.from_hello(dict.fromkeys(ADVERTISED_LIMITS, 2**53 - 1))
    zero = Limits.from_hello(dict.fromkeys(ADVERTISED_LIMITS, 0))
    for name in ADVERTISED_LIMITS:
        low, high = ADVERTISED_BOUNDS[name]
        assert (getattr(zero, name), getattr(huge, name)) == (low, high), name
    assert huge.max_message_bytes == DOCUMENT.max_message_bytes
    assert huge.heartbeat_interval_ms + huge.pong_timeout_ms == 40_000
    assert huge.max_streams_per_process == 4 and zero.max_streams_per_process == 1
    assert min(zero.heartbeat_interval_ms, zero.native_heartbeat_interval_ms, zero.pong_timeout_ms) > 0
    options = connect_options(StreamSettings("ws://127.0.0.1:1", KEY), zero)
    assert options["ping_interval"] and options["ping_timeout"]  # native pings stay on


def test_limits_parsed_before_are_reused_and_never_let_a_bad_value_through() -> None:
    """A gateway advertises the same limits in every ``hello``: they are parsed (and clamped) once.
    The reuse never accepts what a first parse would refuse: ``true`` equals 1 in Python, and a
    boolean is still no limit."""
    advertised = DOCUMENT.advertised()
    first = Limits.from_hello(dict(advertised))
    assert Limits.from_hello(dict(advertised)) is first
    for bad in (True, -1, 1.0, "1", None, [1]):
        with pytest.raises(RemoteProtocolError) as refused:
            Limits.from_hello({**advertised, "max_streams_per_process": bad})
        assert refused.value.field == "limits.max_streams_per_process"
    assert Limits.from_hello({**advertised, "max_streams_per_process": 1}).max_streams_per_process == 1


async def test_a_huge_advertised_max_message_bytes_lets_no_oversized_frame_in(
    gateway: Callable[..., HostileGateway], connect: Callable[..., Any]
) -> None:
    async def advertise_then_flood(peer: Peer) -> None:
        await peer.open({"max_message_bytes": 2**50})
        if peer.number == 1:
            await peer.goodbye("shutdown")
            await peer.ws.close(1012)  # the next connection is opened under the advertised limit
            return
        await peer.recv()  # decide
        await peer.ws.send('{"type":"ping","padding":"' + "x" * (DOCUMENT.max_message_bytes + 2**17) + '"}')
        await peer.drain()

    gw = gateway(advertise_then_flood)
    with pytest.raises(ProtocolViolation, match="max_message_bytes"):
        async with asyncio.timeout(30):
            async with connect(gw).stream(
                REQUEST, decision_mode="on_request", state="log\n", open_deadline=10
            ) as stream:
                assert stream.session.limits.max_message_bytes == DOCUMENT.max_message_bytes
                await stream.decide(timeout=25)
    assert gw.connections == 1 + 3  # three oversized frames in a row, then the caller hears it


async def test_a_lowered_stream_cap_holds_for_its_gateway_only(
    gateway: Callable[..., HostileGateway], connect: Callable[..., Any]
) -> None:
    async def one_stream_only(peer: Peer) -> None:
        await peer.open({"max_streams_per_process": 1})
        await peer.drain()

    async def ordinary(peer: Peer) -> None:
        await peer.open()
        await peer.drain()

    strict, other = gateway(one_stream_only), gateway(ordinary)
    strict_hook = connect(strict)
    async with strict_hook.stream(REQUEST, state="a\n", open_deadline=10):
        # the strict gateway's second stream waits for the first ...
        second = asyncio.create_task(_open(strict_hook.stream(REQUEST, state="b\n", open_deadline=10)))
        await asyncio.sleep(0.5)
        assert not second.done() and strict.connections == 1
        # ... while three streams to another gateway open at once beside it
        other_hook = connect(other)
        async with (
            other_hook.stream(REQUEST, state="c\n", open_deadline=10),
            other_hook.stream(REQUEST, state="d\n", open_deadline=10),
            other_hook.stream(REQUEST, state="e\n", open_deadline=10),
        ):
            assert other.connections == 3 and default_capacity().in_use == 4
    await asyncio.wait_for(second, 10)  # the first closed: the second opened
    assert default_capacity().limit == 4  # the process's own limit never changed


async def _open(stream: Any) -> None:
    async with stream:
        pass
