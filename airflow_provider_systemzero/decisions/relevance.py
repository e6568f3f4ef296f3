"""Which changes of a watched state are worth a decision, and when to start it.

A decision trigger on a busy source would otherwise spend one decision per change, and an account
may *start* only ``account_decision_ceiling`` (60) decisions a minute across all its streams. Two
knobs, chosen by the DAG author, keep the decisions for the changes that can matter:

``decide_when``
    What a change must contain to start a decision: a regular expression (a string, searched with
    :func:`re.search` and :data:`re.MULTILINE` in :func:`what_changed`: the appended text, the
    appended items rendered as JSON, or the new state of a replace), or
    ``{"callable": "pkg.mod.func"}``: ``func(previous, new) -> bool`` called with the previous and
    the new complete state (imported in the triggerer, run in a worker thread). A change that does
    not match is still streamed — the gateway's state stays complete and a later decision covers
    it — but starts no decision.
``debounce_ms``
    Decide once the source has been quiet this long: a burst of changes is one decision, about
    the burst's last state. A source that never goes quiet is still decided about, at the latest
    :data:`MAX_HOLD_FACTOR` × ``debounce_ms`` after the first change that waits.

``decide_initial`` (default ``True``) decides the state the trigger starts with at once (never
debounced: how long the source was quiet before the trigger started is unknown); ``False`` waits
for the first relevant change.

:class:`DecisionDebounce` holds the timing; time is passed in, so it is tested without a clock. Nothing
here imports Airflow; a trigger's :class:`~airflow_provider_systemzero.decisions.source_watch.SourceWatch`
asks it when a decision is due.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from airflow_provider_systemzero.deprecations import Renamed, warn_once
from airflow_provider_systemzero.dotted import check_dotted, import_dotted
from airflow_provider_systemzero.exceptions import SystemZeroArgumentError
from airflow_provider_systemzero.protocol.state import same_json

__all__ = [
    "MAX_DEBOUNCE_MS",
    "MAX_HOLD_FACTOR",
    "DecisionDebounce",
    "DecisionFilter",
    "Relevance",
    "validate_debounce_ms",
    "validate_decide_initial",
    "validate_decide_when",
    "what_changed",
]

#: Longest ``debounce_ms`` accepted (one hour).
MAX_DEBOUNCE_MS = 3_600_000
#: A change waits for quiet at most this many ``debounce_ms`` (a source that never goes quiet is
#: still decided about).
MAX_HOLD_FACTOR = 10
_CODE = "invalid_decide_when"
#: What a ``decide_when`` function is called with and returns (for messages).
_TAKES = "taking (previous, new) and returning a bool"


def _callable_path(spec: dict[str, Any]) -> str:
    """The dotted path of a ``{"callable": ...}`` spec, or the error naming the fix."""
    if set(spec) != {"callable"}:
        raise SystemZeroArgumentError(
            f"decide_when {spec!r} must be a regular expression or {{'callable': 'pkg.mod.func'}} with "
            f"no other key; got the keys {sorted(spec)}: pass only 'callable'",
            code=_CODE,
            field="decide_when",
        )
    return check_dotted(spec["callable"], field="decide_when.callable", code=_CODE, takes=_TAKES)


def validate_decide_when(value: Any) -> str | dict[str, str] | None:
    """Check ``decide_when`` (at DAG parse time and again in the triggerer).

    :param value: ``None`` (every change is decided), a regular expression, or
        ``{"callable": "pkg.mod.func"}``.
    :return: the value, unchanged (plain JSON).
    :raises SystemZeroArgumentError: naming ``decide_when``, the problem and the fix.
    """
    if value is None:
        return None
    if isinstance(value, dict):
        _callable_path(value)
        return value
    if not isinstance(value, str):
        raise SystemZeroArgumentError(
            f"decide_when must be a regular expression (a string) or {{'callable': 'pkg.mod.func'}}, "
            f"got {type(value).__name__}; pass e.g. decide_when=r'READY|FAILED'",
            code=_CODE,
            field="decide_when",
        )
    if not value:
        raise SystemZeroArgumentError(
            "decide_when is an empty regular expression, which matches every change: drop decide_when "
            "to decide every change, or pass the pattern a decisive change contains",
            code=_CODE,
            field="decide_when",
        )
    try:
        re.compile(value, re.MULTILINE)
    except re.error as exc:
        raise SystemZeroArgumentError(
            f"decide_when {value!r} is not a valid regular expression ({exc}): fix the pattern "
            "(Python re syntax; escape literal characters such as '[' or '(' with a backslash)",
            code=_CODE,
            field="decide_when",
        ) from None
    return value


def validate_debounce_ms(value: Any) -> int | None:
    """Check ``debounce_ms``: ``None`` or a whole number of milliseconds from 0 to :data:`MAX_DEBOUNCE_MS`.

    :raises SystemZeroArgumentError: naming ``debounce_ms``, the problem and the fix.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_DEBOUNCE_MS:
        raise SystemZeroArgumentError(
            f"debounce_ms must be a whole number of milliseconds from 0 to {MAX_DEBOUNCE_MS} or None, "
            f"got {type(value).__name__} {value!r}: how long the source must be quiet before a "
            "decision starts",
            code="invalid_debounce",
            field="debounce_ms",
        )
    return value


