"""A stream's dispatch accounting against refusals: what the gateway refused is not owed.

The accounting is told what was sent (``admit``) and what the gateway answered. A refusal means
no dispatch: a change it rejected for now, or an on_request ``decide`` refused as stale or during
a shutdown. Were it still counted as owed, the log would say the gateway still decides, a
timeout would blame a decision the gateway is not making, the close would count an unconfirmed
decision, and a stream stopped by its budget would wait for that decision before failing.
"""

from __future__ import annotations

import pytest

from airflow_provider_systemzero.decisions.budget import DecisionBudget
from airflow_provider_systemzero.protocol.errors import ErrorEnvelope, RetryHint
from airflow_provider_systemzero.protocol.messages import AppendText, Decide, Error
from airflow_provider_systemzero.stream.accounting import DispatchAccounting


def _error(code: str, event_id: str | None = None) -> Error:
    return Error(
        "szws_" + "0" * 32,
        3,
        event_id,
        1,
        None,
        "req_1",
        False,
        ErrorEnvelope("invalid_request_error", code, "refused"),
        RetryHint(True, 100),
    )


def test_a_change_rejected_for_now_is_not_owed_a_decision() -> None:
    budget = DecisionBudget()
    accounting = DispatchAccounting(budget, "on_change", holder=1)
    assert accounting.admit(AppendText("evt_2", "x\n"), 10) is None
    assert accounting.outstanding() == 1 and accounting.waiting_since is not None
    accounting.refused(_error("event_rate_limited", "evt_2"))
    assert accounting.outstanding() == 0 and accounting.waiting_since is None
    assert accounting.connection_ended() is False and budget.usage.unconfirmed == 0
    # sent again later, it is admitted (and owed) again, once
    assert accounting.admit(AppendText("evt_2", "x\n"), 10) is None
    assert accounting.outstanding() == 1


@pytest.mark.parametrize("code", ["stale_state_version", "shutting_down"])
def test_a_refused_decide_is_not_owed_a_decision(code: str) -> None:
    budget = DecisionBudget()
    accounting = DispatchAccounting(budget, "on_request", holder=1)
    assert accounting.admit(Decide(1), 10) is None
    assert accounting.outstanding() == 1
    accounting.refused(_error(code))
    assert accounting.outstanding() == 0 and accounting.waiting_since is None
    assert accounting.connection_ended() is False and budget.usage.unconfirmed == 0


def test_a_rejected_change_leaves_the_others_owed() -> None:
    accounting = DispatchAccounting(DecisionBudget(), "on_change", holder=1)
    for number in (2, 3):
        assert accounting.admit(AppendText(f"evt_{number}", "x\n"), 10) is None
    since = accounting.waiting_since
    accounting.refused(_error("event_rate_limited", "evt_3"))
    assert accounting.outstanding() == 1 and accounting.waiting_since == since


@pytest.mark.parametrize("answer", ["failed", "refused"])
def test_what_settle_counted_is_taken_back_when_it_is_answered_unbilled(answer: str) -> None:
    """settle() counts the decide in flight as unconfirmed before the close; when the gateway
    answers it with a failure or a refusal instead, nothing was billed and nothing else is owed:
    the count goes (before, it stayed, and the next decision was counted besides it)."""
    budget = DecisionBudget()
    accounting = DispatchAccounting(budget, "on_request", holder=1)
    assert accounting.admit(Decide(1), 10) is None
    assert accounting.settle() and budget.usage.unconfirmed == 1
    if answer == "failed":
        accounting.failed(_error("internal_error"), retryable=False)
    else:
        accounting.refused(_error("shutting_down"))
    assert budget.usage.unconfirmed == 0
    assert accounting.connection_ended() is False and budget.usage.unconfirmed == 0


def test_what_settle_counted_stays_while_the_gateway_retries_it() -> None:
    budget = DecisionBudget()
    accounting = DispatchAccounting(budget, "on_change", holder=1)
    assert accounting.admit(AppendText("evt_2", "x\n"), 10) is None
    assert accounting.settle()
    accounting.failed(_error("rate_limited"), retryable=True)  # the gateway dispatches it again
    assert budget.usage.unconfirmed == 1 and accounting.outstanding() == 1
    assert accounting.connection_ended() is False and budget.usage.unconfirmed == 1
