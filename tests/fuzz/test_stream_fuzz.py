"""Fuzz the real hook and stream client over loopback: a gateway that speaks the protocol honestly
(the core's GatewaySession) except where a hypothesis script injects frames, fails the decide, or
ends the connection with any close code or an abort.

Whatever the script, the stream either works or ends in one of the client's documented
exceptions (:class:`SystemZeroError`), within a bound — it never hangs, never leaks a stream slot,
and when the client closes a connection itself it does so with 1000 (normal) or 1002 (the peer
broke the protocol).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.asyncio.server import ServerConnection, serve

from airflow_provider_systemzero.hooks.systemzero import SystemZeroHook
from airflow_provider_systemzero.protocol.errors import ErrorEnvelope, RetryHint
from airflow_provider_systemzero.protocol.gateway import (
    CloseConnection,
    DecideFailure,
    DecideSuccess,
    DispatchDecide,
    GatewaySession,
    SendMessage,
)
from airflow_provider_systemzero.protocol.limits import Limits
from airflow_provider_systemzero.protocol.messages import PROTOCOL, encode_message
from airflow_provider_systemzero.stream import SystemZeroError, default_capacity
from tests.helpers.strategies import QUESTIONS, REPLY, server_frames

KEY = "sz-fuzz-0123456789abcdef"
CONN_ID = "systemzero_fuzz"
#: Seconds after which a stream that has neither worked nor failed counts as hung.
HANG = 8.0
LIMITS = Limits(
    heartbeat_interval_ms=400,
    pong_timeout_ms=400,
    close_handshake_timeout_ms=300,
    account_decision_burst=1_000,
)

scripts = st.fixed_dictionaries(
    {
        # (after how many honest messages, frame): index 0 is before hello
        "inject": st.lists(st.tuples(st.integers(0, 4), server_frames), max_size=4),
        # after how many honest messages the connection ends, and how (None: it never does)
        "end_after": st.one_of(st.none(), st.integers(1, 5)),
        "ending": st.sampled_from(
            [
                "close:1000",
                "close:1001",
                "close:1002",
                "close:1003",
                "close:1008",
                "close:1009",
                "close:1011",
                "close:1012",
                "close:1013",
                "close:4000",
                "abort",
            ]
        ),
        "decide": st.sampled_from(["ok", "503", "422", "409", "maintenance", "500"]),
    }
)


def _outcome(kind: str) -> Any:
    if kind == "ok":
        return DecideSuccess(reply=REPLY, request_id="r")
    status, code, retryable = {
        "503": (503, "overloaded", True),
        "422": (422, "idempotency_key_reused", False),
        "409": (409, "idempotency_conflict", True),
        "maintenance": (503, "maintenance", True),
        "500": (500, "internal", False),
    }[kind]
    return DecideFailure(status, ErrorEnvelope("api_error", code, "scripted"), RetryHint(retryable, 50), "r")


class FuzzGateway:
    """A loopback gateway on its own thread and loop; :attr:`script` applies to every connection."""

    def __init__(self) -> None:
        self.script: dict[str, Any] = {"inject": [], "end_after": None, "ending": "abort", "decide": "ok"}
        self.client_closes: list[int] = []
        self.errors: list[BaseException] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fuzz-gateway", daemon=True)
        self._server: Any = None
        self.origin = ""

    def __enter__(self) -> FuzzGateway:
        self._thread.start()

        async def start() -> Any:
            return await serve(
                self._handler,
                "127.0.0.1",
                0,
                compression=None,
                select_subprotocol=lambda _c, offered: PROTOCOL if PROTOCOL in offered else None,
            )

        self._server = asyncio.run_coroutine_threadsafe(start(), self._loop).result(10)
        self.origin = f"ws://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            self._server.close()
            await self._server.wait_closed()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _handler(self, ws: ServerConnection) -> None:
        script = self.script
        inject: dict[int, list[Any]] = {}
        for index, frame in script["inject"]:
            inject.setdefault(index, []).append(frame)
        gateway = GatewaySession(stream_id="szws_" + "e" * 32, now=time.monotonic(), limits=LIMITS)
        honest = 0
        decided = 0

        async def send_injected() -> bool:
            for frame in inject.pop(honest, []):
                await ws.send(frame)
            if script["end_after"] is not None and honest >= script["end_after"]:
                if script["ending"] == "abort":
                    ws.transport.abort()
                else:
                    await ws.close(int(script["ending"].split(":")[1]), "scripted")
                return False
            return True

        async def perform(actions: list[Any]) -> bool:
            nonlocal honest, decided
            for action in actions:
                if isinstance(action, SendMessage):
                    await ws.send(encode_message(action.message))
                    honest += 1
                    if not await send_injected():
                        return False
                elif isinstance(action, DispatchDecide):
                    decided += 1
                    outcome = _outcome(script["decide"] if decided == 1 else "ok")
                    if not await perform(
                        gateway.dispatch_finished(action.dispatch_id, outcome, time.monotonic())
                    ):
                        return False
                elif isinstance(action, CloseConnection):
                    await ws.close(action.code, action.reason)
                    return False
            return True

        try:
            if not await send_injected() or not await perform(gateway.actions()):
                return
            while not gateway.closed:
                deadline = gateway.next_deadline()
                timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    async with asyncio.timeout(timeout):
                        frame = await ws.recv()
                except TimeoutError:
                    if not await perform(gateway.tick(time.monotonic())):
                        return
                    continue
                now = time.monotonic()
                actions = (
                    gateway.receive_text(frame, now)
                    if isinstance(frame, str)
                    else gateway.receive_binary(now)
                )
                if not await perform(actions):
                    return
        except Exception as exc:  # the client went away mid-send: fine; anything else is recorded
            if not type(exc).__module__.startswith("websockets"):
                self.errors.append(exc)
        finally:
            with contextlib.suppress(Exception):
                await ws.wait_closed()
            protocol = ws.protocol
            if protocol.close_rcvd is not None and protocol.close_rcvd_then_sent:
                self.client_closes.append(protocol.close_rcvd.code)


async def drive(mode: str) -> str:
    """Open a stream through the hook, change the state, ask for a decision; report the outcome."""
    outcome = "worked"
    stream = SystemZeroHook(CONN_ID).stream(
        {"model": "m", "questions": QUESTIONS},
        state="log\n",
        decision_mode=mode,
        identity="fuzz",
        open_deadline=0.6,
    )
    async with asyncio.timeout(HANG):
        try:
            async with stream:
                await stream.append_text("more\n")
                await stream.decide(timeout=0.6)
        except SystemZeroError as exc:  # the documented way to end
            outcome = type(exc).__name__
    # a failure recorded after the caller left (e.g. while closing) must be documented too
    assert stream.failure is None or isinstance(stream.failure, SystemZeroError), repr(stream.failure)
    return outcome


@pytest.fixture
def gateway(monkeypatch: pytest.MonkeyPatch) -> Iterator[FuzzGateway]:
    monkeypatch.setenv("AIRFLOW__SYSTEMZERO__RECONNECT_BACKOFF_BASE", "0.01")
    monkeypatch.setenv("AIRFLOW__SYSTEMZERO__RECONNECT_BACKOFF_CAP", "0.05")
    default_capacity().set_limit(4)
    with FuzzGateway() as gw:
        monkeypatch.setenv(
            f"AIRFLOW_CONN_{CONN_ID.upper()}",
            json.dumps({"conn_type": "systemzero", "host": gw.origin, "password": KEY}),
        )
        yield gw
    default_capacity().set_limit(4)


def test_the_stream_survives_or_fails_cleanly_whatever_the_gateway_sends(gateway: FuzzGateway) -> None:
    outcomes: list[str] = []

    @settings(
        max_examples=int(os.environ.get("SZ_FUZZ_STREAM", "30")),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(script=scripts, mode=st.sampled_from(["on_change", "on_request"]))
    def one(script: dict[str, Any], mode: str) -> None:
        gateway.script = script
        gateway.client_closes.clear()
        outcomes.append(asyncio.run(drive(mode)))
        assert default_capacity().in_use == 0, "a stream slot was not given back"
        assert set(gateway.client_closes) <= {1000, 1002}, gateway.client_closes
        assert not gateway.errors, gateway.errors

    one()
    print(f"\nfuzzed stream outcomes: { {o: outcomes.count(o) for o in sorted(set(outcomes))} }")
