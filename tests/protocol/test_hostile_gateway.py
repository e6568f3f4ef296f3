"""The client core against a gateway that says one thing and does another.

A client joined to the real gateway core (:class:`Pair`); the hostile part is written by hand as
the gateway's next numbered message, and a frame the gateway "drops" is one the client wrote
and nobody read. Each case is a legal but unusual sequence: the rule it checks is quoted.
"""

from __future__ import annotations

import json
from typing import Any

from airflow_provider_systemzero.protocol import ErrorEnvelope, Limits, RetryHint, encode_message
from airflow_provider_systemzero.protocol.connection_state import ConnectionState, Recycle
from airflow_provider_systemzero.protocol.messages import Error, Goodbye
from tests.helpers.pair import Pair, make_client

LIMITS = Limits(close_handshake_timeout_ms=5_000)


def started(mode: str = "on_change") -> Pair:
    """A client whose ``start`` the gateway acknowledged (and, on_change, decided)."""
    pair = Pair(make_client(mode=mode), limits=LIMITS)
    pair.pump()
    assert pair.client.in_sync
    return pair


def say(pair: Pair, message_type: type[Any], **fields: Any) -> None:
    """The gateway's next message, as the gateway core would not send it."""
    message = message_type(stream_id=pair.gateway.stream_id, seq=pair.gateway.next_seq(), **fields)
    pair.client_events.extend(pair.client.receive_text(encode_message(message), pair.now))


def goodbye(pair: Pair, retry_after_ms: int | None, reason: str = "shutdown") -> None:
    say(
        pair,
        Goodbye,
        reason=reason,
        state_version=None,
        last_decision_state_version=None,
        retry_after_ms=retry_after_ms,
    )


def error(
    pair: Pair,
    code: str,
    *,
    retry_after_ms: int | None = None,
    fatal: bool = False,
    event_id: str | None = None,
    http_status: int | None = None,
) -> None:
    say(
        pair,
        Error,
        event_id=event_id,
        state_version=None,
        http_status=http_status,
        request_id="r",
        fatal=fatal,
        envelope=ErrorEnvelope("rate_limit_error", code, code),
        retry=RetryHint(retry_after_ms is not None, retry_after_ms),
    )


def dropped(pair: Pair) -> list[str]:
    """What the client writes now, read by nobody."""
    return pair.client.data_to_send(pair.now)


# ------------------------------------------------------------------ delays before the next connection


def test_a_second_goodbye_never_shortens_the_first() -> None:
    """ "Honor goodbye.resume.retry_after_ms and any longer server retry delay.\""""
    pair = started()
    goodbye(pair, 15_000)
    goodbye(pair, 0)
    assert pair.client.next_connection_delay_ms(pair.now) == 15_000


def test_a_non_fatal_retry_delay_holds_the_next_connection_from_its_arrival() -> None:
    """A 429 the gateway retries in 20 s (on_change): a connection lost meanwhile is not replayed
    (which would dispatch at once) before those 20 s are over, also after a failed opening."""
    pair = started()
    error(pair, "rate_limited", retry_after_ms=20_000, http_status=429)
    pair.now += 1.0
    assert pair.client.next_connection_delay_ms(pair.now) == 19_000
    pair.client.connection_lost()
    pair.now += 4.0
    assert pair.client.next_connection_delay_ms(pair.now) == 15_000  # a failed opening's outcome
    pair.now += 15.0
    assert pair.client.next_connection_delay_ms(pair.now) is None


def test_a_fatal_error_names_its_delay_from_the_end_of_the_connection() -> None:
    pair = started()
    error(pair, "rate_limited", retry_after_ms=2_000, fatal=True, http_status=429)
    pair.now += 1.0
    assert pair.client.next_connection_delay_ms(pair.now) == 2_000


# ------------------------------------------------------------------ what the gateway said it would do


def test_a_goodbye_with_no_close_after_it_is_closed_by_the_client() -> None:
    """WIRE.md §7: goodbye, then close. A gateway that never closes is closed after the close
    handshake timeout; the wakeup says when."""
    pair = started()
    goodbye(pair, 100)
    grace = LIMITS.close_handshake_timeout_ms / 1000
    assert not pair.client.recycle_due(pair.now + grace - 0.01)
    assert pair.client.next_wakeup(pair.now) == grace
    assert pair.client.recycle_due(pair.now + grace)
    assert pair.client.recycle_reason == Recycle.CLOSE_EXPECTED.value


