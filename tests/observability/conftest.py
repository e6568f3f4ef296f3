"""Fixtures of the observability tests (defined in :mod:`tests.helpers.observability`)."""

from __future__ import annotations

from tests.helpers.observability import emu, fast_backoff, isolated  # noqa: F401 - fixtures
