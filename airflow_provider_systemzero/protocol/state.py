"""Stream state and how mutations change it (public document "Ordering and sequence").

* Text appends concatenate exactly, array appends add complete values, ``replace`` changes the
  complete string, array or object state; an object changes only through ``replace``.
* ``append_attachments`` changes only the attachment list; ``replace`` without ``attachments``
  keeps it and ``attachments: []`` removes every attachment; text and array appends keep it.

:func:`apply_mutation` is the gateway's rule; :func:`plan_mutation` is the client's inverse — the
minimal mutation that turns what the gateway has into what the caller wants (text suffix →
``append_text``, array suffix → ``append_items``, anything else → ``replace``; attachments
separately).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from airflow_provider_systemzero.protocol.body import compact_json
from airflow_provider_systemzero.protocol.errors import LocalProtocolError
from airflow_provider_systemzero.protocol.messages import (
    AppendAttachments,
    AppendItems,
    AppendText,
    Attachment,
    Mutation,
    Replace,
    Start,
    validate_attachment_tuple,
)
from airflow_provider_systemzero.protocol.validation import validate_state

__all__ = ["StreamState", "apply_mutation", "plan_mutation", "same_json"]


@dataclass(frozen=True, slots=True)
class StreamState:
    """A state and its inline attachments.

    :param state: string, array or object.
    :param attachments: the inline attachments, in order.
    """

    state: Any
    attachments: tuple[Attachment, ...] = ()


def same_json(a: Any, b: Any) -> bool:
    """Whether two JSON values encode to the same bytes (``1 == True`` in Python, not on the wire)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, str):
        return a == b
    return compact_json(a) == compact_json(b)


def apply_mutation(current: StreamState | None, message: Mutation) -> StreamState:
    """The state after an accepted mutation.

    Checks the rules that depend on the current state (kind of state, attachment names) and
    raises :class:`LocalProtocolError` for a mutation that must be rejected; the current state
    is never modified (values are copied where the result shares structure).

    :param current: the state before (``None`` before ``start``).
    :param message: the mutation.
    """
    if isinstance(message, Start):
        validate_state(message.state, field="start.request.state")
        validate_attachment_tuple(message.attachments, field="start.request.attachments")
        return StreamState(message.state, tuple(message.attachments))
    if current is None:
        raise LocalProtocolError(
            f"{message.TYPE} before start: send start (evt_1) first", code="start_required", field="type"
        )
    if isinstance(message, AppendText):
        if not isinstance(current.state, str):
            raise LocalProtocolError(
                "append_text.text cannot be appended: append_text needs a string state; "
                "use append_items for an array or replace for an object",
                code="state_type_mismatch",
                field="text",
            )
        return StreamState(current.state + message.text, current.attachments)
    if isinstance(message, AppendItems):
        if not isinstance(current.state, list):
            raise LocalProtocolError(
                "append_items.items cannot be appended: append_items needs an array state; "
                "use append_text for a string or replace for an object",
                code="state_type_mismatch",
                field="items",
            )
        if not message.items:
            raise LocalProtocolError(
                "append_items.items must not be empty: append at least one item",
                code="empty_items",
                field="items",
            )
        return StreamState([*current.state, *message.items], current.attachments)
    if isinstance(message, Replace):
        validate_state(message.state, field="replace.state")
        if message.attachments is None:
            return StreamState(message.state, current.attachments)
        validate_attachment_tuple(message.attachments, field="replace.attachments")
        return StreamState(message.state, tuple(message.attachments))
    if isinstance(message, AppendAttachments):
        validate_attachment_tuple(
            message.attachments,
            field="append_attachments.attachments",
            existing=current.attachments,
            allow_empty=False,
        )
        return StreamState(current.state, (*current.attachments, *message.attachments))
    raise TypeError(f"not a mutation: {message!r}")  # pragma: no cover


def plan_mutation(
    sent: StreamState, desired: StreamState, *, event_id: str, idempotency_key: str | None
) -> AppendText | AppendItems | Replace | AppendAttachments | None:
    """The one minimal mutation that turns ``sent`` into ``desired``, or ``None`` if equal.

    When both the state and the attachments changed and the attachments are not a pure
    append on an unchanged state, one ``replace`` carries both, so the result is always a single
    mutation (one event, one version, one key).

    :param sent: what the gateway has (or will have once in-flight mutations are acknowledged).
    :param desired: what the caller wants.
    :param event_id: the event ID to use.
    :param idempotency_key: the key naming the desired state (``None``: unkeyed).
    """
    state_equal = same_json(sent.state, desired.state)
    attachments_equal = sent.attachments == desired.attachments
    if state_equal and attachments_equal:
        return None
    if attachments_equal:
        if (
            isinstance(sent.state, str)
            and isinstance(desired.state, str)
            and desired.state.startswith(sent.state)
        ):
            return AppendText(event_id, desired.state[len(sent.state) :], idempotency_key)
        if (
            isinstance(sent.state, list)
            and isinstance(desired.state, list)
            and len(desired.state) > len(sent.state)
            and same_json(desired.state[: len(sent.state)], sent.state)
        ):
            return AppendItems(event_id, desired.state[len(sent.state) :], idempotency_key)
        return Replace(event_id, desired.state, None, idempotency_key)
    if state_equal:
        count = len(sent.attachments)
        if len(desired.attachments) > count and desired.attachments[:count] == sent.attachments:
            return AppendAttachments(event_id, desired.attachments[count:], idempotency_key)
    return Replace(event_id, desired.state, desired.attachments, idempotency_key)
