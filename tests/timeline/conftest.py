"""Fixtures of the timeline tests (defined in :mod:`tests.helpers.timeline`)."""

from __future__ import annotations

from tests.helpers.timeline import gateway, sensor_run  # noqa: F401 - fixtures
