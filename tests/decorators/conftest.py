"""Fixtures of the decorator tests (defined in :mod:`tests.helpers.policy`)."""

from __future__ import annotations

from tests.helpers.policy import emulator  # noqa: F401 - fixtures
