"""Fixtures of the mistakes tests (defined in :mod:`tests.helpers.mistakes`)."""

from __future__ import annotations

from tests.helpers.mistakes import closed_port, emulator  # noqa: F401 - fixtures
