"""The watch of a changing source: what is read, which decision is current, what to decide, when
to fire, and when to give the stream back — one explicit state machine, with no I/O and no clock.

Every wait on a System Zero decision about a changing state runs one :class:`SourceWatch`: the
sensor's trigger, the asset watcher's trigger, a poking sensor (one decide per poke), and the
operator's trigger (one decision about a fixed state). What runs it (an asyncio driver in the
triggerer, a loop of pokes on a worker) does the I/O: it reads the source, opens and closes
streams, sends states, asks for decisions and runs ``decide_when`` callables, and feeds what
happened back in. The watch answers, in one place, the three questions a wait keeps asking:

**Is this decision about the state the source holds now?** (:meth:`SourceWatch.current`)
    Each read of the source that differs from the one before is a new *generation*. A decision
    covers the state the stream held when it was decided; it is *current* only when that is the
    newest generation read — so only a current decision may fire, count toward ``consecutive``
    or ``min_true_for``, or end a hold. The one exception is the documented ``max_staleness``
    hold: while a decision is in flight, a newer state of the source may wait (not sent) for at
    most ``max_staleness`` seconds when the source changes faster than decisions take (two
    decisions in a row came back superseded) or, with ``decide_when``, when the newer change does
    not match it; a decision that comes back within that time is current without the held
    content. A read under way is waited for before a decision is judged (the driver's rule).

**May this stream be given back?** (:meth:`SourceWatch.owes_nothing`)
    A stream *owes nothing* when no decision is in flight or wanted, nothing read is unsent or
    held, and no ``decide_when`` check is under way. From that moment it offers its slot to any
    trigger waiting for one (given back at once when one asks) and is given back after
    ``lease_after`` quiet seconds. A watch opens a stream only when it wants a decision (or keeps
    one always, with ``lease=False``): a trigger whose initial state is not decided
    (``decide_initial=False``) holds no stream until a change makes a decision due.

**What is read next, and what is done with it?** (:meth:`SourceWatch.actions`)
    The driver reads the source whenever it may have changed, in every phase, and hands each
    read to :meth:`SourceWatch.read`. The watch returns what to do now as :data:`Action` values
    (open, send, decide, check, offer, withdraw, release, fire) and when to look again
    (:meth:`SourceWatch.next_wakeup`); it never asks twice for what is under way, and once it
    returned nothing it returns nothing until an input or the time changes (no spin).

The phases of the stream a watch holds (:class:`Phase`) and their legal moves
(:data:`TRANSITIONS`) are the whole lifecycle; every move is checked against the table. The
verdict itself — the condition, its policy, skip states, hysteresis, once per run — is the
:class:`~airflow_provider_systemzero.decisions.watch.VerdictRules` the watch is given (or
:class:`FirstDecision` for an operator); when a ``decide_when`` or ``debounce_ms`` decision is due is
the :class:`~airflow_provider_systemzero.decisions.relevance.DecisionDebounce`'s.
"""

from __future__ import annotations

import enum
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from airflow_provider_systemzero.decisions.relevance import DecisionDebounce, Relevance
from airflow_provider_systemzero.decisions.timeline import DecisionTimeline
from airflow_provider_systemzero.deprecations import warn_once
from airflow_provider_systemzero.durations import is_seconds
from airflow_provider_systemzero.exceptions import SystemZeroArgumentError
from airflow_provider_systemzero.protocol.reply import DecisionResult
from airflow_provider_systemzero.protocol.state import same_json

__all__ = [
    "DEFAULT_MAX_STALENESS",
    "STARVED_AFTER",
    "TRANSITIONS",
    "Action",
    "Check",
    "Decide",
    "EveryDecision",
    "Fire",
    "FirstDecision",
    "Judged",
    "Offer",
    "Open",
    "Phase",
    "Release",
    "Rules",
    "Send",
    "SourceWatch",
    "Withdraw",
    "validate_max_staleness",
]

log = logging.getLogger(__name__)

#: Default ``max_staleness``: seconds a newer state may be held back while a decision is in flight.
DEFAULT_MAX_STALENESS = 30.0
#: Decisions superseded in a row after which the source counts as changing faster than decisions
#: take, and its newer states are held back while a decision is in flight.
STARVED_AFTER = 2

