"""Every limit of the public System Zero stream document, with its defaults.

The gateway advertises the limits marked ``advertised`` in their field metadata in
``hello.limits`` (the object of the public example, in that order). The others are service rules
the document states but ``hello`` does not carry; they are fixed for protocol v1 and used by
both sides.

A client never lets ``hello`` loosen its own safety checks: :meth:`Limits.from_hello` clamps
every advertised value into :data:`ADVERTISED_BOUNDS` (sizes, liveness timers and the stream cap
never above the document's numbers, timers never zero), so a gateway cannot let a 200 MB frame
in or switch the dead-connection checks off.

The account's decision limits (``account_decision_burst``, ``account_decision_ceiling``) are in
the document's list but not in its example ``hello``: a gateway may advertise them there, under
those names (:data:`ACCOUNT_LIMITS`), and the client paces its decision starts by them; without
them it uses the published values. They only pace the client (the gateway enforces its own), so
any value from 1 up to 100 000 is taken.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from airflow_provider_systemzero.protocol.errors import refuse

__all__ = [
    "ACCOUNT_LIMITS",
    "ADVERTISED_BOUNDS",
    "ADVERTISED_LIMITS",
    "DOCUMENT_LIMITS",
    "MAX_DISPATCHES_PER_STREAM",
    "Limits",
]

#: A stream has at most one decide in flight plus one pending intent (WIRE.md §4): what a
#: client may have started at the gateway and not yet seen settled.
MAX_DISPATCHES_PER_STREAM = 2

#: Field metadata of a limit the gateway advertises in ``hello.limits``.
_IN_HELLO = {"advertised": True}


@dataclass(frozen=True, slots=True)
class Limits:
    """Stream limits; defaults are the public document's numbers. Times are milliseconds."""

    # --- advertised in hello.limits, in the public example's order ---
    max_duration_ms: int = field(default=3_600_000, metadata=_IN_HELLO)
    idle_timeout_ms: int = field(default=120_000, metadata=_IN_HELLO)
    start_timeout_ms: int = field(default=10_000, metadata=_IN_HELLO)
    heartbeat_interval_ms: int = field(default=30_000, metadata=_IN_HELLO)
    native_heartbeat_interval_ms: int = field(default=10_000, metadata=_IN_HELLO)
    receipt_timeout_ms: int = field(default=240_000, metadata=_IN_HELLO)
    max_control_queue_frames: int = field(default=2, metadata=_IN_HELLO)
    pong_timeout_ms: int = field(default=10_000, metadata=_IN_HELLO)
    max_message_bytes: int = field(default=4_194_304, metadata=_IN_HELLO)
    max_decide_body_bytes: int = field(default=3_665_920, metadata=_IN_HELLO)
    max_pending_events: int = field(default=4096, metadata=_IN_HELLO)
    max_events: int = field(default=100_000, metadata=_IN_HELLO)
    max_events_per_second: int = field(default=5, metadata=_IN_HELLO)
    max_send_queue_bytes: int = field(default=4_194_304, metadata=_IN_HELLO)
    max_send_queue_frames: int = field(default=64, metadata=_IN_HELLO)
    min_interval_ms: int = field(default=0, metadata=_IN_HELLO)
    event_burst: int = field(default=10, metadata=_IN_HELLO)
    max_messages_per_second: int = field(default=40, metadata=_IN_HELLO)
    message_burst: int = field(default=80, metadata=_IN_HELLO)
    max_streams_per_process: int = field(default=4, metadata=_IN_HELLO)
    max_native_control_frames_per_second: int = field(default=8, metadata=_IN_HELLO)
    native_control_frame_burst: int = field(default=16, metadata=_IN_HELLO)
    max_native_control_bytes_per_second: int = field(default=512, metadata=_IN_HELLO)
    native_control_byte_burst: int = field(default=1024, metadata=_IN_HELLO)
    # --- service rules stated by the document, not advertised ---
    maximum_decision_interval_ms: int = 60_000
    mutation_burst: int = 10
    application_message_rate: int = 40
    application_message_burst: int = 80
    max_pending_probes: int = 2
    write_progress_timeout_ms: int = 5_000
    decision_settlement_timeout_ms: int = 5_000
    close_handshake_timeout_ms: int = 5_000
    consecutive_retryable_failures: int = 3
    protocol_refusal_limit: int = 3
    protocol_refusal_window_ms: int = 60_000
    account_decision_burst: int = 5
    account_decision_ceiling_per_minute: int = 60

    def __post_init__(self) -> None:
        for name in _NAMES:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"limit {name} must be a non-negative integer, got {value!r}")

    def advertised(self) -> dict[str, int]:
        """The ``hello.limits`` object, in the public example's key order; the account's decision
        limits follow when they differ from the published ones (:data:`ACCOUNT_LIMITS`)."""
        data = {name: getattr(self, name) for name in ADVERTISED_LIMITS}
        for key, name in ACCOUNT_LIMITS.items():
            if getattr(self, name) != getattr(_DOCUMENT, name):
                data[key] = getattr(self, name)
        return data

    def replace(self, **changes: int) -> Limits:
        """A copy with some limits changed (the emulator shrinks timeouts for tests).

        :param changes: limit name → new value.
        """
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_hello(cls, data: Any) -> Limits:
        """Parse ``hello.limits`` strictly.

        Unknown keys (a newer gateway) are ignored; the non-advertised rules keep their
        document values.

        Every value is clamped into :data:`ADVERTISED_BOUNDS`: a gateway may make a limit
        stricter, never looser than the public document (nor switch a liveness timer off).

        :raises RemoteProtocolError: a refusal naming the field when a known limit is missing
            or not a non-negative integer.
        """
        if not isinstance(data, Mapping):
            raise refuse("hello.limits must be an object", "limits")
        given = tuple(map(data.get, _PARSED_KEYS))
        if all(type(value) is int for value in given[: len(ADVERTISED_LIMITS)]) and all(
            value is None or type(value) is int for value in given[len(ADVERTISED_LIMITS) :]
        ):  # never a bool: True would hash as 1
            known = _PARSED.get(given)
            if known is not None:
                return known  # a gateway advertises the same limits in every hello
        values: dict[str, int] = {}
        for name in ADVERTISED_LIMITS:
            value = data.get(name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise refuse(
                    f"hello.limits.{name} must be a non-negative integer, got {value!r}", f"limits.{name}"
                )
            low, high = ADVERTISED_BOUNDS[name]
            values[name] = min(max(value, low), high)
        for key, name in ACCOUNT_LIMITS.items():
            value = data.get(key)
            if value is None:
                continue  # not advertised: the published value
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise refuse(
                    f"hello.limits.{key} must be a non-negative integer, got {value!r}", f"limits.{key}"
                )
            values[name] = min(max(value, 1), _MAX_RATE)
        limits = cls(**values)
        if len(_PARSED) >= _PARSED_KEPT:
            _PARSED.clear()
        _PARSED[given] = limits
        return limits


#: ``hello.limits`` values already parsed (in :data:`ADVERTISED_LIMITS` order) → their
#: :class:`Limits` (immutable, so shared); at most :data:`_PARSED_KEPT` sets are kept.
_PARSED: dict[tuple[int, ...], Limits] = {}
_PARSED_KEPT = 64

#: Every limit's name, in declaration order.
_NAMES: tuple[str, ...] = tuple(f.name for f in fields(Limits))

#: Names of the limits the gateway advertises in ``hello``, in the public example's order (the
#: fields marked as advertised, in their declaration order).
ADVERTISED_LIMITS: tuple[str, ...] = tuple(f.name for f in fields(Limits) if f.metadata.get("advertised"))

#: The account's decision limits a gateway may advertise in ``hello.limits`` (the names of the
#: public document's list) → the :class:`Limits` fields they set.
ACCOUNT_LIMITS: dict[str, str] = {
    "account_decision_burst": "account_decision_burst",
    "account_decision_ceiling": "account_decision_ceiling_per_minute",
}
#: The ``hello.limits`` keys a parse depends on (its cache key).
_PARSED_KEYS: tuple[str, ...] = (*ADVERTISED_LIMITS, *ACCOUNT_LIMITS)

#: The public document's limits (immutable: shared by every session before its ``hello``).
DOCUMENT_LIMITS = _DOCUMENT = Limits()
#: The rates and bursts of a gateway's buckets only pace this client's own sending: a gateway may
#: grant more than the document's numbers, up to this sanity bound.
_MAX_RATE = 100_000
#: The shortest liveness timer a gateway may set (heartbeat, native heartbeat, pong timeout), ms.
_MIN_TIMER_MS = 100
_TIMERS = frozenset({"heartbeat_interval_ms", "native_heartbeat_interval_ms", "pong_timeout_ms"})
_RATES = frozenset(
    {
        "max_events_per_second",
        "event_burst",
        "max_messages_per_second",
        "message_burst",
        "max_native_control_frames_per_second",
        "native_control_frame_burst",
        "max_native_control_bytes_per_second",
        "native_control_byte_burst",
    }
)


def _bounds(name: str) -> tuple[int, int]:
    if name in _RATES:
        return 0, _MAX_RATE
    if name == "min_interval_ms":
        return 0, _DOCUMENT.maximum_decision_interval_ms
    if name == "max_streams_per_process":
        return 1, _DOCUMENT.max_streams_per_process
    return (_MIN_TIMER_MS if name in _TIMERS else 0), getattr(_DOCUMENT, name)


#: ``(lowest, highest)`` a client accepts for each advertised limit (see :meth:`Limits.from_hello`):
#: sizes, counts, timeouts and the stream cap at most the document's numbers; the liveness timers
#: at least 100 ms; ``min_interval_ms`` at most ``maximum_decision_interval``; rates and bursts at
#: most 100 000.
ADVERTISED_BOUNDS: dict[str, tuple[int, int]] = {name: _bounds(name) for name in ADVERTISED_LIMITS}
