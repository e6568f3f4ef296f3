"""The process's decision starts per account: the asyncio side of :mod:`~airflow_provider_systemzero.protocol.starts`.

Every :class:`~airflow_provider_systemzero.stream.decision_stream.DecisionStream` of a process that
talks to one gateway with one API key shares one :class:`DecisionStarts` (looked up with
:func:`decision_starts`, keyed by the stream URL and a non-secret fingerprint of the key, per event
loop). The stream asks it before it writes anything that starts a decision (its dispatch gate), and
before it opens a connection whose ``start`` will (on_change), and tells it how each start ended;
the shared :class:`~airflow_provider_systemzero.protocol.starts.StartQueue` — the mirror of the
account's bucket — decides who goes next, and this adapter wakes that stream when its time comes:
one timer per account, never a loop per stream.

Nothing here keeps the event loop: a sync ``SystemZeroHook.decide()`` runs each call on a loop of
its own, and once that loop is closed and dropped, it is collected with what it held here.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import weakref
from collections.abc import Callable
from typing import Any

from airflow_provider_systemzero.protocol.limits import Limits
from airflow_provider_systemzero.protocol.messages import Error
from airflow_provider_systemzero.protocol.starts import StartQueue

__all__ = ["DecisionStarts", "decision_starts", "key_fingerprint", "running_starts"]

log = logging.getLogger(__name__)


def key_fingerprint(api_key: str) -> str:
    """A short, non-secret tag of an API key (12 hex digits of its SHA-256): streams with the same
    key share the account's starts; the key itself is never kept."""
    return hashlib.sha256(api_key.strip().encode("utf-8")).hexdigest()[:12]


def _now() -> float:
    return asyncio.get_running_loop().time()


