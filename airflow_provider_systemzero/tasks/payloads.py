"""A trigger's event payloads, from both ends: what a failure becomes, and what a resuming task
accepts.

Every trigger ends a failed wait with one small, plain-JSON event free of secrets
(:func:`error_payload`); the task reads its ``error_type`` to choose the exception it raises
(:func:`task_failure`), once :func:`owned_event` found the event usable and its own. A task that
decides on its worker (no trigger) reads its error the same way, so a failure retrying cannot fix
fails at once in every mode.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_provider_systemzero.decisions.watch import WatchEvent

__all__ = ["FINAL_ERROR_TYPES", "error_payload", "owned_event", "task_failure", "timeout_payload"]

#: The most characters of a message from outside the provider an event carries.
_FOREIGN_MESSAGE_CHARS = 2000

#: Error types that retrying cannot fix: the same request is refused the same way again.
FINAL_ERROR_TYPES = frozenset({"authentication", "validation", "configuration", "stream_rejected"})


def timeout_payload(message: str, **extra: Any) -> dict[str, Any]:
    """The event of a wait whose deadline passed: ``status`` and ``error_type`` ``timeout``.

    :param message: what the event says (why the wait had no decision, when known).
    :param extra: fields every event of the trigger carries.
    """
    return {"status": "timeout", "error_type": "timeout", **extra, "message": message}


def error_payload(exc: BaseException, **extra: Any) -> dict[str, Any]:
    """A small JSON error event for an exception (never carries request headers or the key)."""
    from airflow_provider_systemzero.compat import AirflowNotFoundException
    from airflow_provider_systemzero.exceptions import ARGUMENT_ERRORS
    from airflow_provider_systemzero.protocol.untrusted import safe_text
    from airflow_provider_systemzero.stream.exceptions import (
        AuthenticationFailed,
        DeadlineExceeded,
        DecisionFailed,
        StreamRejected,
        SystemZeroError,
        UpgradeRefused,
    )

    message = str(exc) or repr(exc)
    if not isinstance(exc, (SystemZeroError, *ARGUMENT_ERRORS)):
        # another library's (or an author's source's) words: escaped and bounded as a gateway's are
        message = safe_text(message, _FOREIGN_MESSAGE_CHARS)
    if isinstance(exc, DeadlineExceeded | TimeoutError):
        return timeout_payload(message, **extra)
    payload: dict[str, Any] = {"status": "error", "error_type": "unexpected", "message": message, **extra}
    if isinstance(exc, AuthenticationFailed):
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
        code = exc.envelope.code if exc.envelope is not None else None
        payload.update(
            error_type="upgrade_refused", http_status=exc.status, retryable=exc.retryable, code=code
        )
    elif isinstance(exc, StreamRejected):
        payload.update(error_type="stream_rejected", code=exc.code)
    elif isinstance(exc, SystemZeroError):
        payload["error_type"] = "stream_failed"
    elif isinstance(exc, AirflowNotFoundException):  # the installed release's class (compat)
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


def task_failure(task_id: str, event: WatchEvent, *, fix: str = "") -> Exception:
    """The exception a task raises for a failed decision: ``AirflowFailException`` (no retry)
    when retrying cannot help — an authentication, validation or configuration error, a state
    the gateway rejected, an upgrade refused for good (a redirect, a 4xx but 429), or a
    decision's client error (4xx) the gateway did not call retryable —, else ``AirflowException``, which
    Airflow's retries act on (a retry replays the same keys, so a decision the service did
    finish is returned, not billed again).

    :param task_id: the failing task (the message starts with it).
    :param event: the failed event (a trigger's, or :func:`error_payload` of a worker's error).
    :param fix: appended to the event's message (what the author can change).
    """
    from airflow_provider_systemzero.compat import AirflowException, AirflowFailException

    message = f"{task_id}: {event.message or 'the decision failed'}{fix}"
    status = event.http_status
    final = (
        event.error_type in FINAL_ERROR_TYPES
        or (event.error_type == "upgrade_refused" and not event.retryable)
        or (
            event.error_type == "decision_failed"
            and not event.retryable
            and status is not None
            and 400 <= status < 500
        )
    )
    if event.error_type == "decision_failed":
        retry = "not retryable" if final else "Airflow retries apply"
        message += f" (HTTP {status}, code {event.error_code}; {retry})"
    return AirflowFailException(message) if final else AirflowException(message)
