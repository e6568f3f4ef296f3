"""Metrics and spans of System Zero streams, through Airflow's own observability layers.

:class:`~airflow_provider_systemzero.stream.observer.StreamObserver` is what a
:class:`~airflow_provider_systemzero.stream.decision_stream.DecisionStream` tells about itself
(connections, acks, decisions, reconnects, budget stops, rate-limit waits); the base class does
nothing. :class:`AirflowStreamObserver` — the one
:class:`~airflow_provider_systemzero.hooks.systemzero.SystemZeroHook` streams use — turns that into:

**Metrics** through ``airflow.sdk.observability.stats`` (StatsD, Datadog or OpenTelemetry, as the
``[metrics]`` section configures; nothing when metrics are off). Static names under
``systemzero.``; tags carry only small fixed sets of values (decision mode, outcome, close code,
reason, limit, kind, message type) — never a run, task, stream or reply id. See :data:`METRICS`.

**Spans** through OpenTelemetry, opt-in: on when ``[systemzero] otel_spans`` is true, or — when
that option is unset — when Airflow's ``[traces] otel_on`` is. One span per stream connection
(``systemzero.stream.connection``) and one per decision (``systemzero.decision``, a child of its
connection's span) with ids, versions, covered events and the outcome. The state and the
questions' instructions are never put in a span unless ``[systemzero] capture_content`` is true.

Importing this module does not import Airflow (it is imported on first use).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from airflow_provider_systemzero.protocol.untrusted import safe_text
from airflow_provider_systemzero.stream.observer import GOODBYE_REASONS, ObservedStream, StreamObserver

if TYPE_CHECKING:
    from airflow_provider_systemzero.decisions.budget import BudgetExceeded
    from airflow_provider_systemzero.protocol.messages import Ack, Hello
    from airflow_provider_systemzero.protocol.reply import DecisionResult

__all__ = [
    "CLOSE_CODES",
    "METRICS",
    "RECONNECT_REASONS",
    "AirflowStreamObserver",
    "capture_content_enabled",
    "close_code_tag",
    "configure",
    "reason_tag",
    "spans_enabled",
]

log = logging.getLogger(__name__)

#: Every metric emitted, with its kind and tags (names are static; tag values come from small sets).
METRICS: dict[str, tuple[str, tuple[str, ...]]] = {
    "systemzero.streams.open": ("gauge", ()),
    "systemzero.connects": ("counter", ("decision_mode", "replay")),
    "systemzero.connection.closed": ("counter", ("decision_mode", "close_code")),
    "systemzero.reconnects": ("counter", ("decision_mode", "close_code", "reason")),
    "systemzero.acks": ("counter", ("decision_mode", "message_type")),
    "systemzero.decisions": ("counter", ("decision_mode", "outcome")),
    "systemzero.decisions.billed": ("counter", ("decision_mode",)),
    "systemzero.decide.latency": ("timer", ("decision_mode",)),
    "systemzero.decide.queue_time": ("timer", ("decision_mode",)),
    "systemzero.decide.duration": ("timer", ("decision_mode",)),
    "systemzero.tokens.input": ("counter", ("decision_mode",)),
    "systemzero.tokens.cached_input": ("counter", ("decision_mode",)),
    "systemzero.tokens.media": ("counter", ("decision_mode",)),
    "systemzero.budget.refusals": ("counter", ("decision_mode", "limit")),
    "systemzero.rate_limit.waits": ("counter", ("decision_mode", "kind")),
    "systemzero.rate_limit.wait_time": ("timer", ("decision_mode", "kind")),
}

#: The ``reason`` tag values of ``systemzero.reconnects`` (a closed set; anything else is ``other``).
RECONNECT_REASONS = frozenset(
    {
        "close",
        "network",
        "upgrade_refused",
        "receipt_timeout",
        "write_timeout",
        "protocol_violation",
        "released",
        "invalid_uri",
        "closed",
        "other",
        *(f"goodbye.{reason}" for reason in (*GOODBYE_REASONS, "other")),
    }
)
#: The ``close_code`` tag values (the codes of RFC 6455 a stream sees; anything else is ``other``).
CLOSE_CODES = frozenset(
    {1000, 1001, 1002, 1003, 1005, 1006, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014, 1015}
)
#: Characters Airflow's metric-name validation allows (tags are appended to the name with InfluxDB-style tags).
_TAG_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")

_TRACER_NAME = "airflow_provider_systemzero"
_MAX_CONTENT_CHARS = 8192

# ------------------------------------------------------------------------------------ settings

_overrides: dict[str, Any] = {}


def configure(
    *, spans: bool | None = None, capture_content: bool | None = None, tracer_provider: Any = None
) -> None:
    """Override the configuration in this process (tests, or code that sets up tracing itself).

    :param spans: emit spans (``None``: back to the configuration).
    :param capture_content: put the state and the instructions in spans (``None``: back to the configuration).
    :param tracer_provider: an OpenTelemetry ``TracerProvider`` to use instead of the global one
        (``None``: the global one).
    """
    _overrides.clear()
    for name, value in (
        ("spans", spans),
        ("capture_content", capture_content),
        ("tracer_provider", tracer_provider),
    ):
        if value is not None:
            _overrides[name] = value


def reason_tag(reason: str) -> str:
    """The ``reason`` tag of a reconnect: ``goodbye.shutdown``, ``network`` …, from :data:`RECONNECT_REASONS`.

    :param reason: the reconnect's reason (``goodbye:shutdown``, ``upgrade_refused:429`` …).
    """
    kind, _, detail = reason.partition(":")
    tag = f"goodbye.{detail if detail in GOODBYE_REASONS else 'other'}" if kind == "goodbye" else kind
    return tag if tag in RECONNECT_REASONS else "other"


def close_code_tag(code: int | None) -> str:
    """The ``close_code`` tag: the code when it is one of :data:`CLOSE_CODES`, ``none`` or ``other``.

    :param code: the close code seen.
    """
    if not code:
        return "none"
    return str(code) if code in CLOSE_CODES else "other"


def _tag(value: Any) -> str:
    """A tag value Airflow's metric-name validation accepts (anything else becomes ``other``)."""
    text = str(value)
    return text if text and len(text) <= 64 and set(text) <= _TAG_CHARACTERS else "other"


