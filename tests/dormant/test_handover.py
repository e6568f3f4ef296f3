"""The stream slot is handed over on events, never by polling: a waiter asks an idle holder at
once, and gets the freed slot within a loop iteration of its release (pure, no network)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from airflow_provider_systemzero.stream import StreamCapacity
from airflow_provider_systemzero.decisions.source_watch import Currency
from airflow_provider_systemzero.triggers.lease import StreamLease


def _live_timers() -> list[asyncio.TimerHandle]:
    loop = asyncio.get_running_loop()
    return [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]


class _Stream:
    """What a lease reads of a stream: its state, its capacity and whether it is busy."""

    def __init__(self, capacity: StreamCapacity, state: Any = "s1") -> None:
        self.capacity = capacity
        self.state = state
        self.connected = True
        self.dormant = False
        self.work = False

    def has_work(self) -> bool:
        return self.work


async def test_a_queued_waiter_asks_the_idle_holder_and_gets_the_slot_without_polling(
    caplog: pytest.LogCaptureFixture,
) -> None:
    capacity = StreamCapacity(1)
    await capacity.acquire()
    asked = asyncio.Event()
    offer = capacity.offer(asked.set)
    assert capacity.offered == 1 and not asked.is_set()  # nobody waits: the holder keeps its slot
    caplog.set_level(logging.INFO, logger="airflow_provider_systemzero.stream.capacity")
    waiter = asyncio.ensure_future(capacity.acquire())
    async with asyncio.timeout(5):
        await asked.wait()  # the holder was asked because a waiter queued
    assert _live_timers() == []  # nothing polls: no timer was ever scheduled
    capacity.release()  # the holder gives its slot back ...
    assert capacity.in_use == 1 and capacity.waiting == 0  # ... and the waiter has it at once
    capacity.withdraw(offer)
    await asyncio.sleep(0)  # the waiter's wake-up runs in the next iteration
    await asyncio.sleep(0)  # and its task resumes in the one after
    assert waiter.done() and waiter.exception() is None
    waits = [r for r in caplog.records if "waiting for a stream slot" in r.getMessage()]
    assert len(waits) == 1, waits  # said once, not every tick
    capacity.release()


async def test_one_idle_holder_is_asked_per_waiter() -> None:
    capacity = StreamCapacity(2)
    await capacity.acquire()
    await capacity.acquire()
    asked: list[str] = []
    offers = [capacity.offer(lambda n=n: asked.append(n)) for n in ("a", "b")]
    waiter = asyncio.ensure_future(capacity.acquire())
    for _ in range(3):
        await asyncio.sleep(0)
    assert asked == ["a"]  # the oldest idle holder, and only one of them
    capacity.withdraw(offers[0])  # "a" found work after all: the next idle holder is asked
    for _ in range(3):
        await asyncio.sleep(0)
    assert asked == ["a", "b"]
    capacity.release()
    capacity.withdraw(offers[1])
    await waiter
    capacity.release()
    capacity.release()
    assert capacity.in_use == 0 and capacity.offered == 0


async def test_the_lease_gives_a_quiet_stream_back_when_another_waits_once_its_decision_was_evaluated() -> (
    None
):
    capacity = StreamCapacity(1)
    await capacity.acquire()
    stream = _Stream(capacity)
    lease = StreamLease(True, 3600.0)
    currency = Currency(30.0, deciding=True)
    quiet = lease.watch(currency)
    lease.arm(stream)  # a decision came back; the watch has not evaluated it yet
    assert lease.covered == "s1"
    waiter = asyncio.ensure_future(capacity.acquire())
    for _ in range(3):
        await asyncio.sleep(0)
    assert not quiet.done()  # that decision may end the wait: the stream is not given back under it
    currency.evaluated()  # it did not end the wait
    assert quiet.done() and quiet.result() == "another stream waits for a slot"
    # the only timer is the lease's own quiet-time countdown (an hour here): nothing polls
    assert [h.when() - asyncio.get_running_loop().time() > 3000 for h in _live_timers()] == [True]
    capacity.release()
    lease.disarm()
    assert _live_timers() == [] and capacity.offered == 0
    await waiter
    capacity.release()


async def test_a_busy_stream_keeps_its_slot_and_lets_the_next_idle_one_go() -> None:
    capacity = StreamCapacity(2)
    await capacity.acquire()
    await capacity.acquire()
    busy, idle = _Stream(capacity, "b"), _Stream(capacity, "i")
    busy.work = True  # a change is on its way to the gateway
    leases = [StreamLease(True, 3600.0), StreamLease(True, 3600.0)]
    quiets = []
    for lease, stream in zip(leases, (busy, idle), strict=True):
        currency = Currency(30.0, deciding=True)
        quiets.append(lease.watch(currency))
        lease.arm(stream)
        currency.evaluated()
    waiter = asyncio.ensure_future(capacity.acquire())
    for _ in range(4):
        await asyncio.sleep(0)
    assert not quiets[0].done() and quiets[1].done()
    capacity.release()
    for lease in leases:
        lease.disarm()
    await waiter
    capacity.release()
    capacity.release()
