"""The desired state's incremental encoding equals a from-scratch encoding, byte for byte."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_systemzero.identity import state_hash
from airflow_provider_systemzero.protocol import Attachment, Limits, LocalProtocolError, StreamRequest
from airflow_provider_systemzero.protocol.body import compact_json
from airflow_provider_systemzero.protocol.desired import STREAM_ID_PLACEHOLDER, DesiredState
from airflow_provider_systemzero.protocol.keys import derive_state_key
from airflow_provider_systemzero.protocol.messages import AppendText
from airflow_provider_systemzero.protocol.state import StreamState, plan_mutation

QUESTIONS = {"ready": {"type": "boolean", "instructions": "Is the job ready?"}}
LIMITS = Limits()
texts = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
states = st.one_of(texts, st.lists(json_values, max_size=4), st.dictionaries(texts, json_values, max_size=3))
attachments = st.lists(st.sampled_from(["a", "b", "c"]), unique=True, max_size=2).map(
    lambda names: [Attachment(n, "data:text/plain;base64,aGk=") for n in names]
)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("text"), texts),
        st.tuples(st.just("items"), st.lists(json_values, min_size=1, max_size=3)),
        st.tuples(st.just("replace"), states),
        st.tuples(st.just("attachments"), attachments),
    ),
    max_size=25,
)


@settings(max_examples=300, deadline=None)
@given(
    initial=states,
    ops=operations,
    explicit_cache_key=st.booleans(),
    stream_id=st.sampled_from([None, "szws_" + "ab" * 16]),
)
def test_incremental_key_and_size_equal_a_from_scratch_encoding(
    initial: Any, ops: list[tuple[str, Any]], explicit_cache_key: bool, stream_id: str | None
) -> None:
    request = StreamRequest.build(
        model="m", questions=QUESTIONS, prompt_cache_key="pck" if explicit_cache_key else None
    )
    desired = DesiredState(request, "on_change", None, "ns")
    desired.accept(desired.with_state(initial), None, field="state", limits=LIMITS, stream_id=stream_id)
    for kind, value in ops:
        try:
            if kind == "text":
                change = desired.with_text(value)
            elif kind == "items":
                change = desired.with_items(value)
            elif kind == "replace":
                change = desired.with_state(value)
            else:
                change = desired.with_attachments(value)
        except LocalProtocolError:
            continue  # a change of the wrong kind for the state: refused, nothing changed
        if change is not None:
            desired.accept(change, None, field=kind, limits=LIMITS, stream_id=stream_id)
        body = request.decide_body(
            desired.current.state, desired.current.attachments, stream_id=stream_id or STREAM_ID_PLACEHOLDER
        )
        assert desired.key == derive_state_key("ns", body)
        assert desired.body_bytes(stream_id) == len(body.encode("utf-8"))
        assert desired.body(stream_id) == body
        assert desired.state_hash() == state_hash(desired.current.state)


def test_a_refused_append_leaves_the_encoding_as_it_was() -> None:
    request = StreamRequest.build(model="m", questions=QUESTIONS, prompt_cache_key="pck")
    desired = DesiredState(request, "on_change", None, "ns")
    desired.accept(desired.with_state("log\n"), None, field="state", limits=LIMITS, stream_id=None)
    key = desired.key
    small = Limits(max_decide_body_bytes=desired.body_bytes(None) + 3)
    for bad in ("\ud800", "x" * 10):
        try:
            desired.accept(desired.with_text(bad), None, field="text", limits=small, stream_id=None)  # type: ignore[arg-type]
        except LocalProtocolError:
            pass
        else:  # pragma: no cover - the test's premise
            raise AssertionError("the change should have been refused")
    assert desired.key == key and desired.current.state == "log\n"
    assert desired.state_hash() == state_hash("log\n")
    desired.accept(desired.with_text("ok"), None, field="text", limits=small, stream_id=None)  # type: ignore[arg-type]
    assert desired.key == derive_state_key("ns", request.decide_body("log\nok", ()))


@settings(max_examples=300, deadline=None)
@given(initial=states, ops=operations, sent_after=st.sets(st.integers(0, 25)))
def test_a_state_grown_by_appends_is_the_from_scratch_state_and_plans_the_same_mutation(
    initial: Any, ops: list[tuple[str, Any]], sent_after: set[int]
) -> None:
    """Appended text is kept apart and joined only when read: nothing here reads a state until
    the end, and then every state (and the mutation planned between any two) is what plain
    values give."""
    request = StreamRequest.build(model="m", questions=QUESTIONS, prompt_cache_key="pck")
    desired = DesiredState(request, "on_change", None, "ns")
    desired.accept(desired.with_state(initial), None, field="state", limits=LIMITS, stream_id=None)
    plain = [(initial, ())]
    kept = [desired.current]
    sent = desired.current
    planned = []
    for index, (kind, value) in enumerate(ops):
        before = plain[-1]
        try:
            if kind == "text":
                change = desired.with_text(value)
                after = (before[0] + value, before[1]) if change is not None else before
            elif kind == "items":
                change = desired.with_items(value)
                after = ([*before[0], *value], before[1])
            elif kind == "replace":
                change = desired.with_state(value)
                after = (value, before[1])
            else:
                change = desired.with_attachments(value)
                after = (before[0], (*before[1], *value))
        except LocalProtocolError:
            continue
        if change is not None:
            desired.accept(change, None, field=kind, limits=LIMITS, stream_id=None)
        plain.append(after)
        kept.append(desired.current)
        if index in sent_after:  # the client sends what is desired now: plan it from the last sent
            planned.append(
                (
                    sent,
                    desired.current,
                    plan_mutation(sent, desired.current, event_id="e", idempotency_key=None),
                )
            )
            sent = desired.current
    for (state, attachments), grown in zip(plain, kept, strict=True):
        assert grown.state == state and grown.attachments == tuple(attachments)
        assert compact_json(grown.state) == compact_json(state)
    for before, after, mutation in planned:
        expected = plan_mutation(
            StreamState(before.state, before.attachments),
            StreamState(after.state, after.attachments),
            event_id="e",
            idempotency_key=None,
        )
        assert mutation == expected


def test_an_append_is_planned_from_the_appended_text_not_the_prefix() -> None:
    sent = StreamState("x" * 100_000)
    desired = sent.with_text("a").with_text("b")
    assert desired.text_since(sent) == "ab" and sent.text_since(desired) is None
    assert plan_mutation(sent, desired, event_id="e", idempotency_key=None) == AppendText("e", "ab")
    assert desired.pieces == 2  # still unjoined
    assert not desired.same_state(sent) and desired.pieces == 2  # lengths differ
    assert desired.state == "x" * 100_000 + "ab"
    # a state that did not grow from the sent one by appends is compared the ordinary way
    assert plan_mutation(
        StreamState("x" * 100_000), desired, event_id="e", idempotency_key=None
    ) == AppendText("e", "ab")


def test_kept_pieces_stay_a_bounded_share_of_the_text() -> None:
    state = StreamState("x" * 100_000)
    depths = []
    for _ in range(2_000):
        state = state.with_text("y" * 10)
        depths.append(state.pieces)
    # joined whenever the pieces would cost over a quarter of the text: a sawtooth, never a ramp
    assert max(depths) * 128 * 4 <= len(state.state) and 0 in depths[1:]
    assert state.state == "x" * 100_000 + "y" * 20_000
