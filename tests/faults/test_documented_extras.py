"""Two more closes the public document names, beyond the issue's list, that a healthy client can
still meet:

* ``start_timeout`` (fatal error, close 1008): the client was too slow to send ``start`` once —
  a stalled triggerer loop, say. The next connection sends it at once, so the client reconnects
  instead of giving up.
* ``max_events`` (fatal ``event_limit``, goodbye ``event_limit``, close 1008): a long-lived
  stream used up its events; the client reconnects and replays the full state (new numbering).
"""

from __future__ import annotations

from airflow_provider_systemzero.protocol.messages import Error, Goodbye
from tests.helpers.faults import (
    LIMITS,
    OUTPUTS,
    READY,
    WORKING,
    Harness,
    HarnessFactory,
    only_reconnect,
    set_source,
)


async def stalled_first_start(h: Harness) -> None:
    """The first connection's start deadline has passed before any start can arrive; the next
    connections get the normal deadline."""
    h.emu.limits = LIMITS.replace(start_timeout_ms=0)
    await h.until(lambda e: e.stats.closes_by_code.get(1008, 0) >= 1)
    h.emu.limits = LIMITS


async def test_a_start_that_came_too_late_is_retried_sensor(make_harness: HarnessFactory) -> None:
    h = await make_harness()
    set_source("s", READY)
    task = h.start(h.sensor("s"))
    await stalled_first_start(h)
    payload = await task
    await h.check(payload, kind="sensor", desired=READY, billed=1)
    first = h.reconnects()[0]
    assert (first.reason, first.close_code) == ("close", 1008)
    assert [e.code for e in h.emu.messages(Error) if e.fatal][:1] == ["start_timeout"]


async def test_a_start_that_came_too_late_is_retried_operator(make_harness: HarnessFactory) -> None:
    h = await make_harness()
    task = h.start(h.operator(OUTPUTS))
    await stalled_first_start(h)
    payload = await task
    await h.check(payload, kind="operator", desired=OUTPUTS, billed=1)
    assert (h.reconnects()[0].reason, h.reconnects()[0].close_code) == ("close", 1008)


async def test_an_exhausted_event_budget_is_replayed_on_a_new_stream_sensor(
    make_harness: HarnessFactory,
) -> None:
    h = await make_harness(limits=LIMITS.replace(max_events=2))
    set_source("s", WORKING)
    task = h.start(h.sensor("s"))
    await h.until(lambda e: e.stats.decisions_delivered == 1)
    set_source("s", WORKING + "step 1\n")  # evt_2: the last event this stream may take
    await h.until(lambda e: e.stats.decisions_delivered == 2)
    set_source("s", READY)  # evt_3: event_limit, goodbye, 1008; the replay carries it
    payload = await task
    await h.check(payload, kind="sensor", desired=READY, billed=3)
    [goodbye] = h.emu.messages(Goodbye)
    assert goodbye.reason == "event_limit"
    record = only_reconnect(h)
    assert (record.reason, record.close_code) == ("goodbye:event_limit", 1008)
