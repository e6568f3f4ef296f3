"""Fuzz the two sans-I/O sessions with hypothesis-generated frames.

* ``ClientSession.receive_text``: whatever the server sends, only ``RemoteProtocolError`` escapes
  (the adapter then closes and reconnects); the session keeps producing valid client frames.
* ``GatewaySession.receive_text`` / ``receive_binary``: whatever the client sends, nothing
  escapes; every message the gateway emits is one our own client decodes; errors carry a
  documented envelope type; the connection is closed only with a documented code, and after the
  close the session says nothing more.
"""

from __future__ import annotations

import json
import os
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_systemzero.protocol.client import ClientSession
from airflow_provider_systemzero.protocol.errors import (
    ERROR_TYPES,
    ErrorEnvelope,
    RemoteProtocolError,
    RetryHint,
)
from airflow_provider_systemzero.protocol.gateway import (
    CloseConnection,
    DecideFailure,
    DecideSuccess,
    DispatchDecide,
    GatewaySession,
    SendMessage,
)
from airflow_provider_systemzero.protocol.limits import Limits
from airflow_provider_systemzero.protocol.messages import (
    StreamRequest,
    decode_client_message,
    decode_server_message,
    encode_message,
)
from tests.helpers.strategies import QUESTIONS, REPLY, STREAM_ID, client_frames, server_frames, text_values

