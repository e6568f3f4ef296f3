"""StreamCapacity (fair, cancellable, thread-safe) and Backoff (full jitter, server delay floor)."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable

import pytest

from airflow_provider_systemzero.stream import Backoff, StreamCapacity, default_capacity


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
