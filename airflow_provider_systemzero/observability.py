"""Metrics and spans of System Zero streams: the documented import path.

The observer interface lives with the stream
(:mod:`airflow_provider_systemzero.stream.observer`), the Airflow metrics and spans observer next to
the Airflow classes (:mod:`airflow_provider_systemzero.tasks.observability`); this module names
both where the documentation has always named them. Nothing in the package imports it: the stream
imports :mod:`~airflow_provider_systemzero.stream.observer` itself, so this path sits above both
sides of the graph. Importing it loads no Airflow (the Airflow observer imports Airflow on first use).
"""

from __future__ import annotations

from airflow_provider_systemzero.stream.observer import GOODBYE_REASONS, StreamObserver
from airflow_provider_systemzero.tasks.observability import (
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
