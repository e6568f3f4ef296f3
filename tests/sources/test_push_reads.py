"""An async-generator source is called once for its trigger's life: a reader that stops waiting
on ``changed()`` — a stream given up, the trigger's driver stopped, a new wait — never cancels the
author's generator; the read under way, and the generator, and what it built up, are left to the
next ``read()``; a failure is counted once. Only the source's ``aclose()`` (the trigger's cleanup)
ends the generator.

The generator here builds a log up, as the docs' ``deployment_log`` does: a restart would send
the state back to its first line.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from airflow_provider_systemzero.sources.callable import CallableSource


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


async def test_a_reader_cancelled_once_the_value_is_read_leaves_it_to_the_next_read() -> None:
    log = Log()
    source = CallableSource(log.generate)
    assert await source.read() == "call 1 line 0\n"

    async def wait_for_the_next_value() -> None:  # as the trigger's driver does
        await source.changed()

    reader = asyncio.ensure_future(wait_for_the_next_value())
    await _settle()
    assert source.reading_ahead is not None
    # the read gets the value, and the reader is stopped before it resumes
    source.reading_ahead.add_done_callback(lambda _: reader.cancel())
    log.tick.set()
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert await source.read() == "call 1 line 0\ncall 1 line 1\n"  # the value, not a restart
    assert log.calls == 1
    await source.aclose()


async def test_a_reader_that_stops_waiting_never_cancels_the_generator() -> None:
    """What a hysteresis timer or a stream given up did to a dormant wait before: the wait on
    ``changed()`` ends early, again and again; the generator goes on where it was."""
    log = Log()
    source = CallableSource(log.generate)
    assert await source.read() == "call 1 line 0\n"
    for _ in range(3):
        waiting = source.changed()
        await _settle()
        waiting.cancel()
        await _settle()
    pending = source.reading_ahead
    assert pending is not None and not pending.done()  # the read of the next value goes on
    log.tick.set()
    await asyncio.wait_for(source.changed(), 5)
    assert await source.read() == "call 1 line 0\ncall 1 line 1\n"
    assert log.calls == 1
    await source.aclose()


async def test_a_read_that_failed_while_nobody_waited_is_one_failure_and_one_restart() -> None:
    log = Log()
    source = CallableSource(log.generate, retry_delay=0.01)
    assert await source.read() == "call 1 line 0\n"
    waiting = source.changed()
    await _settle()
    waiting.cancel()  # the reader stopped waiting; the read goes on
    log.fail = True
    log.tick.set()  # the feed fails while nobody waits
    await asyncio.wait({source.reading_ahead}, timeout=5)
    assert await source.read() == "call 2 line 0\n"  # the failure taken, the function called again
    assert log.calls == 2 and source.failures == 0
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
    await source.read()
    waiting = source.changed()  # the trigger waits on the read
    await _settle()
    await source.aclose()
    assert ended == [True] and source.reading_ahead is None
    await asyncio.wait_for(waiting, 5)  # the wait does not outlive the source
