"""DecisionStreams of one process under a small account ceiling, against the real emulator.

The streams share the process's decision starts for the account (one queue per gateway and key),
paced by a mirror of the account's bucket: the gateway advertises the account's limits in
``hello`` (the emulator does when they are not the published ones), and a process alone never
hears a 429. The starts go to the longest-waiting stream, on its newest state. on_change, a stream
waits for its turn before its connection's ``start`` (which starts a decision) takes a socket.
Another process spending the account is heard through its 429s, which slow this one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Any

import pytest

from airflow_provider_systemzero.emulator import Emulator
from airflow_provider_systemzero.stream import Backoff, DecisionStream, StreamCapacity, StreamSettings
from airflow_provider_systemzero.stream.capacity import OpeningPlace
from airflow_provider_systemzero.stream.starts import decision_starts
from tests.helpers.wire import FAST, decide_once

KEY = "fleet-key-0001"
REQUEST = {"questions": {"ready": {"type": "boolean", "instructions": "Is the job ready?"}}}


class _Recording:
    """A decider that answers ``ready`` and remembers every state it decided, per stream."""

    def __init__(self) -> None:
        self.decided: list[tuple[str, Any, float]] = []

    def decide(self, request: Mapping[str, Any], *, now: float) -> dict[str, Any]:
        self.decided.append((request["prompt_cache_key"], request["state"], now))
        return {"ready": {"decision": "READY" in str(request["state"])}}


def _stream(
    emu: Emulator, i: int, capacity: StreamCapacity, *, mode: str = "on_request", state: str = ""
) -> DecisionStream:
    return DecisionStream(
        StreamSettings(emu.origin, KEY, default_model="sz-test"),
        {**REQUEST, "prompt_cache_key": f"ceiling-{i}"},
        state=state or f"stream {i}\n",
        decision_mode=mode,
        identity=f"tests.ceiling.{i}",
        backoff=Backoff(base=0.02, cap=0.1),
        capacity=capacity,
    )


async def _until(condition: Any, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within} s: {what}")
        await asyncio.sleep(0.01)


def _entering(stack: contextlib.AsyncExitStack, stream: DecisionStream) -> asyncio.Future[DecisionStream]:
    """Enter ``stream`` in the background (entering waits until its connection is open); the stack
    closes it."""
    entering = asyncio.ensure_future(stream.__aenter__())

    async def leave() -> None:
        if entering.done() and not entering.cancelled() and entering.exception() is None:
            await stream.aclose()
        else:
            entering.cancel()
            with contextlib.suppress(BaseException):
                await entering

    stack.push_async_callback(leave)
    return entering


def _emulator(ceiling_per_minute: int, decider: Any, burst: int = 2) -> Emulator:
    """An emulator whose account starts ``burst`` decisions at once and ``ceiling_per_minute`` a
    minute (advertised in ``hello``: they are not the published ones)."""
    limits = FAST.replace(
        account_decision_burst=burst,
        account_decision_ceiling_per_minute=ceiling_per_minute,
        idle_timeout_ms=30_000,
        start_timeout_ms=5_000,
    )
    return Emulator(api_keys={KEY: 32}, limits=limits, decider=decider)


async def test_streams_of_one_process_share_the_ceiling_without_a_429() -> None:
    decider = _Recording()
    async with (
        _emulator(240, decider, burst=2) as emu,
        contextlib.AsyncExitStack() as stack,
    ):
        streams = [await stack.enter_async_context(_stream(emu, i, StreamCapacity(4))) for i in range(4)]
        starts = decision_starts(emu.url, KEY)
        assert (starts.queue.burst, round(starts.queue.ceiling * 60)) == (2, 240)  # from hello
        for round_ in range(3):
            for i, s in enumerate(streams):
                await s.append_text(f"round {round_} line of {i}\n")
            decisions = await asyncio.wait_for(asyncio.gather(*(s.decide() for s in streams)), 60)
            for s, decision in zip(streams, decisions, strict=True):
                assert decision.state_version == s.state_version  # about its newest state
        assert emu.stats.decision_starts_refused == 0 and starts.queue.rate_limited == 0
        assert emu.stats.decisions_billed == 12


async def test_a_start_waiting_its_turn_decides_the_newest_state() -> None:
    decider = _Recording()
    async with (
        _emulator(60, decider) as emu,
        contextlib.AsyncExitStack() as stack,
    ):
        first, *others = [
            await stack.enter_async_context(_stream(emu, i, StreamCapacity(4))) for i in range(4)
        ]
        await first.decide()  # the account's one token
        pending = [asyncio.ensure_future(s.decide()) for s in others]
        await _until(lambda: all(s.waiting_for_turn for s in others), 10, "the others queued")
        for s in others:  # their states change while they wait for their turn
            await s.append_text("READY\n")
        decisions = await asyncio.wait_for(asyncio.gather(*pending), 60)
        for s, decision in zip(others, decisions, strict=True):
            assert decision.state_version == s.state_version
            assert decision.answers["ready"].decision is True
        # no state the streams had already replaced was decided, and nothing was refused
        for cache_key, state, _ in decider.decided:
            if cache_key != "ceiling-0":
                assert state.endswith("READY\n"), f"{cache_key} was decided on a superseded state {state!r}"
        assert len(decider.decided) == 1 + len(others)
        assert emu.stats.decision_starts_refused == 0


async def test_a_stream_waiting_its_turn_asks_again_on_its_next_connection() -> None:
    async with (
        _emulator(60, _Recording()) as emu,
        contextlib.AsyncExitStack() as stack,
    ):
        first, second = [
            await stack.enter_async_context(_stream(emu, i, StreamCapacity(4))) for i in range(2)
        ]
        await first.decide()
        waiting = asyncio.ensure_future(second.decide())
        await _until(lambda: second.waiting_for_turn, 10, "the second stream queued")
        await emu.restart(retry_after_ms=50)  # its connection ends while it waits for its turn
        decision = await asyncio.wait_for(waiting, 30)
        assert decision.state_version == second.state_version
        assert len(second.reconnects) >= 1 and emu.stats.decision_starts_refused == 0


async def test_on_change_streams_wait_for_their_turn_before_they_connect() -> None:
    """Twelve on_change streams opened at once (as leased triggers reopen on a change): each
    connection's ``start`` starts a decision, so each waits for its turn before it takes a socket.
    No start is refused, none is closed 1013, and a socket is held only to start and decide."""
    decider = _Recording()
    async with _emulator(240, decider, burst=2) as emu:
        capacity = StreamCapacity(4)
        starts_at = time.monotonic()

        async def open_and_decide(i: int) -> Any:
            async with _stream(emu, i, capacity, mode="on_change") as s:
                return await s.decide()

        decisions = await asyncio.wait_for(asyncio.gather(*(open_and_decide(i) for i in range(12))), 30)
        assert all(d.state_version == 1 for d in decisions)
        stats = emu.stats
        assert stats.decision_starts_refused == 0 and stats.closes_by_code.get(1013, 0) == 0
        assert decision_starts(emu.url, KEY).queue.rate_limited == 0
        # two at once, then one every quarter of a second
        assert time.monotonic() - starts_at >= (12 - 2) * 0.25 * 0.9


async def test_a_turn_that_finds_every_socket_held_waits_first_in_line_for_one() -> None:
    """on_change: a stream's turn comes while every socket of ``max_streams_per_process`` is held.
    It gives the turn back and waits for a socket first in line: a decide asked meanwhile by
    another stream of the process goes after it. Once a socket is free its ``start`` goes out, and
    the gateway refuses nothing."""
    decider = _Recording()
    async with _emulator(20, decider, burst=2) as emu, contextlib.AsyncExitStack() as stack:
        capacity = StreamCapacity(1)
        holder = await stack.enter_async_context(_stream(emu, 0, capacity, mode="on_change"))
        await asyncio.wait_for(holder.decide(), 10)  # it holds the one socket
        starts = decision_starts(emu.url, KEY)
        waiter = _stream(emu, 1, capacity, mode="on_change")
        entering = _entering(stack, waiter)
        await _until(lambda: capacity.waiting == 1, 10, "the stream whose turn came waits for a socket")
        assert waiter.waiting_for_turn and not waiter.connected
        # another stream (sockets of its own) asks for a decision while the first waits for a socket
        other = await stack.enter_async_context(_stream(emu, 2, StreamCapacity(4)))
        asked = asyncio.ensure_future(other.decide())
        await _until(lambda: other.waiting_for_turn, 10, "the other stream's decide queued")
        await holder.release()  # the socket is free
        await asyncio.wait_for(entering, 10)
        decision = await asyncio.wait_for(waiter.decide(), 10)
        assert decision.state_version == 1
        await asyncio.wait_for(asked, 10)
        assert [key for key, _, _ in decider.decided] == ["ceiling-0", "ceiling-1", "ceiling-2"]
        stats = emu.stats
        assert stats.decision_starts_refused == 0 and stats.closes_by_code.get(1013, 0) == 0
        assert starts.queue.rate_limited == 0


async def test_a_stream_waiting_for_its_turn_gives_its_socket_to_one_whose_turn_came(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """on_change: a stream had its decision and holds the one socket; its next change waits for
    its turn behind a stream that waits without a socket. When that stream's turn comes, it finds
    no socket and waits first in line; the holder, still waiting for its own turn, gives its
    connection back, so the first in line starts — instead of both waiting for the other until
    the gateway's idle timeout closes the holder. The holder's newest state is decided on its own
    turn, on a new connection."""
    caplog.set_level(logging.INFO, logger="airflow_provider_systemzero.stream.starts")
    decider = _Recording()
    async with _emulator(20, decider, burst=2) as emu, contextlib.AsyncExitStack() as stack:
        capacity = StreamCapacity(1)
        holder = await stack.enter_async_context(_stream(emu, 0, capacity, mode="on_change"))
        await asyncio.wait_for(holder.decide(), 10)  # it holds the socket
        waiter = _stream(emu, 1, capacity, mode="on_change")
        entering = _entering(stack, waiter)  # the mirror keeps half a token: its turn is 1.5 s away
        await _until(lambda: waiter.waiting_for_turn, 10, "the second stream waits for its turn")
        assert capacity.waiting == 0  # for its turn, not for a socket
        await holder.append_text("more\n")  # its next start waits for its turn too, behind the other
        await _until(lambda: holder.waiting_for_turn, 10, "the holder's change waits for its turn")
        assert holder.connected
        await asyncio.wait_for(entering, 10)  # the gateway's idle timeout is 30 s
        decision = await asyncio.wait_for(waiter.decide(), 10)
        assert decision.state_version == 1
        assert any("the connection is given back" in r.message for r in caplog.records)
        await waiter.release()  # the socket is free for the holder's turn
        newest = await asyncio.wait_for(holder.decide(), 10)
        assert newest.state_version == holder.state_version and holder.state.endswith("more\n")
        stats = emu.stats
        assert stats.decision_starts_refused == 0 and stats.closes_by_code.get(1013, 0) == 0
        assert [key for key, _, _ in decider.decided] == ["ceiling-0", "ceiling-1", "ceiling-0"]
        assert capacity.offered == 0  # no offer of a socket is left behind


async def test_one_socket_is_given_back_for_one_stream_waiting_for_a_socket() -> None:
    """on_change: two streams hold both sockets and their next changes wait for their turns behind
    a stream whose turn came and that waits for a socket. One of them gives its connection back
    for it; the other keeps its own (its next start needs no new connection)."""
    decider = _Recording()
    async with _emulator(20, decider, burst=2) as emu, contextlib.AsyncExitStack() as stack:
        capacity = StreamCapacity(2)
        holders = [
            await stack.enter_async_context(_stream(emu, i, capacity, mode="on_change")) for i in (0, 1)
        ]
        for holder in holders:
            await asyncio.wait_for(holder.decide(), 10)  # the account's burst: the next token in 3 s
        waiter = _stream(emu, 2, capacity, mode="on_change")
        entering = _entering(stack, waiter)
        await _until(lambda: capacity.waiting == 1, 10, "the stream whose turn came waits for a socket")
        await asyncio.gather(*(holder.append_text("more\n") for holder in holders))
        await asyncio.wait_for(entering, 10)
        assert [holder.connected for holder in holders].count(True) == 1
        decision = await asyncio.wait_for(waiter.decide(), 10)
        assert decision.state_version == 1
        assert emu.stats.decision_starts_refused == 0


async def _spend(emu: Emulator, state: str) -> dict[str, Any]:
    """Another process's decide on the same account (a plain websockets client)."""
    return await decide_once(emu, KEY, state, cache_key=f"other-{state.strip()}")


