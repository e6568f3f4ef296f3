"""Shared fixtures of the stream client tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest

from airflow_provider_systemzero.emulator import Emulator
from airflow_provider_systemzero.protocol import Limits
from airflow_provider_systemzero.stream import Backoff, StreamSettings, default_capacity

QUESTIONS = {"ready": {"type": "boolean", "instructions": "Is the job ready?"}}
#: Long enough for Airflow's secrets masker (it skips values under 5 characters).
SECRET_KEY = "sz-live-0123456789abcdef"


@pytest.fixture(autouse=True)
def _reset_default_capacity() -> Iterator[None]:
    """Every test starts and ends with the document's process-wide cap (4 streams)."""
    default_capacity().set_limit(4)
    yield
    default_capacity().set_limit(4)


@pytest.fixture
def fast_backoff() -> Backoff:
    """Reconnect backoff shrunk for tests (server delays still apply in full)."""
    return Backoff(base=0.02, cap=0.1)


#: Limits for loopback tests: liveness in hundreds of milliseconds, account decision limits out of
#: the way, idle and lifetime long unless a test shrinks them.
TEST_LIMITS = Limits(start_timeout_ms=2_000, idle_timeout_ms=30_000, max_duration_ms=120_000,
                     heartbeat_interval_ms=400, pong_timeout_ms=300, decision_settlement_timeout_ms=300,
                     write_progress_timeout_ms=2_000, close_handshake_timeout_ms=500,
                     account_decision_burst=1_000, account_decision_ceiling_per_minute=60_000)

EmulatorFactory = Callable[..., Awaitable[Emulator]]


@pytest.fixture
async def make_emulator() -> AsyncIterator[EmulatorFactory]:
    """``await make_emulator(limits=..., **kwargs)``: a started emulator (stopped after the test)
    whose one account is :data:`SECRET_KEY` with capacity 4."""
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


def settings_for(emulator: Emulator, **kwargs: Any) -> StreamSettings:
    """Settings pointing at an emulator with the test key."""
    return StreamSettings(emulator.origin, SECRET_KEY, **kwargs)
