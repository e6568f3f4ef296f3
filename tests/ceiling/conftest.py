"""The ceiling tests' fixtures: an emulator on a thread of its own for the sync hook."""

from __future__ import annotations

from tests.helpers.hooks import server_context, threaded_emu  # noqa: F401 - fixtures
