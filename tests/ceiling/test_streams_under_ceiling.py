"""Several DecisionStreams of one process (the document's four) under a small account ceiling, against the real emulator.

The streams share the process's decision starts for the account (one queue per gateway and key):
each 429 is heard by that one queue and waited out once by all of them, the starts go to the
longest-waiting stream on its newest state, and every stream gets its decisions.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from typing import Any

from airflow_provider_systemzero.emulator import Emulator
from airflow_provider_systemzero.stream import Backoff, DecisionStream, StreamCapacity, StreamSettings
from airflow_provider_systemzero.stream.starts import decision_starts
from tests.emulator.wire import FAST

KEY = "fleet-key-0001"
REQUEST = {"questions": {"ready": {"type": "boolean", "instructions": "Is the job ready?"}}}


class _Recording:
    """A decider that answers ``ready`` and remembers every state it decided, per stream."""

    def __init__(self) -> None:
        self.decided: list[tuple[str, Any, float]] = []

    def decide(self, request: Mapping[str, Any], *, now: float) -> dict[str, Any]:
        self.decided.append((request["prompt_cache_key"], request["state"], now))
        return {"ready": {"decision": "READY" in str(request["state"])}}


def _streams(emu: Emulator, n: int, capacity: StreamCapacity) -> list[DecisionStream]:
    settings = StreamSettings(emu.origin, KEY, default_model="sz-test")
    return [
        DecisionStream(
            settings,
            {**REQUEST, "prompt_cache_key": f"ceiling-{i}"},
            state=f"stream {i}\n",
            decision_mode="on_request",
            identity=f"tests.ceiling.{i}",
            backoff=Backoff(base=0.02, cap=0.1),
            capacity=capacity,
        )
        for i in range(n)
    ]


async def _until(condition: Any, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within} s: {what}")
        await asyncio.sleep(0.01)


def _emulator(ceiling_per_minute: int, decider: _Recording) -> Emulator:
    """An emulator whose account starts one decision at once and ``ceiling_per_minute`` a minute."""
    limits = FAST.replace(
        account_decision_burst=1,
        account_decision_ceiling_per_minute=ceiling_per_minute,
        idle_timeout_ms=30_000,
    )
    return Emulator(api_keys={KEY: 16}, limits=limits, decider=decider)


async def test_one_retry_after_per_process_and_every_stream_decided() -> None:
    decider = _Recording()
    async with (
        _emulator(240, decider) as emu,
        contextlib.AsyncExitStack() as stack,
    ):
        streams = [await stack.enter_async_context(s) for s in _streams(emu, 4, StreamCapacity(4))]
        starts = decision_starts(emu.url, KEY)
        for round_ in range(3):
            for i, stream in enumerate(streams):
                await stream.append_text(f"round {round_} line of {i}\n")
            decisions = await asyncio.wait_for(asyncio.gather(*(s.decide() for s in streams)), 60)
            for stream, decision in zip(streams, decisions, strict=True):
                assert decision.state_version == stream.state_version  # about its newest state
            if round_ == 0:
                # all four started at once, before anyone heard a 429: the burst let one through
                wave = emu.stats.decision_starts_refused
                assert 1 <= wave <= 3
        refused = emu.stats.decision_starts_refused
        # every 429 reached the one queue of this process, which waited it out for all streams
        assert starts.queue.rate_limited == refused
        # after the first wave, the process started one decision per Retry-After window: a few
        # 429s while its pace settles, never one per waiting stream and round (each stream
        # retrying after its own Retry-After would be refused again and again)
        assert refused - wave <= 4, f"{refused - wave} refusals after the first wave"
        assert emu.stats.decisions_billed == 12


async def test_a_start_waiting_its_turn_decides_the_newest_state() -> None:
    decider = _Recording()
    async with (
        _emulator(60, decider) as emu,
        contextlib.AsyncExitStack() as stack,
    ):
        first, *others = [await stack.enter_async_context(s) for s in _streams(emu, 4, StreamCapacity(4))]
        starts = decision_starts(emu.url, KEY)
        await first.decide()  # the account's one token
        await first.append_text("more\n")
        waiting_first = asyncio.ensure_future(first.decide())  # refused: the process is now limited
        await _until(lambda: starts.queue.rate_limited == 1, 10, "the first 429")
        pending = [asyncio.ensure_future(s.decide()) for s in others]
        await _until(lambda: all(starts.queue.is_waiting(s) for s in others), 10, "the others queued")
        for stream in others:  # their states change while they wait for their turn
            await stream.append_text("READY\n")
        decisions = await asyncio.wait_for(asyncio.gather(waiting_first, *pending), 60)
        for stream, decision in zip([first, *others], decisions, strict=True):
            assert decision.state_version == stream.state_version
        for _, answer in zip(others, decisions[1:], strict=True):
            assert answer.answers["ready"].decision is True
        # no state the streams had already replaced was decided
        for cache_key, state, _ in decider.decided:
            if cache_key != "ceiling-0":
                assert state.endswith("READY\n"), f"{cache_key} was decided on a superseded state {state!r}"
        assert len(decider.decided) == 2 + len(others)


async def test_a_stream_waiting_its_turn_asks_again_on_its_next_connection() -> None:
    async with (
        _emulator(60, _Recording()) as emu,
        contextlib.AsyncExitStack() as stack,
    ):
        first, second = [await stack.enter_async_context(s) for s in _streams(emu, 2, StreamCapacity(4))]
        starts = decision_starts(emu.url, KEY)
        await first.decide()
        await first.append_text("more\n")
        refused = asyncio.ensure_future(first.decide())
        await _until(lambda: starts.queue.rate_limited == 1, 10, "the first 429")
        waiting = asyncio.ensure_future(second.decide())
        await _until(lambda: starts.queue.is_waiting(second), 10, "the second stream queued")
        await emu.restart(retry_after_ms=50)  # both connections end while they wait for their turn
        decisions = await asyncio.wait_for(asyncio.gather(refused, waiting), 30)
        assert [d.state_version for d in decisions] == [first.state_version, second.state_version]
        assert len(second.reconnects) >= 1


class _PushedSource:
    """A state source the test changes (the driver reads it through ``changed()`` and ``read()``)."""

    def __init__(self, first: str) -> None:
        self.state = first
        self.waiter: asyncio.Future[None] | None = None

    def set(self, state: str) -> None:
        self.state = state
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def read(self) -> str:
        return self.state

    def changed(self) -> asyncio.Future[None]:
        self.waiter = asyncio.get_running_loop().create_future()
        return self.waiter

    def withheld(self, state: Any) -> bool:
        return False


class _OpenStream:
    """The trigger's streams, as its driver sees them: the one stream the test opened."""

    def __init__(self, stream: DecisionStream) -> None:
        self.stream = stream

    async def resolve_settings(self) -> None:
        return None

    def build(self, state: Any, **kwargs: Any) -> DecisionStream:
        return self.stream

    async def enter(self, stream: DecisionStream) -> None:
        return None

    async def close(self, stream: DecisionStream, *, grace: float = 5.0) -> None:
        return None


