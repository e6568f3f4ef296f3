"""Spend caps checked *before* a decide is dispatched, and the usage a task reports.

Every System Zero decision is billed. A cap that is only compared with the bill after the fact
lets a fast stream overshoot it many times over, so the stream asks a :class:`DecisionBudget`
before it sends anything that can start a dispatch at the gateway:

* on_request — before each ``decide``: one dispatch;
* on_change — before each mutation (``start`` included, so a reconnect's replay too): every
  accepted mutation schedules a dispatch. The gateway holds at most one decide in flight and one
  pending intent, so the mutations sent and not yet covered by a decision can still cause
  ``min(uncovered, 2)`` dispatches; the check counts them all.

A refused check sends nothing: an on_request ``decide()`` raises :class:`BudgetExceeded`; an
on_change stream holds its changes locally, lets the dispatches already scheduled settle (their
replies are counted), then fails with :class:`BudgetExceeded` and closes.

**Billed or replayed.** The client cannot see the bill. A reply counts as billed unless it is
recognisably a replay: a replay returns the *original* reply, with its original ``reply.id``, so
a reply whose id the budget already holds (from this stream or an earlier try of the task) is
*replayed unbilled* and never counts twice. Tokens are summed over distinct reply ids too.

**Unconfirmed dispatches.** A connection lost while a dispatch may be in flight leaves a
dispatch the service may bill without its reply ever reaching the client. The budget counts each
such loss as one *unconfirmed* decision against ``max_decisions`` (conservative: the cap holds
even then), and reports it separately.

**Tokens.** ``max_input_tokens`` caps the sum of ``reply.usage.input_tokens``. Before a dispatch
the check adds an estimate for each possible dispatch: the synthesized body's bytes times the
highest tokens-per-byte ratio seen in this stream's replies (``0.25`` before the first reply).

Three scopes:

* :class:`DecisionBudget` — one stream (or one task try); pure, no I/O;
* :class:`WindowBudget` — per connection and time window (connection extras
  ``budget_decisions_per_hour`` / ``budget_input_tokens_per_hour``), held **in this process**;
* :class:`~airflow_provider_systemzero.tasks.usage.TaskUsageLedger` — per task across all its tries,
  kept in the Airflow 3.3 task state store (AIP-103) under :data:`TASK_STATE_KEY` (the Airflow
  side lives in :mod:`~airflow_provider_systemzero.tasks.usage`).

This module is the arithmetic alone: it imports no Airflow.
"""

from __future__ import annotations

import functools
import logging
import math
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import KW_ONLY, InitVar, asdict, dataclass, field, fields
from typing import Any

from airflow_provider_systemzero.exceptions import SystemZeroError
from airflow_provider_systemzero.protocol.reply import USAGE_FIELDS

__all__ = [
    "DEFAULT_TOKENS_PER_BYTE",
    "MAX_REMEMBERED_REPLY_IDS",
    "TASK_STATE_KEY",
    "BudgetExceeded",
    "DecisionBudget",
    "Usage",
    "WindowBudget",
    "connection_window",
    "event_usage",
    "parse_limit",
    "reset_connection_windows",
]

log = logging.getLogger(__name__)

#: The task state store key of a task's running total (all tries).
TASK_STATE_KEY = "__systemzero_usage__"
#: Event payload key under which a trigger reports the usage of its deferral.
EVENT_USAGE_KEY = "systemzero_usage"
#: XCom key of the usage record every budgeted task pushes.
USAGE_XCOM_KEY = "usage"
#: Reply ids remembered per task to recognise replays (the newest are kept).
MAX_REMEMBERED_REPLY_IDS = 500
#: Tokens per body byte assumed before the first reply tells the real ratio.
DEFAULT_TOKENS_PER_BYTE = 0.25
_WINDOW_SECONDS = 3600.0


