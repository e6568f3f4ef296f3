"""A lease release that meets the end of its connection: the release applies to that one
connection, and the stream comes back on the next change.

A trigger gives its quiet stream back with ``release()`` when ``connected and not has_work()``;
that guard still holds for a few loop steps after the gateway dropped the connection or said
goodbye, so the release can land on a connection that is already ending — or on one whose
``start`` was never acknowledged. Neither may leave the stream closing every later connection.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from airflow_provider_systemzero.protocol.gateway import SendMessage
from airflow_provider_systemzero.protocol.messages import Ack
from airflow_provider_systemzero.stream import Backoff
from tests.helpers.stream import EmulatorFactory, loopback_stream


async def test_releasing_a_connection_whose_start_was_never_acknowledged(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    withhold_acks = False

    def tap(
        stream: Any, actions: list[Any]
    ) -> list[Any]:  # the gateway keeps its acknowledgements while asked
        if withhold_acks:
            return [a for a in actions if not (isinstance(a, SendMessage) and isinstance(a.message, Ack))]
        return actions

    emu = await make_emulator()
    emu.action_tap = tap
    async with loopback_stream(emu, fast_backoff, "lease-unacked") as stream:
        withhold_acks = True
        await emu.drop_all()
        await stream.append_text("Job is running.\n")  # something to send: it reconnects
        await emu.wait_for(lambda e: bool(stream.reconnects) and stream.connected, timeout=5)
        assert not stream.in_sync  # the replayed start is not acknowledged
        opened = emu.stats.streams_total
        await stream.release()  # given back before its start was acknowledged
        withhold_acks = False

        await stream.append_text("Job is ready.\n")
        decision = await stream.decide(timeout=5)
        assert decision.decisions() == {"ready": True}
        latest = emu.latest_state(stream.request.prompt_cache_key or "")
        assert latest is not None and latest.state == stream.state
        # one connection brought the stream back; none was closed right after its upgrade
        assert emu.stats.streams_total - opened <= 2, emu.stats


@pytest.mark.parametrize("ending", ["drop", "goodbye"])
async def test_a_release_landing_as_the_connection_ends_applies_to_that_connection(
    make_emulator: EmulatorFactory, fast_backoff: Backoff, ending: str
) -> None:
    # The guard is checked at every loop step from the moment the gateway ends the connection,
    # so some step meets the window where the client has seen the end but still looks connected.
    emu = await make_emulator()
    async with loopback_stream(emu, fast_backoff, f"lease-{ending}") as stream:
        for steps in range(16):
            await emu.wait_for(lambda e: stream.connected and stream.in_sync, timeout=5)
            end = asyncio.ensure_future(emu.drop_all() if ending == "drop" else emu.restart(retry_after_ms=0))
            released = False
            for _ in range(steps):
                await asyncio.sleep(0)
            if stream.connected and not stream.has_work():  # the trigger's lease guard
                await stream.release()
                released = True
            await end

            await stream.append_text(f"line {steps}\n")
            decision = await stream.decide(timeout=5)
            assert decision.state_version >= 1, (steps, released)
            latest = emu.latest_state(stream.request.prompt_cache_key or "")
            assert latest is not None and latest.state == stream.state, (steps, released)
        assert stream.failure is None
