"""An asset watch remembers across triggerer restarts whether it already fired.

The triggerer of Airflow 3.3 gives a watcher trigger ``asset_state_store``, Airflow's own
``AssetStateStoreAccessors``; here it talks to :class:`Supervisor`, which answers its messages as
the triggerer's supervisor does, from a dict instead of the ``asset_state_store`` table. The
triggers are real and decide against the emulator; a restart is the trigger cancelled and one
rebuilt from ``serialize()`` taking over, as in a triggerer. The deployment test does the same
with real triggerers and a real database.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk import Asset
from airflow.sdk.exceptions import ErrorType
from airflow.sdk.execution_time import comms, context, task_runner

from airflow_provider_systemzero.decisions.conditions import DecisionCondition
from airflow_provider_systemzero.emulator.server import Emulator
from airflow_provider_systemzero.protocol.reply import Answer, DecisionResult
from airflow_provider_systemzero.triggers import watch_memory
from airflow_provider_systemzero.triggers.decision import SystemZeroDecisionEventTrigger
from airflow_provider_systemzero.triggers.watch_memory import WatchMemory
from tests.helpers import TRIGGER_CONDITION, TRIGGER_CONN_ID, TRIGGER_REQUEST, rebuilt, until, watching_events

READY = "Job is ready.\n"
WAITING = "Job is still waiting.\n"
KEY = "systemzero.watch:release"


class Supervisor:
    """The triggerer's supervisor as far as the asset state store goes: one dict per asset name."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], str] = {}  # (asset, key) -> JSON text, as the table keeps it
        self.failing = False

    async def asend(self, msg: Any) -> Any:
        if self.failing:
            raise ConnectionResetError("supervisor gone")
        if isinstance(msg, comms.GetAssetStateStoreByName):
            if (msg.name, msg.key) not in self.rows:
                return comms.ErrorResponse(error=ErrorType.ASSET_STORE_NOT_FOUND)
            return comms.AssetStateStoreResult(value=json.loads(self.rows[msg.name, msg.key]))
        if isinstance(msg, comms.SetAssetStateStoreByName):
            self.rows[msg.name, msg.key] = json.dumps(msg.value)
            return None
        return None  # anything else the trigger may say (a secret to mask) needs no answer

    def value(self, asset: str = "release", key: str = KEY) -> Any:
        text = self.rows.get((asset, key))
        return None if text is None else json.loads(text)


@pytest.fixture
def supervisor(monkeypatch: pytest.MonkeyPatch) -> Supervisor:
    if not hasattr(context, "AssetStateStoreAccessors"):
        pytest.skip("the asset state store is new in Airflow 3.3")
    fake = Supervisor()
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", fake, raising=False)
    monkeypatch.setattr(watch_memory, "SETTLE_S", 0.2)
    return fake


def watcher(path: Path, *assets: str, store: bool = True, **overrides: Any) -> SystemZeroDecisionEventTrigger:
    """The watcher of ``path`` as the triggerer builds it: from its serialized kwargs, with the
    store of its watched assets (``release`` unless named)."""
    trigger = rebuilt(
        SystemZeroDecisionEventTrigger(
            **{
                "systemzero_conn_id": TRIGGER_CONN_ID,
                "request": TRIGGER_REQUEST,
                "condition": TRIGGER_CONDITION,
                "state": "",
                "watch_id": "release",
                "source": {"type": "file", "path": str(path)},
                "lease_after": 30.0,
                **overrides,
            }
        )
    )
    if store:
        inlets = [Asset(name=name, uri=f"sz://{name}") for name in assets or ("release",)]
        trigger.asset_state_store = context.AssetStateStoreAccessors(inlets=inlets)
    return trigger


async def fired_once_and_remembered(log: Path, supervisor: Supervisor) -> str:
    """A first watcher fires for READY and remembers it; returns the event's reply_id."""
    log.write_text(READY)  # noqa: ASYNC240 - a test writing its fixture file
    async with watching_events(watcher(log)) as (events, _):
        await until(lambda: len(events) == 1, within=20, what="the first event")
        await until(lambda: (supervisor.value() or {}).get("fired") is True, what="the memory written")
    return events[0].payload["reply_id"]


# ------------------------------------------------------------------ real triggers, the emulator


def met_decisions(caplog: pytest.LogCaptureFixture) -> int:
    """How many met decisions the watches have checked so far."""
    return sum(
        r.getMessage().endswith("ready = True (probability 0.93, confidence 0.9)") for r in caplog.records
    )


