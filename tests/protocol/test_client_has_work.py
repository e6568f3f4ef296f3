"""ClientSession.has_work across connections (WIRE.md §8: after an idle_timeout / max_duration
goodbye the client reconnects only when it has a change to send or a decision to wait for)."""

from __future__ import annotations

from typing import Any

from airflow_provider_systemzero.protocol import ClientSession, ErrorEnvelope, RetryHint, StreamRequest
from airflow_provider_systemzero.protocol.gateway import DecideFailure
from tests.helpers.pair import Pair

QUESTIONS = {"ready": {"type": "boolean", "instructions": "Is the job ready?"}}


def make_client(mode: str, state: Any = "log\n") -> ClientSession:
    request = StreamRequest.build(model="m", questions=QUESTIONS, prompt_cache_key="pck")
    return ClientSession(request=request, state=state, decision_mode=mode)


def test_on_request_in_sync_session_has_no_work_after_the_connection_ends() -> None:
    client = make_client("on_request")
    assert client.has_work()  # nothing acknowledged yet
    pair = Pair(client)
    pair.pump()
    assert not client.has_work()
    client.connection_lost()
    assert not client.has_work()  # everything was acknowledged: no reason to reconnect
    client.append_text("more\n")
    assert client.has_work()


def test_on_request_pending_decide_is_work_after_the_connection_ends() -> None:
    client = make_client("on_request")
    Pair(client).pump()
    client.connection_lost()
    intent = client.request_decision()
    assert client.has_work()
    client.cancel_intent(intent)
    assert not client.has_work()


def test_unacknowledged_change_is_work_after_the_connection_ends() -> None:
    client = make_client("on_request")
    pair = Pair(client)
    pair.pump()
    client.append_text("x\n")
    assert client.data_to_send(pair.now)  # on the wire, never acknowledged
    client.connection_lost()
    assert client.has_work()


def test_open_connection_without_start_is_work() -> None:
    client = make_client("on_request")
    Pair(client).pump()
    client.connection_lost()
    client.connection_opened(0.0)  # a new connection waits for its start
    assert client.has_work()


def test_on_change_undecided_state_is_work_until_a_decision_covers_it() -> None:
    client = make_client("on_change")
    pair = Pair(client, auto_decide=False)
    pair.pump()
    assert client.in_sync and client.has_work()  # acknowledged, but its decision is still due
    client.connection_lost()
    assert client.has_work()

    second = Pair(client)
    second.pump()  # replay: the gateway decides the replayed state
    assert not client.has_work()
    client.connection_lost()
    assert not client.has_work()


def test_on_change_final_failure_settles_the_state_until_the_next_change() -> None:
    client = make_client("on_change")
    pair = Pair(client, auto_decide=False)
    pair.pump()
    failure = DecideFailure(
        400, ErrorEnvelope("invalid_request_error", "invalid_state", "bad"), RetryHint(False), "req_1"
    )
    pair.finish(pair.dispatches[0], failure)
    assert not client.has_work()  # the gateway will not retry it; nothing to wait for
    client.append_text("fixed\n")
    assert client.has_work()


def test_on_change_retryable_failure_keeps_the_state_unsettled() -> None:
    client = make_client("on_change")
    pair = Pair(client, auto_decide=False)
    pair.pump()
    failure = DecideFailure(
        503, ErrorEnvelope("overloaded_error", "overloaded", "busy"), RetryHint(True, 10), "req_1"
    )
    pair.finish(pair.dispatches[0], failure)
    assert client.has_work()  # the gateway retries: the decision is still due


def test_current_decision_is_the_last_one_until_the_state_changes() -> None:
    client = make_client("on_change")
    pair = Pair(client, auto_decide=False)
    pair.pump()
    assert client.current_decision is None
    pair.finish(pair.dispatches[0])
    assert client.current_decision is client.last_decision is not None
    client.append_text("more\n")
    assert client.current_decision is None  # the state moved on
    pair.pump()
    pair.finish(pair.dispatches[1])
    assert client.current_decision is not None and client.current_decision.state_version == 2
    client.connection_lost()
    assert client.current_decision is not None  # still the state's decision after the connection ends