def _conf_boolean(section: str, key: str) -> bool | None:
    """A boolean option, or ``None`` when it is unset or empty."""
    try:
        from airflow_provider_systemzero.compat import conf
    except ImportError:  # pragma: no cover - Airflow is a dependency
        return None
    try:
        raw = conf.get(section, key, fallback=None)
    except Exception:
        return None
    if raw is None or not str(raw).strip():
        return None
    return str(raw).strip().lower() in ("true", "t", "1", "yes", "on")


def spans_enabled() -> bool:
    """Whether spans are emitted: ``[systemzero] otel_spans``, else ``[traces] otel_on``."""
    if "spans" in _overrides:
        return bool(_overrides["spans"])
    own = _conf_boolean("systemzero", "otel_spans")
    if own is not None:
        return own
    return bool(_conf_boolean("traces", "otel_on"))


def capture_content_enabled() -> bool:
    """Whether spans may carry the state and the instructions (``[systemzero] capture_content``)."""
    if "capture_content" in _overrides:
        return bool(_overrides["capture_content"])
    return bool(_conf_boolean("systemzero", "capture_content"))


# ------------------------------------------------------------------------------------ observers


_open_lock = threading.Lock()
_open_streams = 0


def _adjust_open(delta: int) -> int:
    global _open_streams
    with _open_lock:
        _open_streams = max(0, _open_streams + delta)
        return _open_streams