#: ``SZ_FUZZ=5000`` runs a longer campaign locally.
FUZZ = settings(
    max_examples=int(os.environ.get("SZ_FUZZ", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
HELLO = json.dumps(
    {
        "type": "hello",
        "stream_id": STREAM_ID,
        "seq": 1,
        "protocol": "system-zero.stream.v1",
        "request_id": "r",
        "limits": Limits().advertised(),
        "rate_limit": None,
    }
)

#: What a caller may do between frames.
caller_actions = st.one_of(
    st.tuples(st.just("append"), text_values),
    st.tuples(st.just("decide"), st.none()),
    st.tuples(st.just("cancel"), st.integers(1, 3)),
    st.tuples(st.just("lost"), st.none()),
)


@FUZZ
@given(
    mode=st.sampled_from(["on_change", "on_request"]),
    with_hello=st.booleans(),
    steps=st.lists(st.one_of(server_frames.map(lambda f: ("frame", f)), caller_actions), max_size=15),
)
def test_client_session_lets_only_remote_protocol_errors_escape(
    mode: str, with_hello: bool, steps: list[tuple[str, Any]]
) -> None:
    request = StreamRequest.build(model="m", questions=QUESTIONS, prompt_cache_key="fuzz")
    session = ClientSession(request=request, state="log\n", decision_mode=mode, key_namespace="ns")
    now = 0.0
    session.connection_opened(now)
    if with_hello:
        session.receive_text(HELLO, now)
    for kind, value in steps:
        now += 0.01
        if kind == "frame":
            try:
                session.receive_text(value, now)
            except RemoteProtocolError:
                session.connection_lost()  # the adapter closes 1002 and reconnects
                session.connection_opened(now)
        elif kind == "append":
            session.append_text(value)
        elif kind == "decide":
            session.request_decision()
        elif kind == "cancel":
            session.cancel_intent(value)
        else:
            session.connection_lost()
            session.connection_opened(now)
        for frame in session.data_to_send(now):  # whatever happened, the output is valid
            decode_client_message(frame)
        session.next_wakeup(now)
        session.receipt_deadline()
        session.has_work()


def _outcome(kind: str) -> Any:
    if kind == "ok":
        return DecideSuccess(reply=REPLY, request_id="r")
    status, code, retryable = {
        "429": (429, "rate_limited", True),
        "503": (503, "overloaded", True),
        "maint": (503, "maintenance", True),
        "409": (409, "idempotency_conflict", True),
        "422": (422, "idempotency_key_reused", False),
    }[kind]
    return DecideFailure(status, ErrorEnvelope("api_error", code, "m"), RetryHint(retryable, 100), "r")


SMALL = Limits(
    max_message_bytes=2_048,
    max_decide_body_bytes=1_024,
    start_timeout_ms=500,
    idle_timeout_ms=1_000,
    max_duration_ms=5_000,
    heartbeat_interval_ms=300,
    pong_timeout_ms=200,
    max_pending_events=8,
    max_events=12,
    decision_settlement_timeout_ms=100,
    account_decision_burst=1_000,
)
DOCUMENTED_CLOSES = {
    1000: {"idle_timeout", "max_duration"},
    1008: {"start_timeout", "protocol_refusal_limit", "event_limit"},
    1009: {"message too big"},
    1012: {"shutdown"},
    1013: {"overload", "slow_reader"},
}

gateway_steps = st.lists(
    st.one_of(
        client_frames.map(lambda f: ("frame", f)),
        st.tuples(st.just("big"), st.integers(2_049, 5_000)),
        st.tuples(st.just("tick"), st.sampled_from([0.05, 0.25, 0.6, 1.5])),
        st.tuples(st.just("finish"), st.sampled_from(["ok", "429", "503", "maint", "409", "422"])),
        st.tuples(st.just("shutdown"), st.integers(0, 500)),
        st.tuples(st.just("queue"), st.integers(0, 100)),
    ),
    max_size=25,
)


@FUZZ
@given(steps=gateway_steps, opening=st.sampled_from(["none", "on_change", "on_request"]))
def test_gateway_session_never_raises_and_closes_only_with_documented_codes(
    steps: list[tuple[str, Any]], opening: str
) -> None:
    gateway = GatewaySession(stream_id=STREAM_ID, now=0.0, limits=SMALL)
    now = 0.0
    seqs: list[int] = []
    closed: CloseConnection | None = None
    running: list[DispatchDecide] = []

    def take(actions: list[Any]) -> None:
        nonlocal closed
        for action in actions:
            assert closed is None, f"{action} after {closed}"  # a close is always last, then silence
            if isinstance(action, SendMessage):
                text = encode_message(action.message)
                decoded = decode_server_message(text)  # our own client understands everything it says
                seqs.append(decoded.seq)
                if decoded.TYPE == "error":
                    assert decoded.envelope.type in ERROR_TYPES, decoded
            elif isinstance(action, DispatchDecide):
                running.append(action)
            else:
                assert action.reason in DOCUMENTED_CLOSES.get(action.code, set()), action
                closed = action

    take(gateway.actions())
    if opening != "none":
        take(
            gateway.receive_text(
                json.dumps(
                    {
                        "type": "start",
                        "event_id": "evt_1",
                        "decision_mode": opening,
                        "request": {
                            "model": "m",
                            "state": "s",
                            "questions": QUESTIONS,
                            "prompt_cache_key": "p",
                        },
                    }
                ),
                now,
            )
        )
    for kind, value in steps:
        if kind == "frame":
            take(
                gateway.receive_binary(now) if isinstance(value, bytes) else gateway.receive_text(value, now)
            )
        elif kind == "big":
            take(gateway.receive_text('{"type":"pong","nonce":1,"pad":"' + "x" * value + '"}', now))
        elif kind == "tick":
            now += value
            take(gateway.tick(now))
        elif kind == "finish" and running:
            take(gateway.dispatch_finished(running.pop(0).dispatch_id, _outcome(value), now))
        elif kind == "shutdown":
            take(gateway.begin_shutdown(now, value))
        elif kind == "queue":
            take(
                gateway.send_queue_report(
                    queued_bytes=value * 1_000_000, queued_frames=value, write_stalled_for=value / 10, now=now
                )
            )
        if gateway.closed:
            break
    assert seqs == list(range(1, len(seqs) + 1))  # seq: 1, 2, 3 … over every server message
    if closed is not None:
        assert gateway.closed and gateway.next_deadline() is None
