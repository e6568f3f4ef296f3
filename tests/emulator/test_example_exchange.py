"""The public document's example exchange, byte for byte, over a real loopback socket."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping
from typing import Any

from airflow_provider_systemzero.emulator import Emulator, KeywordDecider
from airflow_provider_systemzero.protocol import Limits, compact_json
from tests.helpers import EXAMPLE_REPLY
from tests.helpers.wire import close_of, recv, send, stream

# The example messages of the public document, verbatim (only their whitespace differs).
EXAMPLE_HELLO = {
    "type": "hello",
    "stream_id": "szws_0123456789abcdef0123456789abcdef",
    "seq": 1,
    "protocol": "system-zero.stream.v1",
    "request_id": "example-opening",
    "limits": {
        "max_duration_ms": 3600000,
        "idle_timeout_ms": 120000,
        "start_timeout_ms": 10000,
        "heartbeat_interval_ms": 30000,
        "native_heartbeat_interval_ms": 10000,
        "receipt_timeout_ms": 240000,
        "max_control_queue_frames": 2,
        "pong_timeout_ms": 10000,
        "max_message_bytes": 4194304,
        "max_decide_body_bytes": 3665920,
        "max_pending_events": 4096,
        "max_events": 100000,
        "max_events_per_second": 5,
        "max_send_queue_bytes": 4194304,
        "max_send_queue_frames": 64,
        "min_interval_ms": 0,
        "event_burst": 10,
        "max_messages_per_second": 40,
        "message_burst": 80,
        "max_streams_per_process": 4,
        "max_native_control_frames_per_second": 8,
        "native_control_frame_burst": 16,
        "max_native_control_bytes_per_second": 512,
        "native_control_byte_burst": 1024,
    },
    "rate_limit": None,
}
EXAMPLE_START = {
    "type": "start",
    "event_id": "evt_1",
    "request": {
        "model": "MODEL_ID",
        "state": "Initial log\n",
        "questions": {"ready": {"type": "boolean", "instructions": "Is the job ready?"}},
        "prompt_cache_key": "example-affinity",
    },
    "decision_mode": "on_request",
    "min_interval_ms": 0,
    "idempotency_key": "example-state-1",
}
EXAMPLE_ACK_1 = {
    "type": "ack",
    "stream_id": "szws_0123456789abcdef0123456789abcdef",
    "seq": 2,
    "event_id": "evt_1",
    "state_version": 1,
    "state_bytes": 15,
    "synthesized_body_bytes": 158,
    "scheduled": False,
}
EXAMPLE_APPEND = {
    "type": "append_text",
    "event_id": "evt_2",
    "text": "Job is ready.\n",
    "idempotency_key": "example-state-2",
}
EXAMPLE_ACK_2 = {
    "type": "ack",
    "stream_id": "szws_0123456789abcdef0123456789abcdef",
    "seq": 3,
    "event_id": "evt_2",
    "state_version": 2,
    "state_bytes": 30,
    "synthesized_body_bytes": 173,
    "scheduled": False,
}
EXAMPLE_DECIDE = {"type": "decide", "state_version": 2}
EXAMPLE_SCHEDULED = {
    "type": "scheduled",
    "stream_id": "szws_0123456789abcdef0123456789abcdef",
    "seq": 4,
    "state_version": 2,
    "in_flight": False,
}
EXAMPLE_PING = {"type": "ping", "stream_id": "szws_0123456789abcdef0123456789abcdef", "seq": 5, "nonce": 1}
EXAMPLE_DECISION = {
    "type": "decision",
    "stream_id": "szws_0123456789abcdef0123456789abcdef",
    "seq": 6,
    "state_version": 2,
    "covered_event_ids": ["evt_1", "evt_2"],
    "reply": EXAMPLE_REPLY,
    "request_id": "example-decision",
    "http_status": 200,
    "server_timing": None,
    "latency_ms": None,
    "rate_limit": None,
    "queue_ms": 0,
    "decide_ms": 40000,
}
EXAMPLE_GOODBYE = {
    "type": "goodbye",
    "stream_id": "szws_0123456789abcdef0123456789abcdef",
    "seq": 7,
    "reason": "shutdown",
    "state_version": 2,
    "last_decision_state_version": 2,
    "resume": {"supported": False, "action": "reconnect_and_replay", "retry_after_ms": 500},
}


def wire(message: Mapping[str, Any], **changes: Any) -> str:
    """The canonical frame of an example message with some fields changed."""
    return compact_json({**message, **changes})


def same_shape(ours: Any, theirs: Any) -> bool:
    """Same keys in the same order, recursively, and the same JSON kinds (numbers alike)."""
    if isinstance(theirs, dict):
        return (
            isinstance(ours, dict)
            and list(ours) == list(theirs)
            and all(same_shape(ours[k], theirs[k]) for k in theirs)
        )
    if isinstance(theirs, list):
        return (
            isinstance(ours, list)
            and len(ours) == len(theirs)
            and all(same_shape(a, b) for a, b in zip(ours, theirs, strict=True))
        )
    if isinstance(theirs, bool) or theirs is None or isinstance(theirs, str):
        return type(ours) is type(theirs)
    return isinstance(ours, int | float) and not isinstance(ours, bool)


class GatedDecider:
    """The keyword decider, answering only once the test opens the gate (so the example's ping
    lands between ``scheduled`` and ``decision`` without depending on timing)."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.inner = KeywordDecider()

    def decide(self, request: Mapping[str, Any], *, now: float) -> Any:
        async def answer() -> Mapping[str, Any]:
            await self.gate.wait()
            return self.inner.decide(request, now=now)

        return answer()


