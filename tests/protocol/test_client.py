"""ClientSession: validation before sending, minimal mutations, pacing, replay and intents."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_provider_systemzero.protocol import (
    Attachment,
    ClientSession,
    Limits,
    LocalProtocolError,
    RemoteProtocolError,
    StreamRequest,
    derive_state_key,
)
from airflow_provider_systemzero.protocol.client import DecisionReceived, MutationRejected, StreamFailed
from airflow_provider_systemzero.protocol.state import StreamState, plan_mutation
from tests.helpers.pair import QUESTIONS, Pair, make_client

DATA = "data:text/plain;base64,aGVsbG8="


# ------------------------------------------------------------------ refusing bad input before sending


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda c: c.append_items([1]), "append_items needs an array state"),
        (lambda c: c.append_text(5), "text must be a string"),
        (lambda c: c.append_text("x", idempotency_key=""), "idempotency_key is empty after trimming"),
        (lambda c: c.replace(5), "state must be a string, an array or an object"),
        (
            lambda c: c.replace({"x": float("nan")}),
            r"state\['x'\] is the number nan, which JSON cannot carry",
        ),
        (lambda c: c.append_attachments([]), "must not be empty"),
        (lambda c: c.append_attachments([Attachment("1a", DATA)]), "must start with a letter"),
        (lambda c: c.append_attachments([Attachment("a", "data:text/plain,hi")]), "not base64-encoded"),
        (lambda c: c.append_attachments([Attachment("a", DATA), Attachment("a", DATA)]), "is used twice"),
        (lambda c: c.append_text("x" * 400), "max_decide_body_bytes"),
    ],
)
def test_invalid_changes_raise_naming_the_rule_and_change_nothing(call: Any, message: str) -> None:
    client = make_client(limits=Limits(max_decide_body_bytes=300))
    before = (client.desired_state, client.desired_attachments, client.desired_key, client.generation)
    with pytest.raises(LocalProtocolError, match=message):
        call(client)
    assert (client.desired_state, client.desired_attachments, client.desired_key, client.generation) == before


@pytest.mark.parametrize(
    ("questions", "message"),
    [
        (
            {"1ready": {"type": "boolean", "instructions": "x"}},
            "question name '1ready' must start with a letter",
        ),
        ({"a" * 65: {"type": "boolean", "instructions": "x"}}, "is 65 characters long"),
        ({"ready-now": {"type": "boolean", "instructions": "x"}}, "contains a character other than"),
        ({}, "at least one question"),
        ({"q": {"type": "choice", "instructions": "x"}}, "options must list at least one option"),
        ({"q": {"type": "boolean", "instructions": ""}}, "instructions must be a non-empty string"),
    ],
)
def test_invalid_requests_are_refused(questions: dict[str, Any], message: str) -> None:
    with pytest.raises(LocalProtocolError, match=message):
        StreamRequest.build(model="m", questions=questions)


def test_derived_keys_without_a_prompt_cache_key_are_refused() -> None:
    """Without prompt_cache_key the gateway uses each stream_id: a replay's body would differ
    while its derived key stays the same, which the decide API refuses for good."""
    request = StreamRequest.build(model="m", questions=QUESTIONS)
    with pytest.raises(LocalProtocolError, match="need an explicit prompt_cache_key") as refused:
        ClientSession(request=request, state="", decision_mode="on_request", key_namespace="ns")
    assert refused.value.field == "prompt_cache_key"
    ClientSession(request=request, state="", decision_mode="on_request")  # unkeyed: nothing to clash


def test_committee_with_deliberate_is_refused() -> None:
    with pytest.raises(LocalProtocolError, match="cannot be combined"):
        StreamRequest.build(model="m", questions=QUESTIONS, route="committee", mode="deliberate")


# ------------------------------------------------------------------ minimal mutations


@pytest.mark.parametrize(
    ("sent", "desired", "expected"),
    [
        ("ab", "abc", {"type": "append_text", "text": "c"}),
        ("ab", "xbc", {"type": "replace", "state": "xbc"}),
        ([1], [1, 2], {"type": "append_items", "items": [2]}),
        ([1], [True, 2], {"type": "replace", "state": [True, 2]}),  # 1 == True in Python, not on the wire
        ([1, 2], [1], {"type": "replace", "state": [1]}),
        ({"a": 1}, {"a": 2}, {"type": "replace", "state": {"a": 2}}),
        ("s", ["s"], {"type": "replace", "state": ["s"]}),
    ],
)
def test_plan_mutation_is_minimal(sent: Any, desired: Any, expected: dict[str, Any]) -> None:
    planned = plan_mutation(StreamState(sent), StreamState(desired), event_id="evt_9", idempotency_key=None)
    assert planned is not None and {k: v for k, v in planned.to_dict().items() if k != "event_id"} == expected


def test_plan_mutation_attachments() -> None:
    a, b = Attachment("a", DATA), Attachment("b", DATA)
    assert (
        plan_mutation(StreamState("s", (a,)), StreamState("s", (a,)), event_id="e", idempotency_key=None)
        is None
    )
    planned = plan_mutation(
        StreamState("s", (a,)), StreamState("s", (a, b)), event_id="e", idempotency_key="k"
    )
    assert planned.to_dict() == {
        "type": "append_attachments",
        "event_id": "e",
        "attachments": [{"name": "b", "data": DATA}],
        "idempotency_key": "k",
    }
    planned = plan_mutation(
        StreamState("s", (a, b)), StreamState("s", (b,)), event_id="e", idempotency_key=None
    )
    assert planned.to_dict()["type"] == "replace" and planned.to_dict()["attachments"] == [b.to_dict()]
    planned = plan_mutation(
        StreamState("s", (a,)), StreamState("t", (a, b)), event_id="e", idempotency_key=None
    )
    assert planned.to_dict()["type"] == "replace" and len(planned.to_dict()["attachments"]) == 2


# ------------------------------------------------------------------ pacing


def test_a_burst_of_appends_coalesces_without_rate_rejections() -> None:
    client = make_client(mode="on_change")
    pair = Pair(client)
    pair.pump()
    expected = "log\n"
    for n in range(1000):
        line = f"line {n}\n"
        client.append_text(line, idempotency_key=f"k{n}")
        expected += line
        pair.pump()
        if n % 10 == 0:
            pair.advance(0.01)
    for _ in range(200):
        if client.in_sync:
            break
        wake = client.next_wakeup(pair.now)
        pair.advance(max(0.0, (wake or pair.now) - pair.now) + 0.001)
    assert client.in_sync
    assert pair.gateway.rejections == 0 and pair.gateway.refusal_count == 0
    assert pair.gateway.stream_state.state == expected
    # the coalesced mutation carries the key of the newest change it includes
    assert pair.gateway.idempotency_key == "k999"
    assert pair.gateway.accepted_events < 200


def test_rate_limited_mutation_is_resent_after_the_delay() -> None:
    client = make_client(mode="on_request")
    pair = Pair(client, limits=Limits(max_events_per_second=1, event_burst=10))
    pair.pump()
    for n in range(9):  # the client paces itself under the gateway's burst: the last change waits
        client.append_text(str(n))
        pair.pump()
    assert not client.in_sync and pair.gateway.accepted_events == 9
    # clock skew: the client's clock runs three seconds ahead of the gateway's, so its bucket refills
    # where the gateway's does not; the waiting change takes the gateway's last token
    pair.client_ahead = 3.0
    pair.pump()
    assert client.in_sync and pair.gateway.accepted_events == 10
    client.append_text("x")  # the gateway's bucket ran dry
    pair.pump()
    [rejected] = [e for e in pair.client_events if isinstance(e, MutationRejected)]
    assert rejected.error.code == "event_rate_limited"
    assert not client.in_sync
    pair.advance(1.0)
    assert client.in_sync and pair.gateway.stream_state.state == "log\n012345678x"


def test_non_retryable_rejection_fails_the_stream() -> None:
    client = make_client(mode="on_request")
    pair = Pair(client, limits=Limits(max_decide_body_bytes=10_000))
    pair.pump()
    pair.gateway.limits = Limits(max_decide_body_bytes=100)  # the gateway is stricter than it advertised
    client.append_text("x" * 200)
    pair.pump()
    [failed] = [e for e in pair.client_events if isinstance(e, StreamFailed)]
    assert failed.error.code == "decide_body_too_large" and client.stream_failure is failed.error
    assert client.data_to_send(pair.now) == []


# ------------------------------------------------------------------ replay


def test_replay_after_loss_is_byte_identical_with_the_same_key() -> None:
    client = make_client(mode="on_request", key_namespace="ns")
    first = Pair(client)
    first.pump()
    client.append_text("a\n")
    first.pump()
    body_v2 = first.gateway.body
    key_v2 = first.gateway.idempotency_key
    assert key_v2 == derive_state_key("ns", body_v2)
    client.append_text("b\n")  # sent but never acknowledged: the connection drops
    frames = client.data_to_send(first.now)
    assert json.loads(frames[0])["type"] == "append_text"
    client.connection_lost()

    second = Pair(client, stream_id="szws_" + "1" * 32)
    second.pump()
    start = json.loads(second.client_frames[0])
    assert start["type"] == "start" and start["request"]["state"] == "log\na\nb\n"
    assert start["idempotency_key"] == derive_state_key("ns", second.gateway.body)
    assert len(second.client_frames) == 1  # nothing more to append: the replay lacked nothing

    # a state that reached version 2 on the first connection replays to the same body and key
    client2 = make_client(mode="on_request", key_namespace="ns")
    one = Pair(client2)
    one.pump()
    client2.append_text("a\n")
    one.pump()
    client2.connection_lost()
    two = Pair(client2, stream_id="szws_" + "2" * 32)
    two.pump()
    assert two.gateway.body == body_v2 and two.gateway.idempotency_key == key_v2


def test_changes_after_replay_are_appended() -> None:
    client = make_client(mode="on_request")
    pair = Pair(client)
    pair.pump()
    client.connection_lost()
    client.append_text("later\n")
    second = Pair(client)
    [start] = client.data_to_send(second.now)  # the replay is on the wire …
    client.append_text("even later\n")  # … when the caller changes the state again
    assert json.loads(start)["request"]["state"] == "log\nlater\n"
    second.client_frames.append(start)
    second.handle(second.gateway.receive_text(start, second.now))
    second.pump()
    types = [json.loads(f)["type"] for f in second.client_frames]
    assert types == ["start", "append_text"]
    assert second.gateway.stream_state.state == "log\nlater\neven later\n"


def test_decide_in_flight_at_loss_is_resent_after_replay_and_resolves_once() -> None:
    client = make_client(mode="on_request")
    pair = Pair(client, auto_decide=False)
    pair.pump()
    intent = client.request_decision()
    pair.pump()
    assert pair.dispatches  # the decide is running when the connection drops
    client.connection_lost()
    second = Pair(client)
    second.pump()
    assert [json.loads(f)["type"] for f in second.client_frames] == ["start", "decide"]
    received = [e for e in second.client_events if isinstance(e, DecisionReceived)]
    assert [r.intents for r in received] == [(intent,)] and client.pending_intents == 0


def test_decision_for_older_state_is_not_current() -> None:
    client = make_client(mode="on_change")
    pair = Pair(client, auto_decide=False)
    pair.pump()
    client.append_text("more\n")
    pair.pump()
    pair.finish(pair.dispatches[0])  # decides version 1 while version 2 is already acknowledged
    first = next(e for e in pair.client_events if isinstance(e, DecisionReceived))
    assert first.result.state_version == 1 and first.current is False
    pair.finish(pair.dispatches[1])
    last = [e for e in pair.client_events if isinstance(e, DecisionReceived)][-1]
    assert last.result.state_version == 2 and last.current is True


def test_on_change_intent_resolves_with_the_first_covering_decision() -> None:
    client = make_client(mode="on_change")
    pair = Pair(client, auto_decide=False)
    pair.pump()
    client.append_text("more\n")
    intent = client.request_decision()
    pair.pump()
    pair.finish(pair.dispatches[0])
    assert client.pending_intents == 1
    pair.finish(pair.dispatches[1])
    assert client.pending_intents == 0
    assert [e.intents for e in pair.client_events if isinstance(e, DecisionReceived)] == [(), (intent,)]


def test_pings_are_answered_first() -> None:
    client = make_client(mode="on_request")
    pair = Pair(client, limits=Limits(heartbeat_interval_ms=100))
    pair.pump()
    pair.advance(0.1)
    assert json.loads(pair.client_frames[-1]) == {"type": "pong", "nonce": 1}


def test_server_contract_violations_raise() -> None:
    client = make_client()
    client.connection_opened(0)
    with pytest.raises(RemoteProtocolError, match="first server message must be hello"):
        client.receive_text(json.dumps({"type": "ping", "stream_id": "s", "seq": 1, "nonce": 1}), 0)


def test_derived_keys_name_states() -> None:
    assert derive_state_key("ns", "a") == derive_state_key("ns", "a") != derive_state_key("ns", "b")
    assert len(derive_state_key("n" * 190, "a")) <= 255


@pytest.mark.parametrize("cache_key", ["pck", None])
@pytest.mark.parametrize(
    ("state", "attachments"),
    [
        ("", ()),
        ("log\nwith \u00e9 and \u2603\n", ()),
        ([1, {"a": "b"}], (Attachment("a", DATA),)),
        ({"k": [True, None, 1.5]}, (Attachment("a", DATA), Attachment("b-2", DATA))),
    ],
)
def test_start_size_check_is_exact_without_encoding_the_state_twice(
    state: Any, attachments: tuple[Attachment, ...], cache_key: str | None
) -> None:
    from airflow_provider_systemzero.protocol.body import json_size
    from airflow_provider_systemzero.protocol.messages import Start, event_id

    request = StreamRequest.build(model="m", questions=QUESTIONS, prompt_cache_key=cache_key, route="direct")
    actual = json_size(Start(event_id(1), request, state, "on_change", attachments, 250, "k" * 255).to_dict())
    # a limit of exactly the start's size is accepted, one byte less is refused
    ClientSession(
        request=request,
        state=state,
        attachments=attachments,
        decision_mode="on_change",
        min_interval_ms=250,
        limits=Limits(max_message_bytes=actual),
    )
    with pytest.raises(LocalProtocolError, match=f"replay start message {actual} bytes"):
        ClientSession(
            request=request,
            state=state,
            attachments=attachments,
            decision_mode="on_change",
            min_interval_ms=250,
            limits=Limits(max_message_bytes=actual - 1),
        )
