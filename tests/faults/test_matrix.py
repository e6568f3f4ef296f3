"""The fault matrix: every fault the public document names, for the sensor (``on_change``) and the
operator (``on_request``), driven through the real triggers against the emulator's fault controls.

Each case ends in :meth:`Harness.check` (the four invariants: the right outcome on the right
decision, a byte-identical final state, billed = distinct decided states, and every reconnect
waited at least the server's delay) plus the case's own evidence that the fault really happened.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_provider_systemzero.compat import AirflowException, AirflowFailException
from airflow_provider_systemzero.protocol.body import body_hash
from airflow_provider_systemzero.protocol.messages import Ack, Decision, Error, Goodbye, Pong
from airflow_provider_systemzero.stream import DecisionStream
from tests.helpers.faults import (
    KEY,
    LIMITS,
    OUTPUTS,
    READY,
    SHORT_PONG,
    WORKING,
    Harness,
    HarnessFactory,
    only_reconnect,
    operator_outcome,
    sensor_outcome,
    set_source,
)


@contextlib.contextmanager
def pongs_muted(stream: DecisionStream) -> Iterator[None]:
    """The client stops answering JSON pings (a reader stuck elsewhere), then recovers."""
    session = stream.session
    original = session.outgoing
    session.outgoing = lambda now: [m for m in original(now) if not isinstance(m, Pong)]  # type: ignore[method-assign]
    try:
        yield
    finally:
        del session.outgoing  # the class's method again


async def sensor_decided_working(h: Harness, **trigger_kwargs: Any) -> Any:
    """Start the sensor on a not-ready state and wait for its first (false) decision."""
    set_source("s", WORKING)
    trigger = h.sensor("s", **trigger_kwargs)
    task = h.start(trigger)
    await h.until(lambda e: e.stats.decisions_delivered == 1)
    assert not task.done()
    return task


# ------------------------------------------------------------------ goodbye shutdown + 1012 during a decide


async def test_shutdown_during_a_decide_sensor(make_harness: HarnessFactory) -> None:
    h = await make_harness()
    task = await sensor_decided_working(h)
    h.emu.backend.decide_latency_ms = 600
    set_source("s", READY)
    await h.until(lambda e: e.backend.calls == 2)  # the READY decide runs
    h.emu.backend.decide_latency_ms = 0
    await h.emu.restart(retry_after_ms=300)  # settles for 100 ms, then goodbye shutdown, 1012
    payload = await task
    await h.check(payload, kind="sensor", desired=READY, billed=2)
    record = only_reconnect(h)
    assert (record.reason, record.close_code, record.server_delay) == ("goodbye:shutdown", 1012, 0.3)
    first_stream = h.emu.sent[0].stream_id
    assert [
        s.message.state_version
        for s in h.emu.sent
        if s.stream_id == first_stream and isinstance(s.message, Decision)
    ] == [1]  # READY's came later


async def test_shutdown_during_a_decide_operator(make_harness: HarnessFactory) -> None:
    h = await make_harness()
    h.emu.backend.decide_latency_ms = 600
    task = h.start(h.operator(OUTPUTS))
    await h.until(lambda e: e.backend.calls == 1)
    h.emu.backend.decide_latency_ms = 0
    await h.emu.restart(retry_after_ms=300)
    payload = await task
    await h.check(payload, kind="operator", desired=OUTPUTS, billed=1)
    record = only_reconnect(h)
    assert (record.reason, record.close_code, record.server_delay) == ("goodbye:shutdown", 1012, 0.3)
    assert h.emu.stats.decisions_billed == 1 and h.emu.stats.decisions_replayed == 1


# ------------------------------------------------------------------ abrupt drop (1006) while waiting for an ack


async def test_drop_while_waiting_for_an_ack_sensor(make_harness: HarnessFactory) -> None:
    h = await make_harness()
    task = await sensor_decided_working(h)
    h.emu.drop_before = lambda m: isinstance(m, Ack) and m.event_id == "evt_2"
    set_source("s", READY)
    payload = await task
    assert h.emu.drop_before is None  # the gateway accepted evt_2; its ack never left
    await h.check(payload, kind="sensor", desired=READY, billed=2)
    record = only_reconnect(h)
    assert (record.reason, record.close_code, record.server_delay) == ("close", 1006, None)


async def test_drop_while_waiting_for_an_ack_operator(make_harness: HarnessFactory) -> None:
    h = await make_harness()
    h.emu.drop_before = lambda m: isinstance(m, Ack) and m.event_id == "evt_1"  # start's ack
    payload = await h.start(h.operator(OUTPUTS))
    assert h.emu.drop_before is None
    await h.check(payload, kind="operator", desired=OUTPUTS, billed=1)
    record = only_reconnect(h)
    assert (record.reason, record.close_code) == ("close", 1006)
    assert h.emu.stats.events_accepted == 2  # start accepted twice: once unacknowledged, once replayed


# ------------------------------------------------------------------ missed pong: 1013 slow_reader


async def test_missed_pong_sensor(make_harness: HarnessFactory) -> None:
    h = await make_harness(limits=SHORT_PONG)
    task = await sensor_decided_working(h)
    h.emu.backend.decide_latency_ms = 1_000
    set_source("s", READY)
    await h.until(lambda e: e.backend.calls == 2)
    h.emu.backend.decide_latency_ms = 0
    with pongs_muted(h.stream_of(Harness.namespace("wait"))):
        await h.until(lambda e: e.stats.closes_by_code.get(1013, 0) == 1)
    payload = await task
    await h.check(payload, kind="sensor", desired=READY, billed=2)
    record = only_reconnect(h)
    assert (record.reason, record.close_code) == ("close", 1013)
    assert any(code == 1013 for _, _, code in h.emu.closes)


async def test_missed_pong_operator(make_harness: HarnessFactory) -> None:
    h = await make_harness(limits=SHORT_PONG)
    h.emu.backend.decide_latency_ms = 1_000
    task = h.start(h.operator(OUTPUTS))
    await h.until(lambda e: e.backend.calls == 1)
    h.emu.backend.decide_latency_ms = 0
    with pongs_muted(h.stream_of(Harness.namespace("decide"))):
        await h.until(lambda e: e.stats.closes_by_code.get(1013, 0) == 1)
    payload = await task
    await h.check(payload, kind="operator", desired=OUTPUTS, billed=1)
    assert (only_reconnect(h).close_code, h.emu.stats.decide_failures.get(409, 0) >= 1) == (1013, True)


# ------------------------------------------------------------------ idle goodbye


async def test_idle_goodbye_sensor(make_harness: HarnessFactory) -> None:
    h = await make_harness(limits=LIMITS.replace(idle_timeout_ms=300))
    task = await sensor_decided_working(h)
    stream = h.stream_of(Harness.namespace("wait"))
    await h.until(lambda e: stream.dormant)  # goodbye idle_timeout, close 1000: nothing to do, no reconnect
    assert [g.reason for g in h.emu.messages(Goodbye)] == ["idle_timeout"] and h.emu.stats.streams_total == 1
    set_source("s", READY)  # the change is the work that brings the stream back
    payload = await task
    await h.check(payload, kind="sensor", desired=READY, billed=2)
    record = only_reconnect(h)
    assert (record.reason, record.close_code) == ("goodbye:idle_timeout", 1000)


async def test_idle_goodbye_operator(make_harness: HarnessFactory) -> None:
    """The gateway idles out while the operator waits out a retryable failure's delay."""
    h = await make_harness(limits=LIMITS.replace(idle_timeout_ms=300))
    h.emu.faults.fail_decides(1, status=503, retry_after_ms=600)
    payload = await h.start(h.operator(OUTPUTS))
    await h.check(payload, kind="operator", desired=OUTPUTS, billed=1)
    record = only_reconnect(h)
    assert (record.reason, record.close_code) == ("goodbye:idle_timeout", 1000)
    failed, succeeded = h.emu.calls
    assert failed.status == 503 and succeeded.started - failed.ended >= 0.6


