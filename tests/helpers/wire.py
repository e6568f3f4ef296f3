"""Helpers for driving the emulator over real loopback sockets with a plain websockets client."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from airflow_provider_systemzero.emulator import Emulator
from airflow_provider_systemzero.protocol import PROTOCOL, Limits

#: Limits with timeouts shrunk so the close paths happen in well under a second.
FAST = Limits(
    start_timeout_ms=300,
    idle_timeout_ms=400,
    heartbeat_interval_ms=10_000,
    pong_timeout_ms=300,
    max_duration_ms=60_000,
    decision_settlement_timeout_ms=300,
    write_progress_timeout_ms=300,
    close_handshake_timeout_ms=300,
    account_decision_burst=1000,
    account_decision_ceiling_per_minute=60_000,
)

EXAMPLE_QUESTIONS = {"ready": {"type": "boolean", "instructions": "Is the job ready?"}}


def start_message(
    state: Any = "Initial log\n",
    *,
    mode: str = "on_request",
    key: str | None = "example-state-1",
    cache_key: str | None = "example-affinity",
    questions: dict[str, Any] | None = None,
    min_interval_ms: int | None = 0,
    event_id: str = "evt_1",
) -> dict[str, Any]:
    request: dict[str, Any] = {
        "model": "MODEL_ID",
        "state": state,
        "questions": questions or EXAMPLE_QUESTIONS,
    }
    if cache_key is not None:
        request["prompt_cache_key"] = cache_key
    message: dict[str, Any] = {
        "type": "start",
        "event_id": event_id,
        "request": request,
        "decision_mode": mode,
    }
    if min_interval_ms is not None:
        message["min_interval_ms"] = min_interval_ms
    if key is not None:
        message["idempotency_key"] = key
    return message


@asynccontextmanager
async def stream(emu: Emulator, *, key: str = "demo", **kwargs: Any) -> AsyncIterator[ClientConnection]:
    """A plain websockets client on the stream URL (no compression, the one subprotocol)."""
    options: dict[str, Any] = {
        "subprotocols": [PROTOCOL],
        "additional_headers": {"Authorization": f"Bearer {key}"},
        "compression": None,
        "open_timeout": 5,
        "close_timeout": 2,
    }
    options.update(kwargs)
    async with connect(emu.url, **options) as ws:
        yield ws


async def send(ws: ClientConnection, message: dict[str, Any]) -> None:
    await ws.send(json.dumps(message))


async def recv(ws: ClientConnection, within: float = 5.0) -> dict[str, Any]:
    """The next server message, answering nothing."""
    async with asyncio.timeout(within):
        return json.loads(await ws.recv())


async def recv_type(
    ws: ClientConnection, kind: str, within: float = 5.0, *, pong: bool = True
) -> dict[str, Any]:
    """Skip messages (answering JSON pings when ``pong``) until one of type ``kind``."""
    async with asyncio.timeout(within):
        while True:
            message = json.loads(await ws.recv())
            if message["type"] == kind:
                return message
            if message["type"] == "ping" and pong:
                await send(ws, {"type": "pong", "nonce": message["nonce"]})


async def opened(emu: Emulator, **kwargs: Any) -> tuple[ClientConnection, dict[str, Any]]:
    """Not a context manager: the caller closes. Returns the connection and its hello."""
    options: dict[str, Any] = {
        "subprotocols": [PROTOCOL],
        "additional_headers": {"Authorization": "Bearer demo"},
        "compression": None,
        "open_timeout": 5,
        "close_timeout": 2,
    }
    options.update(kwargs)
    ws = await connect(emu.url, **options)
    return ws, await recv(ws)


async def until_closed(
    ws: ClientConnection, within: float = 5.0, *, pong: bool = True
) -> list[dict[str, Any]]:
    """Read every message until the connection closes; returns them (the close is on ``ws``)."""
    messages = []
    async with asyncio.timeout(within):
        try:
            while True:
                message = json.loads(await ws.recv())
                messages.append(message)
                if message["type"] == "ping" and pong:
                    await send(ws, {"type": "pong", "nonce": message["nonce"]})
        except ConnectionClosed:
            pass
    return messages


def close_of(ws: ClientConnection) -> tuple[int | None, str | None]:
    """The close code and reason the client received (``(None, None)``: no close frame)."""
    rcvd = ws.protocol.close_rcvd
    return (rcvd.code, rcvd.reason) if rcvd is not None else (None, None)


def http(
    emu: Emulator, method: str, path: str, *, token: str | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], Any]:
    """A blocking HTTP request to the emulator's port (run it with ``asyncio.to_thread``)."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{emu.port}{path}",
        method=method,
        data=b"" if method == "POST" else None,
        headers=dict(headers or {}),
    )
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, dict(response.headers), json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read() or b"null")


async def decide_once(emu: Emulator, key: str, state: str, *, cache_key: str) -> dict[str, Any]:
    """One on_request decide of ``state`` on a new connection of ``key`` (another process of the
    account, for the client under test): its ``decision`` or ``error`` message."""
    async with stream(emu, key=key) as ws:
        await recv(ws)  # hello
        await send(ws, start_message(state, key=None, cache_key=cache_key))
        await recv_type(ws, "ack")
        await send(ws, {"type": "decide", "state_version": 1})
        await recv_type(ws, "scheduled")
        while True:
            message = await recv(ws)
            if message["type"] in ("decision", "error"):
                return message
            if message["type"] == "ping":
                await send(ws, {"type": "pong", "nonce": message["nonce"]})
