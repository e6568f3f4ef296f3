"""Fixtures of the budget, usage, metrics and span tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from airflow_provider_systemzero.decisions.budget import reset_connection_windows
from airflow_provider_systemzero.emulator import Emulator
from airflow_provider_systemzero.stream import Backoff, default_capacity
from airflow_provider_systemzero.tasks import observability
from tests.helpers.stream import SECRET_KEY, TEST_LIMITS


@pytest.fixture(autouse=True)
def isolated() -> Iterator[None]:
    """Each test starts with no connection windows, the default stream cap and configured spans."""
    reset_connection_windows()
    default_capacity().set_limit(4)
    yield
    reset_connection_windows()
    default_capacity().set_limit(4)
    observability.configure()


@pytest.fixture
def fast_backoff() -> Backoff:
    return Backoff(base=0.02, cap=0.1)


@pytest.fixture
async def emu() -> AsyncIterator[Emulator]:
    """An emulator on the test's loop with the test key."""
    emulator = Emulator(limits=TEST_LIMITS, api_keys={SECRET_KEY: 8})
    await emulator.start()
    try:
        yield emulator
    finally:
        await emulator.stop(retry_after_ms=0)


def ledger_of(emulator: Any) -> list[Any]:
    """The test account's ledger entries, in order."""
    return list(emulator.ledger.get(SECRET_KEY, []))
