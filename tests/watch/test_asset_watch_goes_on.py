"""An asset watch goes on after it fires and after it fails, through the public
``SystemZeroDecisionEventTrigger`` against the real emulator over loopback:

1. after an event, the rest of what the watch asked for is carried out (a newer line held behind
   the decision that fired is sent, and the next transition fires again);
2. a ``decide_when`` callable that raised (or did not return in time) once is called again for
   the change, and that change is decided;
3. with ``decide_when``, a decision that failed once (HTTP 500) is asked again for the same change;

and a watch that sees READY → FAILED → READY, with one failed decide and one raising
``decide_when`` callable in between, fires twice.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from airflow_provider_systemzero.triggers import driver, watching
from airflow_provider_systemzero.triggers.decision import SystemZeroDecisionEventTrigger
from tests import helpers
from tests.helpers import TRIGGER_CONN_ID, TRIGGER_REQUEST, RecordingDecider, channels, until, watching_events
from tests.helpers import trigger_callables as callables

rules_file = helpers.rules_file  # the fixture

#: The newest line decides: a log whose last line says the job is ready is ready, any other is not.
LAST_LINE_RULES: dict[str, Any] = {
    "rules": [
        {
            "question": "ready",
            "pattern": r"(?i)job is ready\.$",
            "answer": True,
            "probability": 0.93,
            "confidence": 0.9,
        }
    ],
    "default": {"answer": False, "probability": 0.2, "confidence": 0.8},
}
STARTED = "job started\n"
READY_LINE = "Job is ready.\n"
FAILED_LINE = "job FAILED\n"
GATE = {"callable": "tests.helpers.trigger_callables.flaky_gate"}


def _emulator(monkeypatch: pytest.MonkeyPatch, rules_file: str, **kwargs: Any) -> Any:
    return helpers.recording_emulator(rules_file, monkeypatch, LAST_LINE_RULES, **kwargs)


@pytest.fixture(autouse=True)
def _quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed watch tries again within a fraction of a second (5 s in production)."""
    monkeypatch.setattr(watching, "WATCH_RETRY_FIRST_S", 0.2)
    monkeypatch.setattr(watching, "WATCH_RETRY_MAX_S", 0.4)


@pytest.fixture(autouse=True)
def _fresh_gate() -> None:
    callables.GATE_FAILURES = callables.GATE_HANGS = 0
    callables.RELEASE.clear()


def _watcher(name: str, **kwargs: Any) -> SystemZeroDecisionEventTrigger:
    """An asset watch of the push channel ``name`` (started with :data:`STARTED`), rebuilt from its
    serialized kwargs as the triggerer does."""
    channels.publish(name, STARTED)
    trigger = SystemZeroDecisionEventTrigger(
        systemzero_conn_id=TRIGGER_CONN_ID,
        request=TRIGGER_REQUEST,
        condition=helpers.TRIGGER_CONDITION,
        state="",
        watch_id=name,
        source=channels.source(name),
        **kwargs,
    )
    _, serialized = trigger.serialize()
    return SystemZeroDecisionEventTrigger(**serialized)


def _decided(decider: RecordingDecider, state: str) -> int:
    """How many decisions the gateway made about ``state``."""
    return decider.states.count(state)


def _failures(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == watching.__name__ and r.levelno == logging.ERROR
    ]


# ------------------------------------------------------------------ 1. after an event


