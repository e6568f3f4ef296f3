"""A ConnectionPair-style harness: a ClientSession joined to a GatewaySession in memory."""

from __future__ import annotations

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
from airflow_provider_systemzero.protocol.client import ClientEvent
from airflow_provider_systemzero.protocol.gateway import (
    CloseConnection,
    DecideOutcome,
    DispatchDecide,
    SendMessage,
)

STREAM_ID = "szws_0123456789abcdef0123456789abcdef"


#: The one question of a client built by :func:`make_client`.
QUESTIONS = {"ready": {"type": "boolean", "instructions": "Is the job ready?"}}


def make_client(state: Any = "log\n", mode: str = "on_change", **kwargs: Any) -> ClientSession:
    """A client session asking :data:`QUESTIONS` of model ``m`` from ``state`` in ``mode``.

    :param state: the initial state.
    :param mode: ``on_change`` or ``on_request``.
    :param kwargs: more :class:`ClientSession` arguments.
    """
    request = StreamRequest.build(model="m", questions=QUESTIONS, prompt_cache_key="pck")
    return ClientSession(request=request, state=state, decision_mode=mode, **kwargs)


def example_reply(body: str, key: str | None) -> DecideOutcome:
    """A fixed reply shaped like the public example."""
    return DecideSuccess(
        reply={
            "id": "szd_0123456789abcdef0123456789abcdef",
            "model": "MODEL_ID",
            "answers": {
                "ready": {"type": "boolean", "probability": 0.9, "confidence": 0.9, "decision": True}
            },
        },
        request_id="example-decision",
    )


class Pair:
    """Joins a client and a gateway; ``pump`` moves frames both ways until nothing moves."""

    def __init__(
        self,
        client: ClientSession,
        *,
        limits: Limits | None = None,
        now: float = 0.0,
        decider: Callable[[str, str | None], DecideOutcome] = example_reply,
        auto_decide: bool = True,
        stream_id: str = STREAM_ID,
    ) -> None:
        self.now = now
        #: how far the client's clock runs ahead of the gateway's (seconds; a skew a test sets)
        self.client_ahead = 0.0
        self.client = client
        self.gateway = GatewaySession(
            stream_id=stream_id, now=now, limits=limits, request_id="example-opening"
        )
        self.decider = decider
        self.auto_decide = auto_decide
        self.server_frames: list[str] = []
        self.client_frames: list[str] = []
        self.client_events: list[ClientEvent] = []
        self.dispatches: list[DispatchDecide] = []
        self.closed: CloseConnection | None = None
        self.client.connection_opened(now)
        self.handle(self.gateway.actions())

    @property
    def client_now(self) -> float:
        """The time on the client's clock: :attr:`now` plus :attr:`client_ahead`."""
        return self.now + self.client_ahead

    def handle(self, actions: list[Any]) -> None:
        """Carry out the gateway's actions: deliver its messages to the client, answer its decide
        dispatches (unless told not to), and end the connection where it closes."""
        for action in actions:
            if isinstance(action, SendMessage):
                text = encode_message(action.message)
                self.server_frames.append(text)
                if self.client.connected:
                    self.client_events.extend(self.client.receive_text(text, self.client_now))
            elif isinstance(action, DispatchDecide):
                self.dispatches.append(action)
                if self.auto_decide:
                    self.finish(action)
            else:
                self.closed = action
                self.client.connection_lost()

    def finish(self, action: DispatchDecide, outcome: DecideOutcome | None = None) -> None:
        result = outcome or self.decider(action.body, action.idempotency_key)
        self.handle(self.gateway.dispatch_finished(action.dispatch_id, result, self.now))

    def pump(self, rounds: int = 1000) -> None:
        for _ in range(rounds):
            frames = self.client.data_to_send(self.client_now) if self.client.connected else []
            if not frames:
                return
            for text in frames:
                self.client_frames.append(text)
                self.handle(self.gateway.receive_text(text, self.now))
        raise AssertionError("pump did not settle")

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.handle(self.gateway.tick(self.now))
        self.pump()
