"""Fixtures of the emulator tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from airflow_provider_systemzero.emulator import Emulator
from tests.helpers.wire import FAST


@pytest.fixture
async def emu() -> AsyncIterator[Emulator]:
    """An emulator with shrunken timeouts and account decision limits out of the way."""
    async with Emulator(limits=FAST) as emulator:
        yield emulator