class AirflowStreamObserver(StreamObserver):
    """Metrics through ``airflow.sdk.observability.stats`` and opt-in OpenTelemetry spans.

    :param decision_mode: the stream's decision mode (a metric tag).
    :param spans: emit spans (``None``: :func:`spans_enabled` when the stream is bound).
    :param capture_content: put state and instructions in spans (``None``: :func:`capture_content_enabled`).
    :param stats: where the metrics go, an object with ``incr``, ``gauge`` and ``timing`` as
        ``airflow.sdk.observability.stats.Stats`` has them (``None``: that one, found at the first metric).
    """

    def __init__(
        self,
        decision_mode: str = "on_change",
        *,
        spans: bool | None = None,
        capture_content: bool | None = None,
        stats: Any = None,
    ) -> None:
        self.decision_mode = decision_mode
        self._spans = spans
        self._capture = capture_content
        self._stream: ObservedStream | None = None
        #: what spans start from: found when the stream is bound, only while spans are on
        self._tracer: Any = None
        self._conn_span: Any = None
        self._open = False
        self._stats: Any = stats

    # ------------------------------------------------------------------ plumbing

    def bind(self, stream: ObservedStream) -> None:
        self._stream = stream
        self.decision_mode = getattr(stream, "decision_mode", self.decision_mode)
        if self._spans is None:
            self._spans = spans_enabled()
        if self._capture is None:
            self._capture = capture_content_enabled() if self._spans else False
        if self._spans:
            try:
                from opentelemetry import trace

                provider = _overrides.get("tracer_provider")
                self._tracer = trace.get_tracer(_TRACER_NAME, tracer_provider=provider)
            except Exception as exc:  # OpenTelemetry missing or broken: no spans, never a failure
                log.debug("System Zero spans are off: %s", exc)
                self._spans = False

    def unbind(self) -> None:
        self._stream = None

    def _emit(self, kind: str, name: str, value: float = 1, **tags: Any) -> None:
        try:
            if self._stats is None:
                from airflow_provider_systemzero.compat import stats

                self._stats = stats
            # the gauge counts every stream of the process: it carries no tag
            tags = (
                {}
                if kind == "gauge"
                else {"decision_mode": self.decision_mode, **{k: _tag(v) for k, v in tags.items()}}
            )
            if kind == "counter":
                self._stats.incr(name, int(value), tags=tags)
            elif kind == "gauge":
                self._stats.gauge(name, value)
            else:
                self._stats.timing(name, float(value), tags=tags)
        except Exception as exc:  # metrics must never break a stream
            log.debug("could not emit metric %s: %s", name, exc)

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        try:
            yield
        except Exception as exc:
            log.debug("System Zero span failed: %s", exc)

    def _connection_event(self, name: str, attributes: Mapping[str, Any]) -> None:
        """An event on the connection's span, when there is one."""
        span = self._conn_span
        if span is not None:
            with self._guard():
                span.add_event(name, dict(attributes))

    def _content(self) -> Mapping[str, Any]:
        if not self._capture or self._stream is None:
            return {}
        attributes: dict[str, Any] = {}
        with contextlib.suppress(Exception):
            state = self._stream.state
            text = state if isinstance(state, str) else json.dumps(state, ensure_ascii=False)
            attributes["systemzero.state"] = text[:_MAX_CONTENT_CHARS]
        with contextlib.suppress(Exception):
            questions = self._stream.request.questions_wire()
            attributes["systemzero.questions"] = json.dumps(questions, ensure_ascii=False)[
                :_MAX_CONTENT_CHARS
            ]
        return attributes

    # ------------------------------------------------------------------ events

    def connected(self, url: str, replay: bool) -> None:
        if not self._open:
            self._open = True
            self._emit("gauge", "systemzero.streams.open", _adjust_open(1))
        self._emit("counter", "systemzero.connects", replay=str(replay).lower())
        if self._tracer is not None:
            with self._guard():
                from urllib.parse import urlsplit

                request = getattr(self._stream, "request", None)
                attributes: dict[str, Any] = {
                    "server.address": urlsplit(url).hostname or "",
                    "systemzero.decision_mode": self.decision_mode,
                    "systemzero.replay": replay,
                }
                if request is not None:
                    attributes["systemzero.model"] = str(request.model)
                    attributes["systemzero.questions.names"] = [name for name, _ in request.questions]
                    if request.prompt_cache_key:
                        attributes["systemzero.prompt_cache_key"] = request.prompt_cache_key
                attributes.update(self._content())
                self._conn_span = self._tracer.start_span(
                    "systemzero.stream.connection", attributes=attributes
                )

    def hello(self, hello: Hello) -> None:
        span = self._conn_span
        if span is not None:
            with self._guard():
                span.set_attribute("systemzero.stream_id", safe_text(hello.stream_id))
                span.set_attribute("systemzero.protocol", hello.protocol)
                span.set_attribute("systemzero.hello.request_id", safe_text(hello.request_id))

    def closed(self, close_code: int | None, reason: str) -> None:
        if self._open:
            self._open = False
            self._emit("gauge", "systemzero.streams.open", _adjust_open(-1))
        self._emit("counter", "systemzero.connection.closed", close_code=close_code_tag(close_code))
        span, self._conn_span = self._conn_span, None
        if span is not None:
            with self._guard():
                span.set_attribute("systemzero.close_code", close_code if close_code is not None else -1)
                span.set_attribute("systemzero.close_reason", reason)
                span.set_attribute("systemzero.state_version", int(getattr(self._stream, "state_version", 0)))
                span.end()

    def reconnecting(self, reason: str, close_code: int | None, delay: float) -> None:
        self._emit(
            "counter",
            "systemzero.reconnects",
            close_code=close_code_tag(close_code),
            reason=reason_tag(reason),
        )

    def acknowledged(self, ack: Ack, message_type: str, replayed: bool) -> None:
        self._emit("counter", "systemzero.acks", message_type=message_type)
        self._connection_event(
            "systemzero.ack",
            {
                "systemzero.event_id": ack.event_id,
                "systemzero.state_version": ack.state_version,
                "systemzero.state_bytes": ack.state_bytes,
                "systemzero.body_bytes": ack.synthesized_body_bytes,
                "systemzero.scheduled": ack.scheduled,
                "systemzero.message_type": message_type,
            },
        )

    def decided(self, result: DecisionResult, *, billed: bool) -> None:
        outcome = "billed" if billed else "replayed"
        self._emit("counter", "systemzero.decisions", outcome=outcome)
        if billed:
            self._emit("counter", "systemzero.decisions.billed")
            usage = result.usage
            for field, metric in (
                ("input_tokens", "systemzero.tokens.input"),
                ("cached_input_tokens", "systemzero.tokens.cached_input"),
                ("media_tokens", "systemzero.tokens.media"),
            ):
                if usage.get(field):
                    self._emit("counter", metric, usage[field])
        latency = result.latency_ms
        if latency is None and result.queue_ms is not None and result.decide_ms is not None:
            latency = result.queue_ms + result.decide_ms  # the gateway's time from scheduling to the reply
        for value, metric in (
            (latency, "systemzero.decide.latency"),
            (result.queue_ms, "systemzero.decide.queue_time"),
            (result.decide_ms, "systemzero.decide.duration"),
        ):
            if value is not None:
                self._emit("timer", metric, value)
        if self._tracer is not None:
            with self._guard():
                self._decision_span(result, outcome)

    def _in_connection(self) -> Any:
        """The context a decision's span starts in: its connection's span, when there is one."""
        from opentelemetry import trace

        return trace.set_span_in_context(self._conn_span) if self._conn_span is not None else None

    def _decision_span(self, result: DecisionResult, outcome: str) -> None:
        now = time.time_ns()
        took = result.latency_ms if result.latency_ms is not None else result.decide_ms
        start = now - int(max(0.0, took or 0.0) * 1_000_000)
        attributes: dict[str, Any] = {
            "systemzero.stream_id": safe_text(result.stream_id),
            "systemzero.reply_id": result.reply_id or "",
            "systemzero.request_id": result.request_id,
            "systemzero.state_version": result.state_version,
            "systemzero.covered_event_ids": list(result.covered_event_ids),
            "systemzero.outcome": outcome,
            "systemzero.decision_mode": self.decision_mode,
        }
        if result.model:
            attributes["systemzero.model"] = result.model
        for name, value in (
            ("queue_ms", result.queue_ms),
            ("decide_ms", result.decide_ms),
            ("latency_ms", result.latency_ms),
        ):
            if value is not None:
                attributes[f"systemzero.{name}"] = float(value)
        for name, value in result.usage.items():
            attributes[f"systemzero.usage.{name}"] = value
        for name, answer in result.answers.items():
            decision = answer.decision
            attributes[f"systemzero.answer.{name}.decision"] = (
                decision if isinstance(decision, bool | str) else json.dumps(decision)
            )
            if answer.probability is not None:
                attributes[f"systemzero.answer.{name}.probability"] = answer.probability
            if answer.confidence is not None:
                attributes[f"systemzero.answer.{name}.confidence"] = answer.confidence
        attributes.update(self._content())
        span = self._tracer.start_span(
            "systemzero.decision", context=self._in_connection(), attributes=attributes, start_time=start
        )
        span.end(end_time=now)

    def decision_failed(
        self, http_status: int | None, code: str, retryable: bool, state_version: int | None
    ) -> None:
        self._emit("counter", "systemzero.decisions", outcome="failed")
        if self._tracer is not None:
            with self._guard():
                from opentelemetry.trace import Status, StatusCode

                span = self._tracer.start_span(
                    "systemzero.decision",
                    context=self._in_connection(),
                    attributes={
                        "systemzero.outcome": "failed",
                        "systemzero.http_status": http_status or 0,
                        "systemzero.error.code": code,
                        "systemzero.retryable": retryable,
                        "systemzero.state_version": state_version or 0,
                        "systemzero.stream_id": safe_text(getattr(self._stream, "stream_id", None) or ""),
                        "systemzero.decision_mode": self.decision_mode,
                    },
                )
                span.set_status(Status(StatusCode.ERROR, code))
                span.end()

    def budget_exceeded(self, exc: BudgetExceeded) -> None:
        self._emit("counter", "systemzero.budget.refusals", limit=exc.limit)
        self._connection_event(
            "systemzero.budget_refused",
            {"systemzero.limit": exc.limit, "systemzero.maximum": exc.maximum, "systemzero.spent": exc.spent},
        )

    def rate_limited(self, kind: str, delay: float | None) -> None:
        self._emit("counter", "systemzero.rate_limit.waits", kind=kind)
        if delay is not None:
            self._emit("timer", "systemzero.rate_limit.wait_time", delay * 1000, kind=kind)