def validate_decide_initial(value: Any) -> bool:
    """Check ``decide_initial`` (a bool).

    :raises SystemZeroArgumentError: naming ``decide_initial`` and the fix.
    """
    if not isinstance(value, bool):
        raise SystemZeroArgumentError(
            f"decide_initial must be True or False, got {value!r}: True decides the state the wait "
            "starts with, False waits for the first change matching decide_when",
            code="invalid_decide_initial",
            field="decide_initial",
        )
    return value


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def what_changed(previous: Any, new: Any) -> str:
    """The text a ``decide_when`` expression is searched in, as the stream sends the change.

    A string that grows: the appended text. An array that grows: the appended items rendered as a
    JSON array (``json.dumps``, e.g. ``[{"status": "done"}]``). Anything else is a replace: the new
    state (a string as it is, any other value rendered as JSON).

    :param previous: the state before the change.
    :param new: the state after it.
    """
    if isinstance(previous, str) and isinstance(new, str) and new.startswith(previous):
        return new[len(previous) :]
    if (
        isinstance(previous, list)
        and isinstance(new, list)
        and len(new) > len(previous)
        and same_json(new[: len(previous)], previous)
    ):
        return _as_text(new[len(previous) :])
    return _as_text(new)


class Relevance:
    """A compiled ``decide_when``: whether a change can matter.

    :param spec: a value accepted by :func:`validate_decide_when` (not ``None``).
    """

    def __init__(self, spec: str | dict[str, str]) -> None:
        validate_decide_when(spec)
        self.spec = spec
        self._pattern = re.compile(spec, re.MULTILINE) if isinstance(spec, str) else None
        self._function: Callable[[Any, Any], Any] | None = None

    def describe(self) -> str:
        """The expression, or the callable's path, for a log line."""
        return f"callable {self.spec['callable']!r}" if isinstance(self.spec, dict) else repr(self.spec)

    @property
    def is_callable(self) -> bool:
        """Whether it calls a function (the trigger runs it off the event loop)."""
        return self._pattern is None

    def load(self) -> None:
        """Import the callable (in the triggerer, when the trigger starts).

        :raises SystemZeroArgumentError: the path cannot be imported or is not callable.
        """
        if self._pattern is not None or self._function is not None:
            return
        assert isinstance(self.spec, dict)
        path = _callable_path(self.spec)
        self._function = import_dotted(path, field="decide_when.callable", code=_CODE, takes=_TAKES)

    def matches(self, previous: Any, new: Any) -> bool:
        """Whether the change from ``previous`` to ``new`` can matter.

        :raises SystemZeroArgumentError: the callable does not return a bool.
        """
        if self._pattern is not None:
            return self._pattern.search(what_changed(previous, new)) is not None
        self.load()
        assert self._function is not None
        result = self._function(previous, new)
        if not isinstance(result, bool):
            raise SystemZeroArgumentError(
                f"decide_when.callable {self.spec['callable']!r} returned {type(result).__name__}, "  # type: ignore[index]
                "not a bool: return True when the change can matter, False otherwise",
                code=_CODE,
                field="decide_when.callable",
            )
        return result


