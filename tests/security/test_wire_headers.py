"""What the gateway receives on the upgrade, on every path that opens a connection (a trigger's
first connection, its reconnect after a restart, the connection test): the bearer key, exactly one
subprotocol, and no browser context — no ``Origin``, no ``Cookie``, no compression offer.

Asserted at the server, from the emulator's record of every upgrade request's headers."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from airflow_provider_systemzero.emulator import Emulator
from airflow_provider_systemzero.hooks.systemzero import SystemZeroHook
from airflow_provider_systemzero.identity import task_namespace
from airflow_provider_systemzero.protocol.limits import Limits
from airflow_provider_systemzero.protocol.messages import PROTOCOL
from airflow_provider_systemzero.triggers.decision import SystemZeroDecideTrigger
from tests.helpers import first_event, rebuilt
from tests.helpers.faults import ReadyDecider

KEY = "sz-wire-test-0123456789"
FORBIDDEN = {"origin", "cookie", "cookie2", "sec-websocket-extensions", "proxy-authorization"}


async def test_every_upgrade_carries_the_key_one_subprotocol_and_no_browser_context(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AIRFLOW__SYSTEMZERO__RECONNECT_BACKOFF_BASE", "0.02")
    limits = Limits(decision_settlement_timeout_ms=50)  # the restart cannot wait for the decision
    async with Emulator(
        api_keys={KEY: 8}, decider=ReadyDecider(), decide_latency_ms=300, limits=limits
    ) as emu:
        monkeypatch.setenv(
            "AIRFLOW_CONN_SYSTEMZERO_WIRE",
            json.dumps({"conn_type": "systemzero", "host": emu.origin, "password": KEY}),
        )
        task = asyncio.ensure_future(
            first_event(
                rebuilt(
                    SystemZeroDecideTrigger(
                        systemzero_conn_id="systemzero_wire",
                        request={
                            "model": "m",
                            "questions": {"ready": {"type": "boolean", "instructions": "Is the job ready?"}},
                        },
                        state="READY\n",
                        key_namespace=task_namespace("wire", "decide", "r", -1),
                        deadline=time.time() + 20,
                    )
                )
            )
        )
        await emu.wait_for(lambda e: e.stats.decisions_dispatched == 1)
        await emu.restart(retry_after_ms=50)  # the reconnect opens a second upgrade
        assert (await task)["status"] == "success"
        ok, message = await asyncio.to_thread(SystemZeroHook("systemzero_wire").test_connection)
        assert ok, message
        handshakes = list(emu.handshakes)
    assert len(handshakes) == 3  # first connection, reconnect, connection test
    for headers in handshakes:
        names = {name.lower() for name in headers}
        assert not names & FORBIDDEN, headers
        lowered = {name.lower(): value for name, value in headers.items()}
        assert lowered["sec-websocket-protocol"] == PROTOCOL
        assert lowered["authorization"] == "Bearer ***"  # recorded masked: the bearer key was sent
        assert lowered["user-agent"].startswith("airflow-provider-systemzero/")
    assert emu.stats.upgrade_refusals == {}  # exact path, no query: accepted every time
