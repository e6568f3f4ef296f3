"""Helpers shared by the Airflow-level tests."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any, TypeVar

from airflow_provider_systemzero.emulator.server import Emulator

_T = TypeVar("_T")


class EmulatorThread:
    """Runs an :class:`Emulator` on its own event loop in a thread, for synchronous code such as
    ``dag.test()`` (which runs triggers with ``asyncio.run`` in the calling thread)."""

    def __init__(self, **kwargs: Any) -> None:
        self.emulator = Emulator(**kwargs)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="emulator", daemon=True)

    def call(self, function: Callable[[Emulator], Any]) -> Any:
        """Run ``function(emulator)`` on the emulator's loop (awaiting it if it is a coroutine)."""

        async def runner() -> Any:
            result = function(self.emulator)
            if asyncio.iscoroutine(result):
                result = await result
            return result

        future: Future[Any] = asyncio.run_coroutine_threadsafe(runner(), self._loop)
        return future.result(timeout=60)

    def __enter__(self) -> Emulator:
        self._thread.start()
        self.call(lambda emu: emu.start())
        return self.emulator

    def __exit__(self, *exc_info: object) -> None:
        try:
            self.call(lambda emu: emu.stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()


@contextmanager
def systemzero_connection(conn_id: str, origin: str, key: str = "demo", **extra: Any) -> Iterator[None]:
    """A ``systemzero`` connection stored in the metadata DB (not an env var) for the block."""
    import json

    from airflow.models import Connection
    from airflow.utils.session import create_session

    with create_session() as session:
        session.query(Connection).filter(Connection.conn_id == conn_id).delete()
        session.add(Connection(conn_id=conn_id, conn_type="systemzero", host=origin, password=key,
                               extra=json.dumps(extra) if extra else None))
    try:
        yield
    finally:
        with create_session() as session:
            session.query(Connection).filter(Connection.conn_id == conn_id).delete()


def wait_until(predicate: Callable[[], _T], timeout: float = 10.0, interval: float = 0.01) -> _T:
    """Poll ``predicate`` until it returns a truthy value (bounded); raise ``TimeoutError`` otherwise."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"condition not met within {timeout} s")
        time.sleep(interval)
