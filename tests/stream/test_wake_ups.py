"""Every wait of a stream ends on what it waits for, at once, and on nothing else.

The stream has no poll: each wait is woken by the event it waits for. These tests hold the waits a
caller can see to that, through the stream's public API against the emulator: the reconnect loop
sleeping out a long delay or waiting for work, a ``decide()`` retry sleeping out the gateway's
delay, the consumer of ``decisions()``, and ``release()``.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from airflow_provider_systemzero.stream import Backoff, StreamClosed
from tests.helpers import until
from tests.helpers.stream import EmulatorFactory, make_stream

#: How soon a woken wait must have ended (seconds): far below every delay the tests set up.
PROMPTLY = 3.0


async def test_closing_ends_the_wait_for_a_long_reconnect_delay_at_once(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    emu = await make_emulator()
    stream = make_stream(emu, fast_backoff, identity="wake-long-delay")
    async with stream:
        await stream.decide(timeout=10)
        await emu.restart(retry_after_ms=30_000)  # come back in 30 s
        await until(lambda: not stream.connected, 10, what="the connection to end")
        await stream.append_text("more\n")  # work: the stream waits out the 30 s to reconnect
        await asyncio.sleep(0.2)
        assert not stream.connected and not stream.reconnects
        started = time.monotonic()
    assert time.monotonic() - started < PROMPTLY  # the close woke the wait
    assert not stream.reconnects


async def test_a_stream_waiting_for_work_reconnects_the_moment_work_comes(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    emu = await make_emulator()
    async with make_stream(emu, fast_backoff, identity="wake-on-work") as stream:
        await stream.decide(timeout=10)
        await emu.restart(retry_after_ms=0)
        await until(lambda: stream.dormant, 10, what="the stream to wait for work")
        await asyncio.sleep(0.3)
        assert stream.dormant and not stream.reconnects  # nothing to do: it stays disconnected
        started = time.monotonic()
        await stream.append_text("more\n")  # a change needs a connection
        await until(lambda: stream.connected and stream.in_sync, PROMPTLY, what="the reconnect")
        assert time.monotonic() - started < PROMPTLY
        await emu.restart(retry_after_ms=0)
        await until(lambda: stream.dormant, 10, what="the stream to wait for work again")
        await stream.decide(timeout=10)  # so does a decision asked for
        await emu.restart(retry_after_ms=0)
        await until(lambda: stream.dormant, 10, what="the stream to wait for work once more")
        await stream.wait_in_sync(timeout=PROMPTLY)  # and a caller waiting to be in sync
        assert stream.connected and [r.reason for r in stream.reconnects] == ["goodbye:shutdown"] * 3


async def test_closing_ends_a_decide_sleeping_out_the_gateways_delay_at_once(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    emu = await make_emulator()
    emu.faults.fail_decides(1, status=503, code="overloaded", retry_after_ms=30_000)
    stream = make_stream(emu, fast_backoff, identity="wake-decide-retry")
    async with stream:
        deciding = asyncio.ensure_future(stream.decide())
        await emu.wait_for(lambda e: e.stats.decide_failures.get(503, 0) == 1, timeout=10)
        await asyncio.sleep(0.2)
        assert not deciding.done()  # it sleeps out the 30 s before asking again
        started = time.monotonic()
    with pytest.raises(StreamClosed):
        await asyncio.wait_for(deciding, PROMPTLY)
    assert time.monotonic() - started < PROMPTLY


async def test_the_consumer_of_decisions_wakes_for_a_decision_and_for_the_close(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    emu = await make_emulator()
    stream = make_stream(emu, fast_backoff, identity="wake-consumer", mode="on_change")
    async with stream:
        decisions = stream.decisions()
        first = await asyncio.wait_for(anext(decisions), 10)
        waiting = asyncio.ensure_future(anext(decisions))
        await asyncio.sleep(0.2)
        assert not waiting.done()  # nothing new: the consumer waits
        await stream.append_text("Job is ready.\n")
        second = await asyncio.wait_for(waiting, PROMPTLY)  # woken by the decision
        assert second.state_version == first.state_version + 1
        waiting = asyncio.ensure_future(anext(decisions))
        await asyncio.sleep(0.2)
        assert not waiting.done()
    with pytest.raises(StopAsyncIteration):  # woken by the close: the iteration ends
        await asyncio.wait_for(waiting, PROMPTLY)


async def test_release_returns_once_the_connection_is_given_back(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    emu = await make_emulator()
    async with make_stream(emu, fast_backoff, identity="wake-release") as stream:
        await stream.decide(timeout=10)
        await asyncio.wait_for(stream.release(), PROMPTLY)
        assert not stream.connected
        await emu.wait_for(lambda e: e.stats.streams_open == 0, timeout=PROMPTLY)
        assert (await stream.decide(timeout=10)).state_version == 1  # its next work reconnects
        assert [r.reason for r in stream.reconnects] == ["released"]
