"""Admission: the session asks before it writes what can start a dispatch, and the adapter answers.

The core takes no callback: a session made with ``admission=True`` stops before such a message
(on_change every mutation, ``start`` included; on_request a ``decide``) and says so in
``admission_wanted``; ``admit(True)`` lets that very message go, ``admit(False)`` holds it until
``retry_admission()``. The adapter's reasons (the account's decision starts, a budget) are its own.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_provider_systemzero.protocol import ClientSession, StreamRequest
from airflow_provider_systemzero.protocol.client_events import AdmissionWanted
from airflow_provider_systemzero.protocol.messages import AppendText, Decide, Start
from tests.helpers.pair import Pair

QUESTIONS = {"ready": {"type": "boolean", "instructions": "Is the job ready?"}}


def _client(mode: str, *, admission: bool = True) -> ClientSession:
    request = StreamRequest.build(model="m", questions=QUESTIONS, prompt_cache_key="pck")
    return ClientSession(request=request, state="log\n", decision_mode=mode, admission=admission)


def _types(pair: Pair) -> list[str]:
    return [json.loads(frame)["type"] for frame in pair.client_frames]


def _asked_about_a_change() -> tuple[ClientSession, Pair]:
    """An on_change session whose ``start`` went out, asking about the change after it."""
    client = _client("on_change")
    pair = Pair(client)
    pair.pump()
    _answer(pair, True)
    client.append_text("a\n")
    pair.pump()
    return client, pair


def _answer(pair: Pair, admitted: bool) -> Any:
    """The adapter's turn: answer the open question, then write what the session has."""
    asked = pair.client.admission_wanted
    assert isinstance(asked, AdmissionWanted)
    pair.client.admit(admitted)
    pair.pump()
    return asked.message


def test_on_change_the_start_and_each_mutation_wait_for_their_answer() -> None:
    client = _client("on_change")
    pair = Pair(client)
    pair.pump()
    assert _types(pair) == [] and isinstance(client.admission_wanted.message, Start)  # type: ignore[union-attr]
    assert isinstance(_answer(pair, True), Start)
    assert _types(pair) == ["start"] and client.admission_wanted is None and client.in_sync
    client.append_text("more\n")
    pair.pump()
    assert _types(pair) == ["start"]  # asked, not written
    assert isinstance(_answer(pair, True), AppendText)
    assert _types(pair) == ["start", "append_text"] and client.in_sync


def test_a_refusal_holds_every_mutation_until_asked_again_and_the_newest_state_is_asked_about() -> None:
    client, pair = _asked_about_a_change()
    _answer(pair, False)
    assert client.admission_held and client.admission_wanted is None
    client.append_text("b\n")
    pair.pump()
    # held: nothing written, nothing asked, and the writer is not "due now" for it
    assert _types(pair) == ["start"] and client.admission_wanted is None
    assert client.next_wakeup(pair.now) is None
    client.retry_admission()
    pair.pump()
    message = _answer(pair, True)
    assert isinstance(message, AppendText) and message.text == "a\nb\n"  # the newest state, coalesced
    assert pair.gateway.stream_state is not None and pair.gateway.stream_state.state == "log\na\nb\n"


def test_on_request_a_refused_decide_is_held_while_changes_still_go_out() -> None:
    client = _client("on_request")
    pair = Pair(client)
    pair.pump()
    assert client.admission_wanted is None and _types(pair) == ["start"]  # a start dispatches nothing
    intent = client.request_decision()
    pair.pump()
    assert isinstance(_answer(pair, False), Decide) and client.admission_held
    client.append_text("more\n")
    pair.pump()
    assert _types(pair) == ["start", "append_text"] and client.admission_wanted is None
    client.cancel_intent(intent)  # nobody waits for it any more: the hold ends with it
    assert not client.admission_held
    client.request_decision()
    pair.pump()
    decide = _answer(pair, True)
    assert isinstance(decide, Decide) and decide.state_version == 2  # the newest acknowledged version
    assert _types(pair) == ["start", "append_text", "decide"] and pair.dispatches


def test_only_the_message_admitted_is_written_without_asking_again() -> None:
    client, pair = _asked_about_a_change()
    asked = client.admission_wanted
    assert asked is not None
    client.admit(True)
    client.append_text("b\n")  # the plan changes between the answer and the write
    pair.pump()
    assert _types(pair) == ["start"]  # the newer message is asked about, not written on the old answer
    assert isinstance(_answer(pair, True), AppendText)
    assert _types(pair) == ["start", "append_text"]


def test_a_lost_connection_drops_the_question_and_the_next_one_asks_anew() -> None:
    client = _client("on_change")
    pair = Pair(client)
    pair.pump()
    assert client.admission_wanted is not None
    client.connection_lost()
    assert client.admission_wanted is None
    with pytest.raises(RuntimeError, match="none is open"):
        client.admit(True)
    second = Pair(client)
    second.pump()
    assert isinstance(_answer(second, True), Start) and _types(second) == ["start"]


def test_a_session_without_admission_asks_nothing() -> None:
    client = _client("on_change", admission=False)
    pair = Pair(client)
    pair.pump()
    client.append_text("more\n")
    pair.pump()
    assert client.admission_wanted is None and _types(pair) == ["start", "append_text"]
