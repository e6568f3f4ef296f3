"""The ``decisions`` XCom: a task try's decision history, beside ``decision`` and ``usage``.

A wait's event (the trigger's, or the poke that ended it) and an operator's carry the history
their watch kept (:class:`~airflow_provider_systemzero.decisions.timeline.DecisionTimeline` rows).
On the worker, :meth:`UsageBudgetMixin.push_history
<airflow_provider_systemzero.tasks.usage.UsageBudgetMixin.push_history>` pushes it as the
``decisions`` XCom, after two things only the worker can do:

* **billed or replayed** is told by whoever counted the bill: the trigger's budget (the event's
  usage report lists the replies it billed, :func:`counted_replies`; every other decision of its
  run was a replay) or, for a decision made on the worker, the task's own budget
  (:attr:`UsageBudgetMixin.billed_by_reply
  <airflow_provider_systemzero.tasks.usage.UsageBudgetMixin.billed_by_reply>`);
* **one story per try**: a sensor that asked a person, heard "no" and waited again resumes in the
  same try (Airflow keeps a deferred task's XComs), so the history pushed before is merged with the
  new one — each row once (the same event delivered twice adds nothing), the newest 200 decisions.
  The earlier history is read only when the task knows this try pushed one (its try's record,
  :class:`~airflow_provider_systemzero.tasks.usage.TryRecord`): Airflow's client
  logs an error for an XCom asked for by map index that does not exist, and a try's first
  history has nothing before it.

The ``decisions`` XCom follows ``do_xcom_push`` as the ``usage`` XCom does. What the UI's
"Decision timeline" shows is this XCom.

Importing this module does not import Airflow.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from airflow_provider_systemzero.decisions.budget import EVENT_USAGE_KEY

if TYPE_CHECKING:
    from airflow_provider_systemzero.decisions.watch import WatchEvent

__all__ = ["DECISIONS_XCOM_KEY", "counted_replies"]

#: The XCom key of a task try's decision history.
DECISIONS_XCOM_KEY = "decisions"


def counted_replies(event: WatchEvent) -> list[str] | None:
    """The reply ids a trigger's run billed (``None``: the event carries no usage report).

    :param event: the trigger's event, read back.
    """
    report = event.extra.get(EVENT_USAGE_KEY)
    run = report.get("run") if isinstance(report, Mapping) else None
    ids = run.get("reply_ids") if isinstance(run, Mapping) else None
    return [i for i in ids if isinstance(i, str)] if isinstance(ids, list) else None