class DecisionStarts:
    """One account's decision starts in this process (on the running event loop).

    It holds no reference to its loop (the loop's time is read when asked), so a loop that ends is
    collected even while this object is kept for it.

    :param label: how the log names the account (the gateway URL and the key's fingerprint).
    :param now: the loop's time when it is made.
    """

    def __init__(self, label: str, now: float) -> None:
        self.label = label
        self.queue = StartQueue(now=now)
        self._wake: dict[Any, Callable[[], None]] = {}
        #: the one timer, weakly: the loop holds it while it is scheduled, and a timer holds its loop
        self._timer: weakref.ref[asyncio.TimerHandle] | None = None

    def adopt(self, limits: Limits) -> None:
        """A ``hello``: the account's burst and ceiling it advertises (the published ones if none).

        :param limits: the connection's limits.
        """
        queue = self.queue
        before = (queue.burst, queue.ceiling)
        queue.adopt(limits.account_decision_burst, limits.account_decision_ceiling_per_minute, _now())
        if (queue.burst, queue.ceiling) != before:
            log.info(
                "the gateway advertises the account's decision limits (%s): %d starts at once, %d a minute",
                self.label,
                queue.burst,
                round(queue.ceiling * 60),
            )
        self._schedule()

    def may_start(self, stream: Any, version: int, wake: Callable[[], None]) -> bool:
        """Asked before ``stream`` writes what starts a decision about ``version`` (or opens the
        connection whose ``start`` will).

        :param version: the stream's newest version (its session's generation: it grows across
            connections).
        :param wake: called (no arguments) when the stream's turn comes.
        :returns: whether it may go now; if not, ``wake`` is called when it may.
        """
        now = _now()
        if self.queue.request(stream, version, now):
            self._wake.pop(stream, None)
            return True
        first = stream not in self._wake
        self._wake[stream] = wake
        if first:
            log.info(
                "decision start waits its turn under the account's decision ceiling (%s): %d stream(s) "
                "of this process wait, next start in %.3f s",
                self.label,
                self.queue.waiting,
                max(0.0, (self.queue.wakeup(now) or now) - now),
            )
        self._schedule()
        return False

    def start_sent(self, stream: Any, version: int) -> None:
        """An on_change ``start`` that starts a decision about ``version`` goes out (it cannot be
        held once the connection is open): its token is the grant the stream waited for before
        opening, or one taken now (owed, if the mirror has none)."""
        now = _now()
        if not (self.queue.holds_grant(stream) and self.queue.request(stream, version, now)):
            self.queue.withdraw(stream)
            self.queue.note_start(now)
        self._wake.pop(stream, None)

    def postpone(self, stream: Any, version: int, *, counted: bool) -> None:
        """``stream``'s turn came, but its start cannot go out yet (its connection waits for a
        socket): the token goes back, and the stream is first in line when it asks again.

        :param version: the stream's newest version.
        :param counted: its turn was a start counted at once (not a grant it waited for).
        """
        self.queue.postpone(stream, version, _now(), counted=counted)
        self._wake.pop(stream, None)
        self._schedule()

    def changed(self, stream: Any, version: int) -> None:
        """``stream`` changed its state to ``version``: if it waits for a start, the start is
        for that one and its newest change counts from now."""
        self.queue.changed(stream, version, _now())

    def ended(self, stream: Any, error: Error | None, version: int, *, requeue: bool) -> None:
        """A start of ``stream`` ended: a decision arrived (``error`` ``None``) or it failed.

        :param version: the stream's newest version now.
        :param requeue: on a 429, put the stream back at the front (on_request: the client asks
            again); ``False`` when the gateway retries it itself (on_change).
        """
        now = _now()
        if error is None or error.http_status != 429:
            self.queue.accepted(now)
            return
        delay_ms = error.retry.retry_after_ms
        first = not self.queue.limited
        self.queue.refused(
            stream, version, None if delay_ms is None else delay_ms / 1000, now, requeue=requeue
        )
        if first:
            log.info(
                "the account's decision ceiling was reached (%s, 429 rate_limited): another process "
                "spends the account too; this one waits %.3f s, then starts at most one decision every "
                "%.3f s, longest waiting first, and less as long as the gateway refuses",
                self.label,
                max(0.0, self.queue.blocked_until - now),
                self.queue.pace,
            )
        self._schedule()

    def withdraw(self, stream: Any) -> None:
        """``stream`` wants no start any more (it closed, or its connection ended)."""
        self.queue.withdraw(stream)
        self._wake.pop(stream, None)
        self._schedule()

    def _schedule(self) -> None:
        timer = self._timer() if self._timer is not None else None
        if timer is not None:
            timer.cancel()
        self._timer = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        at = self.queue.wakeup(now)
        if at is not None:
            self._timer = weakref.ref(loop.call_at(max(at, now), self._fire))

    def _fire(self) -> None:
        self._timer = None
        now = _now()
        while (grant := self.queue.grant(now)) is not None:
            wake = self._wake.pop(grant.stream, None)  # a stream requeued by a 429 is woken by asking again
            log.debug("decision start granted after %.3f s (%s)", grant.waited, self.label)
            if wake is not None:
                wake()
        self._schedule()


_BY_LOOP: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, str], DecisionStarts]] = (
    weakref.WeakKeyDictionary()
)


def decision_starts(url: str, api_key: str) -> DecisionStarts:
    """The running loop's :class:`DecisionStarts` for the account behind ``api_key`` at ``url``.

    :param url: the gateway's stream URL.
    :param api_key: the account's key (only its fingerprint is kept).
    """
    loop = asyncio.get_running_loop()
    fingerprint = key_fingerprint(api_key)
    per_loop = _BY_LOOP.setdefault(loop, {})
    starts = per_loop.get((url, fingerprint))
    if starts is None:
        starts = per_loop[(url, fingerprint)] = DecisionStarts(f"{url} key {fingerprint}", loop.time())
    return starts


def running_starts() -> list[DecisionStarts]:
    """Every account's :class:`DecisionStarts` on the running loop (what a process reports)."""
    return list(_BY_LOOP.get(asyncio.get_running_loop(), {}).values())
