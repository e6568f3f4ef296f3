"""Name resolution on the resolver's own threads: shared per name, bounded in number, abandoned
by a caller that gives up, and never a thread for a numeric address. ``socket.getaddrinfo`` is
replaced here by one that blocks until the test lets it answer (the resolver cannot tell it from
a slow DNS server); ``tests/hostile/test_dead_resolver.py`` runs the real one against a DNS
server that never answers."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_provider_systemzero.stream import resolver
from tests.helpers import until


class SlowDNS:
    """``getaddrinfo`` that answers a name only once :meth:`answer` is called; counts the calls."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.running = 0
        self.most_at_once = 0
        self._lock = threading.Lock()
        self._go = threading.Event()
        self._real = socket.getaddrinfo

    def __call__(self, host: str, port: int, *args: Any, **kwargs: Any) -> list[Any]:
        if kwargs.get("flags") == socket.AI_NUMERICHOST:
            return self._real(host, port, *args, **kwargs)
        with self._lock:
            self.calls.append(host)
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        self._go.wait(10)
        with self._lock:
            self.running -= 1
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]

    def answer(self) -> None:
        self._go.set()


@pytest.fixture
def dns(monkeypatch: pytest.MonkeyPatch) -> Iterator[SlowDNS]:
    slow = SlowDNS()
    monkeypatch.setattr(resolver.socket, "getaddrinfo", slow)
    yield slow
    slow.answer()  # no lookup thread outlives the test waiting


async def test_lookups_of_one_name_share_one_call(dns: SlowDNS) -> None:
    waiters = [asyncio.create_task(resolver.resolve("gateway.example", 443)) for _ in range(20)]
    await until(lambda: len(dns.calls) == 1)
    dns.answer()
    answers = await asyncio.gather(*waiters)
    assert dns.calls == ["gateway.example"]
    assert {a[0][4] for a in answers} == {("127.0.0.1", 443)}


async def test_at_most_a_few_threads_resolve_at_once_and_the_rest_wait_their_turn(dns: SlowDNS) -> None:
    names = [f"host{n}.example" for n in range(resolver.MAX_LOOKUP_THREADS + 3)]
    waiters = [asyncio.create_task(resolver.resolve(name, 443)) for name in names]
    await until(lambda: len(dns.calls) == resolver.MAX_LOOKUP_THREADS)
    await asyncio.sleep(0.1)  # the others are queued, not started
    assert len(dns.calls) == resolver.MAX_LOOKUP_THREADS
    dns.answer()
    await asyncio.gather(*waiters)
    assert sorted(dns.calls) == sorted(names) and dns.most_at_once <= resolver.MAX_LOOKUP_THREADS


async def test_a_caller_that_gives_up_leaves_at_once_and_takes_no_executor_thread(dns: SlowDNS) -> None:
    loop = asyncio.get_running_loop()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await resolver.resolve("slow.example", 443)
    await asyncio.wait_for(loop.run_in_executor(None, lambda: None), 1)  # the loop's executor is free
    dns.answer()
    await until(lambda: resolver.lookups_in_flight() == 0)  # the abandoned lookup ended alone


async def test_a_numeric_address_needs_no_thread(dns: SlowDNS) -> None:
    before = threading.active_count()
    assert (await resolver.resolve("127.0.0.1", 8765))[0][4] == ("127.0.0.1", 8765)
    assert (await resolver.resolve("::1", 8765))[0][4][:2] == ("::1", 8765)
    assert dns.calls == [] and threading.active_count() == before