def parse_limit(value: Any, name: str) -> int | None:
    """A cap: ``None`` (no cap) or a whole number ≥ 0 (``0`` allows nothing); strings of digits pass."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    number: Any = value
    if isinstance(value, str) and value.strip().isdigit():
        number = int(value.strip())
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    if isinstance(number, bool) or not isinstance(number, int) or number < 0:
        raise ValueError(f"{name} must be a whole number ≥ 0 (0 allows no decision) or None, got {value!r}")
    return number


# ------------------------------------------------------------------------------------ usage


@dataclass(slots=True)
class Usage:
    """What a stream, a try or a task spent.

    :param dispatched: decide outcomes received (decisions plus failed dispatches).
    :param billed: decisions counted as billed (distinct reply ids not seen before).
    :param replayed: decisions recognised as replays (a reply id already counted): unbilled.
    :param failed: dispatches that failed (not billed).
    :param unconfirmed: dispatches possibly billed whose reply never arrived (a connection was
        lost with a dispatch in flight); they count against ``max_decisions``.
    :param refused: dispatches the budget refused (nothing was sent).
    :param input_tokens: ``usage.input_tokens`` summed over billed replies (likewise the others).
    :param reply_ids: the billed reply ids, oldest first (recognises replays).
    """

    dispatched: int = 0
    billed: int = 0
    replayed: int = 0
    failed: int = 0
    unconfirmed: int = 0
    refused: int = 0
    input_tokens: int = 0
    cached_input_tokens: int = 0
    media_tokens: int = 0
    long_input_tokens: int = 0
    media_items: int = 0
    thought_tokens: int = 0
    reply_ids: list[str] = field(default_factory=list)

    @classmethod
    def counters(cls) -> tuple[str, ...]:
        """The integer fields."""
        return tuple(f.name for f in fields(cls) if f.name != "reply_ids")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Usage:
        """Read a :meth:`to_dict` form leniently (unknown keys ignored, bad numbers are 0)."""
        if not isinstance(data, Mapping):
            return cls()
        values: dict[str, Any] = {}
        for name in cls.counters():
            raw = data.get(name)
            values[name] = (
                int(raw) if isinstance(raw, int | float) and not isinstance(raw, bool) and raw > 0 else 0
            )
        ids = data.get("reply_ids")
        values["reply_ids"] = [i for i in ids if isinstance(i, str)] if isinstance(ids, list) else []
        return cls(**values)

    def to_dict(self, *, reply_ids: bool = True) -> dict[str, Any]:
        """Plain JSON (for XCom, trigger events and the task state store)."""
        data: dict[str, Any] = {name: getattr(self, name) for name in self.counters()}
        if reply_ids:
            data["reply_ids"] = list(self.reply_ids)
        return data

    def plus(self, other: Usage) -> Usage:
        """The sum of two usages (reply ids united, order kept, the newest kept)."""
        total = Usage(**{name: getattr(self, name) + getattr(other, name) for name in self.counters()})
        seen = dict.fromkeys([*self.reply_ids, *other.reply_ids])
        total.reply_ids = list(seen)[-MAX_REMEMBERED_REPLY_IDS:]
        return total

    @property
    def counted_decisions(self) -> int:
        """What ``max_decisions`` compares with: billed plus unconfirmed."""
        return self.billed + self.unconfirmed

    def describe(self) -> str:
        """One line for logs and messages (no ids)."""
        text = (
            f"{self.dispatched} dispatched, {self.billed} billed, {self.replayed} replayed unbilled, "
            f"{self.failed} failed"
        )
        if self.unconfirmed:
            text += f", {self.unconfirmed} unconfirmed"
        if self.refused:
            text += f", {self.refused} refused by the budget"
        return (
            f"{text}; tokens: {self.input_tokens} input ({self.cached_input_tokens} cached), "
            f"{self.media_tokens} media"
        )


# ------------------------------------------------------------------------------------ the error


@dataclass(eq=False, repr=False)  # an exception: compared and shown as one
class BudgetExceeded(SystemZeroError):
    """A dispatch was refused because it could take a budget past its cap; nothing was sent.

    :param limit: the budget's name (``max_decisions``, ``max_input_tokens``,
        ``budget_decisions_per_hour``, ``budget_input_tokens_per_hour``).
    :param maximum: its cap.
    :param spent: the amount counted against it so far.
    :param requested: what the refused dispatch(es) could add.
    :param scope: what the budget covers (e.g. ``task 'dag.task' (all tries)``).
    :param hint: where to raise it.
    :param detail: what the message adds after the amount spent.
    :param retry_after: seconds until a time window frees room (window budgets only).
    """

    limit: str
    maximum: int
    spent: int
    requested: int
    _: KW_ONLY
    scope: str
    hint: str
    #: what the message adds after the amount spent (e.g. how it splits into billed and replayed)
    detail: InitVar[str] = ""
    retry_after: float | None = None

    def __post_init__(self, detail: str) -> None:
        unit = "input tokens" if "tokens" in self.limit else "decisions"
        message = (
            f"System Zero budget {self.limit}={self.maximum} for {self.scope} would be exceeded: {self.spent} "
            f"{unit} spent so far{detail}, and the next dispatch could add {self.requested}; nothing more was "
            f"sent. {self.hint}"
        )
        if self.retry_after is not None:
            message += f" (room frees up in {self.retry_after:.0f} s)"
        super().__init__(message)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON (for trigger events): the fields and the message."""
        return {**asdict(self), "message": str(self)}


