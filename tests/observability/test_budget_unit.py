"""The budget arithmetic, the per-connection window and the task ledger, without any I/O."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_systemzero.decisions.budget import (
    TASK_STATE_KEY,
    BudgetExceeded,
    DecisionBudget,
    Usage,
    WindowBudget,
    connection_window,
    event_usage,
    parse_limit,
)
from airflow_provider_systemzero.tasks.usage import TaskUsageLedger, UsageBudgetMixin

USAGE = {"input_tokens": 40, "cached_input_tokens": 10, "media_tokens": 0}


def test_limits_are_whole_numbers() -> None:
    assert parse_limit(None, "x") is None and parse_limit("", "x") is None
    assert parse_limit(3, "x") == 3 and parse_limit("7", "x") == 7 and parse_limit(2.0, "x") == 2
    for bad in (-1, 1.5, True, "ten", [1]):
        with pytest.raises(ValueError, match="whole number"):
            parse_limit(bad, "max_decisions")


def test_check_counts_what_could_still_be_dispatched() -> None:
    budget = DecisionBudget(max_decisions=2)
    assert budget.check(2) is None  # start + one change may both be dispatched
    assert isinstance(budget.check(3), BudgetExceeded)
    assert budget.record_decision("szd_a", USAGE) is True
    assert budget.check(1) is None
    budget.record_decision("szd_b", USAGE)
    refused = budget.check(1)
    assert isinstance(refused, BudgetExceeded) and refused.limit == "max_decisions"
    text = str(refused)
    assert "max_decisions=2" in text and "2 decisions spent" in text and "Raise" in text


def test_a_replayed_reply_id_never_counts_twice() -> None:
    budget = DecisionBudget(max_decisions=5, spent={"billed": 1, "input_tokens": 40, "reply_ids": ["szd_a"]})
    assert budget.record_decision("szd_a", USAGE) is False  # the original reply again: a replay
    assert budget.record_decision("szd_b", USAGE) is True
    assert budget.record_decision("szd_b", USAGE) is False
    assert (budget.usage.billed, budget.usage.replayed, budget.usage.dispatched) == (1, 2, 3)
    assert budget.usage.input_tokens == 40 and budget.total.input_tokens == 80
    assert budget.total.billed == 2 and budget.total.reply_ids == ["szd_a", "szd_b"]


def test_token_cap_uses_the_learned_ratio_before_dispatch() -> None:
    budget = DecisionBudget(max_input_tokens=100)
    assert budget.check(1, body_bytes=200) is None  # 200 bytes * 0.25 = 50 tokens
    assert isinstance(budget.check(1, body_bytes=500), BudgetExceeded)  # 125 > 100
    budget.record_decision("szd_a", {"input_tokens": 60}, body_bytes=200)  # ratio 0.3
    assert budget.tokens_each(100) == 30
    assert budget.check(1, body_bytes=100) is None  # 60 + 30 ≤ 100
    refused = budget.check(1, body_bytes=150)  # 60 + 45 > 100
    assert refused is not None and refused.limit == "max_input_tokens"


def test_unconfirmed_dispatches_count_against_the_cap() -> None:
    budget = DecisionBudget(max_decisions=1)
    budget.record_unconfirmed()
    assert isinstance(budget.check(1), BudgetExceeded)
    assert budget.usage.unconfirmed == 1 and budget.usage.billed == 0


def test_kwargs_round_trip_keeps_totals_and_ids() -> None:
    budget = DecisionBudget(
        3, 1000, spent={"billed": 1, "reply_ids": ["szd_a"]}, scope="task 'd.t'", hint="h"
    )
    budget.record_decision("szd_b", USAGE)
    clone = DecisionBudget.from_kwargs(budget.to_kwargs())
    assert clone is not None and clone.max_decisions == 3 and clone.max_input_tokens == 1000
    assert clone.spent.billed == 2 and clone.record_decision("szd_b", USAGE) is False
    assert DecisionBudget.from_kwargs(None) is None


def test_window_is_shared_and_slides() -> None:
    now = [0.0]
    window = WindowBudget("conn", max_decisions=2, window=60, clock=lambda: now[0])
    a, b = DecisionBudget(windows=[window]), DecisionBudget(windows=[window])
    assert a.check(1, holder=1) is None
    a.hold(1, 1)
    assert b.check(1, holder=2) is None
    b.hold(2, 1)
    refused = a.check(2, holder=1)  # a's own hold is replaced, b's counts
    assert refused is not None and refused.limit == "budget_decisions_per_hour"
    a.record_decision("szd_a")
    a.hold(1, 0)
    b.record_decision("szd_b")
    b.hold(2, 0)
    assert window.spent() == (2, 0) and a.check(1, holder=1) is not None
    now[0] = 61.0
    assert window.spent() == (0, 0) and a.check(1, holder=1) is None


def test_connection_window_is_per_process_and_per_connection() -> None:
    assert connection_window("c", None, None) is None
    first = connection_window("c", 5, None)
    assert first is connection_window("c", "5", None)
    assert connection_window("other", 5, None) is not first


class FakeStore:
    def __init__(self) -> None:
        self.data: dict[str, Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def set(self, key: str, value: Any, *, retention: Any = None) -> None:
        assert value is not None
        import json

        self.data[key] = json.loads(json.dumps(value))  # what the store keeps is JSON


class FakeTI:
    dag_id, task_id, map_index = "d", "t", -1

    def __init__(self, try_number: int) -> None:
        self.try_number = try_number
        self.xcoms: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[key] = value


def context(store: FakeStore | None, try_number: int = 1) -> dict[str, Any]:
    ctx: dict[str, Any] = {"ti": FakeTI(try_number)}
    if store is not None:
        ctx["task_state_store"] = store
    return ctx


def test_ledger_carries_the_total_across_tries() -> None:
    store = FakeStore()
    first = TaskUsageLedger(context(store, 1), max_decisions=3, task_label="'d.t'")
    budget = first.budget()
    budget.record_decision("szd_a", USAGE)
    budget.record_decision("szd_b", USAGE)
    record = first.finish(budget.usage, run_id=budget.run_id)
    assert record["billed"] == 2 and record["total"]["billed"] == 2 and record["input_tokens"] == 80
    assert first.context["ti"].xcoms["usage"] == record
    second = TaskUsageLedger(context(store, 2), max_decisions=3, task_label="'d.t'")
    budget = second.budget()
    assert budget.check(1) is None and isinstance(budget.check(2), BudgetExceeded)
    assert budget.record_decision("szd_b", USAGE) is False  # an earlier try's reply: a replay
    assert "all tries" in str(budget.check(2))


def test_finishing_the_same_run_twice_counts_once() -> None:
    store = FakeStore()
    ledger = TaskUsageLedger(context(store), max_decisions=3)
    budget = ledger.budget()
    budget.record_decision("szd_a", USAGE)
    ledger.finish(budget.usage, run_id=budget.run_id)
    again = TaskUsageLedger(context(store), max_decisions=3)
    again.finish(budget.usage, run_id=budget.run_id)  # the same event handed to execute_complete twice
    assert again.total.billed == 1


def test_a_deferral_that_never_resumed_counts_its_allowance() -> None:
    store = FakeStore()
    ledger = TaskUsageLedger(context(store, 1), max_decisions=4)
    budget = ledger.budget()
    ledger.reserve(budget)
    assert store.data[TASK_STATE_KEY]["reservations"] == {"1": {"decisions": 4, "input_tokens": 0}}
    later = TaskUsageLedger(context(store, 2), max_decisions=4)
    assert isinstance(later.check(), BudgetExceeded)  # try 1 was killed while deferred
    # a try that resumes replaces its reservation with what it really spent
    ledger.finish({"billed": 1, "dispatched": 1, "reply_ids": ["szd_a"]})
    assert TaskUsageLedger(context(store, 2), max_decisions=4).check() is None


def test_without_a_task_state_store_the_budget_covers_one_try() -> None:
    ledger = TaskUsageLedger(context(None), max_decisions=1)
    assert not ledger.persistent and "this try only" in ledger.scope
    record = ledger.finish(Usage(billed=1, dispatched=1))
    assert record["persistent"] is False
    # the refusal says only what holds without a store (Airflow 3.1 / 3.2): no key to delete
    refused = TaskUsageLedger(context(None), max_decisions=0, task_label="'d.t'").check()
    assert refused is not None
    assert "task state store under" not in str(refused) and "delete that key" not in str(refused)
    assert str(refused).endswith(
        "Raise max_decisions / max_input_tokens on task 'd.t'; without a task state store they cover "
        "this try only (a retry counts from zero)."
    )


def test_event_usage_reports_the_run_and_the_refusal() -> None:
    budget = DecisionBudget(max_decisions=0)
    refused = budget.check(1)
    assert refused is not None
    budget.record_exceeded(refused)
    report = event_usage(budget)["systemzero_usage"]
    assert report["run"]["refused"] == 1 and report["refusal"]["limit"] == "max_decisions"
    assert report["run_id"] == budget.run_id and event_usage(None) == {}


def test_mixin_consumes_its_arguments() -> None:
    class Base:
        def __init__(self, **kwargs: Any) -> None:
            assert not kwargs, kwargs

    class Op(UsageBudgetMixin, Base):
        pass

    op = Op(max_decisions="3", max_input_tokens=None)
    assert op.max_decisions == 3 and op.max_input_tokens is None
    with pytest.raises(ValueError):
        Op(max_decisions=-1)
