"""Nothing a gateway says reaches a person unescaped (issue 45 items 2, 3 and 6): one function
(``protocol/untrusted.py``'s ``safe_text``) for every string it chooses.

A scripted gateway puts the same hostile text — a newline and a forged ``INFO - Marking task as
SUCCESS`` line, terminal escapes, a bidirectional override, backticks, a Markdown image and link,
HTML, a lone surrogate and twenty thousand characters — into every string field it sends: the reply's
``id``, ``model``, ``served_by``, ``context`` (a value and a key), an answer's
``calibration_version`` and an alternative's answer, the decision's ``request_id`` and
``covered_event_ids``, ``hello.request_id``, the ``stream_id``, an error envelope's type, code and
message and its ``request_id``, a goodbye reason and a close reason. Each value names its field, so
each sink shows that the field reached it, and every sink — the task log, the client's log, the
exception, the trigger event, every XCom, the review body — holds it only escaped and bounded.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from airflow_provider_systemzero.decisions.policy import DecisionPolicy
from airflow_provider_systemzero.stream.exceptions import DecisionFailed
from airflow_provider_systemzero.triggers.decision import SystemZeroDecideTrigger, SystemZeroDecisionTrigger
from tests.helpers import event_read_back, run_dag, task_states, xcoms_of
from tests.helpers.hostile import decide_dag, sensor_dag
from tests.helpers.hostile_gateway import ANSWER, REQUEST, HostileGateway, Peer, decide_and_fail

pytestmark = pytest.mark.filterwarnings("ignore:The HMAC key is:Warning")

#: What a forged line of the task log looks like (a date no real line of this run carries).
FORGED = "\n[1999-01-01T00:00:00.000+0000] {taskinstance.py:1} INFO - Marking task as SUCCESS"
#: Terminal escapes (clear the screen, a hyperlink), a right-to-left override, a lone surrogate, NUL.
ESCAPES = "\x1b[2J\x1b]8;;http://evil.example/\x07\u202e\ud800\x00"
#: A review body's worst case: backticks to close a code span, a tracking image, a link that reads as
#: a sign-off, HTML, a table cell's end, a blank line.
MARKDOWN = (
    "` ``` ![t](http://evil.example/t.png) [Approve: checked by SRE](http://evil.example) <img src=x> |\n\n"
)
#: A run no bounded value can hold.
LONG = "A" * 20_000


def hostile(field: str) -> str:
    """The hostile text for ``field``, named by the marker ``<field>`` so a sink shows it arrived."""
    return f"<{field}>{ESCAPES}{MARKDOWN}{FORGED}{LONG}"


def marker(field: str) -> str:
    return f"<{field}>"


#: The string fields of a decision a gateway chooses (a decision is sent with all of them hostile).
DECISION_FIELDS = (
    "reply.id",
    "reply.model",
    "reply.served_by",
    "reply.context.route",
    "reply.context key",
    "calibration_version",
    "alternatives.decision",
    "request_id",
    "covered_event_ids",
)


def hostile_reply(confidence: float = 0.9) -> dict[str, Any]:
    answer = {
        **ANSWER,
        "confidence": confidence,
        "calibration_version": hostile("calibration_version"),
        "alternatives": [{"decision": hostile("alternatives.decision"), "confidence": 0.1}],
    }
    return {
        "id": hostile("reply.id"),
        "model": hostile("reply.model"),
        "served_by": hostile("reply.served_by"),
        "created": 1790000000,
        "context": {"route": hostile("reply.context.route"), hostile("reply.context key"): 1},
        "answers": {"ready": answer},
        "usage": {"input_tokens": 10},
    }


def deciding(confidence: float = 0.9) -> Callable[[Peer], Any]:
    """A gateway whose every string is hostile, answering each ``decide`` (or, on_change, the
    ``start``) with a decision whose every string is hostile too."""

    async def script(peer: Peer) -> None:
        peer.stream_id = hostile("stream_id")
        await peer.hello()
        start = await peer.recv()
        on_change = start["decision_mode"] == "on_change"
        await peer.ack(start["event_id"], 1, scheduled=on_change)
        fields = {
            "reply": hostile_reply(confidence),
            "request_id": hostile("request_id"),
            "covered_event_ids": [hostile("covered_event_ids")],
        }
        if on_change:
            await peer.decision(1, **fields)
        else:
            await peer.decide_then(**fields)
        await peer.drain()

    return script


async def failing(peer: Peer) -> None:
    """A gateway whose every string is hostile, failing each ``decide`` with a hostile error, then
    saying goodbye and closing for hostile reasons."""
    peer.stream_id = hostile("stream_id")
    await peer.open()
    while (await peer.recv())["type"] != "decide":
        pass
    await peer.error(
        hostile("envelope.type"),
        hostile("envelope.code"),
        hostile("envelope.message"),
        http_status=400,
        request_id=hostile("error.request_id"),
    )
    await peer.drain()


async def leaving(peer: Peer) -> None:
    """A gateway whose every string is hostile, saying goodbye for a hostile reason and closing
    with a hostile close reason (a policy close, which no reconnect can fix) on each ``decide``."""
    peer.stream_id = hostile("stream_id")
    await peer.open()
    while (await peer.recv())["type"] != "decide":
        pass
    await peer.goodbye(hostile("goodbye.reason"))
    await peer.ws.close(1008, "<close.reason>" + FORGED[:60] + "\x1b[2J\u202e")


# ------------------------------------------------------------------------------------ the checks


def strings(value: Any) -> Iterator[str]:
    """Every string of a JSON value, keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from strings(item)