# ------------------------------------------------------------------------------------ time windows


class WindowBudget:
    """A cap per connection and time window, shared by every stream of **this process**.

    Holds the billed decisions and input tokens of the last ``window`` seconds, plus what each
    open stream has scheduled but not yet settled, so concurrent streams cannot all take the last
    slot. Without shared storage it cannot see other processes (other workers, triggerers).

    :param name: the connection ID (for messages).
    :param max_decisions: billed decisions allowed per window (``None``: no cap).
    :param max_input_tokens: input tokens allowed per window (``None``: no cap).
    :param window: the window in seconds (default one hour).
    :param clock: monotonic seconds (tests pass a fake).
    """

    def __init__(
        self,
        name: str,
        max_decisions: int | None = None,
        max_input_tokens: int | None = None,
        *,
        window: float = _WINDOW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.max_decisions = parse_limit(max_decisions, "budget_decisions_per_hour")
        self.max_input_tokens = parse_limit(max_input_tokens, "budget_input_tokens_per_hour")
        self.window = float(window)
        self._clock = clock
        self._entries: deque[tuple[float, int, int]] = deque()
        self._outstanding: dict[int, tuple[int, int]] = {}
        self._lock = threading.Lock()

    def _expire(self, now: float) -> None:
        while self._entries and now - self._entries[0][0] >= self.window:
            self._entries.popleft()

    def spent(self) -> tuple[int, int]:
        """``(decisions, input tokens)`` billed within the window."""
        with self._lock:
            self._expire(self._clock())
            return sum(e[1] for e in self._entries), sum(e[2] for e in self._entries)

    def check(self, holder: int, potential: int, tokens_each: int) -> BudgetExceeded | None:
        """Whether ``holder`` may have ``potential`` dispatches outstanding.

        :param holder: the asking stream's id (its own outstanding count is replaced, not added).
        :param potential: dispatches it could have outstanding after sending.
        :param tokens_each: estimated input tokens per dispatch.
        """
        with self._lock:
            now = self._clock()
            self._expire(now)
            others = [v for k, v in self._outstanding.items() if k != holder]
            decisions = sum(e[1] for e in self._entries)
            tokens = sum(e[2] for e in self._entries)
            retry_after = (self._entries[0][0] + self.window - now) if self._entries else None
            refuse = functools.partial(
                BudgetExceeded,
                scope=f"connection {self.name!r} in this process, per {self.window:.0f} s",
                hint=f"Raise the extra of connection {self.name!r} or wait for the window to move; the count "
                "is kept per process (each worker and triggerer has its own).",
                retry_after=retry_after,
            )
            if self.max_decisions is not None:
                held = sum(o[0] for o in others)
                if decisions + held + potential > self.max_decisions:
                    return refuse(
                        "budget_decisions_per_hour", self.max_decisions, decisions + held, potential
                    )
            if self.max_input_tokens is not None:
                held_tokens = sum(o[1] for o in others)
                estimate = potential * tokens_each
                if tokens + held_tokens + estimate > self.max_input_tokens or (
                    potential and tokens + held_tokens >= self.max_input_tokens
                ):
                    return refuse(
                        "budget_input_tokens_per_hour", self.max_input_tokens, tokens + held_tokens, estimate
                    )
            return None

    def hold(self, holder: int, outstanding: int, tokens_each: int) -> None:
        """Record what ``holder`` has scheduled and not yet settled (0 forgets it)."""
        with self._lock:
            if outstanding <= 0:
                self._outstanding.pop(holder, None)
            else:
                self._outstanding[holder] = (outstanding, outstanding * tokens_each)

    def record(self, billed: int, input_tokens: int) -> None:
        """A billed decision (or an unconfirmed one) happened now."""
        with self._lock:
            self._entries.append((self._clock(), billed, input_tokens))

    def withdraw(self, decisions: int) -> None:
        """``decisions`` recorded as unconfirmed were not billed after all: the newest go."""
        with self._lock:
            for index in range(len(self._entries) - 1, -1, -1):
                at, count, tokens = self._entries[index]
                taken = min(count, decisions)
                if taken > 0:
                    self._entries[index] = (at, count - taken, tokens)
                    decisions -= taken
                if decisions <= 0:
                    return


_windows: dict[tuple[str, int | None, int | None], WindowBudget] = {}
_windows_lock = threading.Lock()


def connection_window(
    conn_id: str, decisions_per_hour: Any = None, input_tokens_per_hour: Any = None
) -> WindowBudget | None:
    """The process-wide :class:`WindowBudget` of a connection (``None`` when it sets no cap).

    :param conn_id: the connection ID.
    :param decisions_per_hour: the ``budget_decisions_per_hour`` extra.
    :param input_tokens_per_hour: the ``budget_input_tokens_per_hour`` extra.
    :raises ValueError: a value is not a whole number ≥ 0.
    """
    decisions = parse_limit(decisions_per_hour, "budget_decisions_per_hour")
    tokens = parse_limit(input_tokens_per_hour, "budget_input_tokens_per_hour")
    if decisions is None and tokens is None:
        return None
    key = (conn_id, decisions, tokens)
    with _windows_lock:
        window = _windows.get(key)
        if window is None:
            # a changed cap starts a new window for the connection: carry the history over
            previous = next((w for (c, _, _), w in _windows.items() if c == conn_id), None)
            window = _windows[key] = WindowBudget(conn_id, decisions, tokens)
            if previous is not None:
                window._entries = previous._entries
        return window


def reset_connection_windows() -> None:
    """Forget every connection window of this process (tests)."""
    with _windows_lock:
        _windows.clear()


# ------------------------------------------------------------------------------------ the budget


class DecisionBudget:
    """The caps of one stream or one task try, and what it spent (pure; no I/O).

    :param max_decisions: billed decisions allowed in total (``None``: no cap; ``0``: none).
    :param max_input_tokens: input tokens allowed in total (``None``: no cap).
    :param spent: what earlier runs (other tries of the task) already spent; its reply ids mark replays.
    :param scope: what the caps cover, for messages (e.g. ``task 'dag.task' (all tries)``).
    :param hint: where to raise them, for messages.
    :param windows: per-connection window budgets that apply too.
    :param carried: what the task that set the budget carries through this run, unread here (plain
        JSON: the task try's usage so far): it travels in the trigger's kwargs and comes back in the
        event's usage report (:func:`event_usage`), so a try that defers again after a review
        resumes knowing what it spent before.
    """

    def __init__(
        self,
        max_decisions: Any = None,
        max_input_tokens: Any = None,
        *,
        spent: Usage | Mapping[str, Any] | None = None,
        scope: str = "this stream",
        hint: str = "Raise max_decisions / max_input_tokens where the budget is set.",
        windows: Iterable[WindowBudget] = (),
        carried: Mapping[str, Any] | None = None,
    ) -> None:
        self.max_decisions = parse_limit(max_decisions, "max_decisions")
        self.max_input_tokens = parse_limit(max_input_tokens, "max_input_tokens")
        self.spent = spent if isinstance(spent, Usage) else Usage.from_dict(spent)
        self.scope = scope
        self.hint = hint
        self.windows: list[WindowBudget] = [w for w in windows if w is not None]
        self.carried = dict(carried) if isinstance(carried, Mapping) else None
        self.usage = Usage()
        self.exceeded: BudgetExceeded | None = None
        #: names this run in the task's ledger (a trigger event recorded twice counts once)
        self.run_id = secrets.token_hex(8)
        self._seen: set[str] = set(self.spent.reply_ids)
        self._tokens_per_byte: float | None = None

    # ------------------------------------------------------------------ plain JSON (trigger kwargs)

    def to_kwargs(self) -> dict[str, Any]:
        """The budget as plain JSON for a trigger's kwargs (what the trigger needs to go on)."""
        kwargs = {
            "max_decisions": self.max_decisions,
            "max_input_tokens": self.max_input_tokens,
            "spent": self.total.to_dict(),
            "scope": self.scope,
            "hint": self.hint,
        }
        if self.carried is not None:
            kwargs["carried"] = self.carried
        return kwargs

    @classmethod
    def from_kwargs(cls, data: Mapping[str, Any] | None) -> DecisionBudget | None:
        """Rebuild from :meth:`to_kwargs` (``None`` stays ``None``)."""
        if not data:
            return None
        return cls(
            data.get("max_decisions"),
            data.get("max_input_tokens"),
            spent=data.get("spent"),
            scope=data.get("scope") or "this stream",
            hint=data.get("hint") or "",
            carried=data.get("carried"),
        )

    # ------------------------------------------------------------------ views

    @property
    def limited(self) -> bool:
        """Whether any cap applies."""
        return self.max_decisions is not None or self.max_input_tokens is not None or bool(self.windows)

    @property
    def estimates_tokens(self) -> bool:
        """Whether a check needs the body's size (a token cap applies)."""
        return self.max_input_tokens is not None or any(w.max_input_tokens is not None for w in self.windows)

    @property
    def total(self) -> Usage:
        """Earlier runs plus this one."""
        return self.spent.plus(self.usage)

    def tokens_each(self, body_bytes: int | None) -> int:
        """Estimated input tokens of one dispatch of a body of ``body_bytes`` bytes."""
        if not body_bytes:
            return 0
        ratio = self._tokens_per_byte if self._tokens_per_byte is not None else DEFAULT_TOKENS_PER_BYTE
        return math.ceil(body_bytes * ratio)

    def attach_window(self, window: WindowBudget | None) -> None:
        """Add a connection window (the stream does it when it learns its connection)."""
        if window is not None and window not in self.windows:
            self.windows.append(window)

    # ------------------------------------------------------------------ the check

    def check(
        self, potential: int, body_bytes: int | None = None, *, holder: int = 0
    ) -> BudgetExceeded | None:
        """Whether ``potential`` dispatches may be outstanding; ``None`` when they fit every cap.

        :param potential: the dispatches that could still happen once the message is sent (the
            ones already scheduled included).
        :param body_bytes: the synthesized body's bytes of the state to be decided (token estimate).
        :param holder: the stream's id in the connection windows.
        """
        if potential <= 0:
            return None
        total = self.total
        tokens_each = self.tokens_each(body_bytes)
        refuse = functools.partial(BudgetExceeded, scope=self.scope, hint=self.hint)
        if self.max_decisions is not None and total.counted_decisions + potential > self.max_decisions:
            detail = f" ({total.billed} billed, {total.replayed} replayed unbilled"
            detail += f", {total.unconfirmed} unconfirmed)" if total.unconfirmed else ")"
            return refuse(
                "max_decisions", self.max_decisions, total.counted_decisions, potential, detail=detail
            )
        if self.max_input_tokens is not None:
            estimate = potential * tokens_each
            if (
                total.input_tokens + estimate > self.max_input_tokens
                or total.input_tokens >= self.max_input_tokens
            ):
                detail = f" over {total.billed} billed decision(s) (estimate for the next: {tokens_each} per dispatch)"
                return refuse(
                    "max_input_tokens", self.max_input_tokens, total.input_tokens, estimate, detail=detail
                )
        for window in self.windows:
            refused = window.check(holder, potential, tokens_each)
            if refused is not None:
                return refused
        return None

    def record_exceeded(self, exc: BudgetExceeded) -> None:
        """Note a refused dispatch (the first refusal is kept for the report)."""
        self.usage.refused += 1
        if self.exceeded is None:
            self.exceeded = exc

    def hold(self, holder: int, outstanding: int, body_bytes: int | None = None) -> None:
        """Tell the connection windows how many dispatches this stream has scheduled, unsettled."""
        tokens_each = self.tokens_each(body_bytes)
        for window in self.windows:
            window.hold(holder, outstanding, tokens_each)

    # ------------------------------------------------------------------ recording

    def record_decision(
        self,
        reply_id: str | None,
        usage: Mapping[str, Any] | None = None,
        body_bytes: int | None = None,
        *,
        confirms: bool = False,
    ) -> bool:
        """Count a decision; returns ``True`` when it counts as billed, ``False`` for a replay.

        :param reply_id: ``reply.id`` (a reply without one is counted as billed).
        :param usage: ``reply.usage``.
        :param body_bytes: the decided body's bytes (teaches the tokens-per-byte ratio).
        :param confirms: it is the dispatch already counted as unconfirmed (its usage was reported
            before it arrived): a billed one takes that count's place instead of adding a decision
            (the connection windows already hold it; its tokens are added).
        """
        self.usage.dispatched += 1
        if reply_id is not None and reply_id in self._seen:
            self.usage.replayed += 1
            return False
        confirmed = confirms and self.usage.unconfirmed > 0
        if confirmed:
            self.usage.unconfirmed -= 1
        self.usage.billed += 1
        if reply_id is not None:
            self._seen.add(reply_id)
            self.usage.reply_ids.append(reply_id)
            del self.usage.reply_ids[:-MAX_REMEMBERED_REPLY_IDS]
        counters = usage if isinstance(usage, Mapping) else {}
        for name in USAGE_FIELDS:
            value = counters.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                setattr(self.usage, name, getattr(self.usage, name) + value)
        tokens = counters.get("input_tokens")
        if body_bytes and isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0:
            ratio = tokens / body_bytes
            self._tokens_per_byte = max(ratio, self._tokens_per_byte or 0.0)
        for window in self.windows:
            window.record(
                0 if confirmed else 1,
                tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else 0,
            )
        return True

    def record_failure(self) -> None:
        """A dispatch failed (not billed)."""
        self.usage.dispatched += 1
        self.usage.failed += 1

    def record_unconfirmed(self, count: int = 1) -> None:
        """``count`` dispatches may have been billed without their reply arriving (a lost connection)."""
        if count > 0:
            self.usage.unconfirmed += count
            for window in self.windows:
                window.record(count, 0)

    def withdraw_unconfirmed(self, count: int = 1) -> None:
        """``count`` dispatches counted as unconfirmed were answered unbilled (a replayed reply, a
        failure, a refusal): they no longer count."""
        count = min(count, self.usage.unconfirmed)
        if count > 0:
            self.usage.unconfirmed -= count
            for window in self.windows:
                window.withdraw(count)


def event_usage(budget: DecisionBudget | None) -> dict[str, Any]:
    """What a trigger adds to its event: ``{EVENT_USAGE_KEY: {"run", "run_id", "refusal"}}``, and
    ``"carried"`` when the budget carries something back to its task."""
    if budget is None:
        return {}
    refusal = budget.exceeded.to_dict() if budget.exceeded is not None else None
    report = {"run": budget.usage.to_dict(), "run_id": budget.run_id, "refusal": refusal}
    if budget.carried is not None:
        report["carried"] = budget.carried
    return {EVENT_USAGE_KEY: report}
