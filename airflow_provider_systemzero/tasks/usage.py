"""A task's decision spend across all its tries: the Airflow side of the spending caps.

The arithmetic (:class:`~airflow_provider_systemzero.decisions.budget.DecisionBudget`, the
per-connection :class:`~airflow_provider_systemzero.decisions.budget.WindowBudget`, the usage
record) lives in :mod:`airflow_provider_systemzero.decisions.budget`, which imports no Airflow.
This module keeps what needs a task: :class:`TaskUsageLedger` (the Airflow 3.3 task state store,
AIP-103, under :data:`~airflow_provider_systemzero.decisions.budget.TASK_STATE_KEY`),
:class:`TryRecord` (what one try spent so far, however many times it resumed) and
:class:`UsageBudgetMixin` (the operators' and the sensor's caps, the usage XCom, and the event they
resume with: :meth:`UsageBudgetMixin.resumed_event`).

**One try, many parts.** A try can run in several parts: a sensor that defers, asks a person, hears
"no" and defers again resumes once per deferral, in a new worker process each time; a poking
sensor decides once per poke. The ``usage`` XCom, the log line and the decision timeline count the
whole try at their top level, with each part's own figures beside them (``resumes``). Between
parts the try's record travels with the task: in the trigger's budget kwargs (the event brings it
back), through a person's review in the review's own resume data, and in the task state store where
there is one (Airflow 3.3: a rescheduled poke finds it there too).

Importing this module does not import Airflow.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from airflow_provider_systemzero.decisions.budget import (
    EVENT_USAGE_KEY,
    TASK_STATE_KEY,
    USAGE_XCOM_KEY,
    BudgetExceeded,
    DecisionBudget,
    Usage,
    WindowBudget,
    parse_limit,
)
from airflow_provider_systemzero.decisions.timeline import merge_histories, settle_billed
from airflow_provider_systemzero.tasks.history import DECISIONS_XCOM_KEY, counted_replies
from airflow_provider_systemzero.tasks.payloads import error_payload, owned_event, task_failure

if TYPE_CHECKING:
    from airflow_provider_systemzero.decisions.watch import WatchEvent

__all__ = ["TaskUsageLedger", "TryRecord", "UsageBudgetMixin"]

#: What a budgeted decide returns (the hook's ``DecisionResult``, or what a caller's call makes of it).
_Result = TypeVar("_Result")

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------ Airflow tasks


def _try_number(context: Mapping[str, Any]) -> int:
    ti = context.get("ti")
    number = getattr(ti, "try_number", None)
    return int(number) if isinstance(number, int) else 0


def _final_failure(task_id: str, exc: BaseException) -> Exception | None:
    """The ``AirflowFailException`` for a worker's decide error retrying cannot fix, else ``None``."""
    from airflow_provider_systemzero.compat import AirflowException, AirflowFailException
    from airflow_provider_systemzero.decisions.watch import WatchEvent

    if not isinstance(exc, Exception) or isinstance(exc, AirflowException):
        return None  # cancelled or interrupted; or already the task's own error
    failure = task_failure(task_id, WatchEvent.from_payload(error_payload(exc)))
    return failure if isinstance(failure, AirflowFailException) else None


def _refused(task_id: str, refusal: BudgetExceeded | Mapping[str, Any]) -> Exception:
    """The task's error for a budget refusal (raised here, or read back from a trigger's event).
    A task's own cap holds across its tries, so a retry would be refused the same way: no retry.
    A time window's cap (per connection per hour) frees room as it moves, so Airflow's retries
    apply."""
    from airflow_provider_systemzero.compat import AirflowException, AirflowFailException

    facts = refusal.to_dict() if isinstance(refusal, BudgetExceeded) else refusal
    message = facts.get("message")
    if facts.get("retry_after") is None:
        return AirflowFailException(f"{task_id}: {message}")
    return AirflowException(
        f"{task_id}: {message}; the window moves, so Airflow's retries apply (a retry_delay of at "
        "least that long lets the next try in)"
    )


