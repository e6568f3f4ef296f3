"""Every deadline the API offers holds whatever the peer does; every write has a bound
(issue 24 items 2 and 11).

The gateways here acknowledge ``start`` and then stop reading — the socket's receive buffer
shrunk and the transport paused — while they keep the connection busy with JSON pings. Before,
a blocked ``send`` waited for ever and no liveness check fired (the pings kept the receipt clock
fresh): leaving ``async with`` never returned, ``hook.decide(timeout=)`` and a trigger's deadline
did not hold, and memory grew with the pongs owed.

A caller leaving while a write is blocked drops the socket at once, so the deadline holds to the
second. Otherwise closing a connection to a peer that stopped reading takes at most the
document's ``close_handshake_timeout`` (5 s) before the socket is dropped — after the caller's
result, never inside its deadline (``test_unanswered_close``).
"""

from __future__ import annotations

import asyncio
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest

from airflow_provider_systemzero.protocol.limits import Limits
from airflow_provider_systemzero.protocol.messages import PROTOCOL
from airflow_provider_systemzero.stream.exceptions import DeadlineExceeded, SystemZeroError
from airflow_provider_systemzero.triggers.decision import SystemZeroDecideTrigger
from tests.helpers.hostile import CONN_ID
from tests.helpers.hostile_gateway import REQUEST, HostileGateway, Peer, encode

#: Closing a connection whose peer stopped reading, at most (the document's close handshake).
CLOSING = Limits().close_handshake_timeout_ms / 1000
#: Room for a loaded machine.
SLACK = 3.0
#: The gateways' receive buffer: a peer that stops reading stops the client's writes within a few KiB.
BUFFER = 4096


async def take_nothing_in(peer: Peer) -> None:
    """Acknowledge ``start`` without reading it, then read nothing and send JSON pings for ever:
    the client's write of a large ``start`` blocks, and stays blocked. The ack leaves with
    ``hello``, in one write, so the client reads it with ``hello``: a client reads nothing while
    its own writes are blocked, and would not see an ack sent after it began writing."""
    hello = {"type": "hello", "protocol": PROTOCOL, "request_id": "req_hello", "rate_limit": None}
    hello["limits"] = Limits().advertised()
    ack = {"type": "ack", "event_id": "evt_1", "state_version": 1, "state_bytes": 4}
    ack.update(synthesized_body_bytes=100, scheduled=False)
    protocol = peer.ws.protocol
    for seq, message in ((1, hello), (2, ack)):
        protocol.send_text(encode({"stream_id": peer.stream_id, "seq": seq, **message}).encode())
    peer.ws.transport.pause_reading()
    peer.ws.transport.write(b"".join(protocol.data_to_send()))
    peer.seqs = iter(range(3, 10**9))
    nonce = 0
    while True:
        nonce += 1
        await peer.send({"type": "ping", "nonce": nonce})
        if nonce % 20 == 0:
            await asyncio.sleep(0.001)


#: A state larger than the socket buffers between the client and a gateway that reads nothing.
LARGE = "x" * 3_000_000


async def ack_without_reading(peer: Peer) -> None:
    """Acknowledge every change without reading it (the client then writes the next one), ping meanwhile."""
    await peer.open()
    peer.ws.transport.pause_reading()
    for version in range(2, 10_000):
        await peer.send({"type": "ping", "nonce": version})
        await asyncio.sleep(0.1)
        await peer.ack(f"evt_{version}", version)


async def test_a_write_the_gateway_never_reads_is_given_up_and_leaving_returns(
    gateway: Callable[..., HostileGateway], connect: Callable[..., Any]
) -> None:
    gw = gateway(ack_without_reading, receive_buffer=BUFFER)
    write_bound = Limits().write_progress_timeout_ms / 1000
    started = time.monotonic()
    async with connect(gw).stream(
        REQUEST, decision_mode="on_request", state="log\n", open_deadline=10
    ) as stream:
        for round_ in range(1_000):
            await stream.replace(f"{round_}" + "x" * 3_000_000)
            if any(r.reason == "write_timeout" for r in stream.reconnects):
                break
            await asyncio.sleep(0.05)
        given_up = time.monotonic() - started
        assert [r.reason for r in stream.reconnects][:1] == ["write_timeout"]
        leaving = time.monotonic()
    assert given_up < write_bound + 3 + SLACK  # a few changes are written before the buffers fill
    assert time.monotonic() - leaving < CLOSING + SLACK


