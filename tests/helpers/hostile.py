"""Fixtures of the hostile-gateway suite: a hook whose connection points at a scripted gateway."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from airflow_provider_systemzero.hooks.systemzero import SystemZeroHook
from airflow_provider_systemzero.stream import Backoff
from tests.helpers.hostile_gateway import KEY, HostileGateway, Script

CONN_ID = "systemzero_hostile"


@pytest.fixture
def connect(monkeypatch: pytest.MonkeyPatch) -> Callable[..., SystemZeroHook]:
    """``connect(gateway, backoff=None)``: a hook whose connection (an environment variable, as a
    deployment would set it) points at ``gateway``, with a seeded backoff unless one is given."""
    monkeypatch.setenv("_AIRFLOW_PROCESS_CONTEXT", "server")

    def make(gateway: HostileGateway, *, backoff: Backoff | None = None, **extra: object) -> SystemZeroHook:
        monkeypatch.setenv(
            f"AIRFLOW_CONN_{CONN_ID.upper()}",
            json.dumps(
                {
                    "conn_type": "systemzero",
                    "host": gateway.origin,
                    "password": KEY,
                    "extra": {"model": "sz-test", "open_timeout": 5, **extra},
                }
            ),
        )
        return SystemZeroHook(CONN_ID, backoff=backoff or Backoff(base=0.05, cap=0.2, rng=random.Random(7)))

    return make


@pytest.fixture
def gateway() -> Iterator[Callable[..., HostileGateway]]:
    """``gateway(script)``: a started :class:`HostileGateway`, stopped after the test."""
    started: list[HostileGateway] = []

    def make(script: Script | None = None, **kwargs: object) -> HostileGateway:
        gw = HostileGateway(script, **kwargs)  # type: ignore[arg-type]
        started.append(gw.__enter__())
        return gw

    yield make
    for gw in started:
        gw.__exit__(None, None, None)


def decide_dag(dag_id: str, **kwargs: Any) -> Any:
    """A Dag of one ``SystemZeroDecideOperator`` (task ``decide``) asking ``ready`` about ``log\\n``
    on the hostile gateway's connection (``kwargs`` add or override arguments)."""
    import pendulum
    from airflow.sdk import DAG

    from airflow_provider_systemzero.operators.decide import SystemZeroDecideOperator

    arguments: dict[str, Any] = {
        "task_id": "decide",
        "systemzero_conn_id": CONN_ID,
        "state": "log\n",
        "questions": {"ready": "Is the job ready?"},
        "decision_timeout": 60,
    }
    with DAG(dag_id, schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")) as dag:
        SystemZeroDecideOperator(**(arguments | kwargs))
    return dag


def sensor_dag(dag_id: str, **kwargs: Any) -> Any:
    """A Dag of one ``SystemZeroDecisionSensor`` (task ``wait``) waiting for ``ready`` on the hostile
    gateway's connection (``kwargs`` add or override arguments: the state or source, the mode)."""
    import pendulum
    from airflow.sdk import DAG

    from airflow_provider_systemzero.sensors.decision import SystemZeroDecisionSensor

    arguments: dict[str, Any] = {
        "task_id": "wait",
        "systemzero_conn_id": CONN_ID,
        "model": "sz-test",
        "question": "ready",
        "instructions": "Is the job ready?",
    }
    with DAG(dag_id, schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")) as dag:
        SystemZeroDecisionSensor(**(arguments | kwargs))
    return dag
