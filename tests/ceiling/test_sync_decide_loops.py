"""A sync ``SystemZeroHook.decide()`` runs on an event loop of its own (``asyncio.run``); once the
call returned, nothing of the provider's keeps that loop: the account's decision starts, kept per
loop, let it be collected."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from airflow_provider_systemzero.hooks.systemzero import SystemZeroHook
from airflow_provider_systemzero.stream import Backoff
from tests.helpers import EmulatorThread
from tests.helpers.hooks import CONN_ID

REQUEST = {"questions": {"ready": {"type": "boolean", "instructions": "Is the job ready?"}}}
CALLS = 5


def test_each_sync_decide_leaves_its_closed_loop_to_the_collector(
    threaded_emu: EmulatorThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []
    new_event_loop = asyncio.events.new_event_loop

    def recorded() -> asyncio.AbstractEventLoop:
        loop = new_event_loop()
        loops.append(weakref.ref(loop))
        return loop

    monkeypatch.setattr(asyncio.events, "new_event_loop", recorded)  # what asyncio.run makes its loop with
    hook = SystemZeroHook(CONN_ID, backoff=Backoff(base=0.02, cap=0.1))
    for call in range(CALLS):
        decision = hook.decide(REQUEST, f"call {call}\n", timeout=20, identity="loops")
        assert decision.decisions() == {"ready": False}
    gc.collect()
    assert len(loops) == CALLS, "each call runs on a loop of its own"
    alive = sum(1 for ref in loops if ref() is not None)
    assert alive == 0, f"{alive} of the {CALLS} closed loops of sync decide() calls are still alive"
    assert threaded_emu.call(lambda e: e.stats).decisions_billed == CALLS