# ------------------------------------------------------------------ max_duration goodbye


async def test_max_duration_goodbye_sensor(make_harness: HarnessFactory) -> None:
    h = await make_harness(limits=LIMITS.replace(max_duration_ms=1_500))
    task = await sensor_decided_working(h)
    stream = h.stream_of(Harness.namespace("wait"))
    await h.until(lambda e: stream.dormant)
    assert [g.reason for g in h.emu.messages(Goodbye)] == ["max_duration"] and h.emu.stats.streams_total == 1
    set_source("s", READY)
    payload = await task
    await h.check(payload, kind="sensor", desired=READY, billed=2)
    assert only_reconnect(h).reason == "goodbye:max_duration"


async def test_max_duration_goodbye_operator(make_harness: HarnessFactory) -> None:
    """The lifetime ends while the decide is in flight: reconnect at once, replay, wait the call out."""
    h = await make_harness(limits=LIMITS.replace(max_duration_ms=1_500))
    h.emu.backend.decide_latency_ms = 2_000
    task = h.start(h.operator(OUTPUTS))
    await h.until(lambda e: e.backend.calls == 1)
    h.emu.backend.decide_latency_ms = 0
    payload = await task
    await h.check(payload, kind="operator", desired=OUTPUTS, billed=1)
    record = only_reconnect(h)
    assert (record.reason, record.close_code) == ("goodbye:max_duration", 1000)
    assert h.emu.stats.decisions_replayed == 1


