"""Spare connections: upgraded ahead while streams contend for slots, within the process's cap.

Real streams against the real emulator: the process's four slots are taken, a fifth stream waits
(contention), and once slots come back a spare is upgraded with one of them; the next stream
takes it (its ``start`` goes out on the spare, which already read ``hello``), the process never
holds more than four streams, a stream that queues for a slot gets the spare's, and a spare
nobody takes is closed before the gateway's start deadline. Off unless turned on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from airflow_provider_systemzero.emulator import Emulator
from airflow_provider_systemzero.stream import Backoff, DecisionStream, default_capacity
from airflow_provider_systemzero.stream.spares import Spares, spares
from tests.stream.support import QUESTIONS, EmulatorFactory, settings_for


@pytest.fixture
def pool() -> Any:
    """The process's spares, turned on for the test (and off, with every spare closed, after)."""
    pool = spares()
    before = (pool.opened, pool.taken, pool.expired)
    pool.enable(True)
    yield pool, before
    pool.enable(False)


def _stream(emu: Emulator, name: str, backoff: Backoff) -> DecisionStream:
    return DecisionStream(
        settings_for(emu),
        {"model": "MODEL_ID", "questions": QUESTIONS},
        state=f"{name}\n",
        decision_mode="on_change",
        identity=name,
        open_deadline=15,
        backoff=backoff,
    )


async def _until(condition: Callable[[], bool], within: float = 10.0) -> None:
    """Wait for ``condition`` (set by other tasks: slots, spares), at most ``within`` seconds."""
    async with asyncio.timeout(within):
        while not condition():  # noqa: ASYNC110 - the state belongs to the capacity and the pool
            await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def _closing(pool: Spares) -> AsyncIterator[None]:
    try:
        yield
    finally:
        pool.enable(False)
        await pool.aclose()


async def test_a_spare_is_upgraded_under_contention_and_taken_by_the_next_stream(
    make_emulator: EmulatorFactory, fast_backoff: Backoff, pool: Any
) -> None:
    spares_, (opened, taken, _) = pool
    capacity = default_capacity()
    emu = await make_emulator()
    async with _closing(spares_):
        held = [_stream(emu, f"held-{i}", fast_backoff) for i in range(4)]
        for stream in held:
            await stream.__aenter__()
        fifth = asyncio.ensure_future(_stream(emu, "fifth", fast_backoff).__aenter__())
        await _until(lambda: capacity.waiting == 1)  # the fifth waits: streams contend for slots
        assert spares_.opened == opened  # no spare while every slot is taken
        for stream in held[:3]:
            await stream.aclose()
        fifth_stream = await asyncio.wait_for(fifth, 10)
        # two slots held (held-3, fifth): a spare takes a third, one stays free
        await _until(lambda: spares_.opened == opened + 1)
        assert capacity.in_use == 3
        connections = emu.stats.streams_total
        nxt = _stream(emu, "next", fast_backoff)
        async with nxt:
            assert spares_.taken == taken + 1  # the next stream started on the spare ...
            assert emu.stats.streams_total == connections  # ... which was upgraded before it asked
            await nxt.append_text("READY\n")
            decision = await nxt.decide(timeout=10)
            assert decision.state_version == nxt.state_version
        await fifth_stream.aclose()
        await held[3].aclose()
        assert emu.stats.max_streams_open <= 4 and capacity.max_in_use <= 4
    assert capacity.in_use == 0  # closing the spares gave their slots back


async def test_a_stream_that_queues_gets_the_spares_slot(
    make_emulator: EmulatorFactory, fast_backoff: Backoff, pool: Any
) -> None:
    spares_, (opened, _, _) = pool
    capacity = default_capacity()
    emu, other = await make_emulator(), await make_emulator()
    async with _closing(spares_):
        held = [_stream(emu, f"held-{i}", fast_backoff) for i in range(4)]
        for stream in held:
            await stream.__aenter__()
        fifth = asyncio.ensure_future(_stream(emu, "fifth", fast_backoff).__aenter__())
        await _until(lambda: capacity.waiting == 1)
        for stream in held[:3]:
            await stream.aclose()
        fifth_stream = await asyncio.wait_for(fifth, 10)
        await _until(lambda: spares_.opened == opened + 1)
        # three slots held (two streams and the spare): two streams to another gateway need two
        async with _stream(other, "elsewhere-1", fast_backoff), _stream(other, "elsewhere-2", fast_backoff):
            assert capacity.in_use == 4  # the second queued, and the spare gave its slot up
        await fifth_stream.aclose()
        await held[3].aclose()


async def test_an_untaken_spare_closes_before_the_gateways_start_deadline(
    make_emulator: EmulatorFactory, fast_backoff: Backoff, pool: Any
) -> None:
    spares_, (opened, _, expired) = pool
    capacity = default_capacity()
    emu = await make_emulator()  # start_timeout_ms 2000: a spare lives 1 s
    async with _closing(spares_):
        spares_.contended()
        async with _stream(emu, "one", fast_backoff):
            await _until(lambda: spares_.opened == opened + 1)
        await _until(lambda: spares_.expired >= expired + 1, within=5)
        spares_.enable(False)  # contention is over: no new spare
        await _until(lambda: capacity.in_use == 0, within=5)
    assert 1008 not in emu.stats.closes_by_code  # closed by the client (1000), never for start_timeout


async def test_spares_are_off_unless_turned_on(make_emulator: EmulatorFactory, fast_backoff: Backoff) -> None:
    spares_ = spares()
    assert not spares_.enabled
    emu = await make_emulator()
    opened = spares_.opened
    spares_.contended()
    async with _stream(emu, "alone", fast_backoff), _stream(emu, "beside", fast_backoff):
        pass
    assert spares_.opened == opened and default_capacity().in_use == 0
