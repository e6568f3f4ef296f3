"""Metrics and spans of System Zero streams: the documented import path.

The observer interface lives with the stream
(:mod:`airflow_provider_systemzero.stream.observer`), the Airflow metrics and spans observer next to
the Airflow classes (:mod:`airflow_provider_systemzero.utils.observability`); this module names
both where the documentation has always named them. Each name is looked up on first use, so
importing this module loads neither side (and neither side's import can come back to it half-done).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_provider_systemzero.stream.observer import GOODBYE_REASONS, StreamObserver
    from airflow_provider_systemzero.utils.observability import (
        CLOSE_CODES,
        METRICS,
        RECONNECT_REASONS,
        AirflowStreamObserver,
        capture_content_enabled,
        close_code_tag,
        configure,
        reason_tag,
        spans_enabled,
    )

__all__ = [
    "CLOSE_CODES",
    "GOODBYE_REASONS",
    "METRICS",
    "RECONNECT_REASONS",
    "AirflowStreamObserver",
    "StreamObserver",
    "capture_content_enabled",
    "close_code_tag",
    "configure",
    "reason_tag",
    "spans_enabled",
]

_STREAM_SIDE = ("GOODBYE_REASONS", "StreamObserver")


def __getattr__(name: str) -> Any:
    """Each name from the module that defines it, on first use."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    home = "stream.observer" if name in _STREAM_SIDE else "utils.observability"
    return getattr(importlib.import_module(f"airflow_provider_systemzero.{home}"), name)
