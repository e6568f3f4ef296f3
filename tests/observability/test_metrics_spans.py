"""Metrics through Airflow's metrics layer and opt-in spans, captured in memory."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from airflow_provider_systemzero.compat import airflow_version
from airflow_provider_systemzero.decisions.budget import BudgetExceeded, DecisionBudget
from airflow_provider_systemzero.emulator import Emulator
from airflow_provider_systemzero.stream import Backoff, DecisionStream
from airflow_provider_systemzero.tasks import observability
from airflow_provider_systemzero.tasks.observability import METRICS, AirflowStreamObserver
from tests.helpers.stream import SECRET_KEY, settings_for

STATE = "Initial log: PRIVATE-STATE-CONTENT\n"
REQUEST = {
    "model": "MODEL_ID",
    "questions": {"ready": {"type": "boolean", "instructions": "PRIVATE-INSTRUCTIONS: is it ready?"}},
}


@pytest.fixture
def metrics() -> Iterator[InMemoryMetricReader]:
    """Airflow's own OpenTelemetry metrics backend, reading into memory."""
    pytest.importorskip(
        "airflow.sdk._shared.observability.metrics.stats",
        reason="this Airflow has no Task SDK metrics backend to read from (3.1 keeps it in airflow.stats)",
    )
    from airflow.sdk._shared.observability.metrics import stats as stats_module
    from airflow.sdk._shared.observability.metrics.otel_logger import SafeOtelLogger

    reader = InMemoryMetricReader()
    backend = SafeOtelLogger(MeterProvider(metric_readers=[reader]), prefix="airflow")
    if not hasattr(stats_module, "_factory"):  # Airflow 3.2: the module's Stats class holds the backend
        saved_factory = type.__getattribute__(stats_module.Stats, "factory")
        stats_module.Stats.initialize(factory=lambda: backend)
        try:
            yield reader
        finally:
            stats_module.Stats.initialize(factory=saved_factory or stats_module.NoStatsLogger)
        return
    saved = (stats_module._factory, stats_module._export_legacy_names)
    stats_module.initialize(factory=lambda: backend, export_legacy_names=False)
    try:
        yield reader
    finally:
        stats_module.initialize(factory=saved[0], export_legacy_names=saved[1]) if saved[
            0
        ] else stats_module.initialize(
            factory=lambda: stats_module.NoStatsLogger(), export_legacy_names=saved[1]
        )


def points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    found: dict[str, list[Any]] = {}
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found.setdefault(metric.name, []).extend(metric.data.data_points)
    return found


def total(found: dict[str, list[Any]], name: str, **attributes: str) -> float:
    """A counter's sum, or a histogram's number of observations."""
    return sum(
        p.count if hasattr(p, "count") else p.value
        for p in found.get(name, [])
        if all(p.attributes.get(k) == v for k, v in attributes.items())
    )


@pytest.fixture
def spans() -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    observability.configure(spans=True, tracer_provider=provider)
    return exporter


def stream_for(emu: Emulator, backoff: Backoff, mode: str = "on_change", **kwargs: Any) -> DecisionStream:
    return DecisionStream(
        settings_for(emu),
        REQUEST,
        state=STATE,
        decision_mode=mode,
        identity="observed",
        backoff=backoff,
        open_deadline=15,
        observer=AirflowStreamObserver(mode),
        **kwargs,
    )


async def test_metrics_go_through_airflow_stats(
    emu: Emulator, fast_backoff: Backoff, metrics: InMemoryMetricReader
) -> None:
    async with stream_for(emu, fast_backoff, budget=DecisionBudget(max_decisions=2)) as stream:
        first = await stream.decide(timeout=10)
        await stream.append_text("Job is ready.\n")
        await stream.decide(timeout=10)
        await stream.append_text("More.\n")
        with pytest.raises(BudgetExceeded):
            await stream.decide(timeout=10)
    found = points(metrics)
    assert all(name.startswith("airflow.systemzero.") for name in found), sorted(found)
    assert total(found, "airflow.systemzero.connects", decision_mode="on_change") == 1
    assert total(found, "airflow.systemzero.acks", message_type="start") == 1
    assert total(found, "airflow.systemzero.decisions", outcome="billed") == 2
    assert total(found, "airflow.systemzero.decisions.billed") == 2
    assert total(found, "airflow.systemzero.budget.refusals", limit="max_decisions") == 1
    assert (
        total(found, "airflow.systemzero.tokens.input")
        == stream.usage.input_tokens
        >= first.usage["input_tokens"]
    )
    for timing in ("latency", "queue_time", "duration"):
        series = found[f"airflow.systemzero.decide.{timing}"]
        if airflow_version()[:2] >= (3, 3):
            assert total(found, f"airflow.systemzero.decide.{timing}") == 2  # a histogram: one per decision
        else:  # Airflow 3.2's OTel backend keeps a timing as a gauge of its last value, in ms
            assert len(series) == 1 and series[0].value >= 0
    assert total(found, "airflow.systemzero.connection.closed", close_code="1000") == 1
    assert "airflow.systemzero.streams.open" in found
    # no per-run label: every tag is a declared one
    for name, series in found.items():
        kind, tags = METRICS[name.removeprefix("airflow.")]
        declared = set(tags) | ({"decision_mode"} if kind != "gauge" else set())
        for point in series:
            assert set(point.attributes) <= declared, (name, dict(point.attributes))


