"""Deterministic identities for tasks, so a retry, a clear, a triggerer restart or an HA double
run names the same stream and the same per-state idempotency keys — and is billed once.

No ``uuid4()``, no clock: the namespace is a hash of the task instance's coordinates (the same
inputs always give the same namespace, wherever it is computed).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

__all__ = ["state_hash", "task_namespace"]


def task_namespace(
    dag_id: str, task_id: str, run_id: str, map_index: int | None = -1, *, salt: str | None = None
) -> str:
    """The idempotency namespace of a task instance: ``sz-`` + 40 hex characters.

    :param dag_id: the Dag ID.
    :param task_id: the task ID.
    :param run_id: the Dag run ID.
    :param map_index: the map index (``-1`` for an unmapped task).
    :param salt: an optional user salt (e.g. to force fresh decisions for the same run).
    """
    coordinates = json.dumps(
        [dag_id, task_id, run_id, -1 if map_index is None else int(map_index), salt], separators=(",", ":")
    )
    return "sz-" + hashlib.sha256(coordinates.encode("utf-8")).hexdigest()[:40]


def context_namespace(context: Mapping[str, Any], *, salt: str | None = None) -> str:
    """:func:`task_namespace` of the task instance in an Airflow task context."""
    ti = context["ti"]
    return task_namespace(ti.dag_id, ti.task_id, ti.run_id, getattr(ti, "map_index", -1), salt=salt)


def state_hash(value: Any) -> str:
    """Hex SHA-256 of a JSON value in its canonical compact form (for audit records)."""
    from airflow_provider_systemzero.protocol.body import compact_json

    return hashlib.sha256(compact_json(value).encode("utf-8")).hexdigest()
