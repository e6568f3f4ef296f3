"""Fixtures of the policy tests (defined in :mod:`tests.helpers.policy`)."""

from __future__ import annotations

from tests.helpers.policy import core_api, emulator  # noqa: F401 - fixtures
