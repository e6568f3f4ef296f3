"""What the caller wants the gateway to hold, and the rules a change must pass before it counts.

:class:`DesiredState` belongs to one :class:`~airflow_provider_systemzero.protocol.client.ClientSession`
and outlives its connections. Each caller change is checked here first — the kind of state, the
values, the attachments, the decide body and the replayed ``start`` against the limits, the key —
and either raises :class:`LocalProtocolError` with nothing changed, or becomes the new desired
state with its idempotency key and the next *generation* number. What is accepted is a snapshot:
changing the caller's list or dict afterwards changes nothing here.

An append costs what it appends, not what the state holds. The decide body is
``prefix + state JSON + suffix`` (WIRE.md §3: ``model`` first, ``state`` second), and the JSON of
a string or an array grows at its end: ``"abc`` + ``def"``, ``[1,2`` + ``,3]``. So the session
keeps the SHA-256 of ``prefix + state JSON`` without its closing character, and its byte count;
an ``append_text`` or ``append_items`` feeds only the new fragment into a copy of that hash, and
the per-state key is a copy finished with the closing character and the suffix. The state's own
SHA-256 (its JSON alone, the ``state_hash`` a verdict carries) is kept the same way beside it, so
reading it is O(1) too. The text itself
is not copied either: the new :class:`~airflow_provider_systemzero.protocol.state.StreamState`
keeps the state it grew from and the appended piece, joined only when something reads the whole
string (see :meth:`~airflow_provider_systemzero.protocol.state.StreamState.with_text`). A
``replace`` encodes the new state once. Key, size and state hash are what a from-scratch encoding
gives (a test checks random sequences of appends, replaces and attachment changes).
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Sequence
from typing import Any, NamedTuple

from airflow_provider_systemzero.protocol.body import compact_json, json_size
from airflow_provider_systemzero.protocol.errors import LocalProtocolError
from airflow_provider_systemzero.protocol.keys import state_key
from airflow_provider_systemzero.protocol.limits import Limits
from airflow_provider_systemzero.protocol.messages import (
    Attachment,
    Mutation,
    Start,
    StreamRequest,
    event_id,
    validate_attachment_tuple,
)
from airflow_provider_systemzero.protocol.state import StreamState, plan_mutation, same_json
from airflow_provider_systemzero.protocol.validation import (
    not_json_message,
    validate_idempotency_key,
    validate_state,
)

__all__ = ["MAX_KEY_NAMESPACE_LENGTH", "STREAM_ID_PLACEHOLDER", "Change", "DesiredState"]

#: The longest key namespace: ``<namespace>:<64 hex>`` stays within the 255-character key limit.
MAX_KEY_NAMESPACE_LENGTH = 190
#: A placeholder ``stream_id`` of the right length, to predict body sizes before ``hello``.
STREAM_ID_PLACEHOLDER = "szws_" + "0" * 32


def _snapshot(value: Any) -> Any:
    """A copy the caller cannot change behind the session's back (strings are immutable)."""
    return value if isinstance(value, str) else copy.deepcopy(value)