#: What :attr:`SourceWatch.latest` and :attr:`SourceWatch.sent` are before any state (no state equals it).
_NOTHING: Any = object()


def validate_max_staleness(value: Any) -> float:
    """``max_staleness`` as a float.

    :param value: seconds (``0`` never holds a change back).
    :raises SystemZeroArgumentError: naming the field and the fix.
    """
    if not is_seconds(value, at_most=3600):
        raise SystemZeroArgumentError(
            f"max_staleness must be a number of seconds from 0 to 3600, got {value!r}: pass how long "
            "a newer state of the source may wait while a decision is in flight (0: never)",
            code="invalid_max_staleness",
            field="max_staleness",
        )
    return float(value)


# ------------------------------------------------------------------------------------ phases


class _PhaseType(enum.EnumType):
    """Answers the phase's name before 0.2 (``HOLDING``), warning once."""

    def __getattr__(cls, name: str) -> Any:
        if name == "HOLDING":
            warn_once("Phase.STREAMING", "Phase.STREAMING")
            return cls.STREAMING  # type: ignore[attr-defined]
        raise AttributeError(f"type object {cls.__name__!r} has no attribute {name!r}")


class Phase(enum.Enum, metaclass=_PhaseType):
    """Where a watch is with its stream."""

    #: The first read of the source is under way: nothing is known, nothing is wanted.
    STARTING = "starting"
    #: No stream. The watch waits for the source to change, or for time (``min_interval_ms``,
    #: ``debounce_ms``, a hysteresis run's ``min_true_for``).
    DORMANT = "dormant"
    #: A stream is being opened (a slot of ``max_streams_per_process``, the connection, the
    #: ``start``'s acknowledgement). What the source gives meanwhile becomes its desired state,
    #: so it opens with the newest state.
    OPENING = "opening"
    #: The stream is open: states are sent, decisions asked for and judged (``HOLDING`` before 0.2).
    STREAMING = "streaming"
    #: The stream is being given back (closed with 1000); the next one opens once it is closed.
    RELEASING = "releasing"
    #: The wait ended with a verdict (a sensor's, an operator's). Terminal.
    ENDED = "ended"


#: The legal phase changes. A stream lost or failed returns its watch to DORMANT (:meth:`SourceWatch.lost`).
TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.STARTING: frozenset({Phase.DORMANT}),
    Phase.DORMANT: frozenset({Phase.OPENING, Phase.ENDED}),
    Phase.OPENING: frozenset({Phase.STREAMING, Phase.DORMANT, Phase.ENDED}),
    Phase.STREAMING: frozenset({Phase.RELEASING, Phase.DORMANT, Phase.ENDED}),
    Phase.RELEASING: frozenset({Phase.DORMANT, Phase.ENDED}),
    Phase.ENDED: frozenset(),
}

#: The phases in which the watch has a stream (being opened, or open).
_WITH_STREAM = frozenset({Phase.OPENING, Phase.STREAMING})


# ------------------------------------------------------------------------------------ actions


@dataclass(frozen=True, slots=True)
class Open:
    """Build and enter a stream about :attr:`SourceWatch.sent` (read it when the stream is built:
    :class:`Send` s before that are already in it)."""


@dataclass(frozen=True, slots=True)
class Send:
    """Make ``state`` the stream's desired state (the stream sends the minimal change)."""

    state: Any


@dataclass(frozen=True, slots=True)
class Decide:
    """on_request: ask for a decision about the stream's desired state; feed it to
    :meth:`SourceWatch.decided`."""


@dataclass(frozen=True, slots=True)
class Check:
    """Run the ``decide_when`` callable on the change from ``previous`` to ``new`` (on a thread of
    its own); feed the answer to :meth:`SourceWatch.checked`."""

    previous: Any
    new: Any


@dataclass(frozen=True, slots=True)
class Offer:
    """Offer the stream's slot to a trigger waiting for one; feed the ask to :meth:`SourceWatch.slot_wanted`."""


@dataclass(frozen=True, slots=True)
class Withdraw:
    """Withdraw the offer of the stream's slot (the stream owes something again)."""


