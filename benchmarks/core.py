"""Scenario 5 — the sans-I/O protocol core alone: microseconds per message, no sockets.

* **codec** — ``encode_message`` / ``decode_client_message`` / ``decode_server_message`` for the
  messages of a stream's steady state (a small ``append_text``, its ``ack``, a ``decision``
  carrying a full reply as the emulator sends it);
* **change round trip** — one change through both state machines, in memory: the client's
  ``append_text`` and ``data_to_send``, the gateway's ``receive_text`` (accept, ack, dispatch),
  the client reading the ``ack``, the gateway's ``dispatch_finished`` and the client reading the
  ``decision``. Per change, at several state sizes: each change re-synthesizes the decide body,
  so the cost grows with the state. The client's share (what a triggerer pays) is timed apart
  from the gateway's (what the service pays).

The budget it is compared with: a stream may send at most ``max_messages_per_second`` (40) and
``max_events_per_second`` (5), and a process holds ``max_streams_per_process`` (4) streams.
Each figure is the median of several timed repeats (``time.perf_counter_ns``).
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import time
from typing import Any

from benchmarks.append import append_cost
from benchmarks.common import Options, per_call_us
from benchmarks.fixtures import REQUEST

__all__ = ["run"]

STATE_SIZES = (1_024, 65_536, 1_048_576)
#: Limits with the timers pushed out of the way (time is simulated: each change is 1 s apart,
#: so the rate buckets are always full and every change goes out at once).
_TIMERS = {
    "max_duration_ms": 10**12,
    "idle_timeout_ms": 10**12,
    "heartbeat_interval_ms": 10**12,
    "receipt_timeout_ms": 10**12,
}


def _reply() -> dict[str, Any]:
    """A reply exactly as the emulator's decide backend builds it."""
    from airflow_provider_systemzero.emulator.backend import DecideBackend
    from airflow_provider_systemzero.emulator.deciders import load_decider
    from airflow_provider_systemzero.protocol.body import synthesize_decide_body
    from airflow_provider_systemzero.protocol.gateway import DecideSuccess

    backend = DecideBackend(load_decider("python:benchmarks.fixtures:decide"))
    body = synthesize_decide_body(
        model=REQUEST["model"],
        state="waiting\n",
        questions=REQUEST["questions"],
        prompt_cache_key="bench-core",
    )
    outcome = asyncio.run(backend.decide("bench", body, None))
    assert isinstance(outcome, DecideSuccess)
    return outcome.reply


