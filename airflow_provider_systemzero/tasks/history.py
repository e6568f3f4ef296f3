"""The ``decisions`` XCom: a task try's decision history, beside ``decision`` and ``usage``.

A wait's event (the trigger's, or the poke that ended it) and an operator's carry the history
their watch kept (:class:`~airflow_provider_systemzero.decisions.timeline.DecisionTimeline` rows).
On the worker, :func:`push_history` pushes it as the ``decisions`` XCom, after two things only
the worker can do:

* **billed or replayed** is told by whoever counted the bill: the trigger's budget (the event's
  usage report lists the replies it billed; every other decision of its run was a replay) or, for
  a decision made on the worker, the task's own budget (:attr:`UsageBudgetMixin.billed_by_reply
  <airflow_provider_systemzero.tasks.usage.UsageBudgetMixin.billed_by_reply>`);
* **one story per try**: a sensor that asked a person, heard "no" and waited again resumes in the
  same try (Airflow keeps a deferred task's XComs), so the history pushed before is merged with the
  new one — each row once (the same event delivered twice adds nothing), the newest 200 decisions.
  The earlier history is read only when the task knows this try pushed one (its try's record,
  :attr:`UsageBudgetMixin.histories_pushed
  <airflow_provider_systemzero.tasks.usage.UsageBudgetMixin.histories_pushed>`): Airflow's client
  logs an error for an XCom asked for by map index that does not exist, and a try's first
  history has nothing before it.

The ``decisions`` XCom follows ``do_xcom_push`` as the ``usage`` XCom does. What the UI's
"Decision timeline" shows is this XCom.

Importing this module does not import Airflow.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_provider_systemzero.decisions.budget import EVENT_USAGE_KEY
from airflow_provider_systemzero.decisions.timeline import merge_histories, settle_billed

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator

    from airflow_provider_systemzero.decisions.watch import WatchEvent

__all__ = ["DECISIONS_XCOM_KEY", "push_history"]

log = logging.getLogger(__name__)

#: The XCom key of a task try's decision history.
DECISIONS_XCOM_KEY = "decisions"


def _counted(event: WatchEvent) -> list[str] | None:
    """The reply ids a trigger's run billed (``None``: the event carries no usage report)."""
    report = event.extra.get(EVENT_USAGE_KEY)
    run = report.get("run") if isinstance(report, Mapping) else None
    ids = run.get("reply_ids") if isinstance(run, Mapping) else None
    return [i for i in ids if isinstance(i, str)] if isinstance(ids, list) else None


def _earlier(task: BaseOperator, ti: Any) -> list[dict[str, Any]]:
    """What this try pushed before (a wait that went on after a person said "no"); nothing, without
    a read, when the task knows it pushed none."""
    if not getattr(task, "histories_pushed", 0):
        return []
    try:
        value = ti.xcom_pull(
            task_ids=ti.task_id, key=DECISIONS_XCOM_KEY, map_indexes=getattr(ti, "map_index", -1)
        )
    except Exception as exc:  # the new history still goes out
        log.warning("could not read this try's earlier decision history: %s", exc)
        return []
    return [row for row in value if isinstance(row, Mapping)] if isinstance(value, list) else []


def push_history(
    task: BaseOperator,
    context: Mapping[str, Any],
    event: WatchEvent,
    *,
    condition: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]] | None:
    """Push ``event``'s decision history as the ``decisions`` XCom (see the module docstring).

    :param task: the sensor or operator (its ``do_xcom_push`` and ``billed_by_reply``, and its log).
    :param context: the task's context.
    :param event: the event that ended the wait (or the operator's decision).
    :param condition: what the rows are drawn against when they carry no condition of their own
        (an operator's policy: ``{"question", "policy"}``), the history's first row.
    :return: the history pushed (``None``: the event carries none).
    """
    rows = event.decisions
    if rows is None:
        return None
    if condition is not None and not any(row.get("kind") == "condition" for row in rows):
        rows = [{"kind": "condition", **condition}, *rows]
    rows = settle_billed(rows, getattr(task, "billed_by_reply", None), _counted(event))
    ti = context.get("ti")
    if ti is None or not getattr(task, "do_xcom_push", True):
        return rows
    try:
        history = merge_histories(_earlier(task, ti), rows)
        ti.xcom_push(key=DECISIONS_XCOM_KEY, value=history)
    except Exception as exc:  # the history explains the decision; it never fails the task
        getattr(task, "log", log).warning("could not push the System Zero decision history: %s", exc)
        return rows
    noted = getattr(task, "history_pushed", None)
    if callable(noted):
        noted(context)
    return history