def assert_safe(value: Any, sink: str) -> str:
    """Every string of ``value`` is printable (no line break, escape, bidi control or surrogate) and
    bounded; returns them all, joined, to look for the fields' markers."""
    found = list(strings(value))
    for text in found:
        assert text.isprintable(), f"{sink}: {text[:120]!r}"
        assert "A" * 250 not in text, f"{sink}: an unbounded value ({len(text)} characters)"
    return "\n".join(found)


def assert_log_clean(lines: list[str], sink: str) -> str:
    """No line of a log is forged, carries the gateway's escapes or is unbounded."""
    text = "\n".join(lines)
    assert not re.search(r"(^|\n)\s*\[1999-01-01", text), f"{sink}: a forged log line"
    for line in text.splitlines():
        for raw in ("\x1b[2J", "\x1b]8;;", "\u202e", "\ud800", "\x00"):
            assert raw not in line, f"{sink}: {raw!r} in {line[:160]!r}"
        assert "A" * 250 not in line, f"{sink}: an unbounded line ({len(line)} characters)"
    return text


def assert_storable(payload: dict[str, Any], sink: str) -> None:
    """Airflow stores the event and reads it back unchanged."""
    assert event_read_back(payload) == payload, sink


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every event the provider's triggers fire in this test (their ``run`` observed, not replaced)."""
    fired: list[dict[str, Any]] = []
    for cls in (SystemZeroDecideTrigger, SystemZeroDecisionTrigger):
        original = cls.run

        def recording(self: Any, _run: Any = original) -> Any:
            async def run() -> Any:
                async for event in _run(self):
                    fired.append(event.payload)
                    yield event

            return run()

        monkeypatch.setattr(cls, "run", recording)
    return fired


