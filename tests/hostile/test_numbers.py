"""A number no gateway can mean, through the real sensor trigger (issue 54 item 1).

A ``decision`` whose ``queue_ms`` is 1e300, 3e14 or -1e300 is finite, so the wire decoder took it:
the trigger back-dated the billed-start marker of the decision history by it, and
``datetime.fromtimestamp`` raised ``OverflowError`` / ``ValueError: year out of range`` inside
``SystemZeroDecisionTrigger.run`` — a "Trigger failure" instead of an event. Now every number a
gateway sends has a range in the protocol core: out of it, the frame is a breach of the protocol
naming the field, and after three such connections in a row the trigger ends with an error event
that says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from airflow_provider_systemzero.identity import task_namespace
from airflow_provider_systemzero.triggers.decision import SystemZeroDecisionTrigger
from tests.helpers import first_event, rebuilt
from tests.helpers.hostile import CONN_ID
from tests.helpers.hostile_gateway import REQUEST, HostileGateway, Peer, Raw


def _sensor_trigger() -> SystemZeroDecisionTrigger:
    """The deferrable sensor's trigger, waiting for ``ready`` about a state that never changes."""
    return rebuilt(
        SystemZeroDecisionTrigger(
            systemzero_conn_id=CONN_ID,
            request=REQUEST,
            condition={"question": "ready", "expect": True},
            state="log\n",
            key_namespace=task_namespace("numbers", "wait", "r", -1),
            deadline=time.time() + 60,
            lease=False,
        )
    )


@pytest.mark.parametrize(
    ("field", "number"),
    [("queue_ms", "1e300"), ("queue_ms", "3e14"), ("queue_ms", "-1e300"), ("decide_ms", "1e300")],
)
async def test_an_absurd_dispatch_time_ends_the_trigger_with_an_error_naming_the_field(
    field: str, number: str, gateway: Callable[..., HostileGateway], connect: Callable[..., Any]
) -> None:
    async def script(peer: Peer) -> None:
        await peer.open()
        await peer.decision(1, **{field: Raw(number)})
        await peer.drain()

    gw = gateway(script)
    connect(gw)
    event = await first_event(_sensor_trigger(), within=40)
    assert event["status"] == "error", event
    assert f"decision.{field} must be from 0 to 3600000" in event["message"], event["message"]
    assert gw.connections == 3  # three breaches in a row, then the task hears it
    assert all(row["at"][:4] >= "1970" for row in event["decisions"] if "at" in row)
