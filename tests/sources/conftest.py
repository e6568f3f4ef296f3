"""Fixtures of the source tests: the trigger tests' emulator and rules file."""

from __future__ import annotations

from tests.helpers import emulator, rules_file  # noqa: F401 - fixtures
