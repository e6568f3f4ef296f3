"""Stream state and how mutations change it (public document "Ordering and sequence").

* Text appends concatenate exactly, array appends add complete values, ``replace`` changes the
  complete string, array or object state; an object changes only through ``replace``.
* ``append_attachments`` changes only the attachment list; ``replace`` without ``attachments``
  keeps it and ``attachments: []`` removes every attachment; text and array appends keep it.

:func:`apply_mutation` is the gateway's rule; :func:`plan_mutation` is the client's inverse — the
minimal mutation that turns what the gateway has into what the caller wants (text suffix →
``append_text``, array suffix → ``append_items``, anything else → ``replace``; attachments
separately). A desired text that grew from the sent one by appends is planned from the appended
pieces alone (:meth:`StreamState.text_since`), so an append never compares the whole prefix.
"""

from __future__ import annotations

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


_PENDING: Any = object()
#: About what one kept piece costs in memory (the node and its string's header), in bytes.
_PIECE_BYTES = 128
#: Pieces are joined once they would cost more than this share of the text they make.
_MAX_PIECE_SHARE = 4


class StreamState:
    """A state and its inline attachments (treat as immutable).

    A text state made by :meth:`with_text` holds the state it grew from and the appended text,
    and joins them the first time :attr:`state` is read. So an append costs what it appends
    until something needs the whole string (a replayed ``start``, a ``replace``, a comparison
    with a caller's full state), and :func:`plan_mutation` finds the text appended since an
    earlier state (:meth:`text_since`) without comparing the whole prefix. The pieces never cost
    more than a quarter of the text in memory: past that, an append joins them (a copy of the
    text once per that many appends, so an append still costs O(appended) on average).

    :param state: string, array or object.
    :param attachments: the inline attachments, in order.
    """

    __slots__ = ("_base", "_depth", "_length", "_state", "_tail", "attachments")

    def __init__(self, state: Any, attachments: tuple[Attachment, ...] = ()) -> None:
        self._state = state
        #: The state this one grew from by appending :attr:`_tail` (``None`` once joined).
        self._base: StreamState | None = None
        self._tail = ""
        #: Pieces kept since the last joined state.
        self._depth = 0
        #: The text's length in code points; -1 for a state that is not text.
        self._length = len(state) if isinstance(state, str) else -1
        self.attachments = attachments

    @property
    def state(self) -> Any:
        """The state (a grown text is joined on first read, then kept)."""
        if self._state is _PENDING:
            parts = []
            node: StreamState = self
            while node._state is _PENDING:
                parts.append(node._tail)
                node = node._base  # type: ignore[assignment]
            parts.append(node._state)
            parts.reverse()
            self._state = "".join(parts)
            self._base, self._tail, self._depth = None, "", 0  # the pieces are no longer needed here
        return self._state

    @property
    def pieces(self) -> int:
        """Appended texts kept as pieces, not yet joined into one string (0: the text is one
        string). A grown text is joined when it is first read, or as soon as its pieces would cost
        more than a quarter of it."""
        return self._depth

    @property
    def is_text(self) -> bool:
        """Whether the state is a string (known without joining it)."""
        return self._length >= 0

    def with_text(self, text: str) -> StreamState:
        """This text state with ``text`` appended, the same attachments; O(``text``).

        :param text: the text to append.
        :raises TypeError: the state is not a string.
        """
        if self._length < 0:
            raise TypeError("only a text state grows by appended text")
        grown = StreamState(_PENDING, self.attachments)
        grown._base, grown._tail, grown._length = self, text, self._length + len(text)
        grown._depth = self._depth + 1
        if grown._depth * _PIECE_BYTES * _MAX_PIECE_SHARE > grown._length:
            grown.state  # noqa: B018 - joined now: the pieces would cost more than the bound
        return grown

    def with_attachments(self, attachments: tuple[Attachment, ...]) -> StreamState:
        """The same state with other attachments (a grown text stays unjoined).

        :param attachments: the new attachment list.
        """
        other = StreamState(_PENDING, attachments)
        other._depth = self._depth
        other._state, other._base, other._tail, other._length = (
            self._state,
            self._base,
            self._tail,
            self._length,
        )
        return other

    def text_since(self, earlier: StreamState) -> str | None:
        """The text appended to ``earlier`` to make this state, found by following the appends
        back (O(appended)), or ``None`` when this state did not grow from ``earlier`` that way.

        :param earlier: a state this one may have grown from.
        """
        if earlier._length < 0:
            return None
        parts = []
        node: StreamState = self
        while node is not earlier:
            if node._base is None or node._length <= earlier._length:
                return None
            parts.append(node._tail)
            node = node._base
        parts.reverse()
        return "".join(parts)

    def same_state(self, other: StreamState) -> bool:
        """Whether both states encode to the same JSON bytes (texts of different lengths differ
        without being joined); attachments are not compared.

        :param other: the other state.
        """
        if self is other:
            return True
        if self._length >= 0 and other._length >= 0 and self._length != other._length:
            return False
        return same_json(self.state, other.state)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StreamState):
            return NotImplemented
        return self.attachments == other.attachments and self.state == other.state

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"StreamState(state={self.state!r}, attachments={self.attachments!r})"


def same_json(a: Any, b: Any) -> bool:
    """Whether two JSON values encode to the same bytes (``1 == True`` in Python, not on the wire)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, str):
        return a == b
    return compact_json(a) == compact_json(b)


#: What each append needs the state to be: its type, the appended field, and the rule with its fix.
_APPEND_NEEDS: dict[type, tuple[type, str, str]] = {
    AppendText: (str, "text", "a string state; use append_items for an array or replace for an object"),
    AppendItems: (list, "items", "an array state; use append_text for a string or replace for an object"),
}


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
    needs = _APPEND_NEEDS.get(type(message))
    if needs is not None and not isinstance(current.state, needs[0]):
        _, field, words = needs
        raise LocalProtocolError(
            f"{message.TYPE}.{field} cannot be appended: {message.TYPE} needs {words}",
            code="state_type_mismatch",
            field=field,
        )
    if isinstance(message, AppendText):
        return StreamState(current.state + message.text, current.attachments)
    if isinstance(message, AppendItems):
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
    attachments_equal = sent.attachments == desired.attachments
    if attachments_equal:
        appended = desired.text_since(sent)
        if appended:  # the caller's change was an append: no need to compare the prefix
            return AppendText(event_id, appended, idempotency_key)
    state_equal = desired.same_state(sent)
    if state_equal and attachments_equal:
        return None
    if attachments_equal:
        if sent.is_text and desired.is_text and desired.state.startswith(sent.state):
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