async def test_a_restarted_watch_does_not_fire_again_for_the_run_it_fired_for(
    emulator: Emulator, tmp_path: Path, supervisor: Supervisor, caplog: pytest.LogCaptureFixture
) -> None:
    log = tmp_path / "release.log"
    caplog.set_level(logging.INFO, logger="airflow_provider_systemzero.decisions.watch")
    first_reply = await fired_once_and_remembered(log, supervisor)
    assert met_decisions(caplog) == 1
    async with watching_events(watcher(log)) as (events, _):
        # the restarted watch checks a decision about the same state: still met, no event
        await until(lambda: met_decisions(caplog) == 2, within=20, what="the restarted watch's decision")
        log.write_text(WAITING)  # the run ends: remembered at once
        await until(lambda: supervisor.value()["fired"] is False, within=20, what="the run's end remembered")
        log.write_text(READY + READY)  # a new run
        await until(lambda: len(events) == 1, within=20, what="the new run's event")
        await until(lambda: supervisor.value()["fired"] is True, what="the new run remembered")
    assert events[0].payload["reply_id"] != first_reply
    assert emulator.stats.decisions_billed == 3  # READY, WAITING, READY + READY


async def test_without_a_store_a_restart_fires_again(
    emulator: Emulator, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Airflow 3.1 and 3.2, or a trigger run outside a triggerer (no store): the restarted watch's
    first met decision is a transition; the repeat carries the same reply_id, which a consumer can
    skip. The log gives the reason there is no store on this Airflow."""
    log = tmp_path / "release.log"
    log.write_text(READY)
    caplog.set_level(logging.INFO, logger=watch_memory.__name__)
    replies = []
    for _ in range(2):
        async with watching_events(watcher(log, store=False)) as (events, _):
            await until(lambda: len(events) == 1, within=20, what="an event")
        replies.append(events[0].payload["reply_id"])
    assert replies[0] == replies[1] and emulator.stats.decisions_billed == 1
    if hasattr(context, "AssetStateStoreAccessors"):  # Airflow 3.3: the triggerer would give one
        assert "no asset state store was given to this trigger: it runs outside a triggerer" in caplog.text
        assert "needs Airflow 3.3" not in caplog.text
    else:
        assert "an asset state store needs Airflow 3.3" in caplog.text


async def test_memory_of_a_watch_with_other_kwargs_is_not_used(
    emulator: Emulator, tmp_path: Path, supervisor: Supervisor, caplog: pytest.LogCaptureFixture
) -> None:
    log = tmp_path / "release.log"
    await fired_once_and_remembered(log, supervisor)
    edited = DecisionCondition("ready", True, min_confidence=0.6).to_dict()
    caplog.set_level(logging.INFO, logger=watch_memory.__name__)
    async with watching_events(watcher(log, condition=edited)) as (events, _):
        await until(lambda: len(events) == 1, within=20, what="the edited watch's event")
    assert "written by other kwargs" in caplog.text


async def test_a_watch_shared_by_two_assets_keeps_no_memory_and_says_how_to_fix_it(
    emulator: Emulator, tmp_path: Path, supervisor: Supervisor, caplog: pytest.LogCaptureFixture
) -> None:
    log = tmp_path / "release.log"
    log.write_text(READY)
    caplog.set_level(logging.INFO, logger=watch_memory.__name__)
    async with watching_events(watcher(log, "release", "audit")) as (events, _):
        await until(lambda: len(events) == 1, within=20, what="an event")
    assert "its own watch_id" in caplog.text and supervisor.rows == {}


async def test_a_failing_store_costs_a_repeat_never_an_event(
    emulator: Emulator, tmp_path: Path, supervisor: Supervisor, caplog: pytest.LogCaptureFixture
) -> None:
    log = tmp_path / "release.log"
    log.write_text(READY)
    supervisor.failing = True
    caplog.set_level(logging.INFO, logger=watch_memory.__name__)
    async with watching_events(watcher(log)) as (events, _):
        await until(lambda: len(events) == 1, within=20, what="an event")
        await until(lambda: "could not write" in caplog.text, what="the failed write logged")
    assert "asset watch 'release' could not read its memory" in caplog.text


# ------------------------------------------------------------------ when the memory is written


def _decision(reply: str) -> DecisionResult:
    answer = Answer(name="ready", type="boolean", decision=True, probability=0.9, confidence=0.9)
    return DecisionResult(
        reply={"id": reply},
        state_version=1,
        covered_event_ids=(),
        request_id="r",
        stream_id="s",
        answers={"ready": answer},
    )


class Store:
    """A single asset's accessor: what ``WatchMemory`` calls, recorded."""

    def __init__(self) -> None:
        self.writes: list[dict[str, Any]] = []

    async def aget(self, key: str, default: Any = None) -> Any:
        return self.writes[-1] if self.writes else default

    async def aset(self, key: str, value: Any) -> None:
        self.writes.append(value)


@contextlib.asynccontextmanager
async def kept(memory: WatchMemory) -> AsyncIterator[WatchMemory]:
    try:
        yield memory
    finally:
        await memory.aclose()


async def test_fired_is_written_only_once_the_event_was_handed_over_and_settled() -> None:
    store = Store()
    before = asyncio.all_tasks()
    async with kept(WatchMemory(store, watch_id="w", identity="i", settle=0.05)) as memory:
        memory.note(True, _decision("szd_1"))  # the verdict: its event is not handed over yet
        await asyncio.sleep(0.1)
        assert store.writes == []
        memory.handed_over()
        assert store.writes == [] and asyncio.all_tasks() - before  # its writer waits to settle
        await until(lambda: len(store.writes) == 1, what="the write")
        await until(
            lambda: not asyncio.all_tasks() - before, what="the writer gone: a dormant watch holds no task"
        )
    assert store.writes[0] | {"at": None} == {"fired": True, "identity": "i", "reply_id": "szd_1", "at": None}


async def test_a_run_ending_is_written_at_once_and_supersedes_an_unsettled_fire() -> None:
    store = Store()
    async with kept(WatchMemory(store, watch_id="w", identity="i", settle=60)) as memory:
        memory.note(True, _decision("szd_1"))
        memory.handed_over()  # due in a minute
        memory.note(False, _decision("szd_2"))
        await until(lambda: len(store.writes) == 1, what="the write")
        assert store.writes[0]["fired"] is False and store.writes[0]["reply_id"] == "szd_2"


async def test_a_graceful_stop_writes_a_pending_run_end_and_drops_a_pending_fire() -> None:
    store = Store()
    memory = WatchMemory(store, watch_id="w", identity="i", settle=60)
    memory.note(True, _decision("szd_1"))
    memory.handed_over()
    await memory.aclose()  # the event may not be recorded yet: better once more than never
    assert store.writes == []
    memory.note(False, _decision("szd_2"))
    await memory.aclose()
    assert [w["fired"] for w in store.writes] == [False]
    assert await memory.recall() is False


async def test_without_a_store_nothing_is_kept_and_the_log_says_why(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=watch_memory.__name__)
    before = asyncio.all_tasks()
    memory = WatchMemory(None, watch_id="w", identity="i")
    assert await memory.recall() is False and not memory.kept
    memory.note(False, _decision("szd_1"))
    memory.handed_over()
    assert asyncio.all_tasks() == before  # nothing to write, no task
    assert "asset watch 'w' keeps no memory" in caplog.text and "needs Airflow 3.3" in caplog.text


async def test_without_a_store_on_an_airflow_that_has_them_the_log_says_outside_a_triggerer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=watch_memory.__name__)
    memory = WatchMemory(None, watch_id="w", identity="i", stores_given=True)
    assert await memory.recall() is False and not memory.kept
    assert (
        "asset watch 'w' keeps no memory across triggerer restarts (no asset state store was given to "
        "this trigger: it runs outside a triggerer, which gives each asset's watcher its store)"
    ) in caplog.text
    assert "needs Airflow 3.3" not in caplog.text


