"""What a gateway refuses is not owed: no dispatch follows a refused ``decide``, so the stream
neither waits for its decision nor counts it as possibly billed when the connection ends."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

from airflow_provider_systemzero.stream import Backoff
from tests.helpers.hostile_gateway import REQUEST, HostileGateway, Peer


async def _refuse_the_decide_then_restart(peer: Peer) -> None:
    """First connection: the ``decide`` is refused (a gateway shutting down dispatches nothing),
    then the goodbye and 1012; the next connection decides."""
    await peer.open()
    if peer.number > 1:
        await peer.decide_then()
        await peer.drain()
        return
    while (await peer.recv())["type"] != "decide":
        pass
    await peer.error("api_error", "shutting_down", "restarting", retryable=True, retry_after_ms=50)
    await asyncio.sleep(0.2)
    await peer.goodbye("shutdown", retry_after_ms=50)
    await peer.ws.close(1012)


async def test_a_decide_the_gateway_refused_is_neither_awaited_nor_counted_as_possibly_billed(
    gateway: Callable[..., HostileGateway], connect: Callable[..., Any]
) -> None:
    """A refused ``decide`` starts no dispatch: the connection's end counts no unconfirmed
    decision, and the next connection's decision is the one billed (before: 1 billed and 1
    unconfirmed, for one decision)."""
    gw = gateway(_refuse_the_decide_then_restart)
    async with connect(gw, backoff=Backoff(base=0.05, cap=0.2, rng=random.Random(7))).stream(
        REQUEST, decision_mode="on_request", state="log\n", open_deadline=10
    ) as stream:
        await stream.decide(timeout=15)
        assert len(stream.reconnects) == 1
        assert (stream.usage.billed, stream.usage.unconfirmed) == (1, 0)
