"""Fixtures of the hook tests: connections stored in the real SQLite metadata DB (the root
conftest's throwaway AIRFLOW_HOME), emulators on the test's loop or on a thread of their own."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from airflow_provider_systemzero.emulator import Emulator
from airflow_provider_systemzero.stream import Backoff
from tests.helpers import EmulatorThread, put_connection
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
    """Insert (or replace) a connection row in the metadata DB, with the hook tests' key and
    extras unless given (:func:`~tests.helpers.put_connection`)."""
    put_connection(conn_id, host=host, password=password, port=port, extra=EXTRA if extra is None else extra)


@pytest.fixture
async def emu(server_context: None) -> AsyncIterator[Emulator]:
    """An emulator on the test's loop, with :data:`CONN_ID` pointing at it in the metadata DB."""
    async with Emulator(limits=TEST_LIMITS, api_keys={SECRET_KEY: 8}) as emulator:
        store_connection(host=emulator.origin)
        yield emulator


@pytest.fixture
def threaded_emu(server_context: None) -> Iterator[EmulatorThread]:
    """A :class:`EmulatorThread` with :data:`CONN_ID` pointing at it."""
    with EmulatorThread(limits=TEST_LIMITS, api_keys={SECRET_KEY: 8}, stop={"retry_after_ms": 0}) as threaded:
        store_connection(host=threaded.emulator.origin)
        yield threaded


@pytest.fixture
def sync_threaded_emu(monkeypatch: pytest.MonkeyPatch, airflow_db: None) -> Iterator[EmulatorThread]:
    """A :class:`EmulatorThread` with :data:`CONN_ID` pointing at it, for what reads the
    connection synchronously as a server process does (the Test button, ``airflow connections
    test``): every supported Airflow finds it in the metadata DB that way."""
    monkeypatch.setenv("_AIRFLOW_PROCESS_CONTEXT", "server")
    with EmulatorThread(limits=TEST_LIMITS, api_keys={SECRET_KEY: 8}, stop={"retry_after_ms": 0}) as threaded:
        store_connection(host=threaded.emulator.origin)
        yield threaded


@pytest.fixture
def fast_backoff() -> Backoff:
    return Backoff(base=0.02, cap=0.1)