async def test_hello_is_the_public_example_with_default_limits() -> None:
    async with Emulator() as emu, stream(emu) as ws:
        text = await ws.recv()
        hello = json.loads(text)
        assert re.fullmatch(r"szws_[0-9a-f]{32}", hello["stream_id"])
        assert text == wire(EXAMPLE_HELLO, stream_id=hello["stream_id"], request_id=hello["request_id"])
        assert ws.subprotocol == "system-zero.stream.v1"


async def test_public_example_exchange_byte_for_byte() -> None:
    decider = GatedDecider()
    # The first JSON ping comes 400 ms after the upgrade, between `scheduled` and `decision`.
    limits = Limits(heartbeat_interval_ms=400)
    async with Emulator(limits=limits, decider=decider) as emu, stream(emu) as ws:
        hello = json.loads(await ws.recv())
        sid = hello["stream_id"]
        assert hello["limits"] == {**EXAMPLE_HELLO["limits"], "heartbeat_interval_ms": 400}

        await ws.send(wire(EXAMPLE_START))
        assert await ws.recv() == wire(EXAMPLE_ACK_1, stream_id=sid)
        await ws.send(wire(EXAMPLE_APPEND))
        assert await ws.recv() == wire(EXAMPLE_ACK_2, stream_id=sid)
        await ws.send(wire(EXAMPLE_DECIDE))
        assert await ws.recv() == wire(EXAMPLE_SCHEDULED, stream_id=sid)
        async with asyncio.timeout(5):
            assert await ws.recv() == wire(EXAMPLE_PING, stream_id=sid)
        await send(ws, {"type": "pong", "nonce": 1})
        decider.gate.set()

        text = await ws.recv()
        decision = json.loads(text)
        assert same_shape(decision, EXAMPLE_DECISION), text
        reply = decision["reply"]
        assert decision["seq"] == 6 and decision["stream_id"] == sid
        assert decision["state_version"] == 2
        assert decision["covered_event_ids"] == ["evt_1", "evt_2"]
        assert (
            decision["http_status"],
            decision["server_timing"],
            decision["latency_ms"],
            decision["rate_limit"],
            decision["queue_ms"],
        ) == (200, None, None, None, 0)
        assert re.fullmatch(r"szd_[0-9a-f]{32}", reply["id"])
        assert reply["model"] == "MODEL_ID"
        assert reply["answers"]["ready"]["decision"] is True
        assert reply["answers"]["ready"]["calibration_version"] == "unpublished"
        assert reply["answers"]["ready"]["calibrated"] is False
        assert reply["answers"]["ready"]["alternatives"][0]["decision"] is False

        # "In this exchange the server restarts after the decision, sends goodbye, then closes
        # with code 1012."
        restart = asyncio.create_task(emu.restart(retry_after_ms=500))
        assert await ws.recv() == wire(EXAMPLE_GOODBYE, stream_id=sid)
        await ws.wait_closed()
        assert close_of(ws)[0] == 1012
        await restart

    stats = emu.stats
    assert stats.decisions_billed == 1
    assert stats.events_accepted == 2
    assert stats.closes_by_code == {1012: 1}
    assert emu.latest_state("example-affinity") == ("Initial log\nJob is ready.\n", [])


async def test_example_question_over_the_initial_log_is_false(emu: Emulator) -> None:
    async with stream(emu) as ws:
        await recv(ws)
        await ws.send(wire(EXAMPLE_START))
        await recv(ws)
        await send(ws, {"type": "decide", "state_version": 1})
        assert (await recv(ws))["type"] == "scheduled"
        decision = await recv(ws)
        assert decision["covered_event_ids"] == ["evt_1"]
        assert decision["reply"]["answers"]["ready"]["decision"] is False