@dataclass(frozen=True, slots=True)
class Release:
    """Give the stream back (close 1000); feed the end of the close to :meth:`SourceWatch.released`."""

    reason: str


@dataclass(frozen=True, slots=True)
class Fire:
    """The verdict that ends the wait (a sensor's, an operator's) or makes an event (an asset watch)."""

    verdict: Any


#: What :meth:`SourceWatch.actions` returns.
Action = Open | Send | Decide | Check | Offer | Withdraw | Release | Fire


# ------------------------------------------------------------------------------------ verdicts


class Rules(Protocol):
    """What ends a wait, decision by decision (the watch feeds it current decisions only).

    :class:`~airflow_provider_systemzero.decisions.watch.VerdictRules` is the condition's;
    :class:`FirstDecision` an operator's.
    """

    def observe(
        self, decision: DecisionResult, state_key: str, state: Any, now: float, *, generation: int
    ) -> Any:
        """Take a current decision (about the state of ``generation``); return the verdict when the
        wait ends, else ``None``."""

    def due(self, now: float) -> Any:
        """The verdict when only time was missing and it passed, else ``None``."""

    def wait_time(self, now: float) -> float | None:
        """Seconds until only time can end the wait (``None``: nothing waits on time)."""


class FirstDecision:
    """An operator's rules: the first current decision is the answer."""

    def observe(
        self, decision: DecisionResult, state_key: str, state: Any, now: float, *, generation: int
    ) -> Any:
        return decision

    def due(self, now: float) -> Any:
        return None

    def wait_time(self, now: float) -> float | None:
        return None


@dataclass(frozen=True, slots=True)
class Judged:
    """A current decision with what the rules of a wait judge it by (the arguments of
    :meth:`Rules.observe`): the verdict of :class:`EveryDecision`.

    :param decision: the decision.
    :param state_key: the hash of the state it covers.
    :param state: that state.
    :param generation: the state's generation in the watch of its source.
    """

    decision: DecisionResult
    state_key: str
    state: Any
    generation: int


class EveryDecision:
    """The rules of a watch that decides for other waits (the shared stream of several asset
    watches): every current decision is a verdict, :class:`Judged`, which each wait judges by its
    own rules; nothing waits on time here (a hold's time is each wait's own)."""

    def observe(
        self, decision: DecisionResult, state_key: str, state: Any, now: float, *, generation: int
    ) -> Judged:
        return Judged(decision, state_key, state, generation)

    def due(self, now: float) -> Any:
        return None

    def wait_time(self, now: float) -> float | None:
        return None


# ------------------------------------------------------------------------------------ the watch


