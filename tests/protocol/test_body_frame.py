"""The gateway encodes only the state of each change: the rest of the synthesized decide body is a
frame built once per attachment list. The body and its byte counts must be exactly those of the
one synthesis (WIRE.md §3), whatever the request holds."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_systemzero.protocol import GatewaySession, Limits, StreamRequest, compact_json
from airflow_provider_systemzero.protocol.admission import BodyFrame
from airflow_provider_systemzero.protocol.gateway import SendMessage
from airflow_provider_systemzero.protocol.messages import Ack, Attachment

STREAM_ID = "szws_" + "d" * 32
PNG = "data:image/png;base64,iVBORw0KGgo="
texts = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=10)
json_values = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False), texts
    ),
    lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(texts, children, max_size=3)),
    max_leaves=8,
)
states = st.one_of(texts, st.lists(json_values, max_size=3), st.dictionaries(texts, json_values, max_size=3))
questions = st.dictionaries(
    st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True),
    st.one_of(
        st.builds(lambda i: {"type": "boolean", "instructions": i}, texts.filter(str.strip)),
        st.builds(
            lambda i: {"type": "choice", "instructions": i, "options": ["a", "b"]}, texts.filter(str.strip)
        ),
    ),
    min_size=1,
    max_size=3,
)
attachments = st.lists(
    st.builds(lambda n: Attachment(f"a{n}", PNG), st.integers(0, 9)), max_size=2, unique_by=lambda a: a.name
).map(tuple)


@given(
    model=texts.filter(str.strip),
    questions=questions,
    route=st.sampled_from([None, "direct", "committee"]),
    mode=st.sampled_from([None, "fast"]),
    cache_key=st.one_of(st.none(), st.from_regex(r"[ -~]{1,20}", fullmatch=True).filter(str.strip)),
    attachments=attachments,
    state=states,
)
def test_the_frame_around_a_state_is_the_synthesized_body(
    model: str,
    questions: dict[str, Any],
    route: str | None,
    mode: str | None,
    cache_key: str | None,
    attachments: tuple[Attachment, ...],
    state: Any,
) -> None:
    request = StreamRequest.build(
        model=model, questions=questions, route=route, mode=mode, prompt_cache_key=cache_key
    )
    frame = BodyFrame(request, attachments, STREAM_ID)
    state_json = compact_json(state)
    body = request.decide_body(state, attachments, stream_id=STREAM_ID)
    assert frame.body(state_json) == body
    assert frame.size(None) + len(state_json.encode()) == len(body.encode())


def _acks(session: GatewaySession, message: dict[str, Any], now: float) -> list[Ack]:
    actions = session.receive_text(json.dumps(message), now)
    return [a.message for a in actions if isinstance(a, SendMessage) and isinstance(a.message, Ack)]


def test_the_session_rebuilds_the_frame_when_the_attachments_change_and_only_then() -> None:
    limits = Limits(max_events_per_second=1000, event_burst=1000)
    session = GatewaySession(stream_id=STREAM_ID, now=0.0, limits=limits)
    session.actions()  # hello
    request = {
        "model": "m",
        "state": "é\n",
        "questions": {"ready": {"type": "boolean", "instructions": "Ready?"}},
    }
    steps: list[dict[str, Any]] = [
        {"type": "start", "event_id": "evt_1", "request": request, "decision_mode": "on_request"},
        {"type": "append_text", "event_id": "evt_2", "text": "ü"},
        {"type": "append_attachments", "event_id": "evt_3", "attachments": [{"name": "shot", "data": PNG}]},
        {"type": "append_text", "event_id": "evt_4", "text": "more"},
        {"type": "replace", "event_id": "evt_5", "state": ["x", {"y": 1}]},
        {"type": "replace", "event_id": "evt_6", "state": {"z": "ß"}, "attachments": []},
    ]
    frames = []
    for now, step in enumerate(steps, start=1):
        (ack,) = _acks(session, step, float(now))
        accepted = session.stream_state
        assert accepted is not None and session.request is not None
        body = session.request.decide_body(accepted.state, accepted.attachments, stream_id=STREAM_ID)
        assert session.body == body
        assert ack.synthesized_body_bytes == len(body.encode())
        assert ack.state_bytes == len(compact_json(accepted.state).encode())
        frames.append(session.body_frame)
    # one frame per attachment list: the start's, the appended attachment's, the emptied list's
    assert [frames.index(f) for f in frames] == [0, 0, 2, 2, 2, 5]
