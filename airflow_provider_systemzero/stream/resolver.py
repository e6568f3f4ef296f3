"""Name resolution that no deadline waits for and that takes no thread of the event loop's.

asyncio resolves a host name with ``socket.getaddrinfo`` on the loop's default executor. When
DNS does not answer, that call blocks its thread for the resolver's whole timeout (with glibc's
defaults, 5 s for each of two attempts per name server) and cannot be cancelled: a cancelled
opening leaves the thread running, ``asyncio.run`` waits for it at exit (``hook.decide(timeout=2)``
took 10 s), and in a triggerer a few such streams fill the executor every other trigger shares
(another trigger's ``to_thread`` waited 8 s).

:func:`resolve` keeps ``getaddrinfo`` — the system's resolver, with ``/etc/hosts``, nsswitch
and the resolver configuration a deployment relies on — but runs it on daemon threads of this
module's own:

* at most :data:`MAX_LOOKUP_THREADS` at once, in the whole process; a lookup beyond that waits
  for one of them (its caller's deadline still holds);
* lookups of the same name and port in flight at the same time share one call, so a stream
  fleet against one gateway whose DNS is down takes one thread, not one per stream;
* a caller that gives up (a deadline, a cancellation) leaves at once: the thread finishes on its
  own and its answer is dropped. Nothing waits for it: not ``asyncio.run``, not the interpreter's
  exit (the threads are daemons);
* a numeric address (``127.0.0.1``, ``::1``) is read without a thread.

A plaintext (``ws://``) connection goes to loopback only, decided by the address it connects to,
not by the name (:func:`loopback_only`): ``gateway.localhost`` is a loopback *name*, but a resolver
that forwards ``*.localhost`` to DNS may answer with any address, and the upgrade carries the key.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import socket
import threading
from collections import deque
from typing import Any

from airflow_provider_systemzero.protocol.upgrade import is_loopback_host

__all__ = [
    "MAX_LOOKUP_THREADS",
    "Address",
    "PlaintextBeyondLoopback",
    "ResolutionTimedOut",
    "lookups_in_flight",
    "loopback_only",
    "resolve",
]

#: Threads resolving names at once, at most, in this process.
MAX_LOOKUP_THREADS = 4

#: One address to connect to: ``(family, type, proto, canonname, sockaddr)`` as ``getaddrinfo`` gives it.
Address = tuple[Any, ...]


class ResolutionTimedOut(TimeoutError):
    """A connection attempt's time ran out while a host name was still being resolved.

    :param host: the name (the gateway's, or the proxy's).
    """

    def __init__(self, host: str) -> None:
        super().__init__(f"timed out resolving {host!r}")
        self.host = host


class PlaintextBeyondLoopback(OSError):
    """The host of a plaintext (``ws://``) connection resolved to no loopback address: nothing was
    sent (the key would have crossed the network in clear text).

    :param host: the name.
    :param addresses: the addresses it resolved to.
    """

    def __init__(self, host: str, addresses: list[str]) -> None:
        shown = ", ".join(dict.fromkeys(addresses)) or "no address"
        super().__init__(f"{host!r} resolves to {shown}, not a loopback address")
        self.host = host
        self.addresses = tuple(addresses)


def loopback_only(host: str, addresses: list[Address]) -> list[Address]:
    """The addresses of ``host`` a plaintext (``ws://``) connection may go to: the loopback ones
    (127.0.0.0/8, ``::1``), whatever the name.

    :param host: the name (or address) resolved.
    :param addresses: what :func:`resolve` found.
    :raises PlaintextBeyondLoopback: none of them is a loopback address.
    """
    kept = [address for address in addresses if is_loopback_host(str(address[4][0]))]
    if not kept:
        raise PlaintextBeyondLoopback(host, [str(address[4][0]) for address in addresses])
    return kept


_lock = threading.Lock()
#: Lookups asked for and not answered yet, by ``(host, port)``: running, or waiting for a thread.
_in_flight: dict[tuple[str, int], concurrent.futures.Future[list[Address]]] = {}
_queued: deque[tuple[str, int]] = deque()
_threads = 0


def lookups_in_flight() -> int:
    """Lookups asked for and not answered yet, running or waiting for a thread (a lookup a caller
    gave up on runs to its end: this says when it has)."""
    with _lock:
        return len(_in_flight)


def _numeric(host: str, port: int) -> list[Address] | None:
    """The addresses of a numeric host (no lookup), else ``None``."""
    try:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    except (socket.gaierror, UnicodeError):
        return None


def _work() -> None:
    """A lookup thread: answer queued lookups until none is left."""
    global _threads
    while True:
        with _lock:
            if not _queued:
                _threads -= 1
                return
            key = _queued.popleft()
            future = _in_flight[key]
        try:
            result: list[Address] | None = socket.getaddrinfo(key[0], key[1], type=socket.SOCK_STREAM)
            error: BaseException | None = None
        except BaseException as exc:  # handed to the callers, whatever it is
            result, error = None, exc
        with _lock:
            del _in_flight[key]
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result or [])


def _lookup(host: str, port: int) -> concurrent.futures.Future[list[Address]]:
    """The shared lookup of ``(host, port)``, started (or queued) if none is in flight."""
    global _threads
    key = (host, port)
    with _lock:
        future = _in_flight.get(key)
        if future is not None:
            return future
        future = _in_flight[key] = concurrent.futures.Future()
        _queued.append(key)
        if _threads >= MAX_LOOKUP_THREADS:
            return future
        _threads += 1
    threading.Thread(target=_work, name="systemzero-resolver", daemon=True).start()
    return future


async def resolve(host: str, port: int) -> list[Address]:
    """The addresses of ``host`` for a TCP connection to ``port``, in ``getaddrinfo``'s order.

    Cancel the caller (a deadline) to stop waiting; the lookup is then left to finish alone.

    :param host: a host name or a numeric address.
    :param port: the TCP port.
    :raises socket.gaierror: the name does not resolve (or has no address).
    """
    numeric = _numeric(host, port)
    if numeric is not None:
        return numeric
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[list[Address]] = loop.create_future()

    def answered(done: concurrent.futures.Future[list[Address]]) -> None:
        # on the lookup thread (or here, when it is done already); a closed loop: nobody waits
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_deliver, waiter, done)

    _lookup(host, port).add_done_callback(answered)
    addresses = await waiter
    if not addresses:
        raise socket.gaierror(socket.EAI_NONAME, f"no address for {host!r}")
    return addresses


def _deliver(waiter: asyncio.Future[list[Address]], done: concurrent.futures.Future[list[Address]]) -> None:
    if waiter.done():
        return  # the caller gave up
    error = done.exception()
    if error is not None:
        waiter.set_exception(error)
    else:
        waiter.set_result(done.result())
