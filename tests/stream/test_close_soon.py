"""``close_soon()`` begins a stream's close at once: the connection closes and its slot goes back
before ``aclose()`` is awaited (a trigger's event goes out first, the close runs meanwhile)."""

from __future__ import annotations

import asyncio

import pytest

from airflow_provider_systemzero.stream import Backoff, DecisionStream
from airflow_provider_systemzero.stream.capacity import StreamCapacity
from airflow_provider_systemzero.stream.exceptions import StreamClosed
from tests import helpers
from tests.helpers.stream import QUESTIONS, EmulatorFactory, settings_for


async def test_close_soon_closes_the_connection_before_aclose_is_awaited(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    emu = await make_emulator()
    capacity = StreamCapacity(4)
    stream = DecisionStream(
        settings_for(emu),
        {"model": "MODEL_ID", "questions": QUESTIONS},
        state="waiting\n",
        identity="close-soon",
        open_deadline=15,
        backoff=fast_backoff,
        capacity=capacity,
    )
    await stream.__aenter__()
    assert stream.connected and capacity.in_use == 1
    stream.close_soon()
    await helpers.until(
        lambda: capacity.in_use == 0, 5
    )  # closed, and the slot given back, by the stream itself
    assert not stream.connected
    async with asyncio.timeout(10):
        await stream.aclose()
    with pytest.raises(StreamClosed):
        await stream.append_text("more\n")