# ------------------------------------------------------------------ three retryable failures: fatal, overload, 1013


async def test_three_retryable_failures_sensor(make_harness: HarnessFactory) -> None:
    h = await make_harness()
    task = await sensor_decided_working(h)
    h.emu.faults.fail_decides(3, status=503, retry_after_ms=200)
    set_source("s", READY)
    payload = await task
    await h.check(payload, kind="sensor", desired=READY, billed=2)
    errors = h.emu.messages(Error)
    assert [e.fatal for e in errors] == [False, False, True] and errors[-1].retry.retry_after_ms == 200
    [goodbye] = h.emu.messages(Goodbye)
    assert (goodbye.reason, goodbye.retry_after_ms) == ("overload", 200)
    record = only_reconnect(h)
    assert (record.reason, record.close_code, record.server_delay) == ("goodbye:overload", 1013, 0.2)


async def test_three_retryable_failures_operator(make_harness: HarnessFactory) -> None:
    """on_request is never retried by the gateway (no fatal, no goodbye): the client retries,
    each time after the server's delay, within its budget of three."""
    h = await make_harness()
    h.emu.faults.fail_decides(3, status=503, retry_after_ms=200)
    payload = await h.start(h.operator(OUTPUTS))
    await h.check(payload, kind="operator", desired=OUTPUTS, billed=1)
    assert [e.fatal for e in h.emu.messages(Error)] == [False] * 3 and not h.emu.messages(Goodbye)
    assert not h.reconnects()
    calls = h.emu.calls
    assert [c.status for c in calls] == [503, 503, 503, 200]
    assert all(b.started - a.ended >= 0.2 for a, b in itertools.pairwise(calls))


async def test_retryable_failures_beyond_the_budget_fail_the_operator_retryably(
    make_harness: HarnessFactory,
) -> None:
    h = await make_harness()
    h.emu.faults.fail_decides(4, status=503, retry_after_ms=50)
    payload = await h.start(h.operator(OUTPUTS))
    assert payload["status"] == "error" and payload["error_type"] == "decision_failed"
    assert (payload["http_status"], payload["retryable"]) == (503, True)
    with pytest.raises(AirflowException, match="HTTP 503") as info:
        operator_outcome(payload)
    assert not isinstance(info.value, AirflowFailException)  # Airflow's task retries apply
    await h.settle()
    h.check_billing(0)
    h.check_delays()


