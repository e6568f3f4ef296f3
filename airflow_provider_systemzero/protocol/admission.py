"""What a gateway accepts on one connection: the rules a client message passes before it counts
(WIRE.md §2–4), as pure functions.

Each returns the rejection — a :class:`~airflow_provider_systemzero.protocol.errors.LocalProtocolError`
carrying the wire code — or, for a mutation that passes, what accepting it makes
(:class:`Admission`). :class:`~airflow_provider_systemzero.protocol.gateway.GatewaySession` decides
what to send, what to count and which limits close the connection instead (``max_events``, the
rate buckets).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from airflow_provider_systemzero.protocol.body import compact_json
from airflow_provider_systemzero.protocol.errors import LocalProtocolError
from airflow_provider_systemzero.protocol.limits import Limits
from airflow_provider_systemzero.protocol.messages import Attachment, Mutation, Start, StreamRequest, event_id
from airflow_provider_systemzero.protocol.state import StreamState, apply_mutation
from airflow_provider_systemzero.protocol.validation import (
    validate_decision_mode,
    validate_idempotency_key,
    validate_min_interval_ms,
)

__all__ = ["Admission", "BodyFrame", "admit_mutation", "decide_rejection", "order_rejection"]


def decide_rejection(
    *, started: bool, decision_mode: str | None, shutting_down: bool, requested: int, current: int
) -> LocalProtocolError | None:
    """Why a ``decide`` is rejected, or ``None`` when it schedules a dispatch.

    :param started: a ``start`` was accepted on this connection.
    :param decision_mode: the stream's decision mode.
    :param shutting_down: the gateway is shutting the connection down.
    :param requested: the ``state_version`` the ``decide`` names.
    :param current: the current accepted version.
    """
    if not started:
        return LocalProtocolError(
            "decide before start: send start (evt_1) first", code="start_required", field="type"
        )
    if decision_mode != "on_request":
        return LocalProtocolError(
            "decide is only for on_request streams; this stream decides on_change",
            code="decide_not_allowed",
            field="type",
        )
    if shutting_down:
        return LocalProtocolError(
            "decide during shutdown: the gateway starts no more decides on this connection; reconnect and replay",
            code="shutting_down",
            field="type",
        )
    if requested != current:
        return LocalProtocolError(
            f"decide.state_version {requested} is not the current accepted version "
            f"{current}: decide must name the current accepted version",
            code="stale_state_version",
            field="state_version",
        )
    return None


def order_rejection(message: Mutation, *, started: bool, state_version: int) -> LocalProtocolError | None:
    """Why a mutation is out of order — a second ``start``, anything before ``start``, an event
    ID that is not the next — or ``None``.

    :param message: the mutation.
    :param started: a ``start`` was accepted on this connection.
    :param state_version: the current accepted version.
    """
    if isinstance(message, Start) and started:
        return LocalProtocolError(
            "start was already accepted on this connection: questions, routing, scheduling and the "
            "cache key stay fixed; reconnect to change them",
            code="already_started",
            field="type",
        )
    if not isinstance(message, Start) and not started:
        return LocalProtocolError(
            f"{message.TYPE} before start: send start (evt_1) first", code="start_required", field="type"
        )
    expected = event_id(state_version + 1)
    if message.event_id != expected:
        return LocalProtocolError(
            f"event_id {message.event_id!r} is out of sequence: the next event ID is {expected!r} "
            "(IDs are precisely evt_1, evt_2, … and a rejected update leaves the next ID available)",
            code="event_id_out_of_sequence",
            field="event_id",
        )
    return None


class BodyFrame:
    """The synthesized decide body of a stream around its state: ``prefix`` + the state as compact
    JSON + ``suffix`` (WIRE.md §3 puts ``state`` second, after ``model``).

    Everything but the state — the model, the attachments, the questions, routing and the cache
    key — is fixed for a connection or changes only with the attachments, so the frame is built
    once per attachment list (by the one synthesis, :meth:`StreamRequest.decide_body`, around a
    placeholder state) and a change encodes only its state.

    :param request: the stream's fixed request parts.
    :param attachments: the current attachments (the frame is for this very tuple).
    :param stream_id: the fallback cache key when ``prompt_cache_key`` is ``None``.
    """

    __slots__ = ("_size", "attachments", "prefix", "suffix")

    def __init__(self, request: StreamRequest, attachments: tuple[Attachment, ...], stream_id: str) -> None:
        body = request.decide_body(0, attachments, stream_id=stream_id)
        cut = len('{"model":') + len(compact_json(request.model)) + len(',"state":')
        if body[cut : cut + 2] not in ("0,", "0}"):  # pragma: no cover - the body's key order changed
            raise AssertionError(
                f"the synthesized body does not hold its state at {cut}: {body[: cut + 2]!r}"
            )
        self.attachments = attachments
        self.prefix, self.suffix = body[:cut], body[cut + 1 :]
        self._size: int | None = None

    def size(self, message: Any) -> int:
        """UTF-8 size of the body without its state.

        :param message: the mutation being admitted (named by the error).
        :raises LocalProtocolError: ``invalid_state`` when the frame does not encode as UTF-8.
        """
        if self._size is None:
            self._size = _utf8_size(self.prefix, message) + _utf8_size(self.suffix, message)
        return self._size

    def body(self, state_json: str) -> str:
        """The body for a state already encoded as compact JSON.

        :param state_json: :func:`~airflow_provider_systemzero.protocol.body.compact_json` of the state.
        """
        return self.prefix + state_json + self.suffix


class Admission(NamedTuple):
    """What accepting a mutation makes."""

    #: The state after it.
    state: StreamState
    #: The state as compact JSON, and its UTF-8 size (``ack.state_bytes``).
    state_json: str
    state_bytes: int
    #: The synthesized decide body's frame around the state, and the body's UTF-8 size.
    frame: BodyFrame
    body_bytes: int
    #: The checked idempotency key (``None``: unkeyed).
    key: str | None
    #: The stream's fixed parts: a ``start`` sets them, later mutations keep them.
    request: StreamRequest
    decision_mode: str
    min_interval_ms: int

    @property
    def body(self) -> str:
        """The synthesized decide body of the state."""
        return self.frame.body(self.state_json)


def admit_mutation(
    message: Mutation,
    *,
    current: StreamState | None,
    request: StreamRequest | None,
    decision_mode: str | None,
    min_interval_ms: int,
    stream_id: str,
    limits: Limits,
    pending_events: int,
    frame: BodyFrame | None = None,
) -> Admission:
    """Check a mutation in order against the stream and return what accepting it makes.

    :param message: a mutation in order (see :func:`order_rejection`).
    :param current: the accepted state (``None`` before ``start``).
    :param request: the stream's fixed request parts (``None`` before ``start``).
    :param decision_mode: the stream's decision mode (``None`` before ``start``).
    :param min_interval_ms: the stream's ``min_interval_ms``.
    :param stream_id: the connection's ``stream_id`` (the cache key fallback of the body).
    :param limits: the limits in force.
    :param pending_events: accepted events not yet frozen into a dispatch.
    :param frame: the body frame of the accepted state (reused when the attachments stay).
    :raises LocalProtocolError: the rejection, naming the field.
    """
    key = None if message.idempotency_key is None else validate_idempotency_key(message.idempotency_key)
    if isinstance(message, Start):
        message.request.validate()
        request = message.request
        decision_mode = validate_decision_mode(message.decision_mode)
        min_interval_ms = (
            validate_min_interval_ms(message.min_interval_ms, maximum=limits.maximum_decision_interval_ms)
            or 0
        )
        frame = None
    state = apply_mutation(current, message)
    assert request is not None and decision_mode is not None
    if frame is None or frame.attachments is not state.attachments:
        frame = BodyFrame(request, state.attachments, stream_id)
    state_json = compact_json(state.state)
    size = _utf8_size(state_json, message)
    body_bytes = frame.size(message) + size
    if body_bytes > limits.max_decide_body_bytes:
        raise LocalProtocolError(
            f"{message.TYPE} would make the decide body {body_bytes} bytes: the synthesized body may not "
            f"exceed max_decide_body_bytes ({limits.max_decide_body_bytes})",
            code="decide_body_too_large",
            field="state",
        )
    if pending_events >= limits.max_pending_events:
        raise LocalProtocolError(
            f"{pending_events} accepted events wait for a dispatch: at most max_pending_events "
            f"({limits.max_pending_events}) may wait",
            code="too_many_pending_events",
            field="event_id",
        )
    return Admission(state, state_json, size, frame, body_bytes, key, request, decision_mode, min_interval_ms)


def _utf8_size(text: str, message: Any) -> int:
    if text.isascii():  # known without encoding (and ASCII is its own UTF-8)
        return len(text)
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise LocalProtocolError(
            f"{message.TYPE} holds text that is not valid Unicode (a lone surrogate such as \\ud800): "
            "a state must encode as UTF-8",
            code="invalid_state",
            field="state",
        ) from None