async def test_reconnects_are_counted_by_close_code(
    emu: Emulator, fast_backoff: Backoff, metrics: InMemoryMetricReader
) -> None:
    async with stream_for(emu, fast_backoff, mode="on_request") as stream:
        await stream.decide(timeout=10)
        await emu.drop_all()  # abrupt loss: close code 1006
        await stream.append_text("after\n")
        await stream.decide(timeout=10)
    assert [r.close_code for r in stream.reconnects] == [1006]
    found = points(metrics)
    assert total(found, "airflow.systemzero.reconnects", close_code="1006") == 1
    assert total(found, "airflow.systemzero.connects", replay="true") == 1


async def test_spans_carry_ids_and_no_content_by_default(
    emu: Emulator, fast_backoff: Backoff, spans: InMemorySpanExporter
) -> None:
    async with stream_for(emu, fast_backoff) as stream:
        decision = await stream.decide(timeout=10)
    finished = spans.get_finished_spans()
    by_name: dict[str, list[Any]] = {}
    for span in finished:
        by_name.setdefault(span.name, []).append(span)
    [connection] = by_name["systemzero.stream.connection"]
    [decided] = by_name["systemzero.decision"]
    assert decided.parent is not None and decided.parent.span_id == connection.context.span_id
    attrs = dict(decided.attributes)
    assert attrs["systemzero.reply_id"] == decision.reply_id and attrs["systemzero.outcome"] == "billed"
    assert attrs["systemzero.state_version"] == 1 and list(attrs["systemzero.covered_event_ids"]) == ["evt_1"]
    assert attrs["systemzero.answer.ready.decision"] in (True, False)
    assert dict(connection.attributes)["systemzero.stream_id"] == decision.stream_id
    assert dict(connection.attributes)["systemzero.close_code"] == 1000
    dumped = json.dumps(
        [dict(s.attributes) for s in finished] + [[dict(e.attributes) for e in s.events] for s in finished],
        default=str,
    )
    assert "PRIVATE-STATE-CONTENT" not in dumped and "PRIVATE-INSTRUCTIONS" not in dumped


async def test_content_capture_is_opt_in(
    emu: Emulator, fast_backoff: Backoff, spans: InMemorySpanExporter
) -> None:
    provider = TracerProvider()  # to the same exporter, now with content
    provider.add_span_processor(SimpleSpanProcessor(spans))
    observability.configure(spans=True, capture_content=True, tracer_provider=provider)
    async with stream_for(emu, fast_backoff) as stream:
        await stream.decide(timeout=10)
    decided = next(s for s in spans.get_finished_spans() if s.name == "systemzero.decision")
    assert "PRIVATE-STATE-CONTENT" in decided.attributes["systemzero.state"]
    assert "PRIVATE-INSTRUCTIONS" in decided.attributes["systemzero.questions"]


async def test_spans_are_off_unless_configured(emu: Emulator, fast_backoff: Backoff) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    observability.configure(tracer_provider=provider)  # no spans=…: [traces] otel_on decides, off in tests
    assert not observability.spans_enabled()
    async with stream_for(emu, fast_backoff) as stream:
        await stream.decide(timeout=10)
    assert exporter.get_finished_spans() == ()


def test_spans_follow_airflow_tracing_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    observability.configure()
    monkeypatch.setenv("AIRFLOW__TRACES__OTEL_ON", "True")
    assert observability.spans_enabled() and not observability.capture_content_enabled()
    monkeypatch.setenv("AIRFLOW__SYSTEMZERO__OTEL_SPANS", "False")
    assert not observability.spans_enabled()
    monkeypatch.setenv("AIRFLOW__SYSTEMZERO__CAPTURE_CONTENT", "True")
    assert observability.capture_content_enabled()


async def test_log_lines_follow_the_stream_without_content_or_key(
    emu: Emulator, fast_backoff: Backoff, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="airflow_provider_systemzero.stream")  # every stream module's
    async with stream_for(emu, fast_backoff, mode="on_request") as stream:
        await stream.decide(timeout=10)
        await emu.drop_all()
        await stream.append_text("after\n")
        await stream.decide(timeout=10)
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("airflow_provider_systemzero.stream.") and r.levelno == logging.INFO
    ]
    text = "\n".join(lines)
    for expected in (
        "connected to ws://",
        "(a new stream)",
        "open (system-zero.stream.v1): max_message_bytes=",
        "state version 1 acknowledged (start): state ",
        "decide body ",
        "decision for state version 1 (covers evt_1): ready=",
        "probability 0.",
        "confidence 0.",
        "billed",
        "connection ended (close, close 1006); reconnecting in ",
        "reconnecting the System Zero stream after close (close 1006, waited ",
        "(replaying the stream's state)",
        "acknowledged (start, replayed)",
    ):
        assert expected in text, (expected, lines)
    assert "PRIVATE-STATE-CONTENT" not in text and "PRIVATE-INSTRUCTIONS" not in text
    assert SECRET_KEY not in caplog.text
