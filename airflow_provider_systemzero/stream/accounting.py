"""What a stream's dispatches cost its budget: one connection's accounting, apart from the I/O.

A :class:`~airflow_provider_systemzero.stream.decision_stream.DecisionStream` asks
:class:`DispatchAccounting` before it writes anything that can start a dispatch at the gateway
(on_change: every mutation; on_request: ``decide``) and tells it what the gateway answered. The
accounting knows which dispatches the gateway may still make for this connection — at most one in
flight plus one pending (WIRE.md §4) — and keeps the budget's holds and counts in step. A lost
connection may leave a dispatch behind that was billed but never seen: it is counted as one
unconfirmed decision.

The budget is the pure :class:`~airflow_provider_systemzero.decisions.budget.DecisionBudget`,
imported as it is: the decisions layer imports nothing of the stream, so the import goes one way.
"""

from __future__ import annotations

import time

from airflow_provider_systemzero.decisions.budget import BudgetExceeded, DecisionBudget
from airflow_provider_systemzero.protocol.limits import MAX_DISPATCHES_PER_STREAM
from airflow_provider_systemzero.protocol.messages import Ack, ClientMessage, Decide, Error, event_number
from airflow_provider_systemzero.protocol.reply import DecisionResult

__all__ = ["DispatchAccounting"]


