"""The reconnect plan per close code and goodbye, the backoff's growth, and the retry classification."""

from __future__ import annotations

import random

import pytest

from airflow_provider_systemzero.protocol import (
    Backoff,
    CloseCode,
    ConnectionOutcome,
    DecideFailure,
    DecideRetry,
    ErrorEnvelope,
    GatewaySession,
    Limits,
    PlanKind,
    ReconnectPlanner,
    RetryHint,
    classify_decide_failure,
)
from airflow_provider_systemzero.protocol.gateway import SendMessage
from airflow_provider_systemzero.protocol.messages import Goodbye
from airflow_provider_systemzero.protocol.reconnect import HEALTHY_CONNECTION_S, MAX_SERVER_DELAY_S


def planner() -> ReconnectPlanner:
    return ReconnectPlanner(Backoff(base=1.0, cap=1000.0, rng=random.Random(1)))


def quick(code: int, **kwargs: object) -> ConnectionOutcome:
    """A connection that got its start acknowledged and ended a moment later."""
    return ConnectionOutcome(code, started=True, duration=0.05, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "code",
    [
        CloseCode.NORMAL_CLOSURE,
        CloseCode.INTERNAL_ERROR,
        CloseCode.TRY_AGAIN_LATER,
        CloseCode.ABNORMAL_CLOSURE,
        3000,
        4000,
    ],
)
def test_the_backoff_grows_across_connections_that_end_right_after_start(code: int) -> None:
    p = planner()
    plans = [p.plan(quick(code)) for _ in range(6)]
    assert [plan.attempt for plan in plans] == [0, 1, 2, 3, 4, 5]
    assert all(plan.kind is not PlanKind.STOP for plan in plans)
    # the jitter window doubles: by the sixth attempt the wait is up to 32 s, not a storm
    assert p.backoff.window(plans[-1].attempt) == 32.0


@pytest.mark.parametrize("goodbye", ["idle_timeout", "max_duration", None])
def test_a_1000_close_right_after_start_is_not_reconnected_at_once(goodbye: str | None) -> None:
    p = planner()
    plans = [
        p.plan(quick(CloseCode.NORMAL_CLOSURE, goodbye_reason=goodbye, server_delay_ms=0)) for _ in range(5)
    ]
    assert all(plan.kind is PlanKind.WHEN_NEEDED for plan in plans)
    assert [plan.attempt for plan in plans] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    ("goodbye", "kind"),
    [
        ("idle_timeout", PlanKind.WHEN_NEEDED),
        ("max_duration", PlanKind.WHEN_NEEDED),
        ("shutdown", PlanKind.RECONNECT),
        (None, PlanKind.RECONNECT),
    ],
)
def test_a_connection_the_client_closed_after_a_goodbye_keeps_the_goodbyes_plan(
    goodbye: str | None, kind: PlanKind
) -> None:
    """The gateway said goodbye and never closed, so the client did (recycled): an idle or
    lifetime goodbye still means "come back when there is work", after the delay it named."""
    plan = planner().plan(
        quick(CloseCode.NORMAL_CLOSURE, goodbye_reason=goodbye, server_delay_ms=700, kind="recycled")
    )
    assert plan.kind is kind and plan.delay >= 0.7


@pytest.mark.parametrize(
    ("code", "goodbye", "kind"),
    [
        (CloseCode.SERVICE_RESTART, "shutdown", "closed"),
        (CloseCode.TRY_AGAIN_LATER, "overload", "closed"),
        (CloseCode.TRY_AGAIN_LATER, None, "closed"),
        (CloseCode.INTERNAL_ERROR, None, "closed"),
        (CloseCode.ABNORMAL_CLOSURE, None, "closed"),
        (CloseCode.ABNORMAL_CLOSURE, None, "silent"),
        (CloseCode.ABNORMAL_CLOSURE, None, "stalled"),
    ],
)
def test_a_connection_lost_with_nothing_left_to_do_is_replaced_only_when_needed(
    code: int, goodbye: str | None, kind: str
) -> None:
    """Everything acknowledged and decided: a connection now would only replay a settled state,
    and on_change its start would dispatch that state again. The same loss with work left
    reconnects after the delay; both keep the server's delay and the backoff."""
    idle = planner().plan(
        quick(code, goodbye_reason=goodbye, server_delay_ms=300, kind=kind, work_left=False)
    )
    busy = planner().plan(quick(code, goodbye_reason=goodbye, server_delay_ms=300, kind=kind))
    assert (idle.kind, busy.kind) == (PlanKind.WHEN_NEEDED, PlanKind.RECONNECT)
    assert idle.delay == busy.delay >= 0.3 and idle.attempt == busy.attempt == 0


def test_a_released_connection_waits_out_a_named_retry_delay() -> None:
    plan = planner().plan(quick(CloseCode.NORMAL_CLOSURE, server_delay_ms=2_000, kind="released"))
    assert (plan.kind, plan.delay, plan.server_delay) == (PlanKind.WHEN_NEEDED, 2.0, 2.0)


def test_a_decision_or_a_healthy_stretch_resets_the_backoff() -> None:
    p = planner()
    for _ in range(4):
        p.plan(quick(CloseCode.ABNORMAL_CLOSURE))
    assert p.plan(ConnectionOutcome(CloseCode.ABNORMAL_CLOSURE, started=True, decided=True)).attempt == 0
    for _ in range(3):
        p.plan(quick(CloseCode.ABNORMAL_CLOSURE))
    healthy = ConnectionOutcome(CloseCode.ABNORMAL_CLOSURE, started=True, duration=HEALTHY_CONNECTION_S)
    assert p.plan(healthy).attempt == 0


