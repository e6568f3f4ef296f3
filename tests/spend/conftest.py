"""The emulator and trigger fixtures of the trigger tests."""

from __future__ import annotations

from tests.helpers import emulator, rules_file  # noqa: F401 - fixtures