class DecisionDebounce:
    """When a trigger starts its next decision (time passed in, in seconds of one clock).

    A decision is *pending* once a relevant change (or, with ``decide_initial``, the initial state)
    is waiting for one. It is *due* at once without ``debounce_ms``; with it, once the source has
    been quiet ``debounce_ms`` (any change, relevant or not, restarts the quiet time), and at the
    latest :data:`MAX_HOLD_FACTOR` × ``debounce_ms`` after the first change that waits.

    :param debounce_ms: quiet time before a decision (``None``/``0``: none).
    :param decide_initial: the initial state is pending from the start (due at once).
    :param now: the time the trigger starts.
    """

    def __init__(self, *, debounce_ms: int | None, decide_initial: bool, now: float) -> None:
        #: seconds of quiet before a decision (0: none)
        self.quiet = (debounce_ms or 0) / 1000
        self._pending = decide_initial
        self._first = now
        self._last = now - self.quiet  # the initial state is due at once
        self.changes = 0
        self.relevant_changes = 0

    @property
    def pending(self) -> bool:
        """Whether a change waits for a decision."""
        return self._pending

    def changed(self, relevant: bool, now: float) -> None:
        """The source changed (the change is handed to the stream in any case).

        :param relevant: it matched ``decide_when`` (always ``True`` without one).
        :param now: when.
        """
        self.changes += 1
        self._last = now
        if relevant:
            self.relevant_changes += 1
            if not self._pending:
                self._pending = True
                self._first = now

    def due_at(self) -> float | None:
        """When the pending decision should start (``None``: nothing pending)."""
        if not self._pending:
            return None
        if not self.quiet:
            return self._last
        return min(self._last + self.quiet, self._first + MAX_HOLD_FACTOR * self.quiet)

    def started(self) -> None:
        """A decision about the newest state started: it covers every change so far."""
        self._pending = False

    def again(self, now: float) -> None:
        """The decision started for the pending changes will not settle them — it came back about
        a state the source already changed, or it failed — so the newest state needs one: pending
        again, from ``now``."""
        if not self._pending:
            self._pending = True
            self._first = now


class DecisionFilter:
    """A trigger's ``decide_when``, ``debounce_ms`` and ``decide_initial``, checked, as plain JSON.

    :param decide_when: see :func:`validate_decide_when`.
    :param debounce_ms: see :func:`validate_debounce_ms`.
    :param decide_initial: decide the initial state (``False``: wait for a relevant change).
    :raises SystemZeroArgumentError: naming the field.
    """

    # one per watching trigger, and a triggerer holds thousands: no per-instance __dict__
    __slots__ = ("_relevance", "debounce_ms", "decide_initial", "decide_when")

    def __init__(
        self,
        *,
        decide_when: str | dict[str, str] | None = None,
        debounce_ms: int | None = None,
        decide_initial: bool = True,
    ) -> None:
        self.decide_when = validate_decide_when(decide_when)
        self.debounce_ms = validate_debounce_ms(debounce_ms)
        self.decide_initial = validate_decide_initial(decide_initial)
        self._relevance: Relevance | None = None

    @property
    def active(self) -> bool:
        """Whether some change starts no decision (the stream then decides on request)."""
        return self.decide_when is not None or bool(self.debounce_ms) or not self.decide_initial

    def stream_mode(self, decision_mode: str) -> str:
        """The stream's decision mode: ``on_request`` when active, else the author's ``decision_mode``."""
        return "on_request" if self.active else decision_mode

    def to_kwargs(self) -> dict[str, Any]:
        """The trigger kwargs that differ from the defaults (a trigger without them serializes as before)."""
        return {
            **({"decide_when": self.decide_when} if self.decide_when is not None else {}),
            **({"debounce_ms": self.debounce_ms} if self.debounce_ms is not None else {}),
            **({"decide_initial": False} if not self.decide_initial else {}),
        }

    def relevance(self) -> Relevance | None:
        """The compiled ``decide_when``, its callable imported (in the triggerer; ``None`` without one).

        :raises SystemZeroArgumentError: the callable cannot be imported.
        """
        if self.decide_when is None:
            return None
        if self._relevance is None:
            relevance = Relevance(self.decide_when)
            relevance.load()
            self._relevance = relevance
        return self._relevance

    def debounce(self, now: float) -> DecisionDebounce | None:
        """A fresh :class:`DecisionDebounce` starting ``now`` (``None`` when not active: every change is decided)."""
        if not self.active:
            return None
        return DecisionDebounce(debounce_ms=self.debounce_ms, decide_initial=self.decide_initial, now=now)

    def gate(self, now: float) -> DecisionDebounce | None:
        """Deprecated name of :meth:`debounce` (before 0.2).

        :param now: the time the debounce starts.
        """
        warn_once("DecisionFilter.gate()", "DecisionFilter.debounce()")
        return self.debounce(now)


#: The names of this module before 0.2.
__getattr__ = Renamed(__name__, {"DecisionGate": ("DecisionDebounce", lambda: DecisionDebounce)})