def test_the_server_delay_comes_first_and_is_capped() -> None:
    p = planner()
    plan = p.plan(quick(CloseCode.SERVICE_RESTART, goodbye_reason="shutdown", server_delay_ms=2_000))
    assert plan.server_delay == 2.0 and 2.0 <= plan.delay <= 3.0
    huge = p.plan(quick(CloseCode.SERVICE_RESTART, goodbye_reason="shutdown", server_delay_ms=10**12))
    assert huge.server_delay == MAX_SERVER_DELAY_S and huge.delay <= MAX_SERVER_DELAY_S + p.backoff.window(1)


@pytest.mark.parametrize(
    "code",
    [
        CloseCode.PROTOCOL_ERROR,
        CloseCode.UNSUPPORTED_DATA,
        CloseCode.INVALID_DATA,
        CloseCode.POLICY_VIOLATION,
        CloseCode.MESSAGE_TOO_BIG,
        CloseCode.MANDATORY_EXTENSION,
    ],
)
def test_a_policy_close_without_goodbye_stops(code: int) -> None:
    plan = planner().plan(quick(code))
    assert plan.kind is PlanKind.STOP and "would repeat it" in (plan.final or "")


def test_a_policy_close_after_a_goodbye_or_a_start_timeout_reconnects() -> None:
    p = planner()
    assert p.plan(quick(CloseCode.POLICY_VIOLATION, goodbye_reason="event_limit")).kind is PlanKind.RECONNECT
    assert p.plan(quick(CloseCode.POLICY_VIOLATION, fatal_code="start_timeout")).kind is PlanKind.RECONNECT


def test_three_protocol_violations_in_a_row_stop() -> None:
    p = planner()
    kinds = [p.plan(ConnectionOutcome(CloseCode.PROTOCOL_ERROR, kind="violation")).kind for _ in range(3)]
    assert kinds == [PlanKind.RECONNECT, PlanKind.RECONNECT, PlanKind.STOP]


def test_refused_upgrades_retry_only_when_retryable() -> None:
    p = planner()
    retry = p.plan(ConnectionOutcome(kind="refused", status=429, server_delay_ms=1000))
    assert retry.kind is PlanKind.RECONNECT and retry.reason == "upgrade_refused:429" and retry.delay >= 1.0
    assert p.plan(ConnectionOutcome(kind="refused", status=401, retryable=False)).kind is PlanKind.STOP


def test_a_released_lease_reconnects_when_needed_without_delay_or_backoff() -> None:
    p = planner()
    p.plan(quick(CloseCode.ABNORMAL_CLOSURE))
    plan = p.plan(ConnectionOutcome(CloseCode.NORMAL_CLOSURE, kind="released"))
    assert (plan.kind, plan.delay, p.attempt) == (PlanKind.WHEN_NEEDED, 0.0, 1)


def test_labels_come_from_a_closed_set() -> None:
    assert ConnectionOutcome(1000, goodbye_reason="shutdown\nFAKE LOG LINE").label == "goodbye:other"
    assert ConnectionOutcome(1006, kind="silent").label == "receipt_timeout"


@pytest.mark.parametrize(
    ("status", "code", "retry", "expected"),
    [
        (429, "rate_limited", RetryHint(True, 100), DecideRetry.GATEWAY),
        (503, "overloaded", RetryHint(True), DecideRetry.GATEWAY),
        (503, "maintenance", RetryHint(True, 500), DecideRetry.CLIENT),
        (409, "idempotency_conflict", RetryHint(True), DecideRetry.GATEWAY),
        (409, "other", RetryHint(True), DecideRetry.NONE),
        (429, "rate_limited", RetryHint(False), DecideRetry.NONE),
        (500, "internal", RetryHint(True), DecideRetry.NONE),
        (422, "idempotency_key_reused", RetryHint(False), DecideRetry.NONE),
    ],
)
def test_one_table_classifies_decide_failures(
    status: int, code: str, retry: RetryHint, expected: DecideRetry
) -> None:
    assert classify_decide_failure(status, ErrorEnvelope("api_error", code, "m"), retry) is expected


def test_an_overload_goodbye_names_no_delay_the_failure_did_not_name() -> None:
    limits = Limits(consecutive_retryable_failures=1)
    g = GatewaySession(stream_id="szws_" + "a" * 32, now=0, limits=limits)
    g.actions()
    actions = g.receive_text(
        '{"type":"start","event_id":"evt_1","decision_mode":"on_change","request":{"model":"m",'
        '"state":"s","questions":{"ready":{"type":"boolean","instructions":"?"}}}}',
        0,
    )
    [dispatch] = [a for a in actions if not isinstance(a, SendMessage)]
    failure = DecideFailure(
        503, ErrorEnvelope("overloaded_error", "overloaded", "busy"), RetryHint(True), "r"
    )
    [goodbye] = [
        a.message
        for a in g.dispatch_finished(dispatch.dispatch_id, failure, 1)
        if isinstance(a, SendMessage) and isinstance(a.message, Goodbye)
    ]
    assert goodbye.reason == "overload" and goodbye.retry_after_ms is None
