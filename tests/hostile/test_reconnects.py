"""Reconnects a gateway cannot turn into a storm, and decisions it cannot misattribute
(issue 24 items 1, 3 and 5), plus the default deadline of ``hook.decide`` (item 11).

The rules live in the protocol core: the reconnect plan (``protocol/reconnect.py``) and the
``stream_id``/``seq`` check (``protocol/connection_state.py``).
"""

from __future__ import annotations

import asyncio
import inspect
import random
import time
from collections.abc import Callable
from typing import Any

import pytest

from airflow_provider_systemzero.hooks.systemzero import DEFAULT_DECIDE_TIMEOUT, SystemZeroHook
from airflow_provider_systemzero.stream import Backoff
from tests.helpers.hostile_gateway import REQUEST, HostileGateway, Peer, decide_and_fail

#: The measurement window (seconds) and the most connections a growing backoff allows in it: with
#: this seeded backoff (0.2 s doubling to 5 s) a storm or a backoff stuck at its first step opens
#: 15–280 a second, a growing one fewer than ten in all.
WINDOW = 3.0
MOST = 10


def _backoff() -> Backoff:
    return Backoff(base=0.2, cap=5.0, rng=random.Random(7))


async def _connections_while_streaming(gw: HostileGateway, connect: Callable[..., Any]) -> int:
    """Open an on_change stream (it wants a decision: it has work) and count the connections
    the gateway sees during :data:`WINDOW` seconds."""
    async with asyncio.timeout(WINDOW + 15):
        async with connect(gw, backoff=_backoff()).stream(REQUEST, state="log\n", open_deadline=10):
            started = time.monotonic()
            await asyncio.sleep(WINDOW)  # the measurement window: the gateway counts meanwhile
            return sum(1 for t in gw.connected_at if t >= started)


def _ends(how: str) -> Callable[[Peer], Any]:
    async def script(peer: Peer) -> None:
        await peer.open()
        if how == "close 1000":
            await peer.ws.close(1000)
        elif how in ("idle_timeout", "max_duration"):
            await peer.goodbye(how)
            await peer.ws.close(1000)
        elif how == "fatal error":
            await peer.send(
                {
                    "type": "error",
                    "event_id": None,
                    "state_version": 1,
                    "http_status": 500,
                    "request_id": "r",
                    "fatal": True,
                    "error": {
                        "envelope": {"error": {"type": "api_error", "code": "internal", "message": "boom"}},
                        "retry": {"retryable": True, "retry_after_ms": None},
                    },
                }
            )
            await peer.ws.close(1011)
        elif how == "abort":
            peer.ws.transport.abort()
        else:
            await peer.ws.close(int(how))

    return script


@pytest.mark.parametrize("how", ["close 1000", "idle_timeout", "max_duration", "fatal error"])
async def test_no_reconnect_storm_after_a_connection_ends_right_after_the_ack(
    how: str, gateway: Callable[..., HostileGateway], connect: Callable[..., Any]
) -> None:
    count = await _connections_while_streaming(gateway(_ends(how)), connect)
    assert count <= MOST, f"{count} connections in {WINDOW} s"


@pytest.mark.parametrize("how", ["1011", "1013", "3000", "4000", "abort"])
async def test_backoff_grows_when_every_connection_ends_right_after_the_ack(
    how: str, gateway: Callable[..., HostileGateway], connect: Callable[..., Any]
) -> None:
    count = await _connections_while_streaming(gateway(_ends(how)), connect)
    assert count <= MOST, f"{count} connections in {WINDOW} s"


@pytest.mark.parametrize("field", ["stream_id", "seq"])
async def test_a_decision_naming_another_stream_is_refused(
    field: str, gateway: Callable[..., HostileGateway], connect: Callable[..., Any]
) -> None:
    async def misattribute(peer: Peer) -> None:
        await peer.open()
        wrong = {"stream_id": "szws_" + "f" * 32} if field == "stream_id" else {"seq": 1}
        await peer.decide_then(**wrong)
        await peer.drain()

    await decide_and_fail(connect(gateway(misattribute)))


def test_hook_decide_has_a_finite_default_deadline() -> None:
    default = inspect.signature(SystemZeroHook.decide).parameters["timeout"].default
    assert default == DEFAULT_DECIDE_TIMEOUT and 0 < default < float("inf")
