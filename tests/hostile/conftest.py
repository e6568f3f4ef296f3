"""Fixtures of the hostile-gateway suite: a hook whose connection points at a scripted gateway."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator

import pytest

from airflow_provider_systemzero.hooks.systemzero import SystemZeroHook
from airflow_provider_systemzero.stream import Backoff
from tests.hostile.gateway import KEY, HostileGateway, Script

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
