"""The emulator of the trigger tests, for the asset watch's tests."""

from __future__ import annotations

from tests.airflow.test_triggers import emulator, rules_file  # noqa: F401 - fixtures
