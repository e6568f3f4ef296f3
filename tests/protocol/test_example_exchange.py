"""The public document's example exchange, reproduced field for field through the in-memory pair."""

from __future__ import annotations

import json

from airflow_provider_systemzero.protocol import ClientSession, Limits, StreamRequest
from airflow_provider_systemzero.protocol.client import Acknowledged, DecisionReceived, GoodbyeReceived
from tests.helpers.pair import STREAM_ID, Pair, example_reply

QUESTIONS = {"ready": {"type": "boolean", "instructions": "Is the job ready?"}}


def _example_pair() -> Pair:
    request = StreamRequest.build(model="MODEL_ID", questions=QUESTIONS, prompt_cache_key="example-affinity")
    client = ClientSession(
        request=request,
        state="Initial log\n",
        decision_mode="on_request",
        min_interval_ms=0,
        idempotency_key="example-state-1",
    )
    return Pair(client, auto_decide=False)


def test_example_exchange_field_for_field() -> None:
    pair = _example_pair()
    pair.pump()
    pair.client.append_text("Job is ready.\n", idempotency_key="example-state-2")
    pair.pump()
    intent = pair.client.request_decision()
    pair.pump()
    # the server pings while the decide runs; the client answers at once with the same nonce
    pair.advance(Limits().heartbeat_interval_ms / 1000)
    [dispatch] = pair.dispatches
    pair.finish(dispatch, example_reply(dispatch.body, dispatch.idempotency_key))
    pair.handle(pair.gateway.begin_shutdown(pair.now, retry_after_ms=500))

    client_frames = [json.loads(f) for f in pair.client_frames]
    server = [json.loads(f) for f in pair.server_frames]

    assert client_frames[0] == {
        "type": "start",
        "event_id": "evt_1",
        "request": {
            "model": "MODEL_ID",
            "state": "Initial log\n",
            "questions": QUESTIONS,
            "prompt_cache_key": "example-affinity",
        },
        "decision_mode": "on_request",
        "min_interval_ms": 0,
        "idempotency_key": "example-state-1",
    }
    assert client_frames[1] == {
        "type": "append_text",
        "event_id": "evt_2",
        "text": "Job is ready.\n",
        "idempotency_key": "example-state-2",
    }
    assert client_frames[2] == {"type": "decide", "state_version": 2}
    assert client_frames[3] == {"type": "pong", "nonce": 1}

    assert [m["type"] for m in server] == ["hello", "ack", "ack", "scheduled", "ping", "decision", "goodbye"]
    assert [m["seq"] for m in server] == [1, 2, 3, 4, 5, 6, 7]
    assert all(m["stream_id"] == STREAM_ID for m in server)
    assert server[0]["protocol"] == "system-zero.stream.v1" and server[0]["limits"] == Limits().advertised()
    assert server[0]["rate_limit"] is None
    assert server[1] == {
        "type": "ack",
        "stream_id": STREAM_ID,
        "seq": 2,
        "event_id": "evt_1",
        "state_version": 1,
        "state_bytes": 15,
        "synthesized_body_bytes": 158,
        "scheduled": False,
    }
    assert server[2] == {
        "type": "ack",
        "stream_id": STREAM_ID,
        "seq": 3,
        "event_id": "evt_2",
        "state_version": 2,
        "state_bytes": 30,
        "synthesized_body_bytes": 173,
        "scheduled": False,
    }
    assert server[3] == {
        "type": "scheduled",
        "stream_id": STREAM_ID,
        "seq": 4,
        "state_version": 2,
        "in_flight": False,
    }
    assert server[4] == {"type": "ping", "stream_id": STREAM_ID, "seq": 5, "nonce": 1}
    decision = server[5]
    assert decision["state_version"] == 2 and decision["covered_event_ids"] == ["evt_1", "evt_2"]
    assert decision["http_status"] == 200 and decision["request_id"] == "example-decision"
    assert set(decision) == {
        "type",
        "stream_id",
        "seq",
        "state_version",
        "covered_event_ids",
        "reply",
        "request_id",
        "http_status",
        "server_timing",
        "latency_ms",
        "rate_limit",
        "queue_ms",
        "decide_ms",
    }
    assert server[6] == {
        "type": "goodbye",
        "stream_id": STREAM_ID,
        "seq": 7,
        "reason": "shutdown",
        "state_version": 2,
        "last_decision_state_version": 2,
        "resume": {"supported": False, "action": "reconnect_and_replay", "retry_after_ms": 500},
    }
    assert pair.closed is not None and pair.closed.code == 1012

    # the dispatch carried the synthesized body of version 2 and that version's key
    assert len(dispatch.body.encode()) == 173 and dispatch.idempotency_key == "example-state-2"
    acks = [e for e in pair.client_events if isinstance(e, Acknowledged)]
    assert [a.ack.event_id for a in acks] == ["evt_1", "evt_2"]
    [received] = [e for e in pair.client_events if isinstance(e, DecisionReceived)]
    assert received.intents == (intent,) and received.current
    assert received.result.answer("ready").decision is True
    [goodbye] = [e for e in pair.client_events if isinstance(e, GoodbyeReceived)]
    assert goodbye.goodbye.retry_after_ms == 500 and pair.client.server_delay_ms == 500