def test_a_fatal_error_with_no_close_after_it_is_closed_by_the_client() -> None:
    """ "A fatal error requires a following close.\""""
    pair = started()
    error(pair, "internal", fatal=True)
    assert pair.client.recycle_due(pair.now + LIMITS.close_handshake_timeout_ms / 1000)


def test_a_decision_does_not_cancel_the_close_a_goodbye_announced() -> None:
    pair = started(mode="on_change")
    goodbye(pair, 0)
    pair.client.append_text("x")
    pair.pump()  # the gateway core still acks and decides
    assert pair.client.in_sync and pair.client.recycle_due(pair.now + 5.0)


def test_an_unnamed_refusal_of_an_unanswered_change_replays_it_on_a_new_connection() -> None:
    """message_rate_limited naming no event: the change in flight may be the one refused, and
    nothing would ever answer it."""
    pair = started()
    pair.client.append_text("x")
    assert dropped(pair)  # the append, refused unread
    error(pair, "message_rate_limited", retry_after_ms=300)
    assert not pair.client.recycle_due(pair.now + 0.29)
    assert pair.client.recycle_due(pair.now + 0.3)
    assert pair.client.recycle_reason == Recycle.MESSAGE_REFUSED.value


def test_an_unnamed_refusal_is_moot_once_everything_is_answered() -> None:
    pair = started()
    pair.client.append_text("x")
    pair.pump()  # the append was read and acknowledged; some other message was refused
    error(pair, "message_rate_limited", retry_after_ms=300)
    assert not pair.client.recycle_due(pair.now + 1.0)


def test_an_unnamed_refusal_cancelled_by_the_ack_that_follows() -> None:
    pair = started()
    pair.client.append_text("x")
    [frame] = dropped(pair)
    error(pair, "message_rate_limited", retry_after_ms=300)  # about another message after all
    pair.handle(pair.gateway.receive_text(frame, pair.now))  # the append's ack arrives
    assert pair.client.in_sync and not pair.client.recycle_due(pair.now + 1.0)


def test_a_named_refusal_sends_the_change_again_after_the_delay() -> None:
    pair = started()
    pair.client.append_text("x")
    [frame] = dropped(pair)
    event_id = json.loads(frame)["event_id"]
    error(pair, "message_rate_limited", retry_after_ms=300, event_id=event_id)
    assert dropped(pair) == [] and pair.client.next_wakeup(pair.now) == 0.3
    pair.advance(0.3)
    assert pair.client.in_sync and pair.gateway.stream_state.state == "log\nx"


def test_a_decide_refused_as_stale_is_not_sent_again_on_that_connection() -> None:
    """The decide named the acknowledged version with nothing in flight: sent again, it would be
    refused again at once (a loop at the message rate); the connection is replayed instead."""
    pair = started(mode="on_request")
    pair.client.request_decision()
    [decide] = dropped(pair)
    assert '"decide"' in decide
    error(pair, "stale_state_version")
    for step in range(10):
        assert dropped(pair) == [], f"a decide sent again at step {step}"
        pair.now += 0.09
    assert pair.client.recycle_due(pair.now + 0.2)
    assert pair.client.recycle_reason == Recycle.VERSION_DISAGREES.value


def test_cancelling_one_recycle_reason_keeps_the_others() -> None:
    """A 503 maintenance failure nobody retries plans a replay in 5 s; an unnamed refusal plans one
    sooner, then its answer comes. The maintenance replay must still happen."""
    conn = ConnectionState()
    conn.plan_recycle(5.0, Recycle.DECIDE_NOT_RETRIED)
    conn.plan_recycle(0.3, Recycle.MESSAGE_REFUSED)
    assert conn.recycle_plan() == (0.3, Recycle.MESSAGE_REFUSED)
    conn.refusal_answered()  # nothing unanswered: the refusal dropped nothing of ours
    assert conn.recycle_plan() == (5.0, Recycle.DECIDE_NOT_RETRIED)


def test_an_unnamed_refusal_does_not_replay_a_decide_the_gateway_already_scheduled() -> None:
    """on_request: ``scheduled`` proves the gateway read the decide (its dispatch runs); a refusal
    of some other message (a pong) must not abandon it for a replay."""
    pair = Pair(make_client(mode="on_request"), limits=LIMITS, auto_decide=False)
    pair.pump()
    pair.client.request_decision()
    pair.pump()  # decide → scheduled; the dispatch runs
    assert pair.dispatches and '"scheduled"' in pair.server_frames[-1]
    error(pair, "message_rate_limited", retry_after_ms=300)
    assert not pair.client.recycle_due(pair.now + 10.0)