async def test_after_an_event_the_line_held_behind_it_is_sent_and_the_next_transition_fires(
    rules_file: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decisions take 1 s and the log gains a line while each is in flight: two decisions in a row
    come back about an outdated state, so newer lines wait behind the decision in flight
    (``max_staleness``, 30 s). The decision about "Job is ready." fires while the next line waits
    behind it; that line is then sent at once (not after 30 s), and FAILED then ready again fire a
    second event."""
    name = "goes-on-after-an-event"
    trigger = _watcher(name)
    states = [STARTED]

    def grow(line: str) -> str:
        states.append(states[-1] + line)
        channels.publish(name, states[-1])
        return states[-1]

    async with (
        _emulator(monkeypatch, rules_file, decide_latency_ms=1000) as (emu, decider),
        watching_events(trigger) as (events, _task),
    ):
        # each line comes while the decision about the one before is in flight
        for step in range(1, 4):
            await emu.wait_for(lambda e, n=step: e.stats.decisions_dispatched >= n, timeout=20)
            grow(f"step {step}\n")
        # the source changes faster than decisions take: "step 3" waited behind "step 2"'s
        # decision, then went; the ready line waits behind "step 3"'s, then goes
        await emu.wait_for(lambda e: e.stats.decisions_dispatched >= 4, timeout=20)
        ready = grow(READY_LINE)
        await until(lambda: emu.stats.decisions_dispatched >= 5, 20, what="the ready state dispatched")
        held = grow("step 5\n")  # waits behind the ready state's decision, which fires
        await until(lambda: len(events) == 1, 20, what="the first event")
        assert events[0].payload["decision"] is True
        assert _decided(decider, ready) == 1
        # the line that waited behind the decision that fired is sent and decided now
        await until(lambda: _decided(decider, held) == 1, 10, what="the held line decided")
        failed = grow(FAILED_LINE)
        await until(lambda: _decided(decider, failed) == 1, 10, what="the failed state decided")
        grow(READY_LINE)
        await until(lambda: len(events) == 2, 10, what="the second event")
        assert [e.payload["decision"] for e in events] == [True, True]


# ------------------------------------------------------------------ 2. a decide_when callable fails once


@pytest.mark.parametrize("failure", ["raises", "does not return in time"])
async def test_a_decide_when_callable_that_failed_once_is_called_again_and_its_change_fires(
    rules_file: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, failure: str
) -> None:
    monkeypatch.setattr(driver, "DECIDE_WHEN_TIMEOUT", 0.5)
    caplog.set_level(logging.INFO)
    name = f"gate-{failure.replace(' ', '-')}"
    trigger = _watcher(name, decide_when=GATE)
    async with (
        _emulator(monkeypatch, rules_file) as (_, decider),
        watching_events(trigger) as (events, _task),
    ):
        await until(lambda: _decided(decider, STARTED) == 1, 20, what="the initial state decided")
        if failure == "raises":
            callables.GATE_FAILURES = 1
        else:
            callables.GATE_HANGS = 1
        ready = STARTED + READY_LINE
        channels.publish(name, ready)
        await until(lambda: len(_failures(caplog)) == 1, 10, what="the gate's failure logged")
        callables.RELEASE.set()  # a hung call returns (its answer is about the same change)
        await until(lambda: len(events) == 1, 10, what="the event once the gate answers")
        assert _decided(decider, ready) == 1 and events[0].payload["decision"] is True
        assert len(_failures(caplog)) == 1


# ------------------------------------------------------------------ 3. a decision fails once


async def test_with_decide_when_a_decision_that_failed_once_is_asked_again_and_fires(
    rules_file: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """HTTP 500 is not retried by the stream: the watch's try fails, and the next one asks for the
    decision about the same change again — with ``decide_when`` as without it."""
    caplog.set_level(logging.INFO)
    name = "decide-fails-once"
    trigger = _watcher(name, decide_when=r"(?i)ready|failed")
    async with (
        _emulator(monkeypatch, rules_file) as (emu, decider),
        watching_events(trigger) as (events, _task),
    ):
        await until(lambda: _decided(decider, STARTED) == 1, 20, what="the initial state decided")
        emu.faults.fail_decides(1, status=500)
        ready = STARTED + READY_LINE
        channels.publish(name, ready)
        await until(lambda: len(_failures(caplog)) == 1, 10, what="the failed decision logged")
        assert "HTTP 500" in _failures(caplog)[0]
        await until(lambda: len(events) == 1, 10, what="the event after the retry")
        assert _decided(decider, ready) == 1 and events[0].payload["decision"] is True


# ------------------------------------------------------------------ READY → FAILED → READY


async def test_ready_failed_ready_with_a_failed_decide_and_a_raising_gate_fires_twice(
    rules_file: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    name = "ready-failed-ready"
    trigger = _watcher(name, decide_when=GATE)
    async with (
        _emulator(monkeypatch, rules_file) as (emu, decider),
        watching_events(trigger) as (events, _task),
    ):
        await until(lambda: _decided(decider, STARTED) == 1, 20, what="the initial state decided")
        emu.faults.fail_decides(1, status=500)  # the decision about READY fails once
        ready = STARTED + READY_LINE
        channels.publish(name, ready)
        await until(lambda: len(events) == 1, 10, what="the first event")
        callables.GATE_FAILURES = 1  # the gate raises once on FAILED
        failed = ready + FAILED_LINE
        channels.publish(name, failed)
        await until(lambda: _decided(decider, failed) == 1, 10, what="the failed state decided")
        again = failed + READY_LINE
        channels.publish(name, again)
        await until(lambda: len(events) == 2, 10, what="the second event")
        assert [e.payload["decision"] for e in events] == [True, True]
        assert len(_failures(caplog)) == 2  # the failed decide, the raising gate
        assert emu.faults.pending_decide_failures == 0 and callables.GATE_FAILURES == 0