class DispatchAccounting:
    """One stream's dispatches against its budget.

    :param budget: the budget asked and charged.
    :param decision_mode: the stream's decision mode.
    :param holder: the budget's name for this stream's holds (the stream's ``id``).
    """

    def __init__(self, budget: DecisionBudget, decision_mode: str, holder: int) -> None:
        self.budget = budget
        #: Whether the stream decides on request (one ``decide`` at a time) rather than on change.
        self.on_request = decision_mode == "on_request"
        self.holder = holder
        #: on_change: event numbers of this connection's mutations not yet covered by a decision.
        self._uncovered: list[int] = []
        #: on_request: a ``decide`` was sent and not yet settled.
        self._decide_in_flight = False
        #: version → decide body bytes (from acks), for token estimates.
        self._body_bytes: dict[int, int] = {}
        #: Since when (``time.monotonic()``) the gateway owes this connection a decision: the
        #: first dispatch admitted while none was outstanding, or the last answer that left one
        #: outstanding; ``None`` when none is.
        self.waiting_since: float | None = None
        #: What may still be dispatched was counted as one unconfirmed decision while the
        #: connection is open (:meth:`settle`): its end does not count it again, and the next
        #: decision takes its place instead of adding one.
        self._settled_ahead = False

    def outstanding(self) -> int:
        """Dispatches the gateway may still make for what this connection sent (not yet settled)."""
        if self.on_request:
            return 1 if self._decide_in_flight else 0
        return min(len(self._uncovered), MAX_DISPATCHES_PER_STREAM)

    def _answered(self) -> None:
        """The gateway answered (or the connection ended): a wait still owed starts now."""
        self.waiting_since = time.monotonic() if self.outstanding() else None

    def _hold(self, body_bytes: int | None = None) -> None:
        if self.budget.windows:
            largest = max(self._body_bytes.values(), default=0) if body_bytes is None else body_bytes
            self.budget.hold(self.holder, self.outstanding(), largest)

    def admit(self, message: ClientMessage, desired_body_bytes: int) -> BudgetExceeded | None:
        """Before writing ``message``: ``None`` when it may go (the dispatch is now expected), else
        the refusal (recorded once in the budget).

        :param desired_body_bytes: the decide body size of the desired state (for a mutation).
        """
        budget = self.budget
        if isinstance(message, Decide):
            potential = 1
            body_bytes = self._body_bytes.get(message.state_version)
        else:
            potential = min(len(self._uncovered) + 1, MAX_DISPATCHES_PER_STREAM)
            body_bytes = desired_body_bytes if budget.estimates_tokens else None
        refused = budget.check(potential, body_bytes, holder=self.holder) if budget.limited else None
        if refused is not None:
            budget.record_exceeded(refused)
            return refused
        if isinstance(message, Decide):
            self._decide_in_flight = True
        else:
            self._uncovered.append(event_number(message.event_id))  # type: ignore[attr-defined]
        if self.waiting_since is None:
            self.waiting_since = time.monotonic()
        self._hold(body_bytes)
        return None

    def acknowledged(self, ack: Ack) -> None:
        """A mutation was accepted; without ``scheduled`` (a gateway shutting down) no dispatch follows."""
        self._body_bytes[ack.state_version] = ack.synthesized_body_bytes
        if not self.on_request and not ack.scheduled:
            self._not_dispatched(ack.event_id)
            self._settled_unbilled()

    def decided(self, result: DecisionResult) -> bool:
        """A decision arrived; returns whether it counts as billed (a new reply id)."""
        version = result.state_version
        confirms, self._settled_ahead = self._settled_ahead, False
        billed = self.budget.record_decision(
            result.reply_id, result.reply.get("usage"), self._body_bytes.get(version), confirms=confirms
        )
        if confirms and not billed:
            self.budget.withdraw_unconfirmed(1)  # a replay: what settle counted cost nothing
        if self.on_request:
            self._decide_in_flight = False
        else:
            self._uncovered = [e for e in self._uncovered if e > version]
        self._body_bytes = {v: b for v, b in self._body_bytes.items() if v >= version}
        self._answered()
        self._hold()
        return billed

    def failed(self, error: Error, *, retryable: bool) -> None:
        """A dispatch failed; what the gateway will not dispatch again is no longer outstanding."""
        self.budget.record_failure()
        if self.on_request:
            self._decide_in_flight = False
        elif error.fatal or not retryable:
            version = error.state_version
            self._uncovered = (
                [] if error.fatal or version is None else [e for e in self._uncovered if e > version]
            )
        self._answered()
        self._settled_unbilled()
        self._hold()

    def refused(self, error: Error) -> None:
        """The gateway refused what :meth:`admit` let through, so nothing is dispatched for it: a
        mutation rejected for now (it is admitted again when it is sent again), or, on_request, a
        ``decide`` refused (``stale_state_version``, ``shutting_down``)."""
        if error.event_id is not None:
            self._not_dispatched(error.event_id)
        elif self.on_request:
            self._decide_in_flight = False
            self.waiting_since = None
        self._settled_unbilled()
        self._hold()

    def _not_dispatched(self, event_id: str) -> None:
        """No dispatch follows the mutation ``event_id`` (its ack scheduled none, or it was
        rejected): it is not owed a decision."""
        number = event_number(event_id)
        self._uncovered = [e for e in self._uncovered if e != number]
        if not self.outstanding():
            self.waiting_since = None

    def _settled_unbilled(self) -> None:
        """What :meth:`settle` counted was answered without a bill (a failure, a refusal, an ack
        that schedules nothing) and nothing else may still be dispatched: the unconfirmed decision
        is taken back."""
        if self._settled_ahead and not self.outstanding():
            self._settled_ahead = False
            self.budget.withdraw_unconfirmed(1)

    def settle(self) -> bool:
        """Count what the gateway may still dispatch for this connection as one unconfirmed
        decision now, while it is open (a caller reports its usage before the close); returns
        whether one was counted. Counted once: the connection's end does not count it again, a
        decision that still arrives takes its place, and an unbilled answer (a replayed reply, a
        failure or refusal leaving nothing outstanding) takes it back."""
        if self._settled_ahead or not self.outstanding():
            return False
        self.budget.record_unconfirmed(1)
        self._settled_ahead = True
        return True

    def connection_ended(self) -> bool:
        """The connection is gone; returns whether a dispatch may have been left behind (counted as
        one unconfirmed decision, unless :meth:`settle` already did)."""
        unconfirmed = self.outstanding() > 0 and not self._settled_ahead
        if unconfirmed:
            self.budget.record_unconfirmed(1)
        self._settled_ahead = False
        self._uncovered = []
        self._decide_in_flight = False
        self._body_bytes = {}
        self.waiting_since = None
        self._hold()
        return unconfirmed