#: The most parts of a try whose figures a try's record keeps (the newest; the totals count all).
MAX_PARTS = 50
#: The most tries whose records the task state store keeps (the newest).
MAX_TRIES_KEPT = 10


class TryRecord:
    """What one try of a task spent so far, part by part, and whether it pushed a decision history.

    Plain JSON between the parts of a try (:meth:`to_dict`, :meth:`from_dict`); the module
    docstring says where it travels.

    :param try_number: the try it belongs to (a record of another try is not taken).
    """

    __slots__ = ("histories", "resumes", "run_ids", "try_number", "usage")

    def __init__(self, try_number: int) -> None:
        self.try_number = try_number
        #: the try's usage so far (its reply ids tell a later part's replays)
        self.usage = Usage()
        #: each part's figures and how it ended, oldest first (the newest :data:`MAX_PARTS`)
        self.resumes: list[dict[str, Any]] = []
        #: the runs counted, so a trigger event handed to the task twice counts once
        self.run_ids: list[str] = []
        #: decision histories (``decisions`` XComs) this try pushed
        self.histories = 0

    @classmethod
    def from_dict(cls, data: Any, try_number: int) -> TryRecord | None:
        """Read :meth:`to_dict` output of ``try_number`` leniently (``None``: none, or another try's)."""
        if not isinstance(data, Mapping) or data.get("try_number") != try_number:
            return None
        record = cls(try_number)
        record.usage = Usage.from_dict(data.get("usage"))
        resumes = data.get("resumes")
        record.resumes = (
            [dict(r) for r in resumes if isinstance(r, Mapping)] if isinstance(resumes, list) else []
        )
        ids = data.get("run_ids")
        record.run_ids = [i for i in ids if isinstance(i, str)] if isinstance(ids, list) else []
        histories = data.get("histories")
        record.histories = histories if isinstance(histories, int) and not isinstance(histories, bool) else 0
        return record

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON (trigger kwargs, a review's resume data, the task state store)."""
        return {
            "try_number": self.try_number,
            "usage": self.usage.to_dict(),
            "resumes": [dict(r) for r in self.resumes],
            "run_ids": list(self.run_ids),
            "histories": self.histories,
        }

    def add(self, run: Usage, run_id: str | None, outcome: str) -> bool:
        """Count a part of the try; a run already counted is not counted again.

        :return: whether it was counted.
        """
        if run_id is not None and run_id in self.run_ids:
            return False
        self.usage = self.usage.plus(run)
        self.resumes = [*self.resumes, {"outcome": outcome, **run.to_dict(reply_ids=False)}][-MAX_PARTS:]
        if run_id is not None:
            self.run_ids = [*self.run_ids, run_id][-MAX_PARTS:]
        return True


class TaskUsageLedger:
    """A task's usage across all its tries, on the worker (the trigger cannot reach the store).

    On Airflow 3.3+ the running total lives in the task state store (``context["task_state_store"]``)
    under :data:`TASK_STATE_KEY`, so a retry — or a re-run after a clear — starts from what earlier
    tries spent. Without a store (older Airflow, or a bare test context) the budget covers one try.

    The document::

        {"version": 1, "total": {<Usage, reply_ids included>},
         "reservations": {"<try>": {"decisions": n, "input_tokens": t}}}

    A try that defers first *reserves* the allowance it hands to the trigger; resuming replaces
    the reservation with what the trigger reports. A try that never resumes (killed, marked
    failed, worker lost while deferred) leaves its reservation, which later tries count as spent.

    The try's own record (:class:`TryRecord`) is kept beside the total, under ``"tries"`` (the
    newest :data:`MAX_TRIES_KEPT`); without a store it is the one the task carried here, and the
    budget then covers this try's parts so far.

    :param context: the task context.
    :param max_decisions: the task's ``max_decisions`` (``None``: no cap).
    :param max_input_tokens: the task's ``max_input_tokens`` (``None``: no cap).
    :param task_label: names the task in messages.
    :param do_xcom_push: push the ``usage`` XCom.
    :param logger: where the summary goes (the task log).
    :param carried: the try's record as the task carried it to this part (:meth:`TryRecord.to_dict`;
        ``None``: none, a try's first part).
    """

    def __init__(
        self,
        context: Mapping[str, Any],
        *,
        max_decisions: Any = None,
        max_input_tokens: Any = None,
        task_label: str = "this task",
        do_xcom_push: bool = True,
        logger: logging.Logger | logging.LoggerAdapter | None = None,
        carried: Mapping[str, Any] | None = None,
    ) -> None:  # type: ignore[type-arg]
        self.context = context
        self.max_decisions = parse_limit(max_decisions, "max_decisions")
        self.max_input_tokens = parse_limit(max_input_tokens, "max_input_tokens")
        self.task_label = task_label
        self.do_xcom_push = do_xcom_push
        self.log = logger or log
        self.store = context.get("task_state_store")
        self.try_number = _try_number(context)
        self._document = self._load()
        #: this try's record: the store's, else the one carried here, else a new one
        self.this_try = (
            TryRecord.from_dict(self._document["tries"].get(str(self.try_number)), self.try_number)
            or TryRecord.from_dict(carried, self.try_number)
            or TryRecord(self.try_number)
        )
        if self.store is None:  # no total across tries: the budget covers this try's parts so far
            self._document["total"] = self.this_try.usage.to_dict()
        self._warned = False
        if self.store is None and (self.max_decisions is not None or self.max_input_tokens is not None):
            from airflow_provider_systemzero.compat import AIRFLOW_TASK_STATE_STORE, airflow_version

            if airflow_version()[:2] < AIRFLOW_TASK_STATE_STORE:
                self.log.warning(
                    "Airflow %s has no task state store (it arrives in %s): max_decisions / max_input_tokens of "
                    "%s cover this try only, and a retry starts counting from zero",
                    ".".join(map(str, airflow_version())),
                    ".".join(map(str, AIRFLOW_TASK_STATE_STORE)),
                    self.task_label,
                )

    @property
    def persistent(self) -> bool:
        """Whether the total survives retries (a task state store is available)."""
        return self.store is not None

    @property
    def scope(self) -> str:
        return f"task {self.task_label} ({'all tries' if self.persistent else 'this try only'})"

    @property
    def hint(self) -> str:
        """The fix a refusal names: what holds where the total lives (all tries in the task state
        store), or — without a store — that the next try counts from zero again."""
        if not self.persistent:
            return (
                f"Raise max_decisions / max_input_tokens on task {self.task_label}; without a task "
                "state store they cover this try only (a retry counts from zero)."
            )
        return (
            f"Raise max_decisions / max_input_tokens on task {self.task_label}; the total across tries is "
            f"kept in the task state store under {TASK_STATE_KEY!r} (delete that key to start over)."
        )

    def _load(self) -> dict[str, Any]:
        if self.store is None:
            return {"version": 1, "total": Usage().to_dict(), "reservations": {}, "runs": [], "tries": {}}
        try:
            raw = self.store.get(TASK_STATE_KEY, default=None)
        except Exception as exc:  # an unreachable store must not hide the decision: count this try only
            self.log.warning(
                "could not read the System Zero usage from the task state store (%s); the budget "
                "covers this try only",
                exc,
            )
            self.store = None
            raw = None
        document = raw if isinstance(raw, dict) else {}
        reservations = document.get("reservations")
        runs = document.get("runs")
        tries = document.get("tries")
        return {
            "version": 1,
            "total": Usage.from_dict(document.get("total")).to_dict(),
            "reservations": dict(reservations) if isinstance(reservations, dict) else {},
            "runs": [r for r in runs if isinstance(r, str)] if isinstance(runs, list) else [],
            "tries": dict(tries) if isinstance(tries, dict) else {},
        }

    def _keep_this_try(self) -> None:
        """Put this try's record into the document (the newest :data:`MAX_TRIES_KEPT` tries)."""
        tries = {key: value for key, value in self._document["tries"].items() if key != str(self.try_number)}
        tries[str(self.try_number)] = self.this_try.to_dict()
        self._document["tries"] = dict(list(tries.items())[-MAX_TRIES_KEPT:])

    def _save(self) -> None:
        if self.store is None:
            return
        from datetime import timedelta

        try:
            self.store.set(TASK_STATE_KEY, self._document, retention=timedelta.max)
        except Exception as exc:
            self.log.warning("could not write the System Zero usage to the task state store: %s", exc)

    # ------------------------------------------------------------------ views

    @property
    def total(self) -> Usage:
        """Every try's usage recorded so far (reservations not included)."""
        return Usage.from_dict(self._document["total"])

    def _reserved(self) -> tuple[int, int]:
        """The allowance the other tries reserved and have not reported on: decisions, input tokens."""
        decisions = tokens = 0
        for key, value in self._document["reservations"].items():
            if key != str(self.try_number) and isinstance(value, dict):
                decisions += int(value.get("decisions") or 0)
                tokens += int(value.get("input_tokens") or 0)
        return decisions, tokens

    def _spent_for_run(self) -> Usage:
        spent = self.total
        decisions, tokens = self._reserved()
        if (decisions or tokens) and not self._warned:
            self._warned = True
            self.log.warning(
                "earlier tries of %s ended while deferred without reporting their System Zero usage; "
                "their allowance (%d decisions, %d input tokens) counts as spent",
                self.task_label,
                decisions,
                tokens,
            )
        spent.unconfirmed += decisions
        spent.input_tokens += tokens
        return spent

    def budget(self, *, windows: Iterable[WindowBudget] = ()) -> DecisionBudget:
        """The budget for this part of the try: the caps, minus what earlier tries (and this try's
        earlier parts) spent or reserved; it carries this try's record to a trigger and back."""
        return DecisionBudget(
            self.max_decisions,
            self.max_input_tokens,
            spent=self._spent_for_run(),
            scope=self.scope,
            hint=self.hint,
            windows=windows,
            carried=self.this_try.to_dict(),
        )

    def check(self) -> BudgetExceeded | None:
        """Refuse at once when not even one more dispatch fits (before opening any stream)."""
        return self.budget().check(1, None)

    def reserve(self, budget: DecisionBudget) -> None:
        """Before deferring: reserve the allowance handed to the trigger (replaced on resume)."""
        total = budget.total
        decisions = (
            max(0, budget.max_decisions - total.counted_decisions) if budget.max_decisions is not None else 0
        )
        tokens = (
            max(0, budget.max_input_tokens - total.input_tokens) if budget.max_input_tokens is not None else 0
        )
        if decisions or tokens:
            self._document["reservations"][str(self.try_number)] = {
                "decisions": decisions,
                "input_tokens": tokens,
            }
            self._save()

    # ------------------------------------------------------------------ finishing

    def finish(
        self,
        usage: Usage | Mapping[str, Any] | None,
        *,
        run_id: str | None = None,
        refusal: BudgetExceeded | Mapping[str, Any] | None = None,
        outcome: str = "decided",
    ) -> dict[str, Any]:
        """Add a part's usage to the try and to the total, persist them, push the ``usage`` XCom
        and log a summary of the try.

        :param usage: what the part spent (:class:`Usage` or its dict).
        :param run_id: the part's run id; a run already recorded (the same trigger event handed to
            ``execute_complete`` twice) is not added again.
        :param refusal: the budget refusal that ended the part, if any.
        :param outcome: how the part ended (for the record and the log line).
        :return: the XCom record: the whole try's figures at the top level, each part's in
            ``resumes``, all tries' in ``total``.
        """
        run = usage if isinstance(usage, Usage) else Usage.from_dict(usage)
        recorded = self._document["runs"]  # checked when the document was loaded
        total = self.total
        counted = self.this_try.add(run, run_id, outcome)
        if self.store is None:
            total = self.this_try.usage  # no store: the total is this try's
        elif counted and (run_id is None or run_id not in recorded):
            total = total.plus(run)
            if run_id is not None:
                recorded = [*recorded, run_id][-20:]
        self._document["total"] = total.to_dict()
        self._document["runs"] = recorded
        self._document["reservations"].pop(str(self.try_number), None)
        self._keep_this_try()
        self._save()
        refused = (
            refusal.to_dict()
            if isinstance(refusal, BudgetExceeded)
            else (dict(refusal) if isinstance(refusal, Mapping) else None)
        )
        this_try = self.this_try
        record = {
            **this_try.usage.to_dict(reply_ids=False),
            "try_number": self.try_number,
            "resumes": [dict(part) for part in this_try.resumes],
            "total": total.to_dict(reply_ids=False),
            "limits": {"max_decisions": self.max_decisions, "max_input_tokens": self.max_input_tokens},
            "refused_by": refused.get("limit") if refused else None,
            "persistent": self.persistent,
        }
        parts = len(this_try.resumes)
        self.log.info(
            "System Zero usage of %s, try %s (%s): %s%s",
            self.task_label,
            self.try_number,
            outcome,
            this_try.usage.describe(),
            f" (in {parts} parts; this one: {run.describe()})" if parts > 1 else "",
        )
        self.log.info(
            "System Zero usage of %s across tries: %d decision(s) counted (max_decisions=%s), %d input "
            "tokens (max_input_tokens=%s)%s",
            self.task_label,
            total.counted_decisions,
            self.max_decisions,
            total.input_tokens,
            self.max_input_tokens,
            "" if self.persistent else "; no task state store: this try only",
        )
        ti = self.context.get("ti")
        if self.do_xcom_push and ti is not None:
            try:
                ti.xcom_push(key=USAGE_XCOM_KEY, value=record)
            except Exception as exc:
                self.log.warning("could not push the System Zero usage XCom: %s", exc)
        return record

    def history_pushed(self) -> None:
        """Note that this try pushed a decision history (a later part merges its own into it)."""
        self.this_try.histories += 1
        if self.store is not None:
            self._keep_this_try()
            self._save()


class UsageBudgetMixin:
    """Adds ``max_decisions`` / ``max_input_tokens`` to an operator (put it before ``BaseOperator``).

    :param max_decisions: billed decisions allowed for the task across all its tries (``None``: no cap).
    :param max_input_tokens: input tokens allowed for the task across all its tries (``None``: no cap).
    """

    def __init__(
        self, *, max_decisions: int | None = None, max_input_tokens: int | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.max_decisions = parse_limit(max_decisions, "max_decisions")
        self.max_input_tokens = parse_limit(max_input_tokens, "max_input_tokens")
        #: reply id → billed (``True``) or replayed (``False``) of each decision this task made on the
        #: worker (:meth:`decide_with_budget`), for its decision history
        self.billed_by_reply: dict[str, bool] = {}
        #: this try's record in this process (:meth:`TryRecord.to_dict`): ``None`` until a part of
        #: the try is counted here, or until one carried here is taken (:meth:`resume_try`)
        self._this_try: dict[str, Any] | None = None

    @property
    def this_try(self) -> dict[str, Any] | None:
        """This try's record as it stands in this process, for the task to carry to its next part
        (through a person's review); ``None`` before any part was counted here."""
        return self._this_try

    def resume_try(self, carried: Any) -> None:
        """Take the try's record a part of the try carried here (a review's resume data, a
        trigger's event); a record that is not one is ignored.

        :param carried: :attr:`this_try` as an earlier part left it.
        """
        if isinstance(carried, Mapping):
            self._this_try = dict(carried)

    def push_history(
        self, context: Mapping[str, Any], event: WatchEvent, *, condition: Mapping[str, Any] | None = None
    ) -> list[dict[str, Any]] | None:
        """Push ``event``'s decision history as the ``decisions`` XCom, each decision told billed or
        replayed, merged with what this try pushed before (:mod:`~airflow_provider_systemzero.tasks.history`).

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
        rows = settle_billed(rows, self.billed_by_reply, counted_replies(event))
        ti = context.get("ti")
        if ti is None or not getattr(self, "do_xcom_push", True):
            return rows
        histories = (self._this_try or {}).get("histories")
        pushed = histories if isinstance(histories, int) and not isinstance(histories, bool) else 0
        try:
            history = merge_histories(self._earlier_history(ti) if pushed else [], rows)
            ti.xcom_push(key=DECISIONS_XCOM_KEY, value=history)
        except Exception as exc:  # the history explains the decision; it never fails the task
            getattr(self, "log", log).warning("could not push the System Zero decision history: %s", exc)
            return rows
        # the next part of the try merges its own into it
        if context.get("task_state_store") is not None:  # kept there too, for a rescheduled part
            ledger = self.usage_ledger(context)
            ledger.history_pushed()
            self._this_try = ledger.this_try.to_dict()
        else:
            self._this_try = {**(self._this_try or {}), "histories": pushed + 1}
        return history

    def _earlier_history(self, ti: Any) -> list[dict[str, Any]]:
        """What this try pushed before (a wait that went on after a person said "no")."""
        try:
            value = ti.xcom_pull(
                task_ids=ti.task_id, key=DECISIONS_XCOM_KEY, map_indexes=getattr(ti, "map_index", -1)
            )
        except Exception as exc:  # the new history still goes out
            getattr(self, "log", log).warning("could not read this try's earlier decision history: %s", exc)
            return []
        return [row for row in value if isinstance(row, Mapping)] if isinstance(value, list) else []

    def _finish_usage(self, ledger: TaskUsageLedger, budget_usage: Any, **kwargs: Any) -> dict[str, Any]:
        """:meth:`TaskUsageLedger.finish`, keeping the try's record for the next part."""
        record = ledger.finish(budget_usage, **kwargs)
        self._this_try = ledger.this_try.to_dict()
        return record

    def usage_ledger(self, context: Mapping[str, Any]) -> TaskUsageLedger:
        """This try's :class:`TaskUsageLedger` (with the try's record this process holds)."""
        ti = context.get("ti")
        label = f"{getattr(ti, 'dag_id', '?')}.{getattr(self, 'task_id', '?')}"
        map_index = getattr(ti, "map_index", -1)
        if isinstance(map_index, int) and map_index >= 0:
            label += f"[{map_index}]"
        return TaskUsageLedger(
            context,
            max_decisions=self.max_decisions,
            max_input_tokens=self.max_input_tokens,
            task_label=repr(label),
            do_xcom_push=getattr(self, "do_xcom_push", True),
            logger=getattr(self, "log", None),
            carried=self._this_try,
        )

    def budget_before_dispatch(
        self, context: Mapping[str, Any], body_bytes: int | None = None
    ) -> tuple[TaskUsageLedger, DecisionBudget]:
        """The ledger and this try's budget; fails the task at once when the next dispatch does not fit.

        :param body_bytes: the decide body's size when the state is known (the token estimate).
        :raises AirflowFailException: the budget is spent (the ``usage`` XCom is pushed first).
        """
        ledger = self.usage_ledger(context)
        budget = ledger.budget()
        refused = budget.check(1, body_bytes)
        if refused is not None:
            budget.record_exceeded(refused)
            self._finish_usage(
                ledger, budget.usage, run_id=budget.run_id, refusal=refused, outcome="refused before dispatch"
            )
            raise _refused(getattr(self, "task_id", "?"), refused)
        return ledger, budget

    def resumed_event(self, context: Mapping[str, Any], event: Any, accepted: Collection[str]) -> WatchEvent:
        """On resume from a trigger: its event, once it is usable and this task's own (an event may
        be redelivered, a misrouted one is never taken), read back; with the trigger's usage
        recorded (pushes the ``usage`` XCom), which fails the task when the trigger's budget
        refused a dispatch.

        :param event: the trigger's payload.
        :param accepted: the key namespaces that identify this task's request.
        :raises AirflowException: the event is unusable or belongs to another request.
        :raises AirflowFailException: the task's budget stopped the trigger (``AirflowException``,
            which Airflow retries, for a time window's).
        """
        from airflow_provider_systemzero.decisions.watch import WatchEvent

        event = WatchEvent.from_payload(owned_event(getattr(self, "task_id", "?"), event, accepted))
        self.usage_from_event(context, event)
        return event

    def usage_from_event(self, context: Mapping[str, Any], event: WatchEvent) -> dict[str, Any]:
        """On resume: record the trigger's usage (pushes the ``usage`` XCom); fails the task when
        the trigger's budget refused a dispatch (:meth:`resumed_event` does this with the checks
        before it).

        :param event: the trigger's event, read back.
        :raises AirflowFailException: the task's budget stopped the trigger (``AirflowException``,
            which Airflow retries, for a time window's).
        """
        report = event.extra.get(EVENT_USAGE_KEY)
        report = report if isinstance(report, Mapping) else {}
        refusal = report.get("refusal") if isinstance(report.get("refusal"), Mapping) else None
        ok = event.status in ("success", "review")  # a review event ends a wait as a decision does
        self.resume_try(report.get("carried"))  # what the try spent before it deferred
        record = self._finish_usage(
            self.usage_ledger(context),
            report.get("run"),
            run_id=report.get("run_id"),
            refusal=refusal,
            outcome="decided" if ok else "failed",
        )
        if refusal is not None and not ok:
            raise _refused(getattr(self, "task_id", "?"), refusal)
        return record

    def decide_with_budget(
        self,
        context: Mapping[str, Any],
        call: Callable[[DecisionBudget], _Result],
        body_bytes: int | None = None,
    ) -> _Result:
        """Run a synchronous decide under this try's budget; the usage is recorded on every exit.

        :param call: receives the budget and performs the decide (e.g. ``hook.decide(..., budget=b)``).
        :param body_bytes: the decide body's size (checked before anything connects).
        :raises AirflowFailException: the task's budget refused the dispatch (``AirflowException``,
            which Airflow retries, for a time window's), or the decide failed in a way retrying
            cannot fix (read as a trigger's failed event is:
            :func:`~airflow_provider_systemzero.tasks.payloads.task_failure`); any other error
            is raised as it is, for Airflow's retries.
        """
        ledger, budget = self.budget_before_dispatch(context, body_bytes)
        try:
            result = call(budget)
        except BudgetExceeded as exc:
            self._finish_usage(ledger, budget.usage, run_id=budget.run_id, refusal=exc, outcome="refused")
            raise _refused(getattr(self, "task_id", "?"), exc) from None
        except BaseException as exc:
            self._finish_usage(
                ledger, budget.usage, run_id=budget.run_id, refusal=budget.exceeded, outcome="failed"
            )
            final = _final_failure(getattr(self, "task_id", "?"), exc)
            if final is not None:
                raise final from None
            raise
        self._finish_usage(ledger, budget.usage, run_id=budget.run_id, outcome="decided")
        reply_id = getattr(result, "reply_id", None)
        if isinstance(reply_id, str):  # the budget lists the replies it billed, never a replay
            self.billed_by_reply[reply_id] = reply_id in budget.usage.reply_ids
        return result

    def trigger_budget(self, context: Mapping[str, Any], body_bytes: int | None = None) -> dict[str, Any]:
        """Before deferring: the budget for the trigger's kwargs, with its allowance reserved.

        :param body_bytes: the decide body's size when the state is known: a dispatch whose
            estimate cannot fit is refused here, before a trigger connects.
        :raises AirflowFailException: the budget is spent already.
        """
        ledger, budget = self.budget_before_dispatch(context, body_bytes)
        ledger.reserve(budget)
        return budget.to_kwargs()

    def start_trigger_budget(self) -> dict[str, Any]:
        """The budget for ``start_trigger_args`` (start from the triggerer): no worker runs before
        the trigger, so earlier tries' spend is unknown there and the caps apply to the deferral;
        the usage is still added to the task's total on resume."""
        task_id = getattr(self, "task_id", "?")
        return DecisionBudget(
            self.max_decisions,
            self.max_input_tokens,
            scope=f"task {task_id!r} (this deferral: it started in the triggerer)",
            hint=f"Raise max_decisions / max_input_tokens on task {task_id!r}.",
        ).to_kwargs()
