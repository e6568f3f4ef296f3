"""Shared fixtures of the stream client tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from airflow_provider_systemzero.emulator import Emulator
from airflow_provider_systemzero.stream import Backoff
from tests.helpers.stream import SECRET_KEY, TEST_LIMITS, EmulatorFactory


@pytest.fixture
def fast_backoff() -> Backoff:
    """Reconnect backoff shrunk for tests (server delays still apply in full)."""
    return Backoff(base=0.02, cap=0.1)


@pytest.fixture
async def make_emulator() -> AsyncIterator[EmulatorFactory]:
    """``await make_emulator(limits=..., **kwargs)``: a started emulator (stopped after the test)
    whose one account is the test key with stream capacity 4."""
    started: list[Emulator] = []

    async def make(**kwargs: Any) -> Emulator:
        kwargs.setdefault("limits", TEST_LIMITS)
        kwargs.setdefault("api_keys", {SECRET_KEY: 8})
        emulator = Emulator(**kwargs)
        await emulator.start()
        started.append(emulator)
        return emulator

    yield make
    for emulator in started:
        await emulator.stop(retry_after_ms=0)