async def test_leaving_async_with_returns_when_the_gateway_stops_reading(
    gateway: Callable[..., HostileGateway], connect: Callable[..., Any]
) -> None:
    gw = gateway(take_nothing_in, receive_buffer=BUFFER)
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        async with connect(gw).stream(
            REQUEST, decision_mode="on_request", state=LARGE, open_deadline=10
        ) as stream:
            await stream.decide(timeout=2)
    assert time.monotonic() - started < 2 + SLACK  # the blocked write is abandoned at once


def test_hook_decide_timeout_holds_when_the_gateway_stops_reading(
    gateway: Callable[..., HostileGateway], connect: Callable[..., Any]
) -> None:
    hook = connect(gateway(take_nothing_in, receive_buffer=BUFFER))
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        hook.decide(REQUEST, LARGE, timeout=3)
    assert time.monotonic() - started < 3 + SLACK


async def test_a_trigger_deadline_holds_when_the_gateway_stops_reading(
    gateway: Callable[..., HostileGateway], connect: Callable[..., Any]
) -> None:
    connect(gateway(take_nothing_in, receive_buffer=BUFFER))
    trigger = SystemZeroDecideTrigger(
        systemzero_conn_id=CONN_ID,
        request=REQUEST,
        state=LARGE,
        key_namespace="hostile",
        deadline=time.time() + 3,
    )
    started = time.monotonic()
    async with asyncio.timeout(60):
        event = await anext(aiter(trigger.run()))
    assert event.payload["status"] == "timeout"
    assert time.monotonic() - started < 3 + SLACK


async def test_memory_and_writes_stay_bounded_under_a_ping_flood(
    gateway: Callable[..., HostileGateway], connect: Callable[..., Any]
) -> None:
    pongs: list[float] = []

    async def flood_and_count(peer: Peer) -> None:
        await peer.open()

        async def count() -> None:
            async for text in peer.ws:
                if '"pong"' in str(text):
                    pongs.append(time.monotonic())

        counter = asyncio.create_task(count())
        try:
            for nonce in range(1, 10**9):
                await peer.send({"type": "ping", "nonce": nonce})
                if nonce % 20 == 0:
                    await asyncio.sleep(0.001)
        finally:
            counter.cancel()

    hook = connect(gateway(flood_and_count))
    tracemalloc.start()
    try:
        async with hook.stream(REQUEST, decision_mode="on_request", state="log\n", open_deadline=10):
            flooded = time.monotonic()
            await asyncio.sleep(3)  # the flood runs meanwhile: this is the measurement window
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    window = [t for t in pongs if t >= flooded + 0.5]
    rate = len(window) / 2.5
    # at most the 2 pongs owed, 40 flushes a second (the loop's stall is a timing matter: benchmarks)
    assert 0 < rate <= 2 * 40 * 1.25, f"{rate:.0f} pongs a second"
    assert peak < 32 * 2**20, f"peak {peak / 2**20:.0f} MiB"


async def test_a_huge_server_delay_is_capped(
    gateway: Callable[..., HostileGateway], connect: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    async def goodbye_for_ages(peer: Peer) -> None:
        await peer.open()
        await peer.goodbye("shutdown", retry_after_ms=10**12)
        await peer.ws.close(1012)

    caplog.set_level("INFO", logger="airflow_provider_systemzero")
    async with connect(gateway(goodbye_for_ages)).stream(
        REQUEST, decision_mode="on_request", state="log\n", open_deadline=10
    ) as stream:
        with pytest.raises(SystemZeroError):
            await stream.decide(timeout=2)
    planned = [r.getMessage() for r in caplog.records if "reconnecting in" in r.getMessage()]
    assert planned, "no reconnect was planned"
    delay = float(planned[0].split("reconnecting in ")[1].split(" s")[0])
    assert 300 <= delay <= 300 + 1  # the five-minute cap (plus the seeded jitter), not 31 years
