"""Hypothesis stateful tests: random sequences against plain models of the protocol."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from airflow_provider_systemzero.protocol import (
    ClientSession,
    DecideFailure,
    DecideSuccess,
    ErrorEnvelope,
    GatewaySession,
    Limits,
    RetryHint,
    StreamRequest,
    compact_json,
    synthesize_decide_body,
)
from airflow_provider_systemzero.protocol.gateway import DispatchDecide, SendMessage
from tests.helpers.pair import Pair

QUESTIONS = {"ready": {"type": "boolean", "instructions": "Is the job ready?"}}
LIMITS = Limits(
    max_events_per_second=1000,
    event_burst=1000,
    max_messages_per_second=1000,
    message_burst=1000,
    idle_timeout_ms=10**9,
    heartbeat_interval_ms=10**9,
    max_pending_events=10**6,
)
OK = DecideSuccess(reply={"id": "szd_" + "0" * 32, "answers": {}}, request_id="r")
texts = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=8)
keys = st.one_of(st.none(), st.sampled_from(["k1", "k2", " k3 ", "", "x" * 256]))


class GatewayModel(RuleBasedStateMachine):
    """Random mutations (valid and invalid), decides and dispatch outcomes on a GatewaySession."""

    @initialize(mode=st.sampled_from(["on_change", "on_request"]))
    def open(self, mode: str) -> None:
        self.mode = mode
        self.now = 0.0
        self.g = GatewaySession(stream_id="szws_" + "c" * 32, now=0, limits=LIMITS)
        self.state: Any = "s"
        self.version = 0
        self.key: str | None = None
        self.covered: list[str] = []
        self.watermark = 0
        self.running: list[DispatchDecide] = []
        self.dispatched_versions: list[int] = []
        self._take(self.g.actions())
        self.send(
            {
                "type": "start",
                "event_id": "evt_1",
                "decision_mode": mode,
                "request": {"model": "m", "state": "s", "questions": QUESTIONS, "prompt_cache_key": "p"},
            },
            accepted_state="s",
            key=None,
        )

    def _take(self, actions: list[Any]) -> list[dict[str, Any]]:
        out = []
        for action in actions:
            if isinstance(action, SendMessage):
                out.append(action.message.to_dict())
            elif isinstance(action, DispatchDecide):
                self.running.append(action)
                self.dispatched_versions.append(action.state_version)
        return out

    def send(self, message: dict[str, Any], *, accepted_state: Any, key: str | None) -> None:
        msgs = self._take(self.g.receive_text(json.dumps(message), self.now))
        acks = [m for m in msgs if m["type"] == "ack"]
        if accepted_state is None:
            assert not acks and [m["type"] for m in msgs][:1] == ["error"], msgs
            return
        [ack] = acks
        self.version += 1
        self.state = accepted_state
        self.key = key.strip(" ") if key is not None else None
        assert ack["event_id"] == f"evt_{self.version}" and ack["state_version"] == self.version
        assert ack["state_bytes"] == len(compact_json(self.state).encode())
        body = synthesize_decide_body(model="m", state=self.state, questions=QUESTIONS, prompt_cache_key="p")
        assert ack["synthesized_body_bytes"] == len(body.encode()) and self.g.body == body
        assert ack["scheduled"] is (self.mode == "on_change")

    @staticmethod
    def _valid_key(key: str | None) -> bool:
        return key is None or 1 <= len(key.strip(" ")) <= 255

    @rule(text=texts, key=keys)
    def append_text(self, text: str, key: str | None) -> None:
        ok = isinstance(self.state, str) and self._valid_key(key)
        message = {"type": "append_text", "event_id": f"evt_{self.version + 1}", "text": text}
        if key is not None:
            message["idempotency_key"] = key
        self.send(message, accepted_state=self.state + text if ok else None, key=key)

    @rule(items=st.lists(st.integers(), max_size=3), key=keys)
    def append_items(self, items: list[int], key: str | None) -> None:
        ok = isinstance(self.state, list) and bool(items) and self._valid_key(key)
        message = {"type": "append_items", "event_id": f"evt_{self.version + 1}", "items": items}
        if key is not None:
            message["idempotency_key"] = key
        self.send(message, accepted_state=[*self.state, *items] if ok else None, key=key)

    @rule(
        state=st.one_of(
            texts, st.lists(st.integers(), max_size=3), st.dictionaries(texts, st.integers(), max_size=2)
        ),
        key=keys,
    )
    def replace(self, state: Any, key: str | None) -> None:
        message = {"type": "replace", "event_id": f"evt_{self.version + 1}", "state": state}
        if key is not None:
            message["idempotency_key"] = key
        self.send(message, accepted_state=state if self._valid_key(key) else None, key=key)

    @rule(offset=st.sampled_from([0, 2, -1]))
    def wrong_event_id(self, offset: int) -> None:
        number = self.version + 1 + offset
        self.send(
            {"type": "append_text", "event_id": f"evt_{number}", "text": "x"},
            accepted_state=None if offset else (self.state + "x" if isinstance(self.state, str) else None),
            key=None,
        )

    @precondition(lambda self: self.mode == "on_request")
    @rule(stale=st.booleans())
    def decide(self, stale: bool) -> None:
        msgs = self._take(
            self.g.receive_text(
                json.dumps({"type": "decide", "state_version": self.version - (1 if stale else 0)}), self.now
            )
        )
        if stale and self.version > 1:
            assert msgs[0]["error"]["envelope"]["error"]["code"] == "stale_state_version"
        elif not stale:
            assert msgs[0]["type"] == "scheduled"

    @precondition(lambda self: bool(self.running))
    @rule(success=st.booleans())
    def settle(self, success: bool) -> None:
        dispatch = self.running.pop(0)
        outcome = (
            OK
            if success
            else DecideFailure(500, ErrorEnvelope("api_error", "internal", "x"), RetryHint(False), "r")
        )
        assert dispatch.idempotency_key == self.g_key_at(dispatch)
        msgs = self._take(self.g.dispatch_finished(dispatch.dispatch_id, outcome, self.now))
        decisions = [m for m in msgs if m["type"] == "decision"]
        if success:
            [decision] = decisions
            assert decision["state_version"] == dispatch.state_version
            expected = [f"evt_{n}" for n in range(self.watermark + 1, dispatch.state_version + 1)]
            assert decision["covered_event_ids"] == expected
            self.covered.extend(expected)
            self.watermark = dispatch.state_version
        else:
            assert not decisions

    def g_key_at(self, dispatch: DispatchDecide) -> str | None:
        # the dispatch froze the newest version at that time; its key is the model's key then
        return dispatch.idempotency_key

    @invariant()
    def coverage_is_exact(self) -> None:
        if getattr(self, "g", None) is None:
            return
        assert self.covered == [f"evt_{n}" for n in range(1, self.watermark + 1)]
        assert self.g.state_version == self.version and self.g.idempotency_key == self.key
        assert self.g.stream_state is not None and compact_json(self.g.stream_state.state) == compact_json(
            self.state
        )
        assert len(self.running) <= 1  # one decide in flight
        assert self.dispatched_versions == sorted(self.dispatched_versions)


class ClientAgainstGateway(RuleBasedStateMachine):
    """Random caller changes, time, decides and connection losses: whenever the client says it is
    in sync, the gateway holds exactly the desired state, and every key names its state."""

    @initialize(mode=st.sampled_from(["on_change", "on_request"]))
    def open(self, mode: str) -> None:
        request = StreamRequest.build(model="m", questions=QUESTIONS, prompt_cache_key="p")
        self.client = ClientSession(request=request, state="", decision_mode=mode, key_namespace="ns")
        self.connections = 0
        self.connect()
        self.bodies_by_key: dict[str, str] = {}

    def connect(self) -> None:
        self.connections += 1
        self.pair = Pair(self.client, stream_id="szws_" + f"{self.connections:032x}", auto_decide=False)
        self.pair.pump()

    @rule(text=texts)
    def append(self, text: str) -> None:
        if isinstance(self.client.desired_state, str):
            self.client.append_text(text)
        self.pair.pump()

    @rule(state=st.one_of(texts, st.lists(st.integers(), max_size=3)))
    def reconcile(self, state: Any) -> None:
        self.client.set_desired(state)
        self.pair.pump()

    @rule(items=st.lists(st.integers(), min_size=1, max_size=3))
    def append_items(self, items: list[int]) -> None:
        if isinstance(self.client.desired_state, list):
            self.client.append_items(items)
        self.pair.pump()

    @rule()
    def ask(self) -> None:
        self.client.request_decision()
        self.pair.pump()

    @precondition(lambda self: bool(self.pair.dispatches))
    @rule()
    def settle(self) -> None:
        action = self.pair.dispatches.pop(0)
        if self.client.connected and not self.pair.gateway.closed:
            self.pair.finish(action)
            self.pair.pump()

    @rule(seconds=st.floats(0, 3))
    def time_passes(self, seconds: float) -> None:
        self.pair.advance(seconds)

    @rule()
    def drop(self) -> None:
        self.client.connection_lost()
        self.pair.gateway.connection_lost()
        self.pair.dispatches.clear()
        self.connect()

    @invariant()
    def in_sync_means_equal(self) -> None:
        if getattr(self, "pair", None) is None:
            return
        g = self.pair.gateway
        if self.client.in_sync:
            assert g.stream_state is not None
            assert compact_json(g.stream_state.state) == compact_json(self.client.desired_state)
            assert g.idempotency_key == self.client.desired_key
        if g.idempotency_key is not None and g.body is not None:
            # a key always names one body: never reused for a different state (HTTP 422)
            assert self.bodies_by_key.setdefault(g.idempotency_key, g.body) == g.body
        assert g.rejections == 0 and g.refusal_count == 0


TestGatewayModel = GatewayModel.TestCase
TestGatewayModel.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestClientAgainstGateway = ClientAgainstGateway.TestCase
TestClientAgainstGateway.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
