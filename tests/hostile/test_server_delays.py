"""The real client against a scripted gateway over loopback: every delay the gateway names is
honoured, and what it announces but does not do, the client does itself.

The public document: "Use full-jitter reconnect backoff, honoring any longer server retry
delay." and "Honor goodbye.resume.retry_after_ms and any longer server retry delay." ; "A fatal
error requires a following close." WIRE.md §8: "The client never waits on the server for
something the server has said it will not do."
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from airflow_provider_systemzero.protocol import Limits
from tests.helpers.hostile_gateway import REQUEST, HostileGateway, Peer

#: How long the client gives a gateway that said goodbye (or sent a fatal error) to close: the
#: close handshake timeout (not advertised by the gateway).
CLOSE_GRACE_S = Limits().close_handshake_timeout_ms / 1000


def _error(code: str, **fields: Any) -> dict[str, Any]:
    retry_after_ms = fields.pop("retry_after_ms", None)
    return {
        "type": "error",
        "event_id": None,
        "state_version": None,
        "http_status": None,
        "request_id": "req_err",
        "fatal": False,
        "error": {
            "envelope": {"error": {"type": "rate_limit_error", "code": code, "message": code}},
            "retry": {"retryable": True, "retry_after_ms": retry_after_ms},
        },
        **fields,
    }


async def _decide(connect: Any, gw: HostileGateway, mode: str, within: float = 20) -> Any:
    """One decision through a stream to ``gw`` (bounded): (the decision, the stream's reconnects)."""
    async with asyncio.timeout(within + 10):
        async with connect(gw).stream(REQUEST, decision_mode=mode, state="log\n", open_deadline=10) as stream:
            return await stream.decide(timeout=within), list(stream.reconnects)


async def test_a_second_goodbye_does_not_shorten_the_first(
    gateway: Callable[..., HostileGateway], connect: Callable[..., Any]
) -> None:
    seen: dict[str, float] = {}

    async def script(peer: Peer) -> None:
        await peer.open()
        if peer.number == 1:
            await peer.goodbye("shutdown", retry_after_ms=1_500)
            await peer.goodbye("shutdown", retry_after_ms=0)
            seen["goodbyes"] = time.monotonic()
            await peer.ws.close(1012)
            return
        seen["reconnected"] = time.monotonic()
        await peer.decide_then()
        await peer.drain()

    decision, reconnects = await _decide(connect, gateway(script), "on_request")
    assert decision.state_version == 1
    assert seen["reconnected"] - seen["goodbyes"] >= 1.5
    assert reconnects[0].server_delay == 1.5


async def test_a_retry_delay_outlives_the_connection_it_came_on(
    gateway: Callable[..., HostileGateway], connect: Callable[..., Any]
) -> None:
    """on_change: the gateway will retry a 429 after 1.5 s, then the connection drops. The replay
    on a new connection (whose start dispatches at once) waits the rest of those 1.5 s."""
    seen: dict[str, float] = {}

    async def script(peer: Peer) -> None:
        await peer.open()
        if peer.number == 1:
            await peer.send(_error("rate_limited", http_status=429, state_version=1, retry_after_ms=1_500))
            seen["failed"] = time.monotonic()
            await asyncio.sleep(0.05)
            await peer.ws.close(1013)
            return
        seen["replayed"] = time.monotonic()
        await peer.decision(1)
        await peer.drain()

    decision, _ = await _decide(connect, gateway(script), "on_change")
    assert decision.state_version == 1
    assert seen["replayed"] - seen["failed"] >= 1.5


async def test_a_goodbye_with_no_close_is_closed_by_the_client(
    gateway: Callable[..., HostileGateway], connect: Callable[..., Any]
) -> None:
    """The gateway says goodbye, keeps the connection open, pings, and never decides: the client
    closes after the close handshake timeout and replays on a new connection."""
    closed: dict[str, Any] = {}

    async def script(peer: Peer) -> None:
        await peer.open()
        if peer.number == 1:
            await peer.goodbye("shutdown", retry_after_ms=100)
            said = time.monotonic()
            await peer.drain()  # never closes; the client does
            closed.update(after=time.monotonic() - said, code=peer.ws.close_code)
            return
        await peer.decide_then()
        await peer.drain()

    decision, reconnects = await _decide(connect, gateway(script), "on_request", within=15)
    assert decision.state_version == 1 and len(reconnects) == 1
    assert closed["code"] == 1000 and CLOSE_GRACE_S <= closed["after"] < CLOSE_GRACE_S + 3


def _first_then_decide(first: Callable[[Peer], Awaitable[None]]) -> Callable[[Peer], Awaitable[None]]:
    """A script: the first connection plays ``first`` (then reads until the client leaves); every
    later one decides."""

    async def script(peer: Peer) -> None:
        await peer.open()
        if peer.number == 1:
            await first(peer)
        else:
            await peer.decide_then()
        await peer.drain()

    return script


async def test_a_fatal_error_with_no_close_is_closed_by_the_client(
    gateway: Callable[..., HostileGateway], connect: Callable[..., Any]
) -> None:
    async def fatal(peer: Peer) -> None:
        await peer.send(_error("overloaded", fatal=True, retry_after_ms=100))

    gw = gateway(_first_then_decide(fatal))
    decision, reconnects = await _decide(connect, gw, "on_request", within=15)
    assert decision.state_version == 1 and reconnects[0].reason == "recycled"


async def test_an_unnamed_refusal_of_the_decide_is_replayed(
    gateway: Callable[..., HostileGateway], connect: Callable[..., Any]
) -> None:
    """message_rate_limited naming nothing, and the decide never answered: the client replays
    on a new connection after the delay instead of waiting for the deadline."""

    async def refuse_the_decide(peer: Peer) -> None:
        while (await peer.recv())["type"] != "decide":
            pass
        await peer.send(_error("message_rate_limited", retry_after_ms=200))

    gw = gateway(_first_then_decide(refuse_the_decide))
    decision, reconnects = await _decide(connect, gw, "on_request", within=15)
    assert decision.state_version == 1 and reconnects[0].reason == "recycled"


async def test_a_decide_refused_as_stale_over_and_over_is_not_a_loop(
    gateway: Callable[..., HostileGateway], connect: Callable[..., Any]
) -> None:
    """Every decide answered stale_state_version (it named the acknowledged version): the client
    replays on a new connection after the delay, never sends the same decide again at once."""
    decides: list[float] = []

    async def script(peer: Peer) -> None:
        await peer.open()
        async for text in peer.ws:
            if '"decide"' in str(text):
                decides.append(time.monotonic())
                await peer.send(_error("stale_state_version", retry_after_ms=500))

    gw = gateway(script)
    async with connect(gw).stream(REQUEST, decision_mode="on_request", state="log\n", open_deadline=10) as s:
        task = asyncio.ensure_future(s.decide(timeout=3))
        done, _ = await asyncio.wait({task}, timeout=10)
        assert done and task.exception() is not None  # the deadline, not a loop
    per_connection = max(sum(1 for t in decides if abs(t - d) < 0.4) for d in decides)
    assert per_connection == 1 and len(decides) <= 3 / 0.5 + 1, decides