# ------------------------------------------------------------------ 429 upgrade with Retry-After


async def test_429_upgrade_sensor(make_harness: HarnessFactory) -> None:
    h = await make_harness()
    task = await sensor_decided_working(h)
    h.emu.faults.refuse_upgrades(1, status=429, code="stream_capacity", retry_after_s=1)
    await h.emu.restart(retry_after_ms=0)  # the reconnect meets a full account
    set_source("s", READY)  # changes while the client waits out Retry-After
    payload = await task
    await h.check(payload, kind="sensor", desired=READY, billed=2)
    first, second = h.reconnects()
    assert (first.reason, first.close_code) == ("goodbye:shutdown", 1012)
    assert (second.reason, second.server_delay) == ("upgrade_refused:429", 1.0) and second.waited >= 1.0
    assert h.emu.stats.upgrade_refusals == {429: 1}


async def test_429_upgrade_operator(make_harness: HarnessFactory) -> None:
    h = await make_harness()
    h.emu.faults.refuse_upgrades(1, status=429, code="stream_capacity", retry_after_s=1)
    payload = await h.start(h.operator(OUTPUTS))
    await h.check(payload, kind="operator", desired=OUTPUTS, billed=1)
    record = only_reconnect(h)
    assert (record.reason, record.server_delay) == ("upgrade_refused:429", 1.0) and record.waited >= 1.0


# ------------------------------------------------------------------ 503 maintenance


async def test_503_maintenance_sensor(make_harness: HarnessFactory) -> None:
    h = await make_harness()
    task = await sensor_decided_working(h)
    h.emu.faults.refuse_upgrades(1, status=503, code="maintenance", retry_after_s=1)
    await h.emu.restart(retry_after_ms=200)
    set_source("s", READY)
    payload = await task
    await h.check(payload, kind="sensor", desired=READY, billed=2)
    first, second = h.reconnects()
    assert (first.reason, first.server_delay) == ("goodbye:shutdown", 0.2) and first.waited >= 0.2
    assert (second.reason, second.server_delay) == ("upgrade_refused:503", 1.0) and second.waited >= 1.0


async def test_503_maintenance_operator(make_harness: HarnessFactory) -> None:
    h = await make_harness()
    h.emu.faults.refuse_upgrades(1, status=503, code="maintenance", retry_after_s=1)
    payload = await h.start(h.operator(OUTPUTS))
    await h.check(payload, kind="operator", desired=OUTPUTS, billed=1)
    record = only_reconnect(h)
    assert (record.reason, record.server_delay) == ("upgrade_refused:503", 1.0) and record.waited >= 1.0


# ------------------------------------------------------------------ 401: no retry, a clear failure


async def test_401_sensor(make_harness: HarnessFactory) -> None:
    """The key is revoked while the sensor waits: the reconnect its next change makes meets 401,
    and the task fails for good."""
    h = await make_harness()
    task = await sensor_decided_working(h)
    h.emu.faults.refuse_upgrades(1, status=401, code="invalid_api_key", retry_after_s=None)
    await h.emu.restart(retry_after_ms=0)
    # decided and in sync: the restart alone opens nothing (it would only decide that state again)
    await h.until(lambda e: e.stats.streams_open == 0)
    assert not task.done() and [u.status for u in h.emu.upgrades] == [101]
    set_source("s", READY)
    payload = await task
    assert (payload["status"], payload["error_type"]) == ("error", "authentication")
    assert "HTTP 401" in payload["message"] and "password field" in payload["message"]
    assert KEY not in str(payload)
    with pytest.raises(AirflowFailException, match="HTTP 401"):  # no retry: a wrong key stays wrong
        sensor_outcome(payload)
    assert [u.status for u in h.emu.upgrades] == [101, 401]  # refused once, never retried
    await h.settle()
    h.check_billing(1)
    h.check_delays()


