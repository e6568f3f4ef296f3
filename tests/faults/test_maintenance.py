"""A decide that fails with 503 ``maintenance``: the gateway is going away. The public document
excludes it from the gateway's own retries (``on_change``) because the connection is about to
end (goodbye ``shutdown``, 1012); the state is decided again on the next connection. The client
must treat it as passing — wait the server's delay and retry (``on_request``), or keep waiting for
the replay (``on_change``) — never as a final failure of the task."""

from __future__ import annotations

import pytest

from airflow_provider_systemzero.compat import AirflowException, AirflowFailException
from tests.helpers.faults import (
    OUTPUTS,
    READY,
    WORKING,
    Harness,
    HarnessFactory,
    only_reconnect,
    operator_outcome,
    set_source,
)


def maintenance(h: Harness, count: int = 1) -> None:
    h.emu.faults.fail_decides(count, status=503, code="maintenance", retry_after_ms=300)


async def test_maintenance_then_restart_sensor(make_harness: HarnessFactory) -> None:
    h = await make_harness()
    set_source("s", WORKING)
    task = h.start(h.sensor("s"))
    await h.until(lambda e: e.stats.decisions_delivered == 1)
    maintenance(h)
    set_source("s", READY)
    await h.until(lambda e: e.stats.decide_failures.get(503) == 1)
    await h.emu.restart(retry_after_ms=300)  # what follows a maintenance answer
    payload = await task
    await h.check(payload, kind="sensor", desired=READY, billed=2)
    record = only_reconnect(h)
    assert (record.reason, record.server_delay) == ("goodbye:shutdown", 0.3)


async def test_maintenance_then_restart_operator(make_harness: HarnessFactory) -> None:
    h = await make_harness()
    maintenance(h)
    task = h.start(h.operator(OUTPUTS))
    await h.until(lambda e: e.stats.decide_failures.get(503) == 1)
    await h.emu.restart(retry_after_ms=300)
    payload = await task
    await h.check(payload, kind="operator", desired=OUTPUTS, billed=1)


async def test_maintenance_is_retried_after_the_servers_delay_operator(make_harness: HarnessFactory) -> None:
    h = await make_harness()
    maintenance(h)
    payload = await h.start(h.operator(OUTPUTS))
    await h.check(payload, kind="operator", desired=OUTPUTS, billed=1)
    failed, succeeded = h.emu.calls
    assert failed.status == 503 and succeeded.started - failed.ended >= 0.3


async def test_lasting_maintenance_fails_the_operator_retryably(make_harness: HarnessFactory) -> None:
    h = await make_harness()
    maintenance(h, count=4)
    payload = await h.start(h.operator(OUTPUTS))
    assert (payload["error_type"], payload["code"], payload["retryable"]) == (
        "decision_failed",
        "maintenance",
        True,
    )
    with pytest.raises(AirflowException, match="maintenance") as info:
        operator_outcome(payload)
    assert not isinstance(info.value, AirflowFailException)  # Airflow's task retries apply
