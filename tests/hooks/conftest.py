"""Fixtures of the hooks tests (defined in :mod:`tests.helpers.hooks`)."""

from __future__ import annotations

from tests.helpers.hooks import emu, fast_backoff, server_context, sync_threaded_emu, threaded_emu  # noqa: F401 - fixtures
