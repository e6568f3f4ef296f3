"""When a deferred task's wait ends, and how long Airflow lets its deferral last.

A task that defers hands its deadline to the trigger as epoch seconds, and Airflow a deferral
timeout a little longer (:data:`DEFER_GRACE`), so the trigger's own timeout event — which says
what the wait was stuck on — arrives before Airflow's generic one.

Airflow does not apply a task's ``execution_timeout`` while the task is deferred (only to the
time it runs on a worker). A wait the author bounded with ``execution_timeout`` would otherwise
last until ``decision_timeout`` or the sensor's ``timeout``: :func:`deadline_in` takes the
shorter of the two.

When the deadline passes, the task says whose deadline it was and what to raise
(:func:`timeout_reason`): the trigger's ``timeout`` event says what the wait was stuck on and how
long decisions took (``decision_seconds``, ``deciding_for``), the task knows which of its
arguments set the deadline.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow_provider_systemzero.durations import is_seconds, readable

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator

__all__ = [
    "DEFER_GRACE",
    "STILL_DECIDING",
    "bound_by_execution_timeout",
    "deadline_in",
    "decision_times",
    "defer_timeout",
    "in_seconds",
    "timeout_reason",
    "wait_bound",
]

#: How a trigger's timeout message says that the gateway still owed a decision at the deadline.
STILL_DECIDING = "the gateway was still deciding"
#: How much longer than the trigger's deadline Airflow lets the deferral last.
DEFER_GRACE = timedelta(seconds=60)


def in_seconds(value: float | timedelta | None) -> float | None:
    """A duration argument (seconds or a ``timedelta``) in seconds (``None`` stays ``None``)."""
    if value is None:
        return None
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def wait_bound(task: BaseOperator, wait: float | timedelta | None) -> float | None:
    """Seconds a wait of ``wait`` may last: the shorter of ``wait`` and the task's
    ``execution_timeout`` (``None``: neither bounds it).

    :param task: the deferring task (its ``execution_timeout``, if any).
    :param wait: the task's own bound (``decision_timeout``, the sensor's ``timeout``).
    """
    bounds = [b for b in (in_seconds(wait), in_seconds(task.execution_timeout)) if b is not None]
    return min(bounds) if bounds else None


def deadline_in(task: BaseOperator, wait: float | timedelta | None) -> float | None:
    """The deadline (epoch seconds) of a wait that starts now (:func:`wait_bound`)."""
    bound = wait_bound(task, wait)
    return None if bound is None else time.time() + bound


def bound_by_execution_timeout(task: BaseOperator, wait: float | timedelta | None) -> bool:
    """Whether the task's ``execution_timeout``, not its own bound ``wait``, set :func:`wait_bound`
    (a timeout then is Airflow's own kind: ``AirflowTaskTimeout``, retried)."""
    own = in_seconds(wait)
    return wait_bound(task, wait) != own


def defer_timeout(deadline: float | None) -> timedelta | None:
    """Airflow's timeout of a deferral that waits until ``deadline``: the time left plus
    :data:`DEFER_GRACE`, so the trigger's own, clearer timeout event wins."""
    if not deadline:
        return None
    return timedelta(seconds=max(1.0, deadline - time.time())) + DEFER_GRACE


def _now(bound: float | None) -> str:
    return "" if bound is None else f" (now {readable(bound)})"


def _listed(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def decision_times(facts: Mapping[str, Any], *, owed: bool = True) -> str | None:
    """How long decisions took during a wait, in words, from a trigger's ``timeout`` event
    (``None`` when the event says nothing about it).

    :param facts: the event's fields: ``decision_seconds`` (the last decisions' durations, oldest
        first) and ``deciding_for`` (how long the gateway had owed a decision at the deadline, or
        ``None``).
    :param owed: say how long a decision was owed (``False``: the trigger's message says it).
    """
    raw = facts.get("decision_seconds")
    took = [readable(s) for s in raw if is_seconds(s)] if isinstance(raw, list) else None
    owing = facts.get("deciding_for") if owed else None
    parts = []
    if took:
        parts.append(
            f"the last decision took {took[0]}"
            if len(took) == 1
            else f"the last {len(took)} decisions took {_listed(took)}"
        )
    elif took is not None:
        parts.append("no decision arrived during the wait")
    if is_seconds(owing):
        parts.append(f"the gateway had owed a decision for {readable(owing)} when the deadline passed")
    return ", and ".join(parts) or None


def timeout_reason(
    task: BaseOperator,
    wait_name: str,
    wait: float | timedelta | None,
    facts: Mapping[str, Any],
    *,
    needs: str,
) -> str:
    """Why a deferred task's wait ended at its deadline: whose deadline it was (``wait_name`` or
    ``execution_timeout``, with its length), what the trigger saw, how long decisions took, and what
    to raise.

    :param task: the task (its ``execution_timeout``).
    :param wait_name: the task's own bound: ``timeout`` (a sensor) or ``decision_timeout``.
    :param wait: its value.
    :param facts: the trigger's ``timeout`` event (``message``, ``decision_seconds``, ``deciding_for``).
    :param needs: what the raised bound must cover, in words (``how long a decision takes``).
    """
    own = in_seconds(wait)
    if bound_by_execution_timeout(task, wait):
        name, bound = "execution_timeout", in_seconds(task.execution_timeout)
        fix = f"raise execution_timeout{_now(bound)}, which is shorter than {wait_name}"
        fix += f" ({readable(own)})" if own is not None else ""
    else:
        name, bound = wait_name, own
        fix = f"raise {wait_name}{_now(bound)} to cover {needs}"
    said = str(facts.get("message") or "the wait had no decision before the deadline")
    # the trigger may say itself that a decision was still owed, with that fix: not said twice
    owed_said = STILL_DECIDING in said
    if is_seconds(facts.get("deciding_for")) and not facts.get("decision_seconds") and not owed_said:
        fix += ", or find out why the gateway's decisions take this long"
    head = f"the task's {name}" + (f" of {readable(bound)}" if bound is not None else "") + " passed"
    times = decision_times(facts, owed=not owed_said)
    return f"{head}: {said}; {times}: {fix}" if times else f"{head}: {said}: {fix}"
