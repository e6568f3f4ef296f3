"""A gateway that never answers the client's close frame cannot hold a caller past its deadline,
nor turn a decision in hand into a timeout.

The document gives a close handshake ``close_handshake_timeout`` (5 s) before the socket is
dropped. That wait belongs after the caller's result, never inside its deadline: ``hook.decide``
bounds its close by the time it has left, a stream that never opened is dropped at once, and the
triggers yield their event — a decision, a failure or a timeout — before ``cleanup()`` closes the
stream. The gateways here stop reading (so the close frame is never read, nor answered) and keep
the connection alive with pings.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from collections.abc import Callable
from typing import Any

import pytest

from airflow_provider_systemzero.protocol.limits import Limits
from airflow_provider_systemzero.stream.exceptions import DeadlineExceeded
from airflow_provider_systemzero.triggers.decision import SystemZeroDecideTrigger, SystemZeroDecisionTrigger
from tests.helpers import TRIGGER_CONDITION
from tests.helpers.hostile import CONN_ID, sensor_dag
from tests.helpers.hostile_gateway import REQUEST, HostileGateway, Peer

#: The close handshake the gateway never completes (the document's timeout).
CLOSING = Limits().close_handshake_timeout_ms / 1000
#: Room for a loaded machine: well under the close handshake it must not include.
SLACK = 2.5
DEADLINE = 3.0


async def deaf(peer: Peer) -> None:
    """Stop reading (nothing the client sends, its close frame included, is read) and ping."""
    peer.ws.transport.pause_reading()
    for nonce in itertools.count(1):
        await peer.send({"type": "ping", "nonce": nonce})
        await asyncio.sleep(0.5)


async def deaf_after_hello(peer: Peer) -> None:
    await peer.hello()
    await deaf(peer)


async def deaf_after_ack(peer: Peer) -> None:
    await peer.open()
    await deaf(peer)


async def deaf_after_decision(peer: Peer) -> None:
    await peer.open()
    await peer.decide_then()
    await deaf(peer)


def decide_trigger() -> SystemZeroDecideTrigger:
    """The deferrable operator's trigger, with a deadline of :data:`DEADLINE` from now."""
    return SystemZeroDecideTrigger(
        systemzero_conn_id=CONN_ID,
        request=REQUEST,
        state="log\n",
        key_namespace="hostile",
        deadline=time.time() + DEADLINE,
    )


@pytest.mark.parametrize("script", [deaf_after_hello, deaf_after_ack], ids=["opening", "open"])
def test_hook_decide_ends_by_its_timeout(
    gateway: Callable[..., HostileGateway], connect: Callable[..., Any], script: Any
) -> None:
    hook = connect(gateway(script))
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        hook.decide(REQUEST, "log\n", timeout=DEADLINE)
    assert time.monotonic() - started < DEADLINE + SLACK  # not DEADLINE + the close handshake


async def test_the_decide_trigger_keeps_a_decision_it_has(
    gateway: Callable[..., HostileGateway], connect: Callable[..., Any]
) -> None:
    connect(gateway(deaf_after_decision))
    trigger = decide_trigger()
    run = trigger.run()
    started = time.monotonic()
    try:
        async with asyncio.timeout(60):
            event = await anext(run)
        # the decision, at once: not a timeout after a close handshake run inside the deadline
        assert event.payload["status"] == "success", event.payload
        assert time.monotonic() - started < DEADLINE
    finally:
        await run.aclose()
        closing = time.monotonic()
        await trigger.cleanup()
    # the socket is dropped after the handshake's time
    assert time.monotonic() - closing < CLOSING + 1 + SLACK


@pytest.mark.parametrize("script", [deaf_after_hello, deaf_after_ack], ids=["opening", "open"])
async def test_the_decide_triggers_timeout_comes_at_its_deadline(
    gateway: Callable[..., HostileGateway], connect: Callable[..., Any], script: Any
) -> None:
    connect(gateway(script))
    trigger = decide_trigger()
    started = time.monotonic()
    try:
        async with asyncio.timeout(60):
            event = await anext(aiter(trigger.run()))
        elapsed = time.monotonic() - started
    finally:
        await trigger.cleanup()
    assert event.payload["status"] == "timeout"
    assert elapsed < DEADLINE + SLACK