class _Pair:
    """A client session and a gateway session wired together in memory."""

    #: The clock each side's share is read from (``time.thread_time_ns`` for CPU time).
    clock = staticmethod(time.perf_counter_ns)

    def __init__(
        self, state_size: int, reply: dict[str, Any], *, limits: Any = None, initial: str | None = None
    ) -> None:
        from airflow_provider_systemzero.protocol.client import ClientSession
        from airflow_provider_systemzero.protocol.gateway import GatewaySession
        from airflow_provider_systemzero.protocol.limits import Limits
        from airflow_provider_systemzero.protocol.messages import StreamRequest

        limits = limits or Limits(**_TIMERS)
        self.reply = reply
        self.now = 0.0
        request = StreamRequest.build(
            model=REQUEST["model"], questions=REQUEST["questions"], prompt_cache_key="bench-core"
        )
        if initial is None:
            initial = "".join(f"{i:08d}\n" for i in range(state_size // 9))
        self.client = ClientSession(
            request=request,
            state=initial,
            decision_mode="on_change",
            key_namespace="bench-core",
            limits=limits,
        )
        self.gateway = GatewaySession(stream_id="szws_" + "0" * 32, now=self.now, limits=limits)
        self.client.connection_opened(self.now)
        self.decide_calls = 0
        self.client_ns = 0
        self.gateway_ns = 0
        self._deliver(self.gateway.actions())  # hello
        self.change()  # start, its ack and decision

    def _deliver(self, actions: list[Any]) -> None:
        from airflow_provider_systemzero.protocol.gateway import DecideSuccess, DispatchDecide, SendMessage
        from airflow_provider_systemzero.protocol.messages import encode_message

        clock = self.clock
        while actions:
            pending = []
            for action in actions:
                if isinstance(action, SendMessage):
                    started = clock()
                    frame = encode_message(action.message)
                    middle = clock()
                    self.client.receive_text(frame, self.now)
                    ended = clock()
                    self.gateway_ns += middle - started
                    self.client_ns += ended - middle
                elif isinstance(action, DispatchDecide):
                    self.decide_calls += 1
                    outcome = DecideSuccess(reply=self.reply, request_id="req_" + "0" * 24)
                    started = clock()
                    pending += self.gateway.dispatch_finished(action.dispatch_id, outcome, self.now)
                    self.gateway_ns += clock() - started
            actions = pending

    def change(self, text: str | None = None) -> None:
        """One change through both sides, to its decision (client and gateway time kept apart)."""
        clock = self.clock
        self.now += 1.0
        started = clock()
        if text is not None:
            self.client.append_text(text)
        frames = self.client.data_to_send(self.now)
        self.client_ns += clock() - started
        for frame in frames:
            started = clock()
            actions = self.gateway.receive_text(frame, self.now)
            self.gateway_ns += clock() - started
            self._deliver(actions)


def _set_desired_us(size: int, repeats: int, per_repeat: int) -> float:
    """What a trigger's source pays per change: ``set_desired`` with the full new state (an append)."""
    from airflow_provider_systemzero.protocol.client import ClientSession
    from airflow_provider_systemzero.protocol.messages import StreamRequest

    request = StreamRequest.build(
        model=REQUEST["model"], questions=REQUEST["questions"], prompt_cache_key="bench-core"
    )
    initial = "".join(f"{i:08d}\n" for i in range(size // 9))
    samples = []
    for repeat in range(repeats):
        session = ClientSession(
            request=request, state=initial, decision_mode="on_change", key_namespace="bench-core"
        )
        states = []
        text = initial
        for i in range(per_repeat):
            text += f"step {repeat}-{i} done\n"
            states.append(text)
        gc.disable()
        try:
            started = time.perf_counter_ns()
            for state in states:
                session.set_desired(state)
            samples.append((time.perf_counter_ns() - started) / per_repeat / 1000)
        finally:
            gc.enable()
    return statistics.median(samples)


def _codec(reply: dict[str, Any], repeats: int, number: int) -> list[dict[str, Any]]:
    from airflow_provider_systemzero.protocol.messages import (
        Ack,
        AppendText,
        Decision,
        decode_client_message,
        decode_server_message,
        encode_message,
    )

    stream_id = "szws_" + "0" * 32
    append = AppendText("evt_42", "step 42 done\n", "sz-" + "0" * 40 + ":" + "0" * 64)
    ack = Ack(stream_id, 84, "evt_42", 42, 123_456, 123_789, True)
    decision = Decision(stream_id, 85, 42, ("evt_42",), reply, "req_" + "0" * 24, 200, None, None, None, 0, 1)
    rows = []
    for name, message, decoder in (
        ("append_text", append, decode_client_message),
        ("ack", ack, decode_server_message),
        ("decision", decision, decode_server_message),
    ):
        text = encode_message(message)
        rows.append(
            {
                "message": name,
                "bytes": len(text.encode("utf-8")),
                "encode_us": per_call_us(lambda m=message: encode_message(m), repeats=repeats, number=number),
                "decode_us": per_call_us(lambda t=text, d=decoder: d(t), repeats=repeats, number=number),
            }
        )
    return rows


def run_sync(options: Options) -> dict[str, Any]:
    """Run scenario 5 (no event loop needed)."""
    repeats, number = (3, 200) if options.quick else (9, 1000)
    reply = _reply()
    codec = _codec(reply, repeats, number)
    round_trips = []
    for size in STATE_SIZES:
        # each repeat starts a fresh pair at this size and times a few appends (growing the state
        # by at most a tenth), so the figure belongs to the size it is reported for
        per_repeat = max(5, min(100 if size < 100_000 else 20, size // 160))
        samples = []
        client_samples = []
        decisions = 0
        for repeat in range(repeats * (3 if size < 100_000 else 1)):
            pair = _Pair(size, reply)
            pair.client_ns = pair.gateway_ns = 0
            texts = [f"step {repeat}-{i} done\n" for i in range(per_repeat)]
            gc.disable()
            try:
                started = time.perf_counter_ns()
                for text in texts:
                    pair.change(text)
                samples.append((time.perf_counter_ns() - started) / per_repeat / 1000)
                client_samples.append(pair.client_ns / per_repeat / 1000)
            finally:
                gc.enable()
            decisions += pair.decide_calls - 1
        per_change = statistics.median(samples)
        client = statistics.median(client_samples)
        round_trips.append(
            {
                "state_bytes": size,
                "us_per_change": per_change,
                "client_us_per_change": client,
                "set_desired_us": _set_desired_us(size, repeats, per_repeat),
                "changes_per_s_one_core": 1e6 / per_change,
                "decisions": decisions,
            }
        )
    appends = append_cost(reply, quick=options.quick)
    lim_messages, lim_events, streams = 40, 5, 4
    worst_message_us = max(max(r["encode_us"], r["decode_us"]) for r in codec)
    return {
        "codec": codec,
        "change_round_trip": round_trips,
        "append_cost": appends,
        "budget": {
            "max_messages_per_second": lim_messages,
            "max_events_per_second": lim_events,
            "max_streams_per_process": streams,
            "codec_cpu_pct_at_limits": worst_message_us * lim_messages * streams / 1e4,
            "change_cpu_pct_at_limits_1kb": round_trips[0]["client_us_per_change"]
            * lim_events
            * streams
            / 1e4,
            "change_cpu_pct_at_limits_1mb": round_trips[-1]["client_us_per_change"]
            * lim_events
            * streams
            / 1e4,
        },
    }


async def run(options: Options) -> dict[str, Any]:
    """Run scenario 5 in a worker thread (it is CPU-bound and needs no loop)."""
    return await asyncio.to_thread(run_sync, options)
