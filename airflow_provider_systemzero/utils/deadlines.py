"""When a deferred task's wait ends, and how long Airflow lets its deferral last.

A task that defers hands its deadline to the trigger as epoch seconds, and Airflow a deferral
timeout a little longer (:data:`DEFER_GRACE`), so the trigger's own timeout event — which says
what the wait was stuck on — arrives before Airflow's generic one.

Airflow does not apply a task's ``execution_timeout`` while the task is deferred (only to the
time it runs on a worker). A wait the author bounded with ``execution_timeout`` would otherwise
last until ``decision_timeout`` or the sensor's ``timeout``: :func:`deadline_in` takes the
shorter of the two.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Protocol

__all__ = [
    "DEFER_GRACE",
    "TimedTask",
    "bound_by_execution_timeout",
    "deadline_in",
    "defer_timeout",
    "in_seconds",
    "wait_bound",
]

#: How much longer than the trigger's deadline Airflow lets the deferral last.
DEFER_GRACE = timedelta(seconds=60)


class TimedTask(Protocol):
    """What a deadline reads of a task: Airflow's ``execution_timeout`` (``None``: unbounded)."""

    @property
    def execution_timeout(self) -> timedelta | None:
        """The task's ``execution_timeout``."""
        ...


def in_seconds(value: float | timedelta | None) -> float | None:
    """A duration argument (seconds or a ``timedelta``) in seconds (``None`` stays ``None``)."""
    if value is None:
        return None
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def wait_bound(task: TimedTask, wait: float | timedelta | None) -> float | None:
    """Seconds a wait of ``wait`` may last: the shorter of ``wait`` and the task's
    ``execution_timeout`` (``None``: neither bounds it).

    :param task: the deferring task (its ``execution_timeout``, if any).
    :param wait: the task's own bound (``decision_timeout``, the sensor's ``timeout``).
    """
    bounds = [b for b in (in_seconds(wait), in_seconds(task.execution_timeout)) if b is not None]
    return min(bounds) if bounds else None


def deadline_in(task: TimedTask, wait: float | timedelta | None) -> float | None:
    """The deadline (epoch seconds) of a wait that starts now (:func:`wait_bound`)."""
    bound = wait_bound(task, wait)
    return None if bound is None else time.time() + bound


def bound_by_execution_timeout(task: TimedTask, wait: float | timedelta | None) -> bool:
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
