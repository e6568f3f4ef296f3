"""What each trigger serializes, pinned key by key and in order.

An asset watcher's trigger is identified by the hash of its classpath and the JSON of its kwargs
(``BaseEventTrigger.hash``, key order included): a kwarg added, dropped, renamed or moved makes a
new watcher of every deployed one. The deferred triggers' kwargs are stored with the task, and a
triggerer rebuilds the trigger from them. So these lists change only on purpose.
"""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_systemzero.decisions.source_watch import DEFAULT_MAX_STALENESS
from airflow_provider_systemzero.exceptions import SystemZeroArgumentError
from airflow_provider_systemzero.triggers.decision import (
    SystemZeroDecideTrigger,
    SystemZeroDecisionEventTrigger,
    SystemZeroDecisionTrigger,
)

REQUEST = {"model": "sz-test", "questions": {"ready": {"type": "boolean", "instructions": "Ready?"}}}
CONDITION = {"question": "ready", "expect": True}
#: the sensor's trigger keeps its condition parsed and serializes it as ``DecisionCondition.to_dict()``
#: does (what the sensor defers with): every field, the bars unset
CONDITION_AS_SERIALIZED = {
    "question": "ready",
    "expect": True,
    "min_confidence": None,
    "min_probability": None,
}
SOURCE = {"type": "file", "path": "/tmp/job.log"}


def items(trigger: Any) -> list[tuple[str, Any]]:
    classpath, kwargs = trigger.serialize()
    assert classpath == f"airflow_provider_systemzero.triggers.decision.{type(trigger).__name__}"
    assert type(trigger)(**kwargs).serialize() == (classpath, kwargs)  # rebuilt, the same
    return list(kwargs.items())


def test_the_sensor_trigger_kwargs_at_their_defaults() -> None:
    trigger = SystemZeroDecisionTrigger(
        systemzero_conn_id="sz", request=REQUEST, condition=CONDITION, state="s", key_namespace="ns"
    )
    assert items(trigger) == [
        ("systemzero_conn_id", "sz"),
        ("request", REQUEST),
        ("condition", CONDITION_AS_SERIALIZED),
        ("state", "s"),
        ("source", None),
        ("key_namespace", "ns"),
        ("decision_mode", "on_change"),
        ("deadline", None),
        ("lease", True),
        ("lease_after", 5.0),
        ("min_interval_ms", None),
        ("max_staleness", DEFAULT_MAX_STALENESS),
    ]


def test_the_sensor_trigger_kwargs_all_set() -> None:
    trigger = SystemZeroDecisionTrigger(
        systemzero_conn_id="sz",
        request=REQUEST,
        condition=CONDITION,
        state=["a"],
        key_namespace="ns",
        source=SOURCE,
        decision_mode="on_request",
        deadline=1_900_000_000.5,
        lease=False,
        budget={"max_decisions": 3},
        lease_after=1.5,
        skip_states=["h1"],
        min_interval_ms=250,
        max_staleness=0.0,
        end_when_unmet=True,
        decide_when="(?i)ready",
        debounce_ms=100,
        decide_initial=False,
        allow_empty=True,
    )
    assert items(trigger) == [
        ("systemzero_conn_id", "sz"),
        ("request", REQUEST),
        ("condition", CONDITION_AS_SERIALIZED),
        ("state", ["a"]),
        ("source", SOURCE),
        ("key_namespace", "ns"),
        ("decision_mode", "on_request"),
        ("budget", {"max_decisions": 3}),
        ("deadline", 1_900_000_000.5),
        ("lease", False),
        ("lease_after", 1.5),
        ("skip_states", ["h1"]),
        ("end_when_unmet", True),
        ("min_interval_ms", 250),
        ("max_staleness", 0.0),
        ("allow_empty", True),
        ("decide_when", "(?i)ready"),
        ("debounce_ms", 100),
        ("decide_initial", False),
    ]


def test_the_decide_trigger_kwargs() -> None:
    bare = SystemZeroDecideTrigger(systemzero_conn_id="sz", request=REQUEST, state="s", key_namespace="ns")
    assert items(bare) == [
        ("systemzero_conn_id", "sz"),
        ("request", REQUEST),
        ("state", "s"),
        ("key_namespace", "ns"),
        ("idempotency_key", None),
        ("attachments", []),
        ("deadline", None),
    ]
    full = SystemZeroDecideTrigger(
        systemzero_conn_id="sz",
        request=REQUEST,
        state="s",
        key_namespace="ns",
        idempotency_key="k",
        attachments=[{"name": "a.txt", "data": "eA=="}],
        deadline=5.0,
        budget={"max_decisions": 1},
    )
    assert items(full)[4:] == [
        ("idempotency_key", "k"),
        ("attachments", [{"name": "a.txt", "data": "eA=="}]),
        ("deadline", 5.0),
        ("budget", {"max_decisions": 1}),
    ]


def test_the_asset_watcher_kwargs_are_its_identity() -> None:
    bare = SystemZeroDecisionEventTrigger(
        systemzero_conn_id="sz", request=REQUEST, condition=CONDITION, state="s", watch_id="w"
    )
    assert items(bare) == [
        ("systemzero_conn_id", "sz"),
        ("request", REQUEST),
        ("condition", CONDITION),
        ("state", "s"),
        ("watch_id", "w"),
        ("source", None),
        ("decision_mode", "on_change"),
        ("lease", True),
        ("lease_after", 5.0),
    ]
    full = SystemZeroDecisionEventTrigger(
        systemzero_conn_id="sz",
        request=REQUEST,
        condition=CONDITION,
        state="s",
        watch_id="w",
        source=SOURCE,
        decision_mode="on_request",
        lease=False,
        lease_after=0.5,
        max_staleness=1.0,
        decide_when={"callable": "pkg.mod.func"},
        debounce_ms=50,
        decide_initial=False,
    )
    assert items(full)[5:] == [
        ("source", SOURCE),
        ("decision_mode", "on_request"),
        ("lease", False),
        ("lease_after", 0.5),
        ("max_staleness", 1.0),
        ("decide_when", {"callable": "pkg.mod.func"}),
        ("debounce_ms", 50),
        ("decide_initial", False),
    ]
    classpath, kwargs = bare.serialize()
    assert SystemZeroDecisionEventTrigger.hash(classpath, kwargs) == SystemZeroDecisionEventTrigger.hash(
        *SystemZeroDecisionEventTrigger(**kwargs).serialize()
    )


def test_a_request_that_is_not_plain_json_is_refused_when_the_trigger_is_built() -> None:
    """The trigger keeps its request as JSON text: a value JSON cannot hold is refused at once,
    naming the request, not later in the triggerer."""
    request = {"model": "sz-test", "questions": {"ready": {"type": "boolean", "instructions": {"a", "b"}}}}
    with pytest.raises(SystemZeroArgumentError, match="request is not plain JSON") as refused:
        SystemZeroDecisionTrigger(
            systemzero_conn_id="sz", request=request, condition=CONDITION, state="s", key_namespace="ns"
        )
    assert refused.value.field == "request" and refused.value.code == "invalid_request"
