"""A client and a gateway session joined by a link with latency, on a simulated clock.

:class:`~tests.helpers.pair.Pair` joins the two sessions with no delay, so the client always
hears an ack before it can change the state again. Over a real network a change can land during
every round trip; :class:`LatentPair` lets a test say so. It plays the I/O adapter's part the way
``stream/stream_connection.py`` does: after every input the client writes ``data_to_send(now)`` and is woken
at ``next_wakeup(now)``; a dispatch finishes ``decide_s`` after the gateway starts it.

Each time it writes, it checks the liveness rule: a wake-up is never due now (``outgoing`` sends
everything due at once, so there is nothing left to wake for), and never ``inf``.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from typing import Any

from airflow_provider_systemzero.protocol import (
    ClientSession,
    DecideSuccess,
    GatewaySession,
    Limits,
    StreamRequest,
    encode_message,
)
from airflow_provider_systemzero.protocol.gateway import (
    CloseConnection,
    DecideOutcome,
    DispatchDecide,
    SendMessage,
)

QUESTIONS = {"ready": {"type": "boolean", "instructions": "Is the job ready?"}}


def decided(action: DispatchDecide) -> DecideOutcome:
    """A reply that says yes, with an ID of its own per body."""
    return DecideSuccess(
        reply={
            "id": "szd_" + format(abs(hash(action.body)) % (1 << 128), "032x"),
            "answers": {
                "ready": {"type": "boolean", "probability": 0.9, "confidence": 0.9, "decision": True}
            },
        },
        request_id="latent",
    )


class LatentPair:
    """A :class:`ClientSession` and a :class:`GatewaySession`, ``one_way_s`` apart.

    :param mode: the client's decision mode.
    :param one_way_s: the link's latency each way, in seconds.
    :param decide_s: how long a dispatch takes.
    :param outcome: the outcome of each dispatch (default: :func:`decided`).
    """

    def __init__(
        self,
        mode: str,
        *,
        one_way_s: float = 0.05,
        decide_s: float = 0.2,
        state: Any = "",
        limits: Limits | None = None,
        outcome: Callable[[DispatchDecide], DecideOutcome] = decided,
    ) -> None:
        self.now = 0.0
        self.one_way = one_way_s
        self.decide_s = decide_s
        self.outcome = outcome
        request = StreamRequest.build(model="m", questions=QUESTIONS, prompt_cache_key="latent")
        self.client = ClientSession(request=request, state=state, decision_mode=mode, key_namespace="ns")
        self.gateway = GatewaySession(stream_id="szws_" + "a" * 32, now=0.0, limits=limits or Limits())
        #: (time, text) of every frame the client wrote.
        self.client_frames: list[tuple[float, str]] = []
        #: (time, event) of every event the client reported.
        self.events: list[tuple[float, Any]] = []
        #: The decide body of every dispatch the gateway started, in order.
        self.bodies: list[str] = []
        self.closed: CloseConnection | None = None
        self._queue: list[tuple[float, int, str, Any]] = []
        self._order = itertools.count()
        self.client.connection_opened(0.0)
        self._gateway_did(self.gateway.actions())

    def at(self, when: float, kind: str, payload: Any = None) -> None:
        """Schedule ``kind`` (``call``: ``payload()`` is called) at ``when``."""
        heapq.heappush(self._queue, (when, next(self._order), kind, payload))

    def every(self, start: float, interval: float, change: Callable[[int], Any]) -> None:
        """Call ``change(n)`` at ``start``, then every ``interval`` seconds, for ever."""
        count = itertools.count()

        def tick() -> None:
            change(next(count))
            self.at(self.now + interval, "call", tick)

        self.at(start, "call", tick)

    def _gateway_did(self, actions: list[Any]) -> None:
        for action in actions:
            if isinstance(action, SendMessage):
                self.at(self.now + self.one_way, "to_client", encode_message(action.message))
            elif isinstance(action, DispatchDecide):
                self.bodies.append(action.body)
                self.at(self.now + self.decide_s, "finish", action)
            elif isinstance(action, CloseConnection):
                self.closed = action

    def write(self) -> None:
        """What the adapter does after every input: write what is due, set the alarms."""
        if not self.client.connected:
            return
        for text in self.client.data_to_send(self.now):
            self.client_frames.append((self.now, text))
            self.at(self.now + self.one_way, "to_gateway", text)
        wake = self.client.next_wakeup(self.now)
        if wake is not None:
            assert self.now < wake < math.inf, f"the client would spin at {self.now:.3f} s (wake-up {wake})"
            self.at(wake, "wake")
        deadline = self.gateway.next_deadline()
        if deadline is not None and math.isfinite(deadline):
            self.at(max(deadline, self.now), "gateway_tick")

    def run_until(self, until: float) -> None:
        """Deliver everything due up to ``until`` (simulated seconds), in order."""
        while self._queue and self._queue[0][0] <= until:
            when, _, kind, payload = heapq.heappop(self._queue)
            self.now = max(self.now, when)
            if kind == "to_client" and self.client.connected:
                self.events.extend((self.now, e) for e in self.client.receive_text(payload, self.now))
            elif kind == "to_gateway" and not self.gateway.closed:
                self._gateway_did(self.gateway.receive_text(payload, self.now))
            elif kind == "finish" and not self.gateway.closed:
                outcome = self.outcome(payload)
                self._gateway_did(self.gateway.dispatch_finished(payload.dispatch_id, outcome, self.now))
            elif kind == "gateway_tick" and not self.gateway.closed:
                self._gateway_did(self.gateway.tick(self.now))
            elif kind == "call":
                payload()
            self.write()
        self.now = max(self.now, until)

    def sent(self, message_type: str) -> list[float]:
        """When the client wrote each message of that type."""
        marker = f'"type":"{message_type}"'
        return [t for t, text in self.client_frames if marker in text.replace(" ", "")]
