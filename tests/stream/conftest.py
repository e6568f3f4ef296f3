"""Shared fixtures of the stream client tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from airflow_provider_systemzero.stream import Backoff, default_capacity

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
