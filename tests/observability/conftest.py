"""Fixtures of the observability tests (defined in :mod:`tests.helpers.observability`)."""

from __future__ import annotations

from tests.helpers.observability import _isolated, emu, fast_backoff  # noqa: F401 - fixtures