def _json_text(value: Any, field: str) -> str:
    """:func:`compact_json` of ``value``, or a :class:`LocalProtocolError` naming ``field`` (text
    that is not valid Unicode is refused where the text is encoded: :func:`_utf8`)."""
    try:
        return compact_json(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise LocalProtocolError(
            not_json_message(value, field, exc), code="invalid_state", field=field
        ) from None


def _utf8(text: str, field: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise LocalProtocolError(
            f"{field} holds text that is not valid Unicode ({exc.reason}: {exc.object[exc.start : exc.end]!r}): "
            "a state must encode as UTF-8; nothing was changed",
            code="invalid_state",
            field=field,
        ) from None


class Change(NamedTuple):
    """A proposed change: the state it leads to and, for an append, the JSON fragment it adds
    before the state's closing character (``None``: the state is encoded anew)."""

    state: StreamState
    fragment: str | None = None
    #: :func:`compact_json` of ``state.state`` when the change made it already (checking that the
    #: state is JSON), so that accepting it does not encode the state a second time.
    text: str | None = None


class _Encoding(NamedTuple):
    """The decide body of a state, as far as it does not depend on the connection."""

    #: SHA-256 of ``prefix + state JSON`` without the state's closing character.
    open_hash: Any
    #: Byte count of the same.
    open_bytes: int
    #: The state JSON's closing character (``"`` or ``]``; ``""`` for an object, which never grows).
    close: bytes
    #: SHA-256 of the state JSON alone, without its closing character: with ``close`` it is the
    #: state's hash (:meth:`DesiredState.state_hash`), carried forward as the body's is.
    state_open_hash: Any


class DesiredState:
    """The desired state, its key and its generation, and the checks every change passes.

    :param request: the fixed request parts (they frame the decide body).
    :param decision_mode: the stream's decision mode (it frames the replayed ``start``).
    :param min_interval_ms: the stream's ``min_interval_ms`` (likewise).
    :param key_namespace: when set, a change without an explicit key gets
        :func:`~airflow_provider_systemzero.protocol.keys.derive_state_key` of its resulting body.
    """

    __slots__ = (
        "_encoding",
        "_prefix",
        "_start_overhead_for",
        "_suffix_for",
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
        self._prefix = ('{"model":' + compact_json(request.model) + ',"state":').encode("utf-8")
        self._encoding = _Encoding(hashlib.sha256(), 0, b"", hashlib.sha256())
        self._suffix_for: tuple[tuple[Attachment, ...], str, bytes] | None = None
        self._start_overhead_for: tuple[str, int] | None = None

    # ------------------------------------------------------------------ the decide body

    def body(self, stream_id: str | None) -> str:
        """The synthesized decide body of :attr:`current` (built in full: O(state))."""
        return self.request.decide_body(
            self.current.state, self.current.attachments, stream_id=stream_id or STREAM_ID_PLACEHOLDER
        )

    def body_bytes(self, stream_id: str | None) -> int:
        """The UTF-8 size of :meth:`body`, without building it."""
        return self._size(self._encoding, self.current.attachments, stream_id or STREAM_ID_PLACEHOLDER)

    def _size(self, encoding: _Encoding, attachments: tuple[Attachment, ...], stream_id: str) -> int:
        return encoding.open_bytes + len(encoding.close) + len(self._suffix(attachments, stream_id))

    def _suffix(self, attachments: tuple[Attachment, ...], stream_id: str) -> bytes:
        """What follows the state in the decide body (attachments, questions, … the cache key)."""
        cached = self._suffix_for
        if cached is None or cached[1] != stream_id or cached[0] != attachments:
            empty = self.request.decide_body("", attachments, stream_id=stream_id).encode("utf-8")
            head = self._prefix + b'""'
            if not empty.startswith(
                head
            ):  # pragma: no cover - synthesize_decide_body puts model, state first
                raise AssertionError("the decide body must start with model, then state (WIRE.md §3)")
            cached = self._suffix_for = (attachments, stream_id, empty[len(head) :])
        return cached[2]

    def state_hash(self) -> str:
        """SHA-256 (hex) of :attr:`current`'s state in its canonical compact JSON, as
        :func:`~airflow_provider_systemzero.identity.state_hash` computes it from the whole state,
        here from what each accepted change carried forward: O(1), however large the state."""
        digest = self._encoding.state_open_hash.copy()
        digest.update(self._encoding.close)
        return digest.hexdigest()

    def _encode(self, change: Change, field: str) -> _Encoding:
        """The encoding of ``change.state``: extended by the fragment of an append, else anew."""
        encoding = self._encoding
        if change.fragment is not None:
            fragment = _utf8(change.fragment, field)
            grown, state_grown = encoding.open_hash.copy(), encoding.state_open_hash.copy()
            grown.update(fragment)
            state_grown.update(fragment)
            return _Encoding(grown, encoding.open_bytes + len(fragment), encoding.close, state_grown)
        text = change.text if change.text is not None else compact_json(change.state.state)
        grows = isinstance(change.state.state, str | list)
        state_open = _utf8(text[:-1] if grows else text, field)
        opening = hashlib.sha256(self._prefix)
        opening.update(state_open)
        return _Encoding(
            opening,
            len(self._prefix) + len(state_open),
            text[-1].encode() if grows else b"",
            hashlib.sha256(state_open),
        )

    # ------------------------------------------------------------------ proposed changes

    def with_text(self, text: Any) -> Change | None:
        """The change that appends ``text`` (``None`` for an empty append, which changes nothing)."""
        if not isinstance(text, str):
            raise LocalProtocolError(
                f"text must be a string, got {type(text).__name__}", code="invalid_text", field="text"
            )
        if not self.current.is_text:
            raise LocalProtocolError(
                "append_text needs a string state: use append_items for an array or replace for an object",
                code="state_type_mismatch",
                field="text",
            )
        if not text:
            return None
        return Change(self.current.with_text(text), compact_json(text)[1:-1])

    def with_items(self, items: Any) -> Change:
        """The change that appends complete values to an array state."""
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
        values = _snapshot(list(items))
        fragment = ("," if self.current.state else "") + _json_text(values, "items")[1:-1]
        return Change(StreamState([*self.current.state, *values], self.current.attachments), fragment)

    def with_state(self, state: Any, attachments: Sequence[Attachment] | None = None) -> Change:
        """The change that replaces the state (``attachments`` ``None`` keeps them, ``[]`` removes all)."""
        validate_state(state, field="state")
        text = _json_text(state, "state")
        new_attachments = self.current.attachments
        if attachments is not None:
            new_attachments = tuple(attachments)
            validate_attachment_tuple(new_attachments, field="attachments")
        return Change(StreamState(_snapshot(state), new_attachments), None, text)

    def with_attachments(self, attachments: Sequence[Attachment]) -> Change:
        """The change that adds attachments (unique names); the state and its encoding stay."""
        new = tuple(attachments)
        validate_attachment_tuple(
            new, field="attachments", existing=self.current.attachments, allow_empty=False
        )
        return Change(self.current.with_attachments((*self.current.attachments, *new)), "")

    def is_current(self, state: Any, key: str | None) -> bool:
        """Whether making ``state`` desired would change nothing: the same JSON bytes (``[1]`` and
        ``[true]`` differ though Python calls them equal) and no other key."""
        return same_json(state, self.current.state) and (key is None or key == self.key)

    # ------------------------------------------------------------------ accepting one

    def accept(
        self, change: Change, key: str | None, *, field: str, limits: Limits, stream_id: str | None
    ) -> None:
        """Make ``change`` the desired state, or raise with nothing changed.

        :param change: the proposed change (from one of the ``with_*`` methods).
        :param key: the caller's explicit key, or ``None`` (derived from the namespace, if any).
        :param field: the caller's field, named in errors.
        :param limits: the limits in force.
        :param stream_id: the connection's ``stream_id`` (the cache key fallback), if known.
        :raises LocalProtocolError: text that is not valid Unicode, a decide body or replayed
            ``start`` over the limits, or an invalid key.
        """
        stream_id = stream_id or STREAM_ID_PLACEHOLDER
        encoding = self._encode(change, field)
        attachments = change.state.attachments
        size = self._size(encoding, attachments, stream_id)
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
            finished = encoding.open_hash.copy()
            finished.update(encoding.close + self._suffix(attachments, stream_id))
            key = state_key(self.key_namespace, finished.hexdigest())
        self.current = change.state
        self._encoding = encoding
        self.key = key
        self.generation += 1

    # ------------------------------------------------------------------ the messages it makes

    def start(self) -> Start:
        """The ``start`` that opens a connection's stream with the desired state (a replay after
        a reconnect: the same request bytes and the same key)."""
        return self._start(self.current, self.key)

    def _start(self, state: StreamState, key: str | None) -> Start:
        return Start(
            event_id(1),
            self.request,
            state.state,
            self.decision_mode,
            state.attachments,
            self.min_interval_ms,
            key,
        )

    def mutation_from(self, acked: StreamState, acked_version: int) -> Mutation:
        """The one mutation that turns what the gateway acknowledged into the desired state.

        :param acked: what the gateway holds.
        :param acked_version: its state version (the mutation is the next event).
        :raises AssertionError: both are the same (a change back to the acknowledged state is
            adopted at once and never planned).
        """
        mutation = plan_mutation(
            acked, self.current, event_id=event_id(acked_version + 1), idempotency_key=self.key
        )
        if mutation is None:
            raise AssertionError("desired state equals the acknowledged one but was not adopted")
        return mutation

    def _start_overhead(self, stream_id: str) -> int:
        """Bytes a replayed ``start`` (with the longest key) adds to the decide body of the same state.

        State and attachments appear once in each, framed the same way, so the difference depends
        only on the request: it is measured once on an empty state.
        """
        # the stream_id only counts when it is the cache key (the request names none)
        depends_on = stream_id if self.request.prompt_cache_key is None else None
        if self._start_overhead_for is None or self._start_overhead_for[0] != depends_on:
            overhead = _start_overhead(
                self.request, self.decision_mode, self.min_interval_ms, depends_on or STREAM_ID_PLACEHOLDER
            )
            self._start_overhead_for = (depends_on, overhead)
        return self._start_overhead_for[1]


def _start_overhead(
    request: StreamRequest, decision_mode: str, min_interval_ms: int | None, stream_id: str
) -> int:
    """:meth:`DesiredState._start_overhead`, measured (once per desired state, some microseconds).

    Not kept across streams: a process-wide cache keyed by the request held one request per
    trigger — thousands in a triggerer, each kept while its trigger waited with no stream."""
    start = Start(event_id(1), request, "", decision_mode, (), min_interval_ms, "k" * 255)
    body = request.decide_body("", (), stream_id=stream_id)
    return json_size(start.to_dict()) - len(body.encode("utf-8"))
