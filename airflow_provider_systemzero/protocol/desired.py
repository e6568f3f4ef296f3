"""What the caller wants the gateway to hold, and the rules a change must pass before it counts.

:class:`DesiredState` belongs to one :class:`~airflow_provider_systemzero.protocol.client.ClientSession`
and outlives its connections. Each caller change is checked here first — the kind of state, the
values, the attachments, the decide body and the replayed ``start`` against the limits, the key —
and either raises :class:`LocalProtocolError` with nothing changed, or becomes the new desired
state with its idempotency key and the next *generation* number. What is accepted is a snapshot:
changing the caller's list or dict afterwards changes nothing here.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from airflow_provider_systemzero.protocol.body import json_size
from airflow_provider_systemzero.protocol.errors import LocalProtocolError
from airflow_provider_systemzero.protocol.keys import derive_state_key
from airflow_provider_systemzero.protocol.limits import Limits
from airflow_provider_systemzero.protocol.messages import (
    Attachment,
    Start,
    StreamRequest,
    event_id,
    validate_attachment_tuple,
)
from airflow_provider_systemzero.protocol.state import StreamState, same_json
from airflow_provider_systemzero.protocol.validation import validate_idempotency_key, validate_state

__all__ = ["STREAM_ID_PLACEHOLDER", "DesiredState"]

#: The longest key namespace: ``<namespace>:<64 hex>`` stays within the 255-character key limit.
MAX_KEY_NAMESPACE_LENGTH = 190
#: A placeholder ``stream_id`` of the right length, to predict body sizes before ``hello``.
STREAM_ID_PLACEHOLDER = "szws_" + "0" * 32


def _snapshot(value: Any) -> Any:
    """A copy the caller cannot change behind the session's back (strings are immutable)."""
    return value if isinstance(value, str) else copy.deepcopy(value)


def _check_json(value: Any, field: str) -> None:
    try:
        json_size(value)
    except (TypeError, ValueError) as exc:
        reason = "text that is not valid Unicode" if isinstance(exc, UnicodeEncodeError) else str(exc)
        raise LocalProtocolError(
            f"{field} is not JSON-serialisable: {reason}", code="invalid_state", field=field
        ) from None