async def test_401_operator(make_harness: HarnessFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    h = await make_harness()
    monkeypatch.setenv(
        "AIRFLOW_CONN_SYSTEMZERO_FAULTS",
        f'{{"conn_type": "systemzero", "host": "{h.emu.origin}", "password": "sz-wrong-key-000"}}',
    )
    payload = await h.start(h.operator(OUTPUTS))
    assert (payload["status"], payload["error_type"]) == ("error", "authentication")
    assert "sz-wrong-key-000" not in str(payload)
    with pytest.raises(AirflowFailException, match="HTTP 401"):
        operator_outcome(payload)
    assert [u.status for u in h.emu.upgrades] == [401] and h.emu.stats.streams_total == 0


# ------------------------------------------------------------------ 409 idempotency_conflict, then success


async def test_409_then_success_sensor(make_harness: HarnessFactory) -> None:
    h = await make_harness()
    task = await sensor_decided_working(h)
    h.emu.faults.fail_decides(1, status=409, code="idempotency_conflict", retry_after_ms=200)
    set_source("s", READY)
    payload = await task
    await h.check(payload, kind="sensor", desired=READY, billed=2)
    assert h.emu.stats.decide_failures == {409: 1} and not h.reconnects()
    conflict, success = h.emu.calls[1:]
    assert conflict.status == 409 and success.started - conflict.ended >= 0.2  # the gateway's own retry


async def test_409_then_success_operator(make_harness: HarnessFactory) -> None:
    h = await make_harness()
    h.emu.faults.fail_decides(1, status=409, code="idempotency_conflict", retry_after_ms=200)
    payload = await h.start(h.operator(OUTPUTS))
    await h.check(payload, kind="operator", desired=OUTPUTS, billed=1)
    conflict, success = h.emu.calls
    assert conflict.status == 409 and success.started - conflict.ended >= 0.2  # the client waited it out


# ------------------------------------------------------------------ a decision that arrives after newer state


@pytest.mark.parametrize("mode", ["on_change", "on_request"])
async def test_a_late_decision_about_older_state_never_fires_the_sensor(
    make_harness: HarnessFactory, mode: str
) -> None:
    """READY is decided slowly; meanwhile the log says ROLLBACK. The late "ready" must not count."""
    h = await make_harness()
    set_source("s", READY)
    h.emu.backend.decide_latency_ms = 600
    task = h.start(h.sensor("s", decision_mode=mode))
    await h.until(lambda e: e.backend.calls == 1)
    h.emu.backend.decide_latency_ms = 0
    rolled_back = READY + "ROLLBACK\n"
    set_source("s", rolled_back)
    await h.until(
        lambda e: e.stats.decisions_delivered == 2
    )  # the stale "ready", then ROLLBACK's "not ready"
    assert not task.done()
    final = rolled_back + "READY again\n"
    set_source("s", final)
    payload = await task
    await h.check(payload, kind="sensor", desired=final, billed=3)
    # the stale decision really arrived after the newer state was acknowledged, and said "ready"
    order = [
        (
            type(s.message).__name__,
            getattr(s.message, "event_id", None),
            getattr(s.message, "state_version", None),
        )
        for s in h.emu.sent
        if isinstance(s.message, Ack | Decision)
    ]
    assert order.index(("Ack", "evt_2", 2)) < order.index(("Decision", None, 1)), order
    [stale] = [
        s.message for s in h.emu.sent if isinstance(s.message, Decision) and s.message.state_version == 1
    ]
    assert stale.reply["answers"]["ready"]["decision"] is True and payload["reply_id"] != stale.reply["id"]


async def test_a_late_decision_about_an_older_state_never_answers_the_operator(
    make_harness: HarnessFactory,
) -> None:
    """A try's state is decided slowly; the task is retried with newer upstream outputs before that
    decision lands. The retry's answer is about its own state, never the late one."""
    h = await make_harness()
    older = [*OUTPUTS[:1], {"task_id": "verify", "output": "ROLLBACK"}]
    h.emu.backend.decide_latency_ms = 600
    first_try = h.operator(older)
    task = h.start(first_try)
    await h.until(lambda e: e.backend.calls == 1)
    h.emu.backend.decide_latency_ms = 0
    await h.restart_triggerer(task, first_try)  # the try ends (cleared, retried) …
    payload = await h.start(h.operator(OUTPUTS))  # … and the next one replays newer outputs
    await h.until(lambda e: e.stats.decisions_billed == 2)  # the late call finished on the gateway too
    await h.check(payload, kind="operator", desired=OUTPUTS, billed=2)
    late = [
        e
        for e in h.entries()
        if e.body_sha256 != body_hash(h.stream_of(payload["key_namespace"]).session.desired_body())
    ]
    assert late and payload["reply_id"] not in {e.reply_id for e in late}
    assert payload["answers"]["ready"]["decision"] is True


# ------------------------------------------------------------------ the triggerer restarts mid-wait


async def test_triggerer_restart_mid_decide_sensor(make_harness: HarnessFactory) -> None:
    h = await make_harness()
    set_source("s", WORKING)
    trigger = h.sensor("s")
    task = h.start(trigger)
    await h.until(lambda e: e.stats.decisions_delivered == 1)
    h.emu.backend.decide_latency_ms = 600
    set_source("s", READY)
    await h.until(lambda e: e.backend.calls == 2)
    h.emu.backend.decide_latency_ms = 0
    rebuilt = await h.restart_triggerer(task, trigger)  # cancelled mid-decide, rebuilt from serialize()
    await h.until(lambda e: e.stats.streams_open == 0)
    assert h.emu.stats.closes_by_code == {1000: 1}  # the old trigger closed its stream cleanly
    payload = await h.start(rebuilt)
    await h.check(payload, kind="sensor", desired=READY, billed=2)
    _, key, body = h.emu.started[1]  # the call the restart interrupted
    [original] = [e for e in h.entries() if e.billed and e.body_sha256 == body]
    assert (
        original.idempotency_key == key and payload["reply_id"] == original.reply_id
    )  # replayed, not re-billed


async def test_triggerer_restart_mid_decide_operator(make_harness: HarnessFactory) -> None:
    h = await make_harness()
    h.emu.backend.decide_latency_ms = 600
    trigger = h.operator(OUTPUTS)
    task = h.start(trigger)
    await h.until(lambda e: e.backend.calls == 1)
    h.emu.backend.decide_latency_ms = 0
    rebuilt = await h.restart_triggerer(task, trigger)
    payload = await h.start(rebuilt)
    await h.check(payload, kind="operator", desired=OUTPUTS, billed=1)
    _, key, body = h.emu.started[0]
    [original] = [e for e in h.entries() if e.billed]
    assert (original.idempotency_key, original.body_sha256) == (key, body)
    assert payload["reply_id"] == original.reply_id and h.emu.stats.decisions_replayed >= 1


# ------------------------------------------------------------------ two copies of the same trigger (HA)


async def test_two_copies_at_once_sensor(make_harness: HarnessFactory) -> None:
    h = await make_harness()
    set_source("s", WORKING)
    one, two = h.start(h.sensor("s")), h.start(h.sensor("s"))
    await h.until(lambda e: e.stats.decisions_delivered == 2)  # both copies heard about WORKING
    set_source("s", READY)
    first, second = await one, await two
    assert first["reply_id"] == second["reply_id"]
    for payload in (first, second):
        await h.check(payload, kind="sensor", desired=READY, billed=2, one_client=False)


async def test_two_copies_at_once_operator(make_harness: HarnessFactory) -> None:
    h = await make_harness(decide_latency_ms=100)
    one, two = h.start(h.operator(OUTPUTS)), h.start(h.operator(OUTPUTS))
    first, second = await one, await two
    assert first["reply_id"] == second["reply_id"]
    for payload in (first, second):
        await h.check(payload, kind="operator", desired=OUTPUTS, billed=1, one_client=False)
    assert h.emu.stats.streams_total == 2
