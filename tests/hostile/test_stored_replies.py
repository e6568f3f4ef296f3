"""Replies Airflow can store (issue 45 item 7): a decision becomes a trigger event and XCom, so the
client refuses, as a contract breach, any reply Airflow's own serializer could not store and read
back as sent.

:func:`~tests.helpers.event_read_back` is the road an operator's event takes in Airflow itself:
stored into ``next_kwargs``, handed to the worker as JSON the Task SDK parses, and deserialized
there. Every reply the client accepts takes that road unchanged; what the client refuses is what
fails on it, or comes back as another object, on some supported Airflow.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_systemzero.decisions.watch import answers_payload
from airflow_provider_systemzero.protocol.errors import RemoteProtocolError
from airflow_provider_systemzero.protocol.messages import Decision, Question
from airflow_provider_systemzero.protocol.reply import MAX_REPLY_DEPTH, RESERVED_KEYS, DecisionResult
from airflow_provider_systemzero.stream.exceptions import ProtocolViolation
from tests.helpers import event_read_back, nested, run_dag, task_states
from tests.helpers.hostile import decide_dag
from tests.helpers.hostile_gateway import ANSWER, HostileGateway, Peer, Raw, decide_and_fail, reply

QUESTIONS = (("ready", Question("boolean", "Is the job ready?")),)


def _result(raw: dict[str, Any]) -> DecisionResult:
    return DecisionResult.from_message(Decision("szws_" + "0" * 32, 2, 1, ("evt_1",), raw, "req"), QUESTIONS)


def deep_reply(depth: int) -> dict[str, Any]:
    """A valid reply whose ``context`` makes it ``depth`` levels deep."""
    return {**reply(), "context": nested(depth - 1)}


def test_the_deepest_reply_accepted_is_stored_and_read_back_as_sent() -> None:
    payload = answers_payload(_result(deep_reply(MAX_REPLY_DEPTH)), "log\n", key_namespace="ns")
    assert event_read_back(payload) == payload


@pytest.mark.parametrize("depth", [MAX_REPLY_DEPTH + 1, 199, 600])
def test_a_reply_nested_too_deep_is_refused_and_airflow_could_not_store_the_deepest(depth: int) -> None:
    with pytest.raises(RemoteProtocolError, match=f"deeper than {MAX_REPLY_DEPTH} levels"):
        _result(deep_reply(depth))
    if depth >= 199:  # what the refusal spares: Airflow's own road fails for such a reply
        payload = {"status": "success", "reply": deep_reply(depth)}
        with pytest.raises((RecursionError, ValueError)):
            event_read_back(payload)


#: Objects Airflow's serializer refuses to store, or reads back as another object.
UNSTORABLE = {
    "__classname__": {"__classname__": "builtins.dict"},
    "__id__": {"__id__": 1},
    "__type and __var": {"__type": "dict", "__var": {"a": 1}},
}


@pytest.mark.parametrize("case", sorted(UNSTORABLE))
def test_a_reply_with_a_key_airflow_reserves_is_refused(case: str) -> None:
    raw = {**reply(), "context": UNSTORABLE[case]}
    with pytest.raises(RemoteProtocolError, match="Airflow's serializer reserves"):
        _result(raw)
    # what the refusal spares: from Airflow 3.2, whose serializer reserves these keys (3.1 stores
    # next_kwargs another way), Airflow refuses such an event or reads it back as another object
    if importlib.util.find_spec("airflow.sdk.serde") is not None:
        with contextlib.suppress(AttributeError, TypeError, ValueError, ImportError):
            assert event_read_back({"reply": raw}) != {"reply": raw}


def test_the_reserved_keys_are_airflows_own() -> None:
    shared = pytest.importorskip("airflow.sdk._shared.serialization")
    forbidden = getattr(shared, "FORBIDDEN_XCOM_KEYS", None)
    if forbidden is None:
        pytest.skip("this Airflow names no reserved keys (before 3.3)")
    assert set(forbidden) <= RESERVED_KEYS


#: JSON values a gateway may put in a reply: any text (lone surrogates, NUL, escapes, reserved
#: keys among the keys), numbers within ±(2**53 - 1), any nesting up to 40 levels.
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(codec=None, exclude_categories=()), max_size=30),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(sorted(RESERVED_KEYS))
            | st.text(st.characters(codec=None, exclude_categories=()), max_size=8),
            inner,
            max_size=3,
        )
    ),
    max_leaves=60,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JSON, st.integers(0, 40))
def test_every_reply_the_client_accepts_airflow_stores_and_reads_back_as_sent(
    context: Any, depth: int
) -> None:
    for _ in range(depth):
        context = {"c": context}
    raw = {**reply(), "model": "m", "context": context}
    try:
        result = _result(raw)
    except RemoteProtocolError as exc:
        assert exc.code == "unstorable_reply"
        return
    payload = answers_payload(result, "log\n", key_namespace="ns")
    assert event_read_back(payload) == payload


# ------------------------------------------------------------------------------------ end to end


def sending(raw: dict[str, Any]) -> Callable[[Peer], Any]:
    """A gateway answering each ``decide`` with ``raw`` as the reply (its ``context`` spliced in as
    JSON text, however deep)."""
    spliced = {**raw, "context": Raw(json.dumps(raw["context"]))}

    async def script(peer: Peer) -> None:
        await peer.open()
        await peer.decide_then(reply=spliced)
        await peer.drain()

    return script


async def test_a_reply_that_cannot_be_stored_is_a_protocol_violation_for_the_caller(
    gateway: Callable[..., HostileGateway], connect: Callable[..., Any]
) -> None:
    gw = gateway(sending(deep_reply(600)))
    error = await decide_and_fail(connect(gw))
    assert isinstance(error, ProtocolViolation)
    assert f"nests deeper than {MAX_REPLY_DEPTH} levels" in str(error)
    assert gw.connections == 3  # three breaches in a row, then the caller hears it


@pytest.mark.parametrize(
    "raw",
    [deep_reply(600), {**reply(), "context": {"__type": "dict", "__var": {"ready": ANSWER}}}],
    ids=["600 levels deep", "a key Airflow reserves"],
)
def test_a_deferred_operator_fails_with_the_providers_error_not_an_unusable_payload(
    airflow_db: None,
    gateway: Callable[..., HostileGateway],
    connect: Callable[..., Any],
    capsys: pytest.CaptureFixture[str],
    raw: dict[str, Any],
) -> None:
    connect(gateway(sending(raw)))
    dag_run = run_dag(decide_dag("hostile_unstorable_reply"))
    assert task_states(dag_run) == {"decide": "failed"}
    printed = capsys.readouterr().out
    assert "Airflow could not store it" in printed or "Airflow's serializer reserves" in printed, printed[
        -3000:
    ]
    assert "could not be serialized" not in printed and "RecursionError" not in printed
