"""The event payload of a trigger's failure: small, plain JSON, and free of secrets.

Every trigger ends a failed wait with one such event (:func:`error_payload`); the task reads its
``error_type`` to choose the exception it raises.
"""

from __future__ import annotations

from typing import Any

__all__ = ["error_payload"]


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