@pytest.mark.parametrize("script", [deaf_after_hello, deaf_after_ack], ids=["opening", "open"])
async def test_the_sensor_triggers_timeout_comes_at_its_deadline(
    gateway: Callable[..., HostileGateway], connect: Callable[..., Any], script: Any
) -> None:
    connect(gateway(script))
    trigger = SystemZeroDecisionTrigger(
        systemzero_conn_id=CONN_ID,
        request=REQUEST,
        condition=TRIGGER_CONDITION,
        state="log\n",
        key_namespace="hostile",
        decision_mode="on_request",
        deadline=time.time() + DEADLINE,
    )
    run = trigger.run()
    started = time.monotonic()
    try:
        async with asyncio.timeout(60):
            event = await anext(run)
        assert event.payload["status"] == "timeout"
        assert time.monotonic() - started < DEADLINE + SLACK
    finally:
        await run.aclose()
        await trigger.cleanup()


def poking_dag(dag_id: str, timeout: float, **kwargs: Any) -> Any:
    """A Dag of one poking sensor (task ``wait``, every 0.1 s) on the hostile gateway's connection."""
    return sensor_dag(dag_id, deferrable=False, mode="poke", poke_interval=0.1, timeout=timeout, **kwargs)


def test_a_poking_sensor_ends_by_its_timeout_during_a_decide(
    airflow_db: None,
    gateway: Callable[..., HostileGateway],
    connect: Callable[..., Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Airflow checks a sensor's timeout between pokes; a poke's decide that the gateway never
    answers ends by the sensor's timeout too (not the hook's 10-minute default), as a timeout
    (``AirflowSensorTimeout``, which ``soft_fail`` would turn into a skip)."""
    from tests.helpers import run_dag, task_states

    connect(gateway(deaf_after_ack))
    dag = poking_dag("hostile_poke_timeout", DEADLINE, state="log\n", wait_on_static_state=True)
    started = time.monotonic()
    dag_run = run_dag(dag)
    assert time.monotonic() - started < 60  # dag.test()'s own start-up included; not 600 s
    assert task_states(dag_run) == {"wait": "failed"}
    assert f"the sensor's timeout ({DEADLINE} s) passed during a poke's decision" in capsys.readouterr().out


def test_a_poking_sensors_timeout_counts_from_its_first_poke(
    airflow_db: None,
    gateway: Callable[..., HostileGateway],
    connect: Callable[..., Any],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Any,
) -> None:
    """Pokes that decide nothing (the file is missing) count: the first decide, once the file has
    content, gets what is left of the timeout, not all of it."""
    from tests.helpers import run_dag_while, task_states

    connect(gateway(deaf_after_ack))
    log = tmp_path / "job.log"
    timeout = 6.0
    dag = poking_dag("hostile_poke_clock", timeout, source={"type": "file", "path": str(log)})

    def write_when_poked() -> None:
        from tests.helpers import wait_until

        # the sensor pokes the missing file (its clock runs), then the file gets content
        wait_until(lambda: "the next poke reads it again" in capsys.readouterr().out, timeout=60)
        time.sleep(timeout / 2)
        log.write_text("Job is ready.\n")

    dag_run = run_dag_while(dag, write_when_poked)
    assert task_states(dag_run) == {"wait": "failed"}
    printed = capsys.readouterr().out
    given = re.search(r"passed during a poke's decision \(no decision within ([0-9.]+) s", printed)
    assert given is not None, printed[-2000:]
    assert float(given.group(1)) < timeout * 0.75  # what was left (about half), not the whole timeout


async def test_a_close_that_is_cancelled_lets_the_cancellation_through(connect: Callable[..., Any]) -> None:
    """Cancelled while it waits for the connecting run loop to end (a gateway that never answers
    the upgrade), ``aclose()`` raises ``CancelledError``: a trigger cancelled in its cleanup
    stops, instead of carrying on as if nothing happened."""
    from types import SimpleNamespace

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.read()  # the upgrade request is never answered; until the client goes
        finally:
            writer.close()

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    hook = connect(SimpleNamespace(origin=f"ws://127.0.0.1:{port}"))
    try:
        for _ in range(3):
            stream = hook.stream(REQUEST, decision_mode="on_request", state="log\n", open_deadline=None)
            entering = asyncio.ensure_future(stream.__aenter__())
            await asyncio.sleep(0.3)  # the run loop is connecting
            closing = asyncio.ensure_future(stream.aclose())
            await asyncio.sleep(0)  # aclose() now waits for the run loop it ended
            closing.cancel()
            with pytest.raises(asyncio.CancelledError):
                await closing
            entering.cancel()
            await asyncio.gather(entering, return_exceptions=True)
    finally:
        server.close()
        await server.wait_closed()
