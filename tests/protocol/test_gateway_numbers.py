"""Every number a gateway sends has a range (issue 54 item 1): any finite number in any numeric
field of any server message is either refused by the core — a protocol error naming the field —
or read within its range (clamped where the public document allows it), and what the layers above
the core compute from it (the decision history and its times, the page, the budget, the retry
delay) never raises.

Before, ``decision.queue_ms`` of 1e300 went through: the history back-dated a billed start by it
and ``datetime.fromtimestamp`` raised ``OverflowError`` in the trigger.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_systemzero.decisions.budget import DecisionBudget
from airflow_provider_systemzero.decisions.timeline import DecisionTimeline, parse_time
from airflow_provider_systemzero.plugins.timeline_page import Story, render_page
from airflow_provider_systemzero.protocol import ClientSession, StreamRequest
from airflow_provider_systemzero.protocol.client import Acknowledged, DecisionReceived
from airflow_provider_systemzero.protocol.errors import MAX_SERVER_DELAY_MS, RemoteProtocolError
from airflow_provider_systemzero.protocol.limits import ADVERTISED_BOUNDS, Limits
from airflow_provider_systemzero.protocol.messages import MAX_DISPATCH_MS, MAX_SAFE_INTEGER, PROTOCOL
from airflow_provider_systemzero.protocol.reply import MAX_CREATED, USAGE_FIELDS
from airflow_provider_systemzero.timestamps import EARLIEST, LATEST, back_dated, utc_iso
from tests.helpers import EXAMPLE_REPLY

STREAM_ID = "szws_0123456789abcdef0123456789abcdef"
QUESTIONS = {"ready": {"type": "boolean", "instructions": "Is the job ready?"}}
NOW = 1_790_000_000.0

#: The server messages of the public example exchange (and an error of each kind), each as it
#: arrives third on a connection: after ``hello`` (1) and the ``start``'s ``ack`` (2).
REPLY = EXAMPLE_REPLY
HELLO = {
    "type": "hello",
    "stream_id": STREAM_ID,
    "seq": 1,
    "protocol": PROTOCOL,
    "request_id": "example-opening",
    "limits": {**Limits().advertised(), "account_decision_burst": 5, "account_decision_ceiling": 60},
    "rate_limit": None,
}
ACK = {
    "type": "ack",
    "stream_id": STREAM_ID,
    "seq": 2,
    "event_id": "evt_1",
    "state_version": 1,
    "state_bytes": 15,
    "synthesized_body_bytes": 158,
    "scheduled": True,
}
MESSAGES: dict[str, dict[str, Any]] = {
    "hello": HELLO,
    "ack": ACK,
    "scheduled": {
        "type": "scheduled",
        "stream_id": STREAM_ID,
        "seq": 3,
        "state_version": 1,
        "in_flight": False,
    },
    "ping": {"type": "ping", "stream_id": STREAM_ID, "seq": 3, "nonce": 1},
    "decision": {
        "type": "decision",
        "stream_id": STREAM_ID,
        "seq": 3,
        "state_version": 1,
        "covered_event_ids": ["evt_1"],
        "reply": REPLY,
        "request_id": "example-decision",
        "http_status": 200,
        "server_timing": None,
        "latency_ms": 40,
        "rate_limit": None,
        "queue_ms": 0,
        "decide_ms": 40000,
    },
    "decide failure": {
        "type": "error",
        "stream_id": STREAM_ID,
        "seq": 3,
        "event_id": None,
        "state_version": 1,
        "http_status": 429,
        "request_id": "r",
        "fatal": False,
        "error": {
            "envelope": {"error": {"type": "rate_limit_error", "code": "rate_limited", "message": "slow"}},
            "retry": {"retryable": True, "retry_after_ms": 500},
        },
    },
    "fatal error": {
        "type": "error",
        "stream_id": STREAM_ID,
        "seq": 3,
        "event_id": None,
        "state_version": 1,
        "http_status": 503,
        "request_id": "r",
        "fatal": True,
        "error": {
            "envelope": {"error": {"type": "overloaded_error", "code": "overloaded", "message": "busy"}},
            "retry": {"retryable": True, "retry_after_ms": 500},
        },
    },
    "goodbye": {
        "type": "goodbye",
        "stream_id": STREAM_ID,
        "seq": 3,
        "reason": "shutdown",
        "state_version": 1,
        "last_decision_state_version": 1,
        "resume": {"supported": False, "action": "reconnect_and_replay", "retry_after_ms": 500},
    },
}


def numeric_paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The path to every number of a JSON value (booleans are not numbers)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        yield path
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from numeric_paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from numeric_paths(item, (*path, index))


FIELDS = [(name, path) for name, message in MESSAGES.items() for path in numeric_paths(message)]
finite_numbers = st.one_of(
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([-1, 0, 1, MAX_SAFE_INTEGER, MAX_DISPATCH_MS, MAX_DISPATCH_MS + 1, 1e300, -1e300, 3e14]),
)


def with_number(message: dict[str, Any], path: tuple[Any, ...], number: int | float) -> str:
    changed = copy.deepcopy(message)
    holder = changed
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = number
    return json.dumps(changed)


def session() -> ClientSession:
    request = StreamRequest.build(model="MODEL_ID", questions=QUESTIONS, prompt_cache_key="example-affinity")
    client = ClientSession(request=request, state="Initial log\n", decision_mode="on_change")
    client.connection_opened(NOW)
    return client


def above_the_core(client: ClientSession, events: list[Any], body_bytes: int | None) -> None:
    """What the layers above the core do with what the core accepted; none of it may raise."""
    delay = client.next_connection_delay_ms(NOW)
    assert delay is None or 0 <= delay <= MAX_SERVER_DELAY_MS
    assert client.server_delay_ms is None or 0 <= client.server_delay_ms <= MAX_SERVER_DELAY_MS
    for event in events:
        if not isinstance(event, DecisionReceived):
            continue
        result = event.result
        for took in (result.queue_ms, result.decide_ms, result.latency_ms):
            assert took is None or 0 <= took <= MAX_DISPATCH_MS
        assert all(0 <= count <= MAX_SAFE_INTEGER for count in result.usage.values())
        created = result.reply.get("created")
        assert created is None or 0 <= created <= MAX_CREATED
        timeline = DecisionTimeline()
        timeline.watching({"question": "ready", "expect": True})
        timeline.decision(result, question="ready", at=NOW, disposition="fired", billed=True)
        timeline.mark(
            "billed_start",
            back_dated(NOW, (result.queue_ms or 0) + (result.decide_ms or 0)),
            state_version=result.state_version,
        )
        rows = timeline.to_list()
        assert all(EARLIEST <= parse_time(row["at"]) <= LATEST for row in rows if "at" in row)
        assert "Decision timeline" in render_page(heading="h", subtitle="s", stories=[Story(None, rows)])
        decided_at = utc_iso(created)  # the decision record's decided_at
        assert decided_at is None or EARLIEST <= parse_time(decided_at) <= LATEST
        budget = DecisionBudget(max_decisions=10, max_input_tokens=1_000)
        budget.record_decision(result.reply_id, result.reply.get("usage"), body_bytes)
        budget.check(1, body_bytes)


@settings(max_examples=1_500, deadline=None)
@given(field=st.sampled_from(FIELDS), number=finite_numbers)
def test_any_finite_number_in_any_field_is_refused_naming_it_or_read_within_its_range(
    field: tuple[str, tuple[Any, ...]], number: int | float
) -> None:
    name, path = field
    client = session()
    frames = [] if name == "hello" else [json.dumps(HELLO)] + ([] if name == "ack" else [json.dumps(ACK)])
    body_bytes = ACK["synthesized_body_bytes"]
    for frame in frames:
        client.receive_text(frame, NOW)
        client.data_to_send(NOW)
    text = with_number(MESSAGES[name], path, number)
    try:
        events = client.receive_text(text, NOW)
    except RemoteProtocolError as exc:
        # refused: the error names the field (or the message's own rule about it)
        assert exc.field, exc
        assert str(path[-1]) in f"{exc.field} {exc.message}", (path, exc.field, exc.message)
        return
    # read: within its range, or clamped into it
    if name == "hello":
        for limit, (low, high) in ADVERTISED_BOUNDS.items():
            assert low <= getattr(client.limits, limit) <= high, limit
        assert 1 <= client.limits.account_decision_burst <= 100_000
    if name == "ack":
        [acknowledged] = [event for event in events if isinstance(event, Acknowledged)]
        body_bytes = acknowledged.ack.synthesized_body_bytes
        assert 0 <= body_bytes <= Limits().max_decide_body_bytes
    above_the_core(client, events, body_bytes)


def test_every_numeric_field_of_every_message_is_fed() -> None:
    """The walk finds the numbers of every message, the reply's included."""
    fed = {(name, ".".join(map(str, path))) for name, path in FIELDS}
    assert ("decision", "queue_ms") in fed and ("decision", "reply.usage.input_tokens") in fed
    assert ("decision", "reply.answers.ready.alternatives.0.confidence") in fed
    assert ("hello", "limits.max_duration_ms") in fed and ("goodbye", "resume.retry_after_ms") in fed
    assert {name for name, _ in FIELDS} == set(MESSAGES)
    assert all(f"reply.usage.{counter}" in {p for n, p in fed if n == "decision"} for counter in USAGE_FIELDS)


@pytest.mark.parametrize("number", ["1e300", "3e14", "-1e300", "3600001", "-1"])
def test_the_issues_numbers_in_queue_ms_are_refused_naming_it(number: str) -> None:
    client = session()
    for frame in (json.dumps(HELLO), json.dumps(ACK)):
        client.receive_text(frame, NOW)
        client.data_to_send(NOW)
    text = json.dumps(MESSAGES["decision"]).replace('"queue_ms": 0', f'"queue_ms": {number}')
    try:
        client.receive_text(text, NOW)
    except RemoteProtocolError as exc:
        assert exc.field == "queue_ms" and "from 0 to 3600000" in exc.message and math.isfinite(float(number))
    else:
        raise AssertionError(f"queue_ms {number} was read")
