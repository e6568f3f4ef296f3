"""The emulator of the trigger tests, for the asset watch's tests."""

from __future__ import annotations

from tests.helpers import emulator, rules_file  # noqa: F401 - fixtures