class SlowOrFailingStore(Store):
    """A store whose writes take ``delay`` seconds, and fail the first ``failures`` times."""

    def __init__(self, delay: float = 0.0, failures: int = 0) -> None:
        super().__init__()
        self.delay, self.failures = delay, failures

    async def aset(self, key: str, value: Any) -> None:
        await asyncio.sleep(self.delay)
        if self.failures:
            self.failures -= 1
            raise ConnectionResetError("supervisor busy")
        await super().aset(key, value)


async def test_a_stop_that_interrupts_the_write_of_a_run_end_still_writes_it() -> None:
    """Left as "fired", the store would keep a restarted watch from firing for the next run."""
    store = SlowOrFailingStore(delay=0.2)
    store.writes.append({"fired": True, "identity": "i", "reply_id": "szd_1", "at": None})
    memory = WatchMemory(store, watch_id="w", identity="i")
    assert await memory.recall() is True
    memory.note(False, _decision("szd_2"))
    await asyncio.sleep(0.05)  # the write is under way
    await memory.aclose()  # the trigger stops
    assert store.writes[-1]["fired"] is False
    assert await WatchMemory(store, watch_id="w", identity="i").recall() is False


async def test_a_failed_write_is_tried_again_and_the_warning_says_what_it_costs(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger=watch_memory.__name__)
    store = SlowOrFailingStore(failures=2)
    monkeypatch.setattr(watch_memory, "WRITE_RETRY_FIRST_S", 0.05)
    async with kept(WatchMemory(store, watch_id="w", identity="i")) as memory:
        memory.note(False, _decision("szd_2"))
        await until(lambda: len(store.writes) == 1, what="the write, at the third try")
    assert store.writes[0]["fired"] is False
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and "would not fire for the next run" in warnings[0]