class SourceWatch:
    """One wait's watch of a changing source (see the module docstring).

    :param rules: what ends the wait (:class:`~airflow_provider_systemzero.decisions.watch.VerdictRules`,
        or :class:`FirstDecision`); kept across the watch's streams.
    :param decision_mode: the stream's mode: ``on_change`` (every state sent is decided by the
        gateway) or ``on_request`` (the watch asks, :class:`Decide`); with a ``debounce`` always
        ``on_request``.
    :param debounce: when the next decision starts: the ``decide_when`` / ``debounce_ms`` /
        ``decide_initial`` timing (``None``: every new state is decided).
    :param relevance: the compiled ``decide_when`` (``None``: every change is relevant); a regular
        expression is matched here, a callable by the driver (:class:`Check`).
    :param lease: give a stream that owes nothing back (``False``: open one as soon as there is
        something to stream, and keep it).
    :param lease_after: quiet seconds before a stream that owes nothing is given back.
    :param max_staleness: the hold's bound (see the module docstring; ``0``: never hold).
    :param min_interval: seconds between the last decision and the next stream's opening.
    :param once: the first :class:`Fire` ends the watch (a sensor, an operator); ``False``: an asset
        watch, which fires again on its rules' next verdict.
    :param timeline: the wait's history (the rules record the decisions they judge; the watch adds
        the superseded ones, the state changes and the streams opened and given back); ``None``:
        none is kept.
    :param question: the watched question (what a superseded decision's row records).
    :param clock: the history's wall clock (epoch seconds); the rules of the watch run on the
        ``now`` each call is given.
    """

    # one per waiting trigger, and a triggerer holds thousands: no per-instance __dict__
    __slots__ = (
        "_checked",
        "_checking",
        "_clock",
        "_generations",
        "_offered",
        "_parked",
        "_said_opening",
        "_verdict",
        "_wanted",
        "decided_at",
        "decided_state",
        "deciding",
        "decision_mode",
        "debounce",
        "held_since",
        "judged_gen",
        "latest",
        "latest_gen",
        "latest_withheld",
        "lease",
        "lease_after",
        "max_staleness",
        "min_interval",
        "once",
        "phase",
        "question",
        "quiet_since",
        "relevance",
        "rules",
        "sent",
        "sent_gen",
        "stale_in_a_row",
        "timeline",
    )

    def __init__(
        self,
        rules: Rules,
        *,
        decision_mode: str = "on_change",
        debounce: DecisionDebounce | None = None,
        relevance: Relevance | None = None,
        lease: bool = True,
        lease_after: float = 5.0,
        max_staleness: float = DEFAULT_MAX_STALENESS,
        min_interval: float = 0.0,
        once: bool = True,
        timeline: DecisionTimeline | None = None,
        question: str | None = None,
        clock: Callable[[], float] = time.time,
        gate: DecisionDebounce | None = None,
    ) -> None:
        if gate is not None:  # its name before 0.2
            warn_once("SourceWatch(gate=...)", "SourceWatch(debounce=...)")
            debounce = debounce or gate
        if debounce is not None and decision_mode != "on_request":
            raise ValueError("a debounce (decide_when, debounce_ms, decide_initial=False) decides on request")
        self.rules = rules
        self.decision_mode = decision_mode
        self.debounce = debounce
        self.relevance = relevance
        self.lease = lease
        self.lease_after = lease_after
        self.max_staleness = max_staleness
        self.min_interval = min_interval
        self.once = once
        self.timeline = timeline
        self.question = question
        self._clock = clock
        #: where the watch is with its stream
        self.phase = Phase.STARTING

        # -- the source
        #: the newest state read, whether it holds something to decide, and its generation: each
        #: read that differs from the one before is a new generation (a read equal to what the
        #: stream holds takes that generation back)
        self.latest: Any = _NOTHING
        self.latest_withheld = False
        self.latest_gen = 0
        self._generations = 0

        # -- decide_when
        #: the state the last ``decide_when`` verdict reached (the ``previous`` of the next change)
        self._checked: Any = _NOTHING
        #: the state whose callable check is under way (``_NOTHING``: none)
        self._checking: Any = _NOTHING

        # -- the stream
        #: the state handed to the stream (kept after it is given back: a read equal to it is no
        #: change) and its generation
        self.sent: Any = _NOTHING
        self.sent_gen = 0
        #: a decision about the stream's state is owed: on_change, the gateway decides every state
        #: sent (and the one a stream opens with); on_request, a decide is in flight
        self.deciding = False
        #: when the newest read started waiting unsent while a decision is in flight (the hold)
        self.held_since: float | None = None
        #: decisions superseded in a row (:data:`STARVED_AFTER` of them: the source is starved)
        self.stale_in_a_row = 0

        # -- the verdict
        #: the generation of the newest current decision (0: none), the state it covered, and when
        #: it came
        self.judged_gen = 0
        self.decided_state: Any = None
        self.decided_at = -math.inf
        #: the verdict of the decision just judged, fired by the next :meth:`actions`
        self._verdict: Any = None
        #: the newest decision about the state the stream holds that was not current when it came
        #: (the source had moved on, unsent): judged if the source comes back to that state
        self._parked: tuple[DecisionResult, str] | None = None

        # -- the lease
        #: since when the open stream has owed nothing (``None``: it owes something)
        self.quiet_since: float | None = None
        #: the stream being opened took a newer state (said once per opening)
        self._said_opening = False
        #: its slot is offered, and a waiting trigger asked for it
        self._offered = False
        self._wanted = False

    # ------------------------------------------------------------------ phases

    def _move(self, phase: Phase) -> None:
        if phase not in TRANSITIONS[self.phase]:
            raise RuntimeError(f"a source watch cannot go from {self.phase.value} to {phase.value}")
        self.phase = phase

    @property
    def read_state(self) -> Any:
        """The newest state read from the source (``None`` before the first read)."""
        return None if self.latest is _NOTHING else self.latest

    @property
    def ended(self) -> bool:
        """Whether the wait ended (a verdict fired, and the watch fires once)."""
        return self.phase is Phase.ENDED

    # ------------------------------------------------------------------ the rules, once each

    def current(self, gen: int, now: float) -> bool:
        """Whether a decision about generation ``gen`` is about the state the source holds now.

        The newest generation read is current. The one exception (``max_staleness``): while the
        newest read waits unsent behind a decision in flight, the state the stream holds counts
        as current for at most ``max_staleness`` seconds from the start of the hold.
        """
        if gen <= 0:
            return False
        if gen == self.latest_gen:
            return True
        return (
            gen == self.sent_gen
            and self.held_since is not None
            and now - self.held_since < self.max_staleness
        )

    def owes_nothing(self, now: float) -> bool:
        """Whether the open stream may be given back: no decision in flight or wanted (now or once
        a debounce ends), nothing read unsent or held, and no ``decide_when`` check under way."""
        return (
            self.phase is Phase.STREAMING
            and not self.deciding
            and self.held_since is None
            and (self.latest_gen == self.sent_gen or self.latest_withheld)
            and self._checking is _NOTHING
            and not self._wants_decision(now, soon=True)
        )

    def wants_decision(self, now: float, *, soon: bool = False) -> bool:
        """Whether the newest state needs a decision now (``soon``: or once its debounce's quiet time
        ends): the liveness question a driver's next step answers.

        :param now: the loop's time.
        :param soon: count a relevant change still inside its quiet time as due.
        """
        return self._wants_decision(now, soon=soon)

    def _wants_decision(self, now: float, *, soon: bool = False) -> bool:
        """Whether the newest state needs a decision: it holds something to decide, no current
        decision is about it, and — with a debounce — one is due (a relevant change, after the quiet
        time; ``soon``: also before it ends), or a run of qualifying decisions waits on a state
        that has since changed (its last decision is no longer current, so the run can end only
        with a decision about the newest state)."""
        if self.latest is _NOTHING or self.latest_withheld or self.judged_gen == self.latest_gen:
            return False
        debounce = self.debounce
        if debounce is None:
            return True
        if debounce.pending:
            due = debounce.due_at()
            return soon or (due is not None and due <= now)
        return self.rules.wait_time(now) is not None

    def _holds(self, now: float) -> bool:
        """Whether the newest read waits unsent behind the decision in flight (the hold)."""
        if self.phase is not Phase.STREAMING or not self.deciding or self.max_staleness <= 0:
            return False
        if self.held_since is not None and now - self.held_since >= self.max_staleness:
            return False  # held long enough: it goes, and the decision in flight will be superseded
        if self.stale_in_a_row >= STARVED_AFTER:
            return True  # the source changes faster than decisions take
        if self.debounce is not None and self.relevance is not None:
            return not self.debounce.pending  # no change that matches decide_when since the decide began
        return False

    # ------------------------------------------------------------------ inputs

    def read(self, state: Any, now: float, *, withheld: bool = False) -> None:
        """The source was read: ``state`` is what it holds now.

        :param state: the state read (compared with the last read as JSON: ``1`` and ``True`` differ).
        :param now: when.
        :param withheld: it holds nothing to decide (a file without content): it is not sent or decided.
        """
        if self.phase is Phase.ENDED:
            return
        if self.phase is Phase.STARTING:
            self._move(Phase.DORMANT)
        if self.latest is not _NOTHING and same_json(state, self.latest):
            return
        self.latest, self.latest_withheld = state, withheld
        if self.sent is not _NOTHING and same_json(state, self.sent):
            self.latest_gen = self.sent_gen  # back to what the stream holds: nothing to send
            parked, self._parked = self._parked, None
            if parked is not None and not self.deciding and self.judged_gen != self.sent_gen:
                self._judge(*parked, now)  # the decision about it is current again
        else:
            self._generations += 1
            self.latest_gen = self._generations
        self._mark("state_change", generation=self.latest_gen, **({"withheld": True} if withheld else {}))
        if withheld:
            self.held_since = None  # nothing to decide now: no older state stands in for it
            if self._checked is _NOTHING:
                self._checked = state  # the first content is a change from it, as any other
        elif self._checked is _NOTHING:
            self._checked = state  # the first state: what the first change is matched against
        elif self.relevance is not None and not self.relevance.is_callable:
            self._judge_change(self.relevance.matches(self._checked, state), state, now)
        elif self.relevance is None and self.debounce is not None:
            self._judge_change(True, state, now)  # debounce_ms / decide_initial alone: every change counts
        if self.debounce is not None and self.debounce.pending and self.latest_gen == self.judged_gen:
            self.debounce.started()  # back to a state already decided: nothing is due for it
        if not withheld and self.latest_gen != self.sent_gen and self.held_since is None and self._holds(now):
            # it waits behind the decision in flight from now (the one exception of current())
            self.held_since = now
            log.info(
                "holding the source's newer state while the decision in flight comes back (at most %.1f s)",
                self.max_staleness,
            )

    def checked(self, relevant: bool, now: float) -> None:
        """The ``decide_when`` callable answered the :class:`Check` under way.

        :param relevant: the change matches (a decision is worth starting for it).
        """
        state, self._checking = self._checking, _NOTHING
        if state is not _NOTHING:
            self._judge_change(relevant, state, now)

    def _judge_change(self, relevant: bool, state: Any, now: float) -> None:
        debounce = self.debounce
        assert debounce is not None
        if not relevant:
            log.debug("a change does not match decide_when: no decision starts for it")
        waiting = debounce.pending
        debounce.changed(relevant, now)
        self._checked = state
        due = debounce.due_at()
        if debounce.quiet and debounce.pending and due is not None and due > now and not waiting:
            log.info("debounce: deciding once the source is quiet (in %.3f s at most)", due - now)

    def opened(self, now: float) -> None:
        """The stream opened (the gateway acknowledged its ``start``)."""
        self._move(Phase.STREAMING)
        self._said_opening = False
        self._mark("stream_opened")

    def decided(self, decision: DecisionResult, now: float, *, covers: bool, state_hash: str) -> None:
        """The stream's decision arrived.

        :param decision: the decision.
        :param covers: it covers the complete state the stream holds now (in sync, same
            connection, same version): it is about :attr:`sent`; otherwise about an older state.
        :param state_hash: the hash of the state it covers (when it ``covers``).
        """
        if self.phase is not Phase.STREAMING:
            return  # a stream given back, or a wait that ended: nothing of it counts
        if self._verdict is not None and self.once:
            return  # the wait ends with the verdict judged before it
        if covers or self.decision_mode == "on_request":
            self.deciding = False  # on_change: the gateway owes nothing more; on_request: the decide settled
        if not (covers and self.current(self.sent_gen, now)):
            # about the state the stream holds, which the source left unsent: kept, in case it returns
            self._parked = (decision, state_hash) if covers else None
            self._superseded(decision, state_hash if covers else None)
            self.stale_in_a_row += 1
            log.debug(
                "skipping the decision for version %s: the source changed since", decision.state_version
            )
            if self.stale_in_a_row == STARVED_AFTER and self.max_staleness > 0:
                log.info(
                    "%d decisions in a row were about an outdated state: the source changes faster "
                    "than a decision takes, so its newer state now waits (up to max_staleness=%.1f s) "
                    "while a decision is in flight",
                    self.stale_in_a_row,
                    self.max_staleness,
                )
            if self.debounce is not None and self.decision_mode == "on_request":
                self.debounce.again(now)  # the relevant change it was for still needs a current decision
            return
        if self.held_since is None:
            self.stale_in_a_row = 0  # the source was quiet while it was decided
        self._judge(decision, state_hash, now)

    def _judge(self, decision: DecisionResult, state_hash: str, now: float) -> None:
        """A current decision about the state the stream holds: the rules judge it."""
        self._parked = None
        self.judged_gen, self.decided_state, self.decided_at = self.sent_gen, self.sent, now
        verdict = self.rules.observe(decision, state_hash, self.sent, now, generation=self.sent_gen)
        if verdict is not None:
            self._verdict = verdict
        elif self.relevance is not None and self.rules.wait_time(now) is None:
            log.info("waiting for a change that matches decide_when (%s)", self.relevance.describe())

    def _superseded(self, decision: DecisionResult, state_hash: str | None) -> None:
        """Note a decision about a state the source no longer holds in the history."""
        if self.timeline is not None and self.question is not None:
            self.timeline.decision(
                decision,
                question=self.question,
                at=self._clock(),
                disposition="ignored",
                state_key=state_hash,
                current=False,
                generation=self.sent_gen if state_hash is not None else None,
                reason="the source changed since: a decision about a state it no longer holds",
            )

    def _mark(self, kind: str, **fields: Any) -> None:
        if self.timeline is not None:
            self.timeline.mark(kind, self._clock(), **fields)

    def slot_wanted(self, now: float) -> None:
        """A trigger waits for a slot and asked for this stream's (its offer was called)."""
        self._wanted = True

    def released(self, now: float) -> None:
        """The stream given back is closed."""
        if self.phase is Phase.RELEASING:
            self._move(Phase.DORMANT)

    def lost(self, now: float) -> None:
        """The work under way failed or was stopped (the driver stopped every piece of it and
        reports why): the stream ended without being given back, or a decision or a
        ``decide_when`` check failed. The watch goes on from what it read: see :meth:`_stop_work`
        for what this undoes and what it asks again."""
        if self.phase in _WITH_STREAM or self.phase is Phase.RELEASING:
            self._move(Phase.DORMANT)
        self._stop_work(now)

    def _stop_work(self, now: float) -> None:
        """The one rule of an end of work (a failure, a stream given back, the end of the wait):
        every mark of work the watch counted as started goes, and what that work was for is
        wanted again, so the newest state is decided as soon as the watch runs on.

        * a decision asked for (on_request) or owed by the gateway (on_change) will not come: no
          decision is in flight; with a debounce, the change it was asked for is pending again;
        * a ``decide_when`` check will not answer: the newest change is checked again;
        * a newer state held behind the decision in flight is held no longer, and the stream's
          quiet time, the offer of its slot and a waiter's ask for it end with the stream;
        * what is settled stays: what was read, the decisions judged (and a decision parked for a
          state the source may come back to), a verdict judged and not fired yet (it fires at the
          next :meth:`actions`), and the rules' run (hysteresis, whether it fired).

        The phase is the caller's (DORMANT after a failure, RELEASING, ENDED).
        """
        if self.deciding and self.decision_mode == "on_request" and self.debounce is not None:
            self.debounce.again(now)  # started for the pending change, which still needs a decision
        self.deciding = False
        self._checking = _NOTHING
        self.held_since = None
        self.quiet_since = None
        self._offered = self._wanted = False
        self._said_opening = False

    # ------------------------------------------------------------------ outputs

    def actions(self, now: float) -> list[Action]:
        """What to do now, in order; the watch counts each as done (or under way) once returned.

        Calling it again at the same time with no new input returns nothing (no spin).
        """
        out: list[Action] = []
        if self.phase in (Phase.ENDED, Phase.STARTING):
            return out
        # a verdict of the decision just judged, or of a run whose only lack was time (hysteresis),
        # judged on a current decision: with ``once`` nothing else matters after it
        verdict, self._verdict = self._verdict, None
        if verdict is None and self.rules.wait_time(now) is not None and self.current(self.judged_gen, now):
            verdict = self.rules.due(now)
        if verdict is not None:
            out.append(Fire(verdict))
            if self.once:
                if self._offered:
                    out.insert(0, Withdraw())
                self._move(Phase.ENDED)
                self._stop_work(now)
                return out
        # decide_when: a callable judges one change at a time (the newest against the last judged)
        self._check_next(out)
        if self.phase in _WITH_STREAM:
            self._send_newest(now, out)
            if self.phase is Phase.STREAMING:
                self._decide(now, out)
                self._lease(now, out)
        elif self.phase is Phase.DORMANT and self._should_open(now):
            self._move(Phase.OPENING)
            if self.sent is not _NOTHING:
                log.info("the source changed: opening a new stream to decide the new state")
            self._hand_newest()
            # on_change, the stream's opening state is decided by the gateway
            self.deciding = self.decision_mode == "on_change"
            out.append(Open())
        return out

    def _check_next(self, out: list[Action]) -> None:
        if (
            self.relevance is None
            or not self.relevance.is_callable
            or self._checking is not _NOTHING
            or self._checked is _NOTHING
            or self.latest_withheld
            or same_json(self.latest, self._checked)
        ):
            return
        self._checking = self.latest
        out.append(Check(self._checked, self.latest))

    def _send_newest(self, now: float, out: list[Action]) -> None:
        if self.latest_gen == self.sent_gen or self.latest_withheld:
            self.held_since = None
            return
        if self._holds(now):
            if self.held_since is None:
                self.held_since = now
                log.info(
                    "holding the source's newer state while the decision in flight comes back "
                    "(at most %.1f s)",
                    self.max_staleness,
                )
            return
        if self.held_since is not None and self.deciding:
            log.info(
                "no decision within max_staleness (%.1f s): sending the newer state; the decision in "
                "flight will be skipped as stale",
                self.max_staleness,
            )
        self.held_since = None
        if self.phase is Phase.OPENING and not self._said_opening:
            self._said_opening = True
            log.info("the source changed while the stream waits to open: it opens with the newest state")
        self._hand_newest()
        if self.decision_mode == "on_change":
            self.deciding = True  # the gateway decides every state sent
        out.append(Send(self.latest))

    def _hand_newest(self) -> None:
        """The newest read becomes the stream's state (sent, or the state a stream opens with): a
        decision parked for the state it held before is about another state from now on."""
        self.sent, self.sent_gen = self.latest, self.latest_gen
        self._parked = None

    def _decide(self, now: float, out: list[Action]) -> None:
        if (
            self.decision_mode != "on_request"
            or self.deciding
            or self.sent_gen != self.latest_gen
            or not self._wants_decision(now)
        ):
            return
        self.deciding = True
        if self.debounce is not None:
            self.debounce.started()
        out.append(Decide())

    def _should_open(self, now: float) -> bool:
        if self.latest is _NOTHING or self.latest_withheld:
            return False
        if not self.lease:
            return True  # the stream is kept: it opens as soon as there is something to stream
        return self._wants_decision(now, soon=True) and now >= self.decided_at + self.min_interval

    def _lease(self, now: float, out: list[Action]) -> None:
        if not self.lease:
            return
        if not self.owes_nothing(now):
            self.quiet_since = None
            self._wanted = False
            if self._offered:
                self._offered = False
                out.append(Withdraw())
            return
        if self.quiet_since is None:
            self.quiet_since = now
        reason = None
        if self._wanted:
            reason = "another stream waits for a slot"
        elif now >= self.quiet_since + self.lease_after:
            reason = f"nothing new for {self.lease_after:.1f} s"
        if reason is None:
            if not self._offered:
                self._offered = True
                out.append(Offer())
            return
        if self._offered:
            out.append(Withdraw())
        log.info("%s: giving the stream back until the state changes", reason)
        self._mark("stream_released", reason=reason)
        self._move(Phase.RELEASING)
        self._stop_work(now)
        out.append(Release(reason))

    def next_wakeup(self, now: float) -> float | None:
        """The next time :meth:`actions` may have something to do with no new input (``None``:
        only an input can change anything). Always later than ``now``: what is due now,
        :meth:`actions` has done, or waits for an input."""
        if self.phase in (Phase.ENDED, Phase.STARTING):
            return None
        times: list[float] = []
        wait = self.rules.wait_time(now)
        if wait is not None and self.current(self.judged_gen, now):
            times.append(now + wait)
        debounce = self.debounce
        if debounce is not None and debounce.pending:
            due = debounce.due_at()
            if due is not None:
                times.append(due)
        if self.held_since is not None:
            times.append(self.held_since + self.max_staleness)
        if self.phase is Phase.STREAMING and self.lease and self.quiet_since is not None:
            times.append(self.quiet_since + self.lease_after)
        if self.phase is Phase.DORMANT and self.lease:
            times.append(self.decided_at + self.min_interval)
        later = [t for t in times if t > now]
        return min(later) if later else None