async def test_a_429_from_another_process_slows_this_one() -> None:
    """Another process took the account's token: this one's start is refused once, the process
    waits out the Retry-After (its mirror holds no more than the 429 said), and its decision
    still comes."""
    async with _emulator(60, _Recording(), burst=1) as emu, contextlib.AsyncExitStack() as stack:
        (mine,) = [await stack.enter_async_context(_stream(emu, 0, StreamCapacity(4)))]
        starts = decision_starts(emu.url, KEY)
        assert (await _spend(emu, "theirs\n"))["type"] == "decision"  # the one token of the minute
        refused_at = time.monotonic()
        decision = await asyncio.wait_for(mine.decide(), 30)
        waited = time.monotonic() - refused_at
        assert decision.state_version == mine.state_version
        assert emu.stats.decision_starts_refused == 1 and starts.queue.rate_limited == 1
        assert waited >= 0.9  # the Retry-After: the token a second after the other process's


async def test_an_on_change_stream_refused_gives_its_connection_back_before_the_gateway_retries(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """on_change, the gateway retries a 429'd dispatch by itself and closes the stream with 1013 at
    the third refusal in a row: the stream does not wait for that, it gives the connection back
    (close 1000) and opens again on its turn, so a second process's spending never closes it."""
    caplog.set_level(logging.INFO, logger="airflow_provider_systemzero.stream.starts")
    async with _emulator(60, _Recording()) as emu:
        async with _stream(emu, 0, StreamCapacity(4), mode="on_change", state="mine\n") as mine:
            await asyncio.wait_for(mine.decide(), 10)  # the account's token of this second
            bucket = emu.backend.account_bucket(KEY)  # when the next token is there
            assert bucket is not None
            await _until(lambda: bucket.tokens(time.monotonic()) >= 1, 5, "the account's next token")
            assert (await _spend(emu, "theirs\n"))["type"] == "decision"  # another process takes it
            await mine.append_text("more\n")  # its mirror had that token: refused
            await _until(lambda: emu.stats.decision_starts_refused >= 1, 10, "the 429")
            decision = await asyncio.wait_for(mine.decide(), 30)
            assert mine.state.endswith("more\n") and decision.answers["ready"].decision is False
        stats = emu.stats
        assert stats.decision_starts_refused >= 1 and stats.closes_by_code.get(1013, 0) == 0
        assert any(
            "the connection is given back before the gateway retries it" in r.message for r in caplog.records
        )
        # (it reconnected to decide again, unless the gateway's retry came before its close)


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
        self.places = StreamCapacity(4)  # the stream is open already: a place is free at once

    async def resolve_settings(self) -> None:
        return None

    def ask_opening(self) -> OpeningPlace:
        return self.places.ask_opening()

    def leave_opening(self, place: OpeningPlace) -> None:
        self.places.leave_opening(place)

    def build(self, state: Any, **kwargs: Any) -> DecisionStream:
        return self.stream

    async def enter(self, stream: DecisionStream) -> None:
        return None

    async def close(self, stream: DecisionStream, *, grace: float = 5.0) -> None:
        return None


async def test_a_trigger_decision_that_waited_its_turn_on_the_newest_state_is_current() -> None:
    from airflow_provider_systemzero.decisions.conditions import DecisionCondition
    from airflow_provider_systemzero.decisions.source_watch import SourceWatch
    from airflow_provider_systemzero.decisions.watch import VerdictRules
    from airflow_provider_systemzero.triggers.driver import WatchDriver

    decider = _Recording()
    async with _emulator(60, decider, burst=1) as emu, contextlib.AsyncExitStack() as stack:
        other, stream = [
            await stack.enter_async_context(_stream(emu, i, StreamCapacity(4))) for i in range(2)
        ]
        await other.decide()  # the account's one token: the next start waits a second for its turn
        source = _PushedSource(stream.state)
        watch = SourceWatch(
            VerdictRules(DecisionCondition("ready", True), reviews=False),
            decision_mode="on_request",
            lease=False,
        )
        driver = WatchDriver(watch, source, _OpenStream(stream))  # type: ignore[arg-type]
        verdict = asyncio.ensure_future(driver.next_verdict())
        try:
            await _until(lambda: stream.waiting_for_turn, 10, "the trigger's start queued")
            source.set(stream.state + "READY\n")  # the source changes while the start waits its turn
            decision = (await asyncio.wait_for(verdict, 30)).decision
        finally:
            verdict.cancel()
            await driver.aclose()
        assert decision.answers["ready"].decision is True  # about the newest state, taken as current
        assert emu.stats.decisions_replayed == 0  # not asked again as if it were outdated
        assert emu.stats.decision_starts_refused == 0