class DesiredState:
    """The desired state, its key and its generation, and the checks every change passes.

    :param request: the fixed request parts (they frame the decide body).
    :param decision_mode: the stream's decision mode (it frames the replayed ``start``).
    :param min_interval_ms: the stream's ``min_interval_ms`` (likewise).
    :param key_namespace: when set, a change without an explicit key gets :func:`derive_state_key`
        of its resulting body.
    """

    __slots__ = (
        "_start_overhead_for",
        "current",
        "decision_mode",
        "generation",
        "key",
        "key_namespace",
        "min_interval_ms",
        "request",
    )

    def __init__(
        self,
        request: StreamRequest,
        decision_mode: str,
        min_interval_ms: int | None,
        key_namespace: str | None,
    ) -> None:
        self.request = request
        self.decision_mode = decision_mode
        self.min_interval_ms = min_interval_ms
        if key_namespace is not None:
            validate_idempotency_key(key_namespace, field="key_namespace")
            if len(key_namespace) > MAX_KEY_NAMESPACE_LENGTH:
                raise LocalProtocolError(
                    f"key_namespace is longer than {MAX_KEY_NAMESPACE_LENGTH} characters: derived keys "
                    "(namespace, ':' and 64 hex digits) must stay within 255 characters",
                    code="invalid_idempotency_key",
                    field="key_namespace",
                )
        self.key_namespace = key_namespace
        #: The state and attachments the caller wants.
        self.current = StreamState(None, ())
        #: The idempotency key naming :attr:`current` (``None``: unkeyed).
        self.key: str | None = None
        #: Counts accepted changes; the initial state is generation 0.
        self.generation = -1
        self._start_overhead_for: tuple[str, int] | None = None

    def body(self, stream_id: str | None) -> str:
        """The synthesized decide body of :attr:`current`."""
        return self.request.decide_body(
            self.current.state, self.current.attachments, stream_id=stream_id or STREAM_ID_PLACEHOLDER
        )

    # ------------------------------------------------------------------ proposed changes

    def with_text(self, text: Any) -> StreamState | None:
        """The state after appending ``text`` (``None`` for an empty append, which changes nothing)."""
        if not isinstance(text, str):
            raise LocalProtocolError(
                f"text must be a string, got {type(text).__name__}", code="invalid_text", field="text"
            )
        if not isinstance(self.current.state, str):
            raise LocalProtocolError(
                "append_text needs a string state: use append_items for an array or replace for an object",
                code="state_type_mismatch",
                field="text",
            )
        return StreamState(self.current.state + text, self.current.attachments) if text else None

    def with_items(self, items: Any) -> StreamState:
        """The state after appending complete values to an array state."""
        if isinstance(items, str | bytes) or not isinstance(items, Sequence):
            raise LocalProtocolError(
                "items must be a list of JSON values", code="invalid_items", field="items"
            )
        if not isinstance(self.current.state, list):
            raise LocalProtocolError(
                "append_items needs an array state: use append_text for a string or replace for an object",
                code="state_type_mismatch",
                field="items",
            )
        if not items:
            raise LocalProtocolError(
                "items must not be empty: append at least one item", code="empty_items", field="items"
            )
        _check_json(list(items), "items")
        return StreamState([*self.current.state, *_snapshot(list(items))], self.current.attachments)

    def with_state(self, state: Any, attachments: Sequence[Attachment] | None = None) -> StreamState:
        """The state after a ``replace`` (``attachments`` ``None`` keeps them, ``[]`` removes all)."""
        validate_state(state, field="state")
        _check_json(state, "state")
        new_attachments = self.current.attachments
        if attachments is not None:
            new_attachments = tuple(attachments)
            validate_attachment_tuple(new_attachments, field="attachments")
        return StreamState(_snapshot(state), new_attachments)

    def with_attachments(self, attachments: Sequence[Attachment]) -> StreamState:
        """The state after adding attachments (unique names; the state itself unchanged)."""
        new = tuple(attachments)
        validate_attachment_tuple(
            new, field="attachments", existing=self.current.attachments, allow_empty=False
        )
        return StreamState(self.current.state, (*self.current.attachments, *new))

    def is_current(self, state: Any, key: str | None) -> bool:
        """Whether making ``state`` desired would change nothing: the same JSON bytes (``[1]`` and
        ``[true]`` differ though Python calls them equal) and no other key."""
        return same_json(state, self.current.state) and (key is None or key == self.key)

    # ------------------------------------------------------------------ accepting one

    def accept(
        self, new: StreamState, key: str | None, *, field: str, limits: Limits, stream_id: str | None
    ) -> None:
        """Make ``new`` the desired state, or raise with nothing changed.

        :param new: the proposed state (from one of the ``with_*`` methods).
        :param key: the caller's explicit key, or ``None`` (derived from the namespace, if any).
        :param field: the caller's field, named in errors.
        :param limits: the limits in force.
        :param stream_id: the connection's ``stream_id`` (the cache key fallback), if known.
        :raises LocalProtocolError: text that is not valid Unicode, a decide body or replayed
            ``start`` over the limits, or an invalid key.
        """
        stream_id = stream_id or STREAM_ID_PLACEHOLDER
        body = self.request.decide_body(new.state, new.attachments, stream_id=stream_id)
        try:
            size = len(body.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise LocalProtocolError(
                f"{field} holds text that is not valid Unicode ({exc.reason}: {exc.object[exc.start : exc.end]!r}): "
                "a state must encode as UTF-8; nothing was changed",
                code="invalid_state",
                field=field,
            ) from None
        if size > limits.max_decide_body_bytes:
            raise LocalProtocolError(
                f"{field} would make the decide body {size} bytes: the synthesized body may not exceed "
                f"max_decide_body_bytes ({limits.max_decide_body_bytes}); nothing was changed",
                code="decide_body_too_large",
                field=field,
            )
        start_size = size + self._start_overhead(stream_id)
        if start_size > limits.max_message_bytes:
            raise LocalProtocolError(
                f"{field} would make the replay start message {start_size} bytes: messages may not exceed "
                f"max_message_bytes ({limits.max_message_bytes}); nothing was changed",
                code="message_too_large",
                field=field,
            )
        if key is not None:
            key = validate_idempotency_key(key)
        elif self.key_namespace is not None:
            key = derive_state_key(self.key_namespace, body)
        self.current = new
        self.key = key
        self.generation += 1

    def _start_overhead(self, stream_id: str) -> int:
        """Bytes a replayed ``start`` (with the longest key) adds to the decide body of the same state.

        State and attachments appear once in each, framed the same way, so the difference depends
        only on the request: it is measured once on an empty state instead of encoding the whole
        state a second time on every change.
        """
        if self._start_overhead_for is None or self._start_overhead_for[0] != stream_id:
            start = json_size(
                Start(
                    event_id(1), self.request, "", self.decision_mode, (), self.min_interval_ms, "k" * 255
                ).to_dict()
            )
            body = len(self.request.decide_body("", (), stream_id=stream_id).encode("utf-8"))
            self._start_overhead_for = (stream_id, start - body)
        return self._start_overhead_for[1]
