"""A trigger's event payloads, from both ends: what a failure becomes, and what a resuming task
accepts.

Every trigger ends a failed wait with one small, plain-JSON event free of secrets
(:func:`error_payload`); the task reads its ``error_type`` to choose the exception it raises,
once :func:`owned_event` found the event usable and its own.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

__all__ = ["error_payload", "owned_event"]


def error_payload(exc: BaseException, **extra: Any) -> dict[str, Any]:
    """A small JSON error event for an exception (never carries request headers or the key)."""
    from airflow_provider_systemzero.exceptions import ARGUMENT_ERRORS
    from airflow_provider_systemzero.stream.exceptions import (
        AuthenticationFailed,
        DeadlineExceeded,
        DecisionFailed,
        SystemZeroError,
        UpgradeRefused,
    )

    payload: dict[str, Any] = {
        "status": "error",
        "error_type": "unexpected",
        "message": str(exc) or repr(exc),
        **extra,
    }
    if isinstance(exc, DeadlineExceeded | TimeoutError):
        payload.update(status="timeout", error_type="timeout")
    elif isinstance(exc, AuthenticationFailed):
        payload["error_type"] = "authentication"
    elif isinstance(exc, ARGUMENT_ERRORS):
        payload.update(error_type="validation", field=exc.field, code=exc.code)
    elif isinstance(exc, DecisionFailed):
        payload.update(
            error_type="decision_failed",
            http_status=exc.http_status,
            code=exc.envelope.code,
            retryable=exc.retryable,
        )
    elif isinstance(exc, UpgradeRefused):
        payload.update(error_type="upgrade_refused", http_status=exc.status)
    elif isinstance(exc, SystemZeroError):
        payload["error_type"] = "stream_failed"
    elif type(exc).__name__ == "AirflowNotFoundException":
        payload["error_type"] = "configuration"
    return payload


def owned_event(task_id: str, event: Any, accepted: Collection[str]) -> dict[str, Any]:
    """Check that a resumed task got a usable event of its own (events may be redelivered, and a
    misrouted one must never be taken for this task's decision).

    :param task_id: the resuming task (for the message).
    :param event: the trigger's payload.
    :param accepted: the key namespaces that identify this task's request.
    :raises AirflowException: the event is unusable or belongs to another request.
    """
    from airflow_provider_systemzero.compat import AirflowException

    if not isinstance(event, dict) or "status" not in event:
        raise AirflowException(f"{task_id}: the trigger sent no usable event ({event!r})")
    if event.get("key_namespace") not in accepted:
        raise AirflowException(
            f"{task_id}: the event belongs to another task instance or request "
            f"({event.get('key_namespace')!r}, expected one of {sorted(accepted)!r})"
        )
    return event
