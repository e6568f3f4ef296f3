"""An async-generator source is called once for its trigger's life: whoever stops waiting for its
next value — a stream's feeder given back, a hysteresis timer, a cancelled dormant wait — leaves
the read (and the generator, and what it built up) to the next reader; a failure is counted once.

The generator here builds a log up, as the docs' ``deployment_log`` does: a restart would send
the state back to its first line.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from airflow_provider_systemzero.sources.callable import CallableSource
from airflow_provider_systemzero.triggers.state_source import NO_CHANGE
from airflow_provider_systemzero.triggers.streaming import TriggerStream


class Log:
    """An accumulating log the test advances (``tick``) or breaks (``fail``); counts its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.tick = asyncio.Event()
        self.fail = False

    async def generate(self) -> AsyncIterator[str]:
        self.calls += 1
        log, line = "", 0
        while True:
            log += f"call {self.calls} line {line}\n"
            yield log
            line += 1
            await self.tick.wait()
            self.tick.clear()
            if self.fail:
                self.fail = False
                raise ConnectionError("the feed dropped")


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_reader_cancelled_once_the_value_is_read_leaves_it_to_the_next_reader() -> None:
    log = Log()
    source = CallableSource(log.generate)
    changes = source.changes()
    assert await anext(changes) == "call 1 line 0\n"
    reader = asyncio.ensure_future(anext(changes))  # a stream's feeder waits for the next value
    await _settle()
    assert source._pending is not None
    # the read gets the value, and the stream is given back before the feeder resumes
    source._pending.add_done_callback(lambda _: reader.cancel())
    log.tick.set()
    with pytest.raises(asyncio.CancelledError):
        await reader
    await changes.aclose()
    assert await source.current() == "call 1 line 0\ncall 1 line 1\n"  # the value, not a restart
    assert log.calls == 1
    await source.aclose()


async def test_a_hysteresis_timer_in_a_dormant_wait_leaves_the_generator_alone() -> None:
    log = Log()
    source = CallableSource(log.generate)
    stream = TriggerStream("sz", {}, key_namespace="ns")
    await source.current()
    log.tick.set()
    stream.covered = await source.taken(await source.next_change())
    # a qualifying run needs a little more time (min_true_for): the dormant wait is bounded
    assert await stream.change_within(0.05, source) is NO_CHANGE
    assert await source.current() == "call 1 line 0\ncall 1 line 1\n"
    assert log.calls == 1
    await source.aclose()


async def test_a_read_that_failed_while_nobody_waited_is_one_failure_and_one_restart() -> None:
    log = Log()
    source = CallableSource(log.generate, retry_delay=0.01)
    changes = source.changes()
    assert await anext(changes) == "call 1 line 0\n"
    reader = asyncio.ensure_future(anext(changes))
    await _settle()
    reader.cancel()  # the stream was given back; the read goes on
    with pytest.raises(asyncio.CancelledError):
        await reader
    await changes.aclose()
    log.fail = True
    log.tick.set()  # the feed fails while nobody waits
    await asyncio.wait({source._pending}, timeout=5)
    assert await source.current() == "call 2 line 0\n"  # the failure taken, the function called again
    assert log.calls == 2 and source._failures == 0
    await source.aclose()


async def test_cleanup_cancels_the_read_and_the_generator_ends() -> None:
    log = Log()
    ended: list[Any] = []

    async def generate() -> AsyncIterator[str]:
        try:
            async for value in log.generate():
                yield value
        finally:
            ended.append(True)

    source = CallableSource(generate)
    await source.current()
    waiting = source.next_change()  # a dormant wait on the read
    await _settle()
    await source.aclose()
    assert ended == [True] and source._pending is None
    with pytest.raises(asyncio.CancelledError):
        await waiting