async def test_a_trigger_decision_that_waited_its_turn_on_the_newest_state_is_current() -> None:
    from airflow_provider_systemzero.decisions.conditions import DecisionCondition
    from airflow_provider_systemzero.decisions.source_watch import SourceWatch
    from airflow_provider_systemzero.decisions.watch import DecisionWatch
    from airflow_provider_systemzero.triggers.driver import WatchDriver

    decider = _Recording()
    async with _emulator(60, decider) as emu, contextlib.AsyncExitStack() as stack:
        other, stream = [await stack.enter_async_context(s) for s in _streams(emu, 2, StreamCapacity(4))]
        starts = decision_starts(emu.url, KEY)
        await other.decide()  # the account's one token
        await other.append_text("more\n")
        refused = asyncio.ensure_future(other.decide())
        await _until(lambda: starts.queue.rate_limited == 1, 10, "the first 429")
        source = _PushedSource(stream.state)
        watch = SourceWatch(
            DecisionWatch(DecisionCondition("ready", True), reviews=False),
            decision_mode="on_request",
            lease=False,
        )
        driver = WatchDriver(watch, source, _OpenStream(stream))  # type: ignore[arg-type]
        verdict = asyncio.ensure_future(driver.next_verdict())
        try:
            await _until(lambda: starts.queue.is_waiting(stream), 10, "the trigger's start queued")
            source.set(stream.state + "READY\n")  # the source changes while the start waits its turn
            decision = (await asyncio.wait_for(verdict, 30)).decision
        finally:
            verdict.cancel()
            await driver.aclose()
        await refused
        assert decision.answers["ready"].decision is True  # about the newest state, taken as current
        assert emu.stats.decisions_replayed == 0  # not asked again as if it were outdated
