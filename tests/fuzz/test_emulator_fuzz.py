"""Random client frames at the real gateway emulator over a socket: whatever a client sends, the
gateway answers with well-formed messages and either keeps the stream open or closes it with a
documented code — it never drops the connection (1006) or fails internally (1011)."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from airflow_provider_systemzero.protocol.errors import RemoteProtocolError
from airflow_provider_systemzero.protocol.limits import Limits
from airflow_provider_systemzero.protocol.messages import PROTOCOL, decode_server_message
from tests.helpers import EmulatorThread
from tests.helpers.strategies import client_frames

KEY = "sz-emulator-fuzz-0123456789"
LIMITS = Limits(max_message_bytes=4_096, start_timeout_ms=300, account_decision_burst=1_000)
#: The gateway's documented closes (WIRE.md §7); 1000 also when the client ends the stream itself.
DOCUMENTED = {1000, 1008, 1009, 1012, 1013}


async def exchange(url: str, frames: list[str | bytes]) -> tuple[int | None, list[str]]:
    """Send the frames, then read until the gateway closes (or a short quiet), then close normally."""
    received: list[str] = []
    async with connect(
        url,
        subprotocols=[PROTOCOL],
        compression=None,  # type: ignore[list-item]
        additional_headers={"Authorization": f"Bearer {KEY}"},
        open_timeout=5,
    ) as ws:
        try:
            for frame in frames:
                await ws.send(frame)
            while True:
                async with asyncio.timeout(0.2):
                    message = await ws.recv()
                assert isinstance(message, str)
                received.append(message)
        except (ConnectionClosed, TimeoutError):
            pass
    return ws.close_code, received  # the gateway's code, or 1000 when the client ended a quiet stream


def test_the_emulator_answers_any_client_frames_with_documented_messages_and_closes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with EmulatorThread(api_keys={KEY: 8}, limits=LIMITS) as emulator:
        url = emulator.url

        @settings(
            max_examples=int(os.environ.get("SZ_FUZZ_EMULATOR", "25")),
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        )
        @given(frames=st.lists(client_frames, min_size=1, max_size=8))
        def one(frames: list[Any]) -> None:
            code, received = asyncio.run(exchange(url, frames))
            assert code in DOCUMENTED, code
            for text in received:  # every server message is one our client decodes
                try:
                    decode_server_message(text)
                except RemoteProtocolError as exc:  # pragma: no cover - a failure to report
                    raise AssertionError(
                        f"the emulator sent an undecodable message {text!r}: {exc}"
                    ) from None

        with caplog.at_level(logging.ERROR, logger="airflow_provider_systemzero.emulator"):
            one()
        stats = emulator.stats
    assert not set(stats.closes_by_code) - DOCUMENTED, stats.closes_by_code
    assert not [
        r
        for r in caplog.records
        if r.name.startswith("airflow_provider_systemzero.emulator") and r.levelno >= logging.ERROR
    ], caplog.text
