"""Fixtures of the trigger tests: an emulator on loopback and its rules file."""

from __future__ import annotations

from tests.helpers import emulator, rules_file  # noqa: F401 - fixtures