def logged(caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """Every log line of the run: the task log dag.test() prints, and every record the client made
    (the test gateway's own records left out)."""
    out = capsys.readouterr()
    records = [r.getMessage() for r in caplog.records if not r.name.startswith("websockets.server")]
    return [out.out, out.err, *records]


@dataclass
class Sinks:
    """What a Dag run against the hostile gateway left where a person or Airflow reads it, each
    checked already to hold the gateway's text only escaped and bounded (:func:`assert_safe`).

    :ivar state: the task's state.
    :ivar log: the task log and the client's log, joined.
    :ivar xcoms: every string of every XCom of the run, joined.
    :ivar events: every string of every event the provider's triggers fired, joined (each event
        stored and read back by Airflow's serializer first).
    """

    state: str
    log: str
    xcoms: str
    events: str


@pytest.fixture
def run_against(
    airflow_db: None,
    gateway: Callable[..., HostileGateway],
    connect: Callable[..., Any],
    events: list[dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> Callable[[Callable[[Peer], Any], Any], Sinks]:
    """``run_against(script, dag)``: run ``dag`` with ``dag.test()`` against a gateway playing
    ``script``, and check every sink (:class:`Sinks`)."""

    def run(script: Callable[[Peer], Any], dag: Any) -> Sinks:
        caplog.set_level(logging.INFO)
        connect(gateway(script))
        dag_run = run_dag(dag)
        (state,) = task_states(dag_run).values()
        log = assert_log_clean(logged(caplog, capsys), "log")
        xcoms = {
            f"{task}.{key}": value for (task, key, _), value in xcoms_of(dag.dag_id, dag_run.run_id).items()
        }
        for event in events:
            assert_storable(event, "event")
        return Sinks(state, log, assert_safe(xcoms, "XCom"), assert_safe(events, "event"))

    return run


#: Where each field of a decision shows, per task: the Dag, the fields in its XComs, the fields in
#: its trigger's event (none: it decides on its worker).
TASKS: dict[str, tuple[Callable[[], Any], tuple[str, ...], tuple[str, ...]]] = {
    "operator, deferred": (
        lambda: decide_dag("hostile_text_operator_deferred"),
        DECISION_FIELDS[:-2],  # the reply XCom holds the whole reply; the record its model, id, alternatives
        (*DECISION_FIELDS, "stream_id"),  # the operator's event: the reply, the ids, the stream
    ),
    "operator, on the worker": (
        lambda: decide_dag("hostile_text_operator_worker", deferrable=False),
        DECISION_FIELDS[:-2],
        (),
    ),
    "sensor, deferred": (
        lambda: sensor_dag("hostile_text_sensor", state="log\n", min_confidence=0.5, timeout=60),
        ("reply.id", "reply.model", "request_id", "covered_event_ids", "alternatives.decision"),
        ("reply.id", "reply.model", "request_id", "covered_event_ids", "alternatives.decision"),
    ),
}


@pytest.mark.parametrize("task", list(TASKS))
def test_every_string_of_a_decision_reaches_every_sink_escaped_and_bounded(
    run_against: Callable[..., Sinks], task: str
) -> None:
    """Item 2 and the rest of the decision: the task log (the operator's own line names the reply),
    every XCom, the trigger's event."""
    dag, in_xcom, in_event = TASKS[task]
    sinks = run_against(deciding(), dag())
    assert sinks.state == "success"
    assert marker("reply.id") in sinks.log
    for field in in_xcom:
        assert marker(field) in sinks.xcoms, field
    for field in in_event:
        assert marker(field) in sinks.events, field


# ------------------------------------------------------------------------------------ a failure


async def test_a_failed_decision_carries_the_gateways_text_escaped_and_bounded(
    gateway: Callable[..., HostileGateway], connect: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    """Item 6: the request ID, the envelope's type, code and message, in the exception's message,
    its ``repr`` and its attributes; the client's log (goodbye and close reasons too)."""
    caplog.set_level(logging.DEBUG, logger="airflow_provider_systemzero")
    error = await decide_and_fail(connect(gateway(failing)))
    assert isinstance(error, DecisionFailed)
    message = str(error)
    assert_log_clean([message, repr(error)], "exception")
    assert len(message) < 2_000, len(message)
    for field in ("error.request_id", "envelope.type", "envelope.code", "envelope.message"):
        assert marker(field) in message, field
    kept = assert_safe(
        {
            "request_id": error.request_id,
            "type": error.envelope.type,
            "code": error.envelope.code,
            "message": error.envelope.message,
        },
        "exception attributes",
    )
    assert marker("error.request_id") in kept and marker("envelope.message") in kept
    assert_log_clean([r.getMessage() for r in caplog.records], "client log")


async def test_a_goodbye_and_a_close_carry_the_gateways_text_escaped_and_bounded(
    gateway: Callable[..., HostileGateway], connect: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="airflow_provider_systemzero")
    error = await decide_and_fail(connect(gateway(leaving)), decide_timeout=3)
    message = str(error)
    assert_log_clean([message, repr(error)], "exception")
    assert marker("close.reason") in message, message
    log = assert_log_clean([r.getMessage() for r in caplog.records], "client log")
    for field in ("goodbye.reason", "stream_id"):
        assert marker(field) in log, field


def test_a_failed_decision_fails_the_task_with_the_gateways_text_escaped_and_bounded(
    run_against: Callable[..., Sinks],
) -> None:
    sinks = run_against(failing, decide_dag("hostile_text_failure"))
    assert sinks.state == "failed"
    assert marker("envelope.message") in sinks.log
    assert '"decision_failed"' not in sinks.events and "decision_failed" in sinks.events
    for field in ("error.request_id", "envelope.code", "envelope.message"):
        assert marker(field) in sinks.events, field


# ------------------------------------------------------------------------------------ a review


def _markdown_leaks(body: str) -> tuple[list[str], str]:
    """What Markdown makes of ``body``: the kinds of link, image and HTML tokens in it (none may be),
    and the text that is not code (where no gateway text may be)."""
    from markdown_it import MarkdownIt

    parser = MarkdownIt("commonmark").enable("table")
    kinds: list[str] = []
    prose: list[str] = []

    def walk(tokens: list[Any]) -> None:
        for token in tokens:
            if token.type in ("link_open", "image", "html_inline", "html_block"):
                kinds.append(token.type)
            if token.type == "text":
                prose.append(token.content)
            if token.children:
                walk(token.children)

    walk(parser.parse(body))
    return kinds, "\n".join(prose)


def test_gateway_text_in_a_review_body_stays_inside_code_spans(run_against: Callable[..., Sinks]) -> None:
    """Item 3: the model, the reply ID and an alternative's answer reach the person asked only as
    code: no tracking image, no link, no HTML, no line of their own."""
    from tests.helpers.policy import CoreApi, Reviewer

    dag = decide_dag(
        "hostile_text_review", policy=DecisionPolicy(act_above=0.8, review_above=0.5, below="skip")
    )
    with Reviewer(CoreApi(), dag.dag_id, lambda request: ["No"]) as reviewer:
        sinks = run_against(deciding(confidence=0.66), dag)
    assert sinks.state == "success"
    (request,) = reviewer.seen
    body = request["body"]
    assert_safe(body.split("\n"), "review body")
    for field in ("reply.model", "reply.id", "alternatives.decision"):
        assert marker(field) in body, field
    kinds, prose = _markdown_leaks(body)
    assert kinds == [], kinds
    for field in ("reply.model", "reply.id", "alternatives.decision"):
        assert marker(field) not in prose, field
    assert "Approve: checked by SRE" not in prose and "evil.example" not in prose
    assert "Is the job ready?" in prose  # the body still reads as prose around the code
    assert marker("reply.model") in sinks.xcoms  # the decision record of the review


def test_hook_decide_gives_the_caller_the_gateways_strings_made_safe(
    gateway: Callable[..., HostileGateway], connect: Callable[..., Any]
) -> None:
    """What ``SystemZeroHook.decide`` returns holds the gateway's strings as ``safe_text`` leaves them
    (the stream's own ``stream_id`` aside, which the client matches as sent)."""
    result = connect(gateway(deciding())).decide(REQUEST, state="log\n", timeout=30)
    seen = assert_safe(
        {
            "reply": result.reply,
            "request_id": result.request_id,
            "covered_event_ids": list(result.covered_event_ids),
            "summary": result.to_summary(),
        },
        "DecisionResult",
    )
    for field in DECISION_FIELDS:
        assert marker(field) in seen, field
    assert result.answer("ready").decision is True and result.answer("ready").calibration_version
