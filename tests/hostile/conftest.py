"""Fixtures of the hostile tests (defined in :mod:`tests.helpers.hostile`)."""

from __future__ import annotations

from tests.helpers.hostile import connect, gateway  # noqa: F401 - fixtures
