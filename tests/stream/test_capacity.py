"""StreamCapacity (fair, cancellable, thread-safe) and Backoff (full jitter, server delay floor)."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable

import pytest

from airflow_provider_systemzero.stream import Backoff, StreamCapacity, default_capacity
from tests.helpers.places import building


def _wait_for(predicate: Callable[[], bool], timeout: float) -> bool:
    """Block (in a helper thread) until ``predicate`` holds or ``timeout`` passes."""
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            return False
        time.sleep(0.002)
    return True


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_slot_and_an_offer_on_the_same_loop_need_no_wake_up_through_the_self_pipe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A waiter on the loop that releases the slot (the usual triggerer: one loop) is woken with
    ``call_soon``: ``call_soon_threadsafe`` would write to the loop's self-pipe and read it back."""
    loop = asyncio.get_running_loop()
    threadsafe: list[object] = []
    original = loop.call_soon_threadsafe

    def counting(callback: object, *args: object, **kwargs: object) -> object:
        threadsafe.append(callback)
        return original(callback, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(loop, "call_soon_threadsafe", counting)
    capacity = StreamCapacity(1)
    await capacity.acquire()
    asked = asyncio.Event()
    offer = capacity.offer(asked.set)  # the holder is idle: it offers its slot
    waiting = asyncio.create_task(capacity.acquire())
    async with asyncio.timeout(5):
        await asked.wait()  # the offer was called when the waiter queued
    capacity.withdraw(offer)
    capacity.release()
    async with asyncio.timeout(5):
        await waiting  # and the released slot reached the waiter
    capacity.release()
    assert threadsafe == []


async def test_waiters_get_slots_in_arrival_order() -> None:
    capacity = StreamCapacity(1)
    await capacity.acquire()
    order: list[int] = []

    async def waiter(n: int) -> None:
        await capacity.acquire()
        order.append(n)

    tasks = []
    for n in range(5):
        tasks.append(asyncio.create_task(waiter(n)))
        await _settle()  # queue them in a known order
    assert capacity.waiting == 5 and order == []
    for expected in range(5):
        capacity.release()
        await _settle()
        assert order == list(range(expected + 1))
    capacity.release()
    await asyncio.gather(*tasks)
    assert capacity.in_use == 0 and capacity.max_in_use == 1


async def test_a_newcomer_does_not_overtake_queued_waiters() -> None:
    capacity = StreamCapacity(1)
    await capacity.acquire()
    first = asyncio.create_task(capacity.acquire())
    await _settle()
    capacity.release()  # the slot is granted to `first`, even before it runs
    late = asyncio.create_task(capacity.acquire())
    await _settle()
    assert first.done() and not late.done()
    capacity.release()
    await asyncio.wait_for(late, 1)
    capacity.release()


async def test_cancelling_a_waiter_removes_it_from_the_queue() -> None:
    capacity = StreamCapacity(1)
    await capacity.acquire()
    doomed = asyncio.create_task(capacity.acquire())
    survivor = asyncio.create_task(capacity.acquire())
    await _settle()
    doomed.cancel()
    with pytest.raises(asyncio.CancelledError):
        await doomed
    assert capacity.waiting == 1
    capacity.release()
    await asyncio.wait_for(survivor, 1)
    assert capacity.in_use == 1
    capacity.release()


async def test_a_slot_granted_to_a_cancelled_waiter_is_passed_on() -> None:
    capacity = StreamCapacity(1)
    await capacity.acquire()
    doomed = asyncio.create_task(capacity.acquire())
    survivor = asyncio.create_task(capacity.acquire())
    await _settle()
    capacity.release()  # grants `doomed` …
    doomed.cancel()  # … which is cancelled before it could run
    with pytest.raises(asyncio.CancelledError):
        await doomed
    await asyncio.wait_for(survivor, 1)  # the slot was not lost
    assert capacity.in_use == 1
    capacity.release()
    assert capacity.in_use == 0


async def test_waiters_on_other_threads_and_loops_are_woken() -> None:
    capacity = StreamCapacity(1)
    await capacity.acquire()
    got = threading.Event()

    def other_thread() -> None:
        async def take() -> None:
            await capacity.acquire()
            got.set()
            capacity.release()

        asyncio.run(take())

    thread = threading.Thread(target=other_thread)
    thread.start()
    queued = await asyncio.to_thread(_wait_for, lambda: capacity.waiting == 1, 5)
    assert queued and not got.is_set()
    capacity.release()
    await asyncio.to_thread(thread.join, 5)
    assert got.is_set() and capacity.in_use == 0


async def test_raising_the_limit_lets_waiters_in() -> None:
    capacity = StreamCapacity(1)
    await capacity.acquire()
    waiter = asyncio.create_task(capacity.acquire())
    await _settle()
    assert not waiter.done()
    capacity.set_limit(2)
    await asyncio.wait_for(waiter, 1)
    assert capacity.in_use == 2
    capacity.release()
    capacity.release()


def test_limits_are_validated_and_advertised_limits_only_lower_their_own_gateway() -> None:
    with pytest.raises(ValueError, match="positive integer"):
        StreamCapacity(0)
    capacity = StreamCapacity(4)
    capacity.adopt_advertised(8, "wss://a")
    assert capacity.limit_for("wss://a") == 4
    capacity.adopt_advertised(2, "wss://a")
    assert (capacity.limit_for("wss://a"), capacity.limit_for("wss://b"), capacity.limit) == (2, 4, 4)
    capacity.adopt_advertised(3, "wss://a")  # the gateway's latest word, not the lowest ever seen
    assert capacity.limit_for("wss://a") == 3
    with pytest.raises(RuntimeError, match="without a matching acquire"):
        capacity.release()


def test_the_default_capacity_is_shared_and_sized_from_the_document() -> None:
    assert default_capacity() is default_capacity()
    assert default_capacity().limit == 4


def test_backoff_is_full_jitter_capped_and_never_below_the_server_delay() -> None:
    backoff = Backoff(base=0.5, cap=4.0, rng=random.Random(7))
    for attempt in range(10):
        window = min(4.0, 0.5 * 2**attempt)
        delays = [backoff.delay(attempt) for _ in range(200)]
        assert all(0 <= d <= window for d in delays)
        assert max(delays) > window * 0.8 and min(delays) < window * 0.2  # spread over the whole window
    assert all(backoff.delay(0, 3.0) >= 3.0 for _ in range(100))
    assert backoff.delay(10_000) <= 4.0  # no overflow for huge attempts
    with pytest.raises(ValueError):
        Backoff(base=-1)


async def test_try_acquire_takes_a_slot_only_when_one_is_free() -> None:
    cap = StreamCapacity(2)
    assert cap.try_acquire() and cap.try_acquire()
    assert not cap.try_acquire() and cap.in_use == 2  # full: nothing taken
    waiter = asyncio.ensure_future(cap.acquire())
    await _settle()
    cap.release()
    await _settle()
    assert waiter.done() and cap.in_use == 2  # the freed slot went to the waiter
    cap.release()
    assert cap.waiting == 0 and cap.try_acquire() and cap.in_use == 2


# ---------------------------------------------------------------------- building streams


async def _enter_opening(
    capacity: StreamCapacity, origin: str | None, entered: list[str], name: str, release: asyncio.Event
) -> None:
    async with building(capacity, origin):
        entered.append(name)
        await release.wait()


async def test_at_most_twice_the_cap_of_streams_are_built_at_once_first_come_first_served() -> None:
    capacity = StreamCapacity(2)
    assert capacity.opening_room() == 4
    entered: list[str] = []
    gates = {f"s{i}": asyncio.Event() for i in range(7)}
    tasks = [asyncio.create_task(_enter_opening(capacity, None, entered, n, g)) for n, g in gates.items()]
    await _settle()
    assert entered == ["s0", "s1", "s2", "s3"] and capacity.building == 4  # the rest wait
    assert capacity.waiting_to_build == 3
    gates["s2"].set()  # one is open: its place goes to the oldest caller waiting
    await _settle()
    assert entered == ["s0", "s1", "s2", "s3", "s4"] and capacity.building == 4
    for gate in gates.values():
        gate.set()
    await asyncio.gather(*tasks)
    assert entered == [f"s{i}" for i in range(7)] and capacity.building == 0


async def test_a_newcomer_does_not_build_before_callers_waiting_to() -> None:
    capacity = StreamCapacity(1)
    entered: list[str] = []
    gates = {name: asyncio.Event() for name in ("a", "b", "c", "late")}
    tasks = [
        asyncio.create_task(_enter_opening(capacity, None, entered, n, gates[n])) for n in ("a", "b", "c")
    ]
    await _settle()
    gates["a"].set()  # a's place is granted to c, whose task has not run yet ...
    await asyncio.sleep(0)
    tasks.append(asyncio.create_task(_enter_opening(capacity, None, entered, "late", gates["late"])))
    await _settle()
    assert entered == ["a", "b", "c"]  # ... and the newcomer queues behind it
    for gate in gates.values():
        gate.set()
    await asyncio.gather(*tasks)
    assert entered == ["a", "b", "c", "late"]


async def test_the_places_of_one_gateway_never_hold_up_another() -> None:
    capacity = StreamCapacity(2)
    capacity.adopt_advertised(1, "ws://a")  # a's gateway says 1 stream: 2 places
    entered: list[str] = []
    hold = asyncio.Event()
    tasks = [
        asyncio.create_task(_enter_opening(capacity, "ws://a", entered, f"a{i}", hold)) for i in range(3)
    ]
    await _settle()
    assert entered == ["a0", "a1"]  # a's two places are taken, a2 waits
    other = asyncio.Event()
    b = asyncio.create_task(_enter_opening(capacity, "ws://b", entered, "b0", other))
    await _settle()
    assert entered == ["a0", "a1", "b0"]  # another gateway builds at once
    capacity.adopt_advertised(2, "ws://a")  # it says 2 again: 4 places
    await _settle()
    assert entered == ["a0", "a1", "b0", "a2"]
    hold.set()
    other.set()
    await asyncio.gather(*tasks, b)
    assert capacity.building == 0


async def test_a_caller_cancelled_while_waiting_to_build_leaves_the_queue() -> None:
    capacity = StreamCapacity(1)
    entered: list[str] = []
    hold = asyncio.Event()
    first = [asyncio.create_task(_enter_opening(capacity, None, entered, n, hold)) for n in ("a", "b")]
    waiting = asyncio.create_task(_enter_opening(capacity, None, entered, "gone", hold))
    after = asyncio.create_task(_enter_opening(capacity, None, entered, "next", hold))
    await _settle()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    hold.set()
    await asyncio.gather(*first, after)
    assert entered == ["a", "b", "next"] and capacity.building == capacity.waiting_to_build == 0


async def test_a_place_granted_to_a_cancelled_caller_is_passed_on() -> None:
    capacity = StreamCapacity(1)
    entered: list[str] = []
    hold, rest = asyncio.Event(), asyncio.Event()
    first = [asyncio.create_task(_enter_opening(capacity, None, entered, n, hold)) for n in ("a", "b")]
    granted = asyncio.create_task(_enter_opening(capacity, None, entered, "gone", rest))
    after = asyncio.create_task(_enter_opening(capacity, None, entered, "next", rest))
    await _settle()
    hold.set()  # a and b are open: their places go to "gone" and "next" ...
    await first[0]
    granted.cancel()  # ... and "gone" is cancelled before its task resumes
    with pytest.raises(asyncio.CancelledError):
        await granted
    await _settle()
    assert "gone" not in entered and capacity.building == entered.count("next")
    rest.set()
    await asyncio.gather(first[1], after)
    assert entered == ["a", "b", "next"] and capacity.building == 0


async def test_a_place_is_waited_for_through_its_future_alone_and_given_up_in_any_state() -> None:
    """A caller with no task to spare asks for a place and links to its future: a place held that is
    given up goes to the oldest caller queued; a caller that gives up while queued leaves the queue;
    giving a place up twice changes nothing."""
    capacity = StreamCapacity(1)
    held = [capacity.ask_opening() for _ in range(capacity.opening_room())]
    assert all(place.future.done() for place in held) and capacity.building == 2
    gone, queued = capacity.ask_opening(), capacity.ask_opening()
    woken: list[str] = []
    queued.future.add_done_callback(lambda _: woken.append("queued"))
    assert not gone.future.done() and capacity.waiting_to_build == 2
    capacity.leave_opening(gone)  # it no longer waits: out of the queue, its future cancelled
    assert gone.future.cancelled() and capacity.waiting_to_build == 1 and capacity.building == 2
    capacity.leave_opening(held[0])  # a stream open: its place goes to the next caller queued
    await _settle()
    assert woken == ["queued"] and queued.future.done() and not queued.future.cancelled()
    assert capacity.building == 2 and capacity.waiting_to_build == 0
    capacity.leave_opening(held[0])  # twice: nothing changes
    capacity.leave_opening(gone)
    assert capacity.building == 2
    for place in (held[1], queued):
        capacity.leave_opening(place)
    assert capacity.building == capacity.waiting_to_build == 0


async def test_a_caller_on_another_thread_and_loop_is_let_in() -> None:
    capacity = StreamCapacity(1)
    entered: list[str] = []
    hold = asyncio.Event()
    tasks = [asyncio.create_task(_enter_opening(capacity, None, entered, n, hold)) for n in ("a", "b")]
    await _settle()

    def other_loop() -> None:
        async def build() -> None:
            async with building(capacity):
                entered.append("thread")

        asyncio.run(build())

    thread = threading.Thread(target=other_loop)
    thread.start()
    assert await asyncio.to_thread(_wait_for, lambda: capacity.building == 2 and "thread" not in entered, 5)
    hold.set()
    await asyncio.gather(*tasks)
    await asyncio.to_thread(thread.join, 10)
    assert entered == ["a", "b", "thread"] and capacity.building == 0
