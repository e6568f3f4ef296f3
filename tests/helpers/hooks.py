"""Fixtures of the hook tests: connections stored in the real SQLite metadata DB (the root
conftest's throwaway AIRFLOW_HOME), emulators on the test's loop or on a thread of their own."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from airflow_provider_systemzero.emulator import Emulator
from airflow_provider_systemzero.stream import Backoff
from tests.helpers.stream import SECRET_KEY, TEST_LIMITS

CONN_ID = "systemzero_test"
EXTRA = {"model": "MODEL_ID", "prompt_cache_key_prefix": "hook-tests", "open_timeout": "5"}


@pytest.fixture
def server_context(monkeypatch: pytest.MonkeyPatch, airflow_db: None) -> None:
    """Look connections up like an Airflow server process: environment, then the metastore."""
    from airflow_provider_systemzero.compat import airflow_version

    if airflow_version()[:2] < (3, 3):
        pytest.skip(
            "on Airflow 3.1 and 3.2 (3.1.8, 3.2.2 checked) an async connection lookup outside a task or "
            "trigger process "
            "does not reach the metadata DB, so this server-context test cannot find its connection"
        )
    monkeypatch.setenv("_AIRFLOW_PROCESS_CONTEXT", "server")


def store_connection(
    conn_id: str = CONN_ID,
    *,
    host: str,
    password: str | None = SECRET_KEY,
    extra: dict[str, Any] | None = None,
    port: int | None = None,
) -> None:
    """Insert (or replace) a connection row in the metadata DB."""
    from airflow.models import Connection
    from airflow.utils.session import create_session

    with create_session() as session:
        session.query(Connection).filter(Connection.conn_id == conn_id).delete()
        session.add(
            Connection(
                conn_id=conn_id,
                conn_type="systemzero",
                host=host,
                password=password,
                port=port,
                extra=json.dumps(EXTRA if extra is None else extra),
            )
        )


@pytest.fixture
async def emu(server_context: None) -> AsyncIterator[Emulator]:
    """An emulator on the test's loop, with :data:`CONN_ID` pointing at it in the metadata DB."""
    async with Emulator(limits=TEST_LIMITS, api_keys={SECRET_KEY: 8}) as emulator:
        store_connection(host=emulator.origin)
        yield emulator


class ThreadedEmulator:
    """An emulator on its own loop and thread, for sync callers that block their thread."""

    def __init__(self, **kwargs: Any) -> None:
        self.emulator = Emulator(**kwargs)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="emulator", daemon=True)

    def call(self, function: Callable[[Emulator], Any]) -> Any:
        """Run ``function(emulator)`` on the emulator's loop, awaiting it if it is a coroutine."""

        async def run() -> Any:
            result = function(self.emulator)
            return await result if asyncio.iscoroutine(result) else result

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=30)

    def __enter__(self) -> ThreadedEmulator:
        self._thread.start()
        self.call(lambda e: e.start())
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self.call(lambda e: e.stop(retry_after_ms=0))
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()


@pytest.fixture
def threaded_emu(server_context: None) -> Iterator[ThreadedEmulator]:
    """A :class:`ThreadedEmulator` with :data:`CONN_ID` pointing at it."""
    with ThreadedEmulator(limits=TEST_LIMITS, api_keys={SECRET_KEY: 8}) as threaded:
        store_connection(host=threaded.emulator.origin)
        yield threaded


@pytest.fixture
def sync_threaded_emu(monkeypatch: pytest.MonkeyPatch, airflow_db: None) -> Iterator[ThreadedEmulator]:
    """A :class:`ThreadedEmulator` with :data:`CONN_ID` pointing at it, for what reads the
    connection synchronously as a server process does (the Test button, ``airflow connections
    test``): every supported Airflow finds it in the metadata DB that way."""
    monkeypatch.setenv("_AIRFLOW_PROCESS_CONTEXT", "server")
    with ThreadedEmulator(limits=TEST_LIMITS, api_keys={SECRET_KEY: 8}) as threaded:
        store_connection(host=threaded.emulator.origin)
        yield threaded


@pytest.fixture
def fast_backoff() -> Backoff:
    return Backoff(base=0.02, cap=0.1)
