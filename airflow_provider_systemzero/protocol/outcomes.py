"""Who waits for a decision, and what has been decided, across connections.

A session numbers the caller's accepted changes (*generations*). :class:`Outcomes` keeps, per
session:

* the **intents**: callers waiting for a decision about generation *g* or later;
* the newest generation any connection **acknowledged**;
* the newest generation **settled** (on_change: a decision covered it, or its dispatch failed for
  good, so the gateway will not dispatch it again);
* the **last decision** and the generation it covers, and a **final failure** and the generation
  it settled — so a caller asking about a state already decided (or already failed) is answered
  at once instead of waiting for a dispatch that will never come.

When the caller returns to a state the gateway already holds, the session *adopts* the new
generation as the old one (:meth:`Outcomes.adopt`): whatever covered the old one covers it too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from airflow_provider_systemzero.protocol.messages import Error
from airflow_provider_systemzero.protocol.reply import DecisionResult

__all__ = ["Intent", "Outcomes"]


@dataclass(slots=True)
class Intent:
    """A caller waiting for a decision about generation ``generation`` or later."""

    intent_id: int
    generation: int


@dataclass(slots=True)
class Outcomes:
    """Intents and settled generations of one session (see the module docstring)."""

    intents: list[Intent] = field(default_factory=list)
    #: The newest generation any connection acknowledged.
    acked: int = -1
    #: The newest generation a decision or a final failure settled.
    settled: int = -1
    #: The last decision received, on any connection, and the generation it covers.
    last_decision: DecisionResult | None = None
    decided: int = -1
    #: The last final (non-retryable) dispatch failure and the generation it settled.
    final_failure: Error | None = None
    failed: int = -1
    #: Whether that failure was reported as the current state's (``decisions()`` raised it): one
    #: about a state changed since is reported when the caller returns to its state.
    failure_reported: bool = False
    _next_id: int = 0

    def request(self, generation: int) -> int:
        """A new intent for ``generation``; returns its ID."""
        self._next_id += 1
        self.intents.append(Intent(self._next_id, generation))
        return self._next_id

    def cancel(self, intent_id: int) -> None:
        """Forget an intent (its waiter gave up)."""
        self.intents = [i for i in self.intents if i.intent_id != intent_id]

    def oldest_wanted(self) -> int | None:
        """The lowest generation an intent waits for, or ``None``."""
        return min((i.generation for i in self.intents), default=None)

    def resolve(self, generation: int) -> tuple[int, ...]:
        """Remove and return the intents a decision (or a final failure) about ``generation``
        answers: those asked about it or an older one."""
        done = tuple(i.intent_id for i in self.intents if i.generation <= generation)
        if done:
            self.intents = [i for i in self.intents if i.generation > generation]
        return done

    def fail_through(self, generation: int) -> tuple[int, ...]:
        """Remove and return the intents a final failure about ``generation`` answers: those
        asked about it or an older one. An intent asked about a newer generation still waits for
        a dispatch of its own (``-1``, a generation not known: every intent is answered)."""
        if generation < 0:
            generation = max((i.generation for i in self.intents), default=-1)
        return self.resolve(generation)

    def acknowledged(self, generation: int) -> None:
        """A connection acknowledged ``generation``."""
        self.acked = max(self.acked, generation)

    def decision(self, result: DecisionResult, generation: int) -> tuple[int, ...]:
        """A decision covering ``generation`` arrived; returns the intents it answers."""
        self.last_decision = result
        self.decided = generation
        self.settled = max(self.settled, generation)
        return self.resolve(generation)

    def failed_for_good(self, error: Error, generation: int, *, reported: bool) -> None:
        """The dispatch of ``generation`` failed and nobody will retry it.

        :param reported: it was reported as the current state's failure.
        """
        self.settled = max(self.settled, generation)
        self.failed, self.final_failure = generation, error
        self.failure_reported = reported

    def adopt(self, previous: int, current: int, *, decided_here: bool) -> tuple[int, ...]:
        """``current`` holds the same state as the acknowledged ``previous``: it inherits what
        settled ``previous``. Returns the intents the last decision now answers (a final failure
        of ``previous`` answers them through :meth:`inherited_failure`).

        :param decided_here: the last decision covered ``previous`` on the connection that holds it.
        """
        self.acknowledged(current)
        if self.failed == previous:
            self.failed = current
        if self.settled == previous:
            self.settled = current
        if decided_here and self.decided == previous and self.last_decision is not None:
            self.decided = current
            return self.resolve(current)
        return ()

    def inherited_failure(self, current: int) -> tuple[Error, tuple[int, ...], bool] | None:
        """After :meth:`adopt`: when ``current`` inherited a final failure, the failure, the
        intents it now answers (nothing will dispatch that state again) and whether it was not
        yet reported as the current state's (it is now); ``None`` otherwise."""
        if self.failed != current or self.final_failure is None:
            return None
        report = not self.failure_reported
        self.failure_reported = True
        return self.final_failure, self.resolve(current), report

    def current_decision(self, generation: int) -> DecisionResult | None:
        """The last decision if it covers ``generation``."""
        return self.last_decision if self.decided == generation else None

    def current_failure(self, generation: int) -> Error | None:
        """The final failure if it settled ``generation``."""
        return self.final_failure if self.failed == generation else None
