"""GatewaySession driven frame by frame: every rejection, refusal, schedule and close path."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_provider_systemzero.protocol import (
    DecideFailure,
    DecideSuccess,
    ErrorEnvelope,
    GatewaySession,
    Limits,
    RetryHint,
)
from airflow_provider_systemzero.protocol.gateway import CloseConnection, DispatchDecide, SendMessage

SID = "szws_" + "ab" * 16
QUESTIONS = {"ready": {"type": "boolean", "instructions": "Is the job ready?"}}
OK = DecideSuccess(reply={"id": "szd_" + "0" * 32, "answers": {}}, request_id="r")


def failure(status: int, code: str, *, retryable: bool = True, delay: int | None = 100) -> DecideFailure:
    return DecideFailure(
        status, ErrorEnvelope("overloaded_error", code, code), RetryHint(retryable, delay), "rf"
    )


class Driver:
    """Feeds one GatewaySession and records what it did."""

    def __init__(self, limits: Limits | None = None, now: float = 0.0) -> None:
        self.now = now
        self.g = GatewaySession(stream_id=SID, now=now, limits=limits)
        self.sent: list[dict[str, Any]] = []
        self.dispatches: list[DispatchDecide] = []
        self.close: CloseConnection | None = None
        self.take(self.g.actions())

    def take(self, actions: list[Any]) -> list[dict[str, Any]]:
        new = []
        for a in actions:
            if isinstance(a, SendMessage):
                new.append(a.message.to_dict())
            elif isinstance(a, DispatchDecide):
                self.dispatches.append(a)
            else:
                assert self.close is None, "closed twice"
                self.close = a
        self.sent.extend(new)
        return new

    def send(self, message: dict[str, Any] | str) -> list[dict[str, Any]]:
        text = message if isinstance(message, str) else json.dumps(message)
        return self.take(self.g.receive_text(text, self.now))

    def start(self, state: Any = "log\n", mode: str = "on_change", **extra: Any) -> list[dict[str, Any]]:
        request = {"model": "m", "state": state, "questions": QUESTIONS, "prompt_cache_key": "pck"}
        request.update(extra.pop("request", {}))
        return self.send(
            {"type": "start", "event_id": "evt_1", "request": request, "decision_mode": mode, **extra}
        )

    def finish(self, outcome: Any = OK, index: int = -1) -> list[dict[str, Any]]:
        return self.take(self.g.dispatch_finished(self.dispatches[index].dispatch_id, outcome, self.now))

    def at(self, t: float) -> list[dict[str, Any]]:
        self.now = t
        return self.take(self.g.tick(t))


def only(msgs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    matches = [m for m in msgs if m["type"] == kind]
    assert len(matches) == 1, msgs
    return matches[0]


def code(msg: dict[str, Any]) -> str:
    return msg["error"]["envelope"]["error"]["code"]


# ------------------------------------------------------------------ start


def test_hello_is_seq_one_with_limits() -> None:
    d = Driver(Limits(idle_timeout_ms=5))
    assert d.sent[0]["type"] == "hello" and d.sent[0]["seq"] == 1
    assert d.sent[0]["limits"]["idle_timeout_ms"] == 5


@pytest.mark.parametrize(
    ("request_change", "extra", "expected_code"),
    [
        ({"questions": {"1ready": {"type": "boolean", "instructions": "x"}}}, {}, "invalid_question_name"),
        ({"questions": {}}, {}, "invalid_questions"),
        ({"questions": {"q": {"type": "score", "instructions": "x"}}}, {}, "invalid_question"),
        ({"route": "committee", "mode": "deliberate"}, {}, "incompatible_route_mode"),
        ({"route": "fastest"}, {}, "invalid_route"),
        (
            {"attachments": [{"name": "9x", "data": "data:text/plain;base64,eA=="}]},
            {},
            "invalid_attachment_name",
        ),
        (
            {
                "attachments": [
                    {"name": "a", "data": "data:text/plain;base64,eA=="},
                    {"name": "a", "data": "data:text/plain;base64,eA=="},
                ]
            },
            {},
            "duplicate_attachment_name",
        ),
        ({"attachments": [{"name": "a", "data": "https://x"}]}, {}, "invalid_attachment"),
        ({}, {"min_interval_ms": 60001}, "invalid_min_interval"),
        ({}, {"idempotency_key": "   "}, "invalid_idempotency_key"),
        ({}, {"idempotency_key": "k" * 256}, "invalid_idempotency_key"),
        ({}, {"idempotency_key": "caf\u00e9"}, "invalid_idempotency_key"),
        ({}, {"decision_mode": "sometimes"}, "invalid_decision_mode"),
    ],
)
def test_rejected_start_leaves_stream_waiting_for_evt_1(
    request_change: dict[str, Any], extra: dict[str, Any], expected_code: str
) -> None:
    d = Driver()
    mode = extra.pop("decision_mode", "on_change")
    err = only(d.start(mode=mode, request=request_change, **extra), "error")
    assert code(err) == expected_code and err["fatal"] is False and err["event_id"] == "evt_1"
    assert d.g.state_version == 0
    ack = only(d.start(), "ack")
    assert ack["event_id"] == "evt_1" and ack["state_version"] == 1


def test_key_is_trimmed_of_spaces() -> None:
    d = Driver()
    d.start(mode="on_request", idempotency_key="  k1  ")
    assert d.g.idempotency_key == "k1"


def test_start_timeout_is_fatal_1008() -> None:
    d = Driver(Limits(start_timeout_ms=100))
    msgs = d.at(0.1)
    err = only(msgs, "error")
    assert code(err) == "start_timeout" and err["fatal"] is True
    assert d.close == CloseConnection(1008, "start_timeout")


def test_mutation_before_start_is_rejected() -> None:
    d = Driver()
    err = only(d.send({"type": "append_text", "event_id": "evt_1", "text": "x"}), "error")
    assert code(err) == "start_required" and err["fatal"] is False


def test_second_start_is_rejected() -> None:
    d = Driver()
    d.start()
    err = only(d.start(), "error")
    assert code(err) == "already_started" and d.g.state_version == 1


# ------------------------------------------------------------------ mutations


@pytest.mark.parametrize(
    ("start_state", "mutation", "expected_code"),
    [
        ("log", {"type": "append_items", "items": [1]}, "state_type_mismatch"),
        ([1], {"type": "append_text", "text": "x"}, "state_type_mismatch"),
        ({"a": 1}, {"type": "append_text", "text": "x"}, "state_type_mismatch"),
        ([1], {"type": "append_items", "items": []}, "empty_items"),
        ("log", {"type": "append_attachments", "attachments": []}, "invalid_attachment"),
        ("log", {"type": "append_text", "text": "x", "idempotency_key": ""}, "invalid_idempotency_key"),
        ("log", {"type": "append_text", "event_id": "evt_3", "text": "x"}, "event_id_out_of_sequence"),
        ("log", {"type": "append_text", "event_id": "evt_02", "text": "x"}, "event_id_out_of_sequence"),
    ],
)
def test_rejected_mutation_changes_nothing(
    start_state: Any, mutation: dict[str, Any], expected_code: str
) -> None:
    d = Driver()
    d.start(state=start_state, mode="on_request", idempotency_key="k1")
    before = (d.g.stream_state, d.g.state_version, d.g.idempotency_key, d.g.body)
    err = only(d.send({"event_id": "evt_2", **mutation}), "error")
    assert code(err) == expected_code and err["fatal"] is False
    assert err["event_id"] == mutation.get("event_id", "evt_2")
    assert (d.g.stream_state, d.g.state_version, d.g.idempotency_key, d.g.body) == before
    # the next ID is still available for a corrected retry
    fix = {"type": "replace", "event_id": "evt_2", "state": "new"}
    assert only(d.send(fix), "ack")["event_id"] == "evt_2"


def test_each_mutation_kind_and_attachment_rules() -> None:
    d = Driver()
    data = "data:text/plain;base64,aGVsbG8="
    d.start(state=["a"], mode="on_request", request={"attachments": [{"name": "one", "data": data}]})
    d.send({"type": "append_items", "event_id": "evt_2", "items": ["b", {"c": 1}]})
    assert d.g.stream_state.state == ["a", "b", {"c": 1}]
    err = only(
        d.send(
            {
                "type": "append_attachments",
                "event_id": "evt_3",
                "attachments": [{"name": "one", "data": data}],
            }
        ),
        "error",
    )
    assert code(err) == "duplicate_attachment_name"
    d.send(
        {"type": "append_attachments", "event_id": "evt_3", "attachments": [{"name": "two", "data": data}]}
    )
    assert [a.name for a in d.g.stream_state.attachments] == ["one", "two"]
    d.send({"type": "replace", "event_id": "evt_4", "state": {"obj": True}})  # omitted attachments: kept
    assert len(d.g.stream_state.attachments) == 2
    d.send({"type": "replace", "event_id": "evt_5", "state": {"obj": True}, "attachments": []})
    assert d.g.stream_state.attachments == () and d.g.state_version == 5
    assert '"attachments"' not in d.g.body


def test_unkeyed_mutation_clears_key_and_each_version_has_its_own() -> None:
    d = Driver()
    d.start(mode="on_request", idempotency_key="k1")
    d.send({"type": "append_text", "event_id": "evt_2", "text": "x", "idempotency_key": "k2"})
    assert d.g.idempotency_key == "k2"
    d.send({"type": "append_text", "event_id": "evt_3", "text": "y"})
    assert d.g.idempotency_key is None


def test_decide_body_limit_rejects() -> None:
    d = Driver(Limits(max_decide_body_bytes=200))
    d.start(mode="on_request")
    err = only(d.send({"type": "append_text", "event_id": "evt_2", "text": "x" * 200}), "error")
    assert code(err) == "decide_body_too_large" and d.g.state_version == 1


def test_event_rate_limit_rejects_with_retry_after_and_rejections_do_not_spend() -> None:
    d = Driver(Limits(max_events_per_second=1, event_burst=2))
    d.start(mode="on_request")
    assert only(d.send({"type": "append_text", "event_id": "evt_2", "text": "a"}), "ack")
    err = only(d.send({"type": "append_text", "event_id": "evt_3", "text": "b"}), "error")
    assert code(err) == "event_rate_limited" and err["error"]["retry"] == {
        "retryable": True,
        "retry_after_ms": 1000,
    }
    assert err["error"]["envelope"]["error"]["type"] == "rate_limit_error"
    d.now = 0.5
    d.send({"type": "append_text", "event_id": "evt_3", "text": "b"})  # still limited
    d.now = 1.0
    assert (
        only(d.send({"type": "append_text", "event_id": "evt_3", "text": "b"}), "ack")["state_version"] == 3
    )


def test_pending_event_limit() -> None:
    d = Driver(Limits(max_pending_events=2, max_events_per_second=100, event_burst=100))
    d.start(mode="on_request")
    d.send({"type": "append_text", "event_id": "evt_2", "text": "a"})
    err = only(d.send({"type": "append_text", "event_id": "evt_3", "text": "b"}), "error")
    assert code(err) == "too_many_pending_events"
    d.send({"type": "decide", "state_version": 2})  # freezes evt_1..2 into a dispatch
    assert only(d.send({"type": "append_text", "event_id": "evt_3", "text": "b"}), "ack")


def test_event_limit_is_fatal_with_goodbye_and_1008() -> None:
    d = Driver(Limits(max_events=2, max_events_per_second=100, event_burst=100))
    d.start(mode="on_request")
    d.send({"type": "append_text", "event_id": "evt_2", "text": "a"})
    msgs = d.send({"type": "append_text", "event_id": "evt_3", "text": "b"})
    assert code(only(msgs, "error")) == "event_limit" and only(msgs, "error")["fatal"]
    assert only(msgs, "goodbye")["reason"] == "event_limit"
    assert d.close == CloseConnection(1008, "event_limit")


# ------------------------------------------------------------------ refusals


@pytest.mark.parametrize(
    "frame",
    [
        "not json",
        "[1, 2]",
        json.dumps({"type": "shout"}),
        json.dumps({"type": "append_text", "event_id": "evt_2"}),
        json.dumps({"type": "append_text", "event_id": 2, "text": "x"}),
        json.dumps({"type": "decide", "state_version": "1"}),
        json.dumps({"type": "pong", "nonce": True}),
        json.dumps({"type": "replace", "event_id": "evt_2", "state": 5}),
        # Python reads these, JSON has no such numbers: refused, never an abort in admission
        '{"type": "replace", "event_id": "evt_2", "state": [NaN]}',
        '{"type": "append_items", "event_id": "evt_2", "items": [-Infinity]}',
        '{"type": "replace", "event_id": "evt_2", "state": {"x": 1e999}}',
    ],
)
def test_malformed_frames_are_refusals(frame: str) -> None:
    d = Driver()
    d.start()
    err = only(d.send(frame), "error")
    assert err["fatal"] is False and err["error"]["envelope"]["error"]["type"] == "invalid_request_error"
    assert d.g.refusal_count == 1 and d.g.state_version == 1


def test_a_refused_mutation_echoes_its_event_id() -> None:
    d = Driver()
    d.start()
    err = only(d.send({"type": "append_text", "event_id": "evt_2"}), "error")
    assert err["event_id"] == "evt_2" and d.g.refusal_count == 1


@pytest.mark.parametrize(
    ("frame", "expected"),
    [
        ({"type": "append_text", "event_id": "evt_2", "text": "x", "extra": 1}, "unknown_field"),
        (
            {
                "type": "append_attachments",
                "event_id": "evt_2",
                "attachments": [{"name": "a", "data": "data:text/plain;base64,eA==", "mime": "text/plain"}],
            },
            "invalid_attachment",
        ),
    ],
)
def test_an_unknown_field_is_a_rejection_not_a_refusal(frame: dict, expected: str) -> None:
    """WIRE.md §2 lists the refusals exhaustively; an unknown field is not among them."""
    d = Driver()
    d.start()
    err = only(d.send(frame), "error")
    assert code(err) == expected and err["event_id"] == "evt_2" and err["fatal"] is False
    assert d.g.refusal_count == 0 and d.g.rejections == 1 and d.g.state_version == 1
    # the rejection left the next ID free
    assert (
        only(d.send({"type": "append_text", "event_id": "evt_2", "text": "y"}), "ack")["state_version"] == 2
    )


def test_text_that_is_not_valid_unicode_is_rejected_invalid_state() -> None:
    d = Driver()
    d.start()
    err = only(d.send('{"type":"append_text","event_id":"evt_2","text":"\\ud800"}'), "error")
    assert code(err) == "invalid_state" and err["event_id"] == "evt_2" and d.close is None
    assert d.g.state_version == 1


def test_three_refusals_in_the_window_are_fatal_1008() -> None:
    d = Driver(Limits(idle_timeout_ms=10**6, heartbeat_interval_ms=10**6))
    d.start(mode="on_request")
    d.send("x")
    d.now = 30
    d.send("y")
    d.now = 61  # the first refusal left the 60 s window
    assert only(d.send("z"), "error")["fatal"] is False
    last = only(d.send("w"), "error")
    assert last["fatal"] is True and d.close == CloseConnection(1008, "protocol_refusal_limit")


def test_binary_frame_is_a_refusal() -> None:
    d = Driver()
    d.take(d.g.receive_binary(0))
    assert code(only(d.sent[1:], "error")) == "invalid_message"


def test_message_rate_limit_is_a_refusal() -> None:
    d = Driver(Limits(max_messages_per_second=1, message_burst=2))
    d.start(mode="on_request")
    d.send({"type": "decide", "state_version": 1})
    err = only(d.send({"type": "decide", "state_version": 1}), "error")
    assert code(err) == "message_rate_limited" and d.g.refusal_count == 1


def test_message_over_max_bytes_closes_1009() -> None:
    d = Driver(Limits(max_message_bytes=100))
    d.start(state="x" * 200)
    assert d.close == CloseConnection(1009, "message too big")


# ------------------------------------------------------------------ scheduling


def test_on_change_schedules_every_change_and_coalesces_into_latest() -> None:
    d = Driver(Limits(max_events_per_second=100, event_burst=100))
    assert only(d.start(), "ack")["scheduled"] is True
    assert len(d.dispatches) == 1 and d.dispatches[0].state_version == 1
    for n in range(2, 6):
        assert only(d.send({"type": "append_text", "event_id": f"evt_{n}", "text": str(n)}), "ack")[
            "scheduled"
        ]
    assert len(d.dispatches) == 1  # one in flight, one pending intent
    decision = only(d.finish(index=0), "decision")
    assert decision["state_version"] == 1 and decision["covered_event_ids"] == ["evt_1"]
    assert d.dispatches[-1].state_version == 5  # the pending intent took the latest state
    decision = only(d.finish(), "decision")
    assert decision["covered_event_ids"] == ["evt_2", "evt_3", "evt_4", "evt_5"]


def test_ack_precedes_decision_that_covers_it() -> None:
    d = Driver()
    msgs = d.start()
    assert [m["type"] for m in msgs] == ["ack"] and d.dispatches
    assert [m["type"] for m in d.finish()] == ["decision"]


def test_on_request_decide_must_name_current_version_and_scheduled_comes_first() -> None:
    d = Driver()
    d.start(mode="on_request")
    d.send({"type": "append_text", "event_id": "evt_2", "text": "x"})
    err = only(d.send({"type": "decide", "state_version": 1}), "error")
    assert code(err) == "stale_state_version" and err["fatal"] is False and not d.dispatches
    sched = only(d.send({"type": "decide", "state_version": 2}), "scheduled")
    assert sched == {
        "type": "scheduled",
        "stream_id": SID,
        "seq": sched["seq"],
        "state_version": 2,
        "in_flight": False,
    }
    assert d.dispatches[-1].state_version == 2
    d.send({"type": "append_text", "event_id": "evt_3", "text": "y"})
    assert only(d.send({"type": "decide", "state_version": 3}), "scheduled")["in_flight"] is True
    d.send({"type": "append_text", "event_id": "evt_4", "text": "z"})
    d.finish(index=0)
    # the snapshot is chosen when dispatch becomes eligible: version 4, not 3
    assert d.dispatches[-1].state_version == 4
    assert only(d.finish(), "decision")["covered_event_ids"] == ["evt_3", "evt_4"]


def test_decide_on_an_on_change_stream_is_rejected() -> None:
    d = Driver()
    d.start()
    assert code(only(d.send({"type": "decide", "state_version": 1}), "error")) == "decide_not_allowed"


def test_min_interval_spaces_dispatch_starts() -> None:
    d = Driver(Limits(max_events_per_second=100, event_burst=100))
    d.start(min_interval_ms=500)
    d.finish()
    d.send({"type": "append_text", "event_id": "evt_2", "text": "x"})
    assert len(d.dispatches) == 1
    assert d.g.next_deadline() == pytest.approx(0.5)
    d.at(0.49)
    assert len(d.dispatches) == 1
    d.at(0.5)
    assert len(d.dispatches) == 2 and d.dispatches[1].state_version == 2


def test_failed_dispatch_loses_no_coverage() -> None:
    d = Driver(Limits(max_events_per_second=100, event_burst=100))
    d.start(mode="on_request")
    d.send({"type": "decide", "state_version": 1})
    d.finish(failure(500, "internal", retryable=False))
    d.send({"type": "append_text", "event_id": "evt_2", "text": "x"})
    d.send({"type": "decide", "state_version": 2})
    assert only(d.finish(), "decision")["covered_event_ids"] == ["evt_1", "evt_2"]


# ------------------------------------------------------------------ retries


@pytest.mark.parametrize(
    ("status", "err_code", "retried"),
    [
        (429, "rate_limited", True),
        (503, "overloaded", True),
        (503, "maintenance", False),
        (409, "idempotency_conflict", True),
        (409, "other", False),
        (500, "internal", False),
    ],
)
def test_on_change_retry_policy(status: int, err_code: str, retried: bool) -> None:
    d = Driver()
    d.start()
    err = only(d.finish(failure(status, err_code, delay=250)), "error")
    assert err["http_status"] == status and err["fatal"] is False and err["event_id"] is None
    assert err["state_version"] == 1 and err["error"]["retry"]["retry_after_ms"] == 250
    d.at(0.249)
    assert len(d.dispatches) == 1
    d.at(0.25)
    assert len(d.dispatches) == (2 if retried else 1)


def test_retryable_failure_without_permission_is_not_retried() -> None:
    d = Driver()
    d.start()
    d.finish(failure(503, "overloaded", retryable=False))
    d.at(5)
    assert len(d.dispatches) == 1


def test_third_consecutive_retryable_failure_is_fatal_overload_1013() -> None:
    d = Driver()
    d.start()
    d.finish(failure(503, "overloaded", delay=100))
    d.at(0.1)
    d.finish(failure(503, "overloaded", delay=100))
    d.at(0.2)
    msgs = d.finish(failure(429, "rate_limited", delay=700))
    err = only(msgs, "error")
    assert err["fatal"] is True and err["error"]["retry"]["retry_after_ms"] == 700
    bye = only(msgs, "goodbye")
    assert bye["reason"] == "overload" and bye["resume"]["retry_after_ms"] == 700
    assert d.close == CloseConnection(1013, "overload")


def test_retry_reaching_the_remaining_lifetime_is_fatal_at_once() -> None:
    d = Driver(Limits(max_duration_ms=1000))
    d.start()
    msgs = d.finish(failure(503, "overloaded", delay=1000))
    assert only(msgs, "error")["fatal"] is True and d.close == CloseConnection(1013, "overload")


def test_on_request_never_retries_by_itself() -> None:
    d = Driver()
    d.start(mode="on_request")
    d.send({"type": "decide", "state_version": 1})
    d.finish(failure(503, "overloaded", delay=10))
    d.at(10)
    assert len(d.dispatches) == 1


# ------------------------------------------------------------------ liveness and closing


def test_ping_and_missed_pong_closes_1013_slow_reader() -> None:
    d = Driver(Limits(heartbeat_interval_ms=1000, pong_timeout_ms=500, idle_timeout_ms=60_000))
    d.start(mode="on_request")
    ping = only(d.at(1.0), "ping")
    assert ping["nonce"] == 1
    d.g.ping_written(1, 1.1)  # the pong is due 500 ms after the write completed
    d.at(1.55)
    assert d.close is None
    d.at(1.6)
    assert d.close == CloseConnection(1013, "slow_reader")


def test_pong_with_the_nonce_keeps_the_connection_and_does_not_reset_idle() -> None:
    d = Driver(Limits(heartbeat_interval_ms=1000, pong_timeout_ms=500, idle_timeout_ms=2500))
    d.start(mode="on_request")
    for t in (1.0, 2.0):
        nonce = only(d.at(t), "ping")["nonce"]
        d.now = t + 0.1
        assert d.send({"type": "pong", "nonce": nonce}) == []
    msgs = d.at(2.5)
    assert only(msgs, "goodbye")["reason"] == "idle_timeout" and d.close == CloseConnection(
        1000, "idle_timeout"
    )


def test_idle_excludes_time_waiting_for_a_decision() -> None:
    d = Driver(Limits(idle_timeout_ms=1000, heartbeat_interval_ms=60_000))
    d.start(mode="on_request")
    d.now = 0.5
    d.send({"type": "decide", "state_version": 1})
    d.at(3.0)
    assert d.close is None  # decide in flight
    d.now = 3.0
    d.finish()  # the clock restarts when the decide settles
    d.at(3.99)
    assert d.close is None
    d.at(4.0)
    assert d.close == CloseConnection(1000, "idle_timeout")


def test_max_duration_goodbye() -> None:
    d = Driver(Limits(max_duration_ms=2000, idle_timeout_ms=10_000, heartbeat_interval_ms=60_000))
    d.start(mode="on_request")
    msgs = d.at(2.0)
    assert only(msgs, "goodbye")["reason"] == "max_duration" and d.close == CloseConnection(
        1000, "max_duration"
    )


def test_shutdown_settles_in_flight_then_goodbye_1012_and_acks_unscheduled() -> None:
    d = Driver(Limits(max_events_per_second=100, event_burst=100))
    d.start()
    d.take(d.g.begin_shutdown(0, 500))
    assert d.close is None  # waits for the in-flight decide
    ack = only(d.send({"type": "append_text", "event_id": "evt_2", "text": "x"}), "ack")
    assert ack["scheduled"] is False
    assert code(only(d.send({"type": "decide", "state_version": 2}), "error")) in ("decide_not_allowed",)
    msgs = d.finish()
    assert [m["type"] for m in msgs] == ["decision", "goodbye"]
    assert msgs[1]["reason"] == "shutdown" and msgs[1]["resume"]["retry_after_ms"] == 500
    assert len(d.dispatches) == 1 and d.close == CloseConnection(1012, "shutdown")


def test_shutdown_gives_up_on_a_slow_decide_after_settlement_timeout() -> None:
    d = Driver()
    d.start()
    d.take(d.g.begin_shutdown(0, 500))
    d.at(5.0)
    assert only(d.sent, "goodbye")["reason"] == "shutdown" and d.close == CloseConnection(1012, "shutdown")


def test_send_queue_limits_close_slow_reader() -> None:
    d = Driver(Limits(max_send_queue_frames=3))
    d.take(d.g.send_queue_report(queued_bytes=10, queued_frames=4, write_stalled_for=0, now=0))
    assert d.close == CloseConnection(1013, "slow_reader")
