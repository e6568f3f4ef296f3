"""Names renamed before 0.2 keep working and warn once per process, naming the new name
(docs/compatibility.md, the deprecation policy; docs/changelog.md, Deprecated)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from airflow_provider_systemzero import deprecations
from airflow_provider_systemzero.decisions import relevance, source_watch, watch
from airflow_provider_systemzero.decisions.conditions import DecisionCondition
from airflow_provider_systemzero.exceptions import SystemZeroArgumentError
from airflow_provider_systemzero.sources.file import FileSource
from airflow_provider_systemzero.sources.spec import build_source
from airflow_provider_systemzero.stream import starts
from airflow_provider_systemzero.stream.capacity import StreamCapacity


@pytest.fixture(autouse=True)
def fresh_process() -> None:
    """Each test sees the warnings as a new process would (each old name warns once per process)."""
    deprecations.forget_warnings()


def _warned(use: object) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        use()  # type: ignore[operator]
        use()  # type: ignore[operator]
    return [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]


def test_renamed_classes_are_the_new_ones_and_warn_once() -> None:
    assert _warned(lambda: watch.DecisionWatch) == [
        "airflow_provider_systemzero.decisions.watch.DecisionWatch is deprecated and will be removed "
        "in a later minor release: use airflow_provider_systemzero.decisions.watch.VerdictRules"
    ]
    assert watch.DecisionWatch is watch.VerdictRules
    (message,) = _warned(lambda: relevance.DecisionGate)
    assert message.endswith("use airflow_provider_systemzero.decisions.relevance.DecisionDebounce")
    assert relevance.DecisionGate is relevance.DecisionDebounce
    with pytest.raises(AttributeError, match="has no attribute 'Nothing'"):
        watch.Nothing  # noqa: B018


def test_the_streaming_phase_answers_its_old_name() -> None:
    (message,) = _warned(lambda: source_watch.Phase.HOLDING)
    assert "use Phase.STREAMING" in message
    assert source_watch.Phase.HOLDING is source_watch.Phase.STREAMING


def test_the_debounce_answers_its_old_names() -> None:
    decision_filter = relevance.DecisionFilter(debounce_ms=250)
    (message,) = _warned(lambda: decision_filter.gate(0.0))
    assert "use DecisionFilter.debounce()" in message
    debounce = decision_filter.gate(0.0)
    assert isinstance(debounce, relevance.DecisionDebounce) and debounce.quiet == 0.25
    rules = watch.VerdictRules(DecisionCondition("ready", True))
    (message,) = _warned(lambda: source_watch.SourceWatch(rules, decision_mode="on_request", gate=debounce))
    assert "SourceWatch(debounce=...)" in message
    assert source_watch.SourceWatch(rules, decision_mode="on_request", gate=debounce).debounce is debounce


def test_a_file_sources_watch_field_is_read_as_notifications(tmp_path: Path) -> None:
    path = str(tmp_path / "job.log")
    (message,) = _warned(lambda: build_source({"type": "file", "path": path, "watch": "poll"}, ""))
    assert "'notifications'" in message
    source = build_source({"type": "file", "path": path, "watch": "poll"}, "")
    assert isinstance(source, FileSource) and source.notifications == "poll"
    (message,) = _warned(lambda: FileSource(path, watch="poll"))
    assert "FileSource(notifications=...)" in message
    assert FileSource(path, watch="notify").notifications == "notify"
    with pytest.raises(SystemZeroArgumentError, match="give 'notifications' only") as info:
        build_source({"type": "file", "path": path, "watch": "poll", "notifications": "poll"}, "")
    assert info.value.field == "source.watch"
    with pytest.raises(SystemZeroArgumentError, match=r"source\.watch 'inotify' is not one of"):
        build_source({"type": "file", "path": path, "watch": "inotify"}, "")


def test_the_accounts_starts_answer_their_old_name() -> None:
    (message,) = _warned(lambda: starts.DecisionStarts)
    assert message.endswith("use airflow_provider_systemzero.stream.starts.AccountStarts")
    assert starts.DecisionStarts is starts.AccountStarts


async def test_a_place_held_for_a_block_answers_its_old_name() -> None:
    capacity = StreamCapacity(1)
    (message,) = _warned(lambda: capacity.opening())
    assert message.endswith("use StreamCapacity.ask_opening() and StreamCapacity.leave_opening()")
    async with capacity.opening():
        assert capacity.building == 1
    assert capacity.building == 0


def test_a_streams_starts_read_the_decision_mode_of_their_session() -> None:
    from airflow_provider_systemzero.protocol.client import ClientSession
    from airflow_provider_systemzero.stream.request import StreamRequest

    request = StreamRequest.build(
        model="m", questions={"ready": {"type": "boolean", "instructions": "Ready?"}}, prompt_cache_key="pck"
    )
    session = ClientSession(request=request, state="log\n", decision_mode="on_request", admission=True)
    account = starts.AccountStarts("test account", 0.0)
    origin = "ws://127.0.0.1:1/v1/stream"
    (message,) = _warned(
        lambda: starts.StreamStarts(
            account, session, StreamCapacity(1), origin=origin, decision_mode="on_request"
        )
    )
    assert "StreamStarts(decision_mode=...)" in message and message.endswith(
        "use the session's decision_mode, which it reads"
    )
    with pytest.raises(ValueError, match="differs from its session's 'on_request'"):
        starts.StreamStarts(account, session, StreamCapacity(1), origin=origin, decision_mode="on_change")
