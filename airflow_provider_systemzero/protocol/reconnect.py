"""What the client does when a connection ends, and how decide failures are retried (WIRE.md §5, §7, §8).

Theory of operation
-------------------

A stream outlives its connections. When one ends, the I/O adapter describes what it saw in a
:class:`ConnectionOutcome` (the close code, the ``goodbye`` if any, the fatal ``error`` before
the close, whether ``start`` was acknowledged, how long it lasted, whether a decision arrived)
and asks :class:`ReconnectPlanner` for a :class:`ReconnectPlan`:

* :attr:`PlanKind.RECONNECT` — open a new connection after ``delay`` seconds and replay;
* :attr:`PlanKind.WHEN_NEEDED` — the same, but only once the session has work (a change to
  send, a decision to wait for); after an ``idle_timeout`` / ``max_duration`` goodbye, a server
  close 1000, or a lease given back;
* :attr:`PlanKind.STOP` — a reconnect would repeat the failure; the caller is told.

The delay is full-jitter exponential backoff counted *after* the server's own delay
(``goodbye.resume.retry_after_ms``, a fatal error's ``retry_after_ms``, ``Retry-After``), so a
gateway restart does not bring every client back at one instant. The attempt counter grows
across connections that end before anything useful happened — a close right after the
``start`` ack counts — and resets only after a decision or a connection that stayed healthy
for :data:`HEALTHY_CONNECTION_S`. So no gateway behaviour, however hostile, makes the client
reconnect faster than the backoff allows.

The same module classifies decide failures once for both sides (:func:`classify_decide_failure`):
the gateway uses it to decide whether on_change re-dispatches by itself, the client to decide
whether it waits, resends, or tells the caller.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass, field

from airflow_provider_systemzero.protocol.errors import ErrorEnvelope, RetryHint

__all__ = [
    "DEFAULT_REJECTION_RETRY_MS",
    "HEALTHY_CONNECTION_S",
    "MAX_SERVER_DELAY_S",
    "MIN_BROUGHT_FORWARD_DELAY_S",
    "Backoff",
    "CloseCode",
    "ConnectionOutcome",
    "DecideRetry",
    "GoodbyeReason",
    "PlanKind",
    "ReconnectPlan",
    "ReconnectPlanner",
    "classify_decide_failure",
    "delay_within",
    "doubled",
]


class CloseCode(enum.IntEnum):
    """WebSocket close codes as the stream uses them (RFC 6455 §7.4.1 and the public document)."""

    #: The client's own close (it sends no goodbye); a server's after ``idle_timeout`` / ``max_duration``.
    NORMAL_CLOSURE = 1000
    GOING_AWAY = 1001
    #: A frame broke the protocol.
    PROTOCOL_ERROR = 1002
    UNSUPPORTED_DATA = 1003
    #: Never sent on the wire: the connection was lost without a close frame.
    ABNORMAL_CLOSURE = 1006
    INVALID_DATA = 1007
    #: ``start_timeout``, ``protocol_refusal_limit``, ``event_limit``.
    POLICY_VIOLATION = 1008
    #: A message over ``max_message_bytes``.
    MESSAGE_TOO_BIG = 1009
    MANDATORY_EXTENSION = 1010
    INTERNAL_ERROR = 1011
    #: The gateway restarts (after goodbye ``shutdown``).
    SERVICE_RESTART = 1012
    #: ``slow_reader`` or ``overload``.
    TRY_AGAIN_LATER = 1013


class GoodbyeReason(enum.StrEnum):
    """The ``goodbye.reason`` values the public document names."""

    IDLE_TIMEOUT = "idle_timeout"
    MAX_DURATION = "max_duration"
    SHUTDOWN = "shutdown"
    OVERLOAD = "overload"
    EVENT_LIMIT = "event_limit"


#: Close codes a reconnect cannot fix unless the gateway said goodbye first: the client sent
#: something the gateway will refuse again.
_FINAL_CLOSE_CODES = frozenset(
    {
        CloseCode.PROTOCOL_ERROR,
        CloseCode.UNSUPPORTED_DATA,
        CloseCode.INVALID_DATA,
        CloseCode.POLICY_VIOLATION,
        CloseCode.MESSAGE_TOO_BIG,
        CloseCode.MANDATORY_EXTENSION,
    }
)
#: Goodbyes after which the client reconnects only when it has work (WIRE.md §8).
_WHEN_NEEDED_GOODBYES = frozenset({GoodbyeReason.IDLE_TIMEOUT, GoodbyeReason.MAX_DURATION})
#: Fatal errors before a policy close that a new connection does not repeat: ``start_timeout``
#: means this client was too slow once (a stalled event loop); the next connection sends ``start`` at once.
_TRANSIENT_FATAL_CODES = frozenset({"start_timeout"})
#: Consecutive connections ending in a contract breach before the stream gives up.
MAX_CONSECUTIVE_VIOLATIONS = 3
#: A connection open this long without trouble counts as healthy: the next failure starts the
#: backoff from the first attempt again. Longer than any burst of "ack, then close" a broken
#: gateway can produce, shorter than the gateway's default heartbeat interval (30 s).
HEALTHY_CONNECTION_S = 20.0
#: The longest server-requested delay honoured as given (a gateway asking for more is capped to
#: it; the caller's own deadline ends the wait sooner anyway).
MAX_SERVER_DELAY_S = 300.0
#: Delay before a mutation rejected for a passing reason (``event_rate_limited``,
#: ``too_many_pending_events``, ``shutting_down``) is sent again when the gateway names none.
DEFAULT_REJECTION_RETRY_MS = 1000
#: The shortest wait before an attempt that :func:`delay_within` brought forward.
MIN_BROUGHT_FORWARD_DELAY_S = 0.5


class DecideRetry(enum.Enum):
    """Who, if anyone, retries a failed decide (WIRE.md §5)."""

    #: on_change: the gateway re-dispatches the latest state itself after ``retry_after_ms``
    #: (429, 503 other than ``maintenance``, 409 ``idempotency_conflict``, retry permitted).
    GATEWAY = "gateway"
    #: 503 ``maintenance``, retry permitted: the gateway is going away and does not retry; the
    #: client asks again (on_request) or reconnects and replays (on_change) after the delay.
    CLIENT = "client"
    #: Not retryable: whoever waits for the decision is told.
    NONE = "none"


def classify_decide_failure(http_status: int, envelope: ErrorEnvelope, retry: RetryHint) -> DecideRetry:
    """Classify a failed decide once, for the gateway and the client alike.

    :param http_status: the decide's HTTP status.
    :param envelope: its error envelope.
    :param retry: its retry hint (``retryable`` false always means :attr:`DecideRetry.NONE`).
    """
    if not retry.retryable:
        return DecideRetry.NONE
    if http_status == 429:
        return DecideRetry.GATEWAY
    if http_status == 503:
        return DecideRetry.CLIENT if envelope.code == "maintenance" else DecideRetry.GATEWAY
    if http_status == 409 and envelope.code == "idempotency_conflict":
        return DecideRetry.GATEWAY
    return DecideRetry.NONE


def doubled(first: float, cap: float, times: int) -> float:
    """``first`` doubled ``times`` times, at most ``cap``: the wait of every growing retry (the
    backoff's jitter window, an asset watch's next try, a refused start's floor).

    :param first: the first value (``times`` = 0).
    :param cap: the largest value.
    :param times: how many times it doubled (0 or more).
    """
    return min(cap, first * (2 ** min(max(times, 0), 62)))


#: One random source for every stream's jitter (a generator per stream costs ~3 KB each).
_SHARED_RNG = random.Random()


@dataclass(slots=True)
class Backoff:
    """Full-jitter exponential backoff that never undercuts a server's delay.

    ``delay(attempt, server_delay)`` is ``server_delay + uniform(0, min(cap, base * 2**attempt))``:
    the jitter is counted from the end of the server's delay, so the clients a gateway restart
    told to wait the same time do not all come back at the same instant.

    :param base: seconds; the first attempt waits up to this long.
    :param cap: seconds; the jitter window never grows beyond it.
    :param rng: the random source (tests may seed it).
    """

    base: float = 0.5
    cap: float = 30.0
    rng: random.Random = field(default_factory=lambda: _SHARED_RNG, repr=False)

    def __post_init__(self) -> None:
        if self.base < 0 or self.cap < 0:
            raise ValueError(
                f"backoff base and cap must be non-negative, got base={self.base}, cap={self.cap}"
            )

    def window(self, attempt: int) -> float:
        """The jitter window of attempt ``attempt`` (0-based), in seconds."""
        return doubled(self.base, self.cap, attempt)

    def delay(self, attempt: int, server_delay: float | None = None) -> float:
        """Seconds to wait before reconnect attempt ``attempt`` (0-based).

        :param attempt: consecutive unproductive connections so far.
        :param server_delay: the server's minimum delay in seconds, if it named one (capped at
            :data:`MAX_SERVER_DELAY_S`).
        """
        window = self.window(attempt)
        jitter = self.rng.uniform(0, window) if window > 0 else 0.0
        return min(server_delay or 0.0, MAX_SERVER_DELAY_S) + jitter


def delay_within(delay: float, time_left: float | None) -> float:
    """A plan's ``delay``, shortened so that the next attempt comes within ``time_left`` seconds (but
    never sooner than :data:`MIN_BROUGHT_FORWARD_DELAY_S`): a stream that gives up at a fixed time (a
    loopback origin that never answered) makes its last attempt then, not after a long backoff.

    :param delay: the delay the backoff chose.
    :param time_left: seconds until the caller gives up (``None``: no such point; ``delay`` stands).
    """
    if time_left is None:
        return delay
    return min(delay, max(MIN_BROUGHT_FORWARD_DELAY_S, time_left))


class PlanKind(enum.Enum):
    """What to do after a connection ended."""

    RECONNECT = "reconnect"
    WHEN_NEEDED = "when_needed"
    STOP = "stop"


_KIND_LABELS = {
    "closed": "close",
    "silent": "receipt_timeout",
    "stalled": "write_timeout",
    "violation": "protocol_violation",
}


@dataclass(frozen=True, slots=True)
class ConnectionOutcome:
    """What the I/O adapter saw of one connection attempt.

    :param close_code: the close code (``None`` when no connection opened; 1006 for an abrupt loss).
    :param close_reason: the close frame's reason text.
    :param goodbye_reason: the ``goodbye.reason`` received, if any.
    :param server_delay_ms: the server's delay (goodbye, fatal error or ``Retry-After``), if any.
    :param fatal_code: the code of the fatal ``error`` before the close, if any.
    :param started: the connection's ``start`` was acknowledged.
    :param decided: a decision arrived on it.
    :param duration: seconds it was open (0 for a failed upgrade).
    :param kind: ``closed`` (a close frame or abrupt loss after the upgrade), ``network`` (no
        connection), ``refused`` (the upgrade was answered with an HTTP status), ``violation``
        (the gateway broke the protocol), ``silent`` (nothing received past the deadline),
        ``stalled`` (the peer read nothing while a frame waited to be written), ``released`` (the
        client gave the connection back) or ``recycled`` (the client closed to
        replay, see :attr:`~airflow_provider_systemzero.protocol.client.ClientSession.recycle_due`).
    :param retryable: for ``refused``: whether the status is worth retrying.
    :param status: for ``refused``: the HTTP status.
    :param released: the client had asked to give this connection back when it ended, whatever
        ended it first (a drop, a goodbye, a close before ``start`` was acknowledged).
    :param work_left: the session still had something to send or a decision to wait for when the
        connection ended (:meth:`~airflow_provider_systemzero.protocol.client.ClientSession.has_work`).
    """

    close_code: int | None = None
    close_reason: str = ""
    goodbye_reason: str | None = None
    server_delay_ms: int | None = None
    fatal_code: str | None = None
    started: bool = False
    decided: bool = False
    duration: float = 0.0
    kind: str = "closed"
    retryable: bool = True
    status: int | None = None
    released: bool = False
    work_left: bool = True

    @property
    def label(self) -> str:
        """A short, closed-set description for logs and metric tags."""
        if self.goodbye_reason is not None:
            reason = (
                self.goodbye_reason if self.goodbye_reason in GoodbyeReason.__members__.values() else "other"
            )
            return f"goodbye:{reason}"
        if self.kind == "refused":
            return f"upgrade_refused:{self.status}"
        return _KIND_LABELS.get(self.kind, self.kind)


@dataclass(frozen=True, slots=True)
class ReconnectPlan:
    """The planner's answer.

    :param kind: reconnect, reconnect when needed, or stop.
    :param delay: seconds from the end of the connection before the next attempt.
    :param attempt: the backoff attempt this plan used (0 after a healthy connection).
    :param reason: why (see :attr:`ConnectionOutcome.label`).
    :param server_delay: the server's delay in seconds, if it named one (capped).
    :param final: for :attr:`PlanKind.STOP`: a sentence saying why a reconnect cannot help.
    """

    kind: PlanKind
    delay: float
    attempt: int
    reason: str
    server_delay: float | None = None
    final: str | None = None


@dataclass(slots=True)
class ReconnectPlanner:
    """Decides, for each ended connection, whether and when to reconnect.

    :param backoff: the backoff to draw delays from.
    """

    backoff: Backoff = field(default_factory=Backoff)
    #: Consecutive unproductive connections (the backoff attempt of the next plan).
    attempt: int = 0
    #: Consecutive connections that ended in a contract breach.
    violations: int = 0

    def plan(self, outcome: ConnectionOutcome) -> ReconnectPlan:
        """The plan after ``outcome``; updates the attempt and violation counters."""
        label = outcome.label
        server_delay = (
            None
            if outcome.server_delay_ms is None
            else min(outcome.server_delay_ms / 1000, MAX_SERVER_DELAY_S)
        )
        if outcome.kind == "released":
            # a lease given back is no failure: reconnect as soon as there is work (and not before
            # a retry delay the gateway named has passed)
            return ReconnectPlan(PlanKind.WHEN_NEEDED, server_delay or 0.0, self.attempt, label, server_delay)
        if outcome.decided or outcome.duration >= HEALTHY_CONNECTION_S:
            self.attempt = 0
        self.violations = self.violations + 1 if outcome.kind == "violation" else 0
        if self.violations >= MAX_CONSECUTIVE_VIOLATIONS:
            return self._stop(
                label, f"the gateway broke the protocol on {self.violations} connections in a row"
            )
        if outcome.kind == "refused" and not outcome.retryable:
            return self._stop(label, "the gateway refused the upgrade and would refuse it again")
        code = outcome.close_code
        if (
            outcome.kind == "closed"
            and code in _FINAL_CLOSE_CODES
            and outcome.goodbye_reason is None
            and outcome.fatal_code not in _TRANSIENT_FATAL_CODES
        ):
            return self._stop(
                label, f"the gateway closed the stream with code {code}: a reconnect would repeat it"
            )
        kind = PlanKind.RECONNECT
        if (
            outcome.kind == "closed"
            and code == CloseCode.NORMAL_CLOSURE
            and (outcome.goodbye_reason is None or outcome.goodbye_reason in _WHEN_NEEDED_GOODBYES)
        ) or (outcome.kind == "recycled" and outcome.goodbye_reason in _WHEN_NEEDED_GOODBYES):
            # an idle or lifetime goodbye: come back when there is work, whoever closed after it
            # (the client does when the gateway did not: Recycle.CLOSE_EXPECTED)
            kind = PlanKind.WHEN_NEEDED
        if outcome.released and outcome.kind != "violation":
            # given back as it ended for another reason: the release still holds, so come back
            # when there is work, after the backoff
            kind = PlanKind.WHEN_NEEDED
        if not outcome.work_left:
            # everything was acknowledged (and, on_change, decided): a new connection now would
            # only replay a settled state, and on_change its start dispatches that state again —
            # a second decision and, where the service cannot replay the first reply, a second
            # bill. Come back with the next change or decision asked for.
            kind = PlanKind.WHEN_NEEDED
        attempt = self.attempt
        delay = self.backoff.delay(attempt, server_delay)
        self.attempt += 1
        return ReconnectPlan(kind, delay, attempt, label, server_delay)

    def _stop(self, label: str, why: str) -> ReconnectPlan:
        return ReconnectPlan(PlanKind.STOP, 0.0, self.attempt, label, final=why)
