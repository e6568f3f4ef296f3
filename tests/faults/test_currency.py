"""Which decision may fire the sensor's trigger: only one about the state the stream holds.

* A decision that resolves while the next change is being handed to the stream (``set_state``
  yields) is about the previous state: it never fires, even when that change takes a while.
* A source that changes faster than a decision takes is still decided about: after two decisions
  in a row came back about an outdated state, newer content waits (up to ``max_staleness``) while
  a decision is in flight, so the next one is current — and few decisions are billed meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from typing import Any

import pytest

from airflow_provider_systemzero.decisions.source_watch import STARVED_AFTER
from airflow_provider_systemzero.identity import state_hash
from airflow_provider_systemzero.stream import DecisionStream
from tests.helpers.faults import HarnessFactory, set_source

READY = "build 7 started\nREADY\n"


async def test_an_on_request_decision_resolving_while_a_change_is_taken_never_fires(
    make_harness: HarnessFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """READY is decided slowly; meanwhile the log says ROLLBACK and handing that change over takes
    longer than the decision. The decision about READY must not fire with ROLLBACK's hash."""
    original = DecisionStream.set_state

    async def slow_set_state(self: DecisionStream, state: Any, **kwargs: Any) -> None:
        await original(self, state, **kwargs)
        await asyncio.sleep(0.6)  # the change is taken; the call returns after the decision arrived

    monkeypatch.setattr(DecisionStream, "set_state", slow_set_state)
    h = await make_harness()
    h.emu.backend.decide_latency_ms = 300
    set_source("s", READY)
    task = h.start(h.sensor("s", decision_mode="on_request"))
    await h.until(lambda e: e.backend.calls == 1)
    rolled_back = READY + "ROLLBACK\n"
    set_source("s", rolled_back)
    # READY's decision (now outdated), then ROLLBACK's — unless the outdated one fired the trigger
    await h.until(lambda e: task.done() or e.stats.decisions_delivered == 2)
    h.emu.backend.decide_latency_ms = 0
    assert not task.done(), task.result()
    final = rolled_back + "READY again\n"
    set_source("s", final)
    payload = await task
    await h.check(payload, kind="sensor", desired=final, billed=3)
    assert payload["state_hash"] == state_hash(final)


@pytest.mark.parametrize("mode", ["on_change", "on_request"])
async def test_a_source_changing_faster_than_a_decision_takes_is_still_decided(
    make_harness: HarnessFactory, mode: str
) -> None:
    """Decisions take 300 ms; after READY the log gains a heartbeat line every 100 ms."""
    h = await make_harness()
    h.emu.backend.decide_latency_ms = 300
    set_source("s", READY)

    async def heartbeat() -> None:
        text = READY
        for n in itertools.count():
            await asyncio.sleep(0.1)
            text += f"heartbeat {n}: READY\n"
            set_source("s", text)

    beats = asyncio.ensure_future(heartbeat())
    try:
        payload = await h.start(h.sensor("s", decision_mode=mode), within=10)
    finally:
        beats.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beats
    stream = h.stream_of(payload["key_namespace"])
    # the decision that fired is about the complete state the stream held (and the gateway accepted)
    await h.check(payload, kind="sensor", desired=stream.state)
    assert payload["state_hash"] == state_hash(stream.state)
    # a few outdated decisions before the hold, then every decision counts
    assert h.emu.stats.decisions_billed <= STARVED_AFTER + 3, h.entries()


async def test_max_staleness_zero_never_holds_a_change(make_harness: HarnessFactory) -> None:
    """With ``max_staleness=0`` every change goes to the stream at once: a source faster than the
    decisions is never decided about (the documented cost of never holding)."""
    h = await make_harness()
    h.emu.backend.decide_latency_ms = 1000
    set_source("s", READY)
    task = h.start(h.sensor("s", max_staleness=0), within=30)
    text = READY
    for n in itertools.count():
        await asyncio.sleep(0.1)
        text += f"heartbeat {n}: READY\n"
        set_source("s", text)
        if h.emu.stats.decisions_delivered >= STARVED_AFTER + 1 or task.done():
            break
    assert not task.done(), task.result()  # every decision came back about an outdated state
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
