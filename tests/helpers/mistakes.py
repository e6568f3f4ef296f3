"""Fixtures for the mistakes a new DAG author makes: a rules emulator, a port nothing listens on,
and the text a failed run printed (what the author reads)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pendulum
import pytest

from tests.helpers import READY_RULES, rules_emulator

RULES = READY_RULES
KEY = "mistakes-key"
CONN = "sz_mistakes"
START = pendulum.datetime(2026, 1, 1, tz="UTC")


@pytest.fixture(scope="package")
def emulator(airflow_db: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A running emulator and the connection ``sz_mistakes`` to it (model ``sz-test``)."""
    with rules_emulator(RULES, tmp_path_factory.mktemp("rules"), KEY, CONN, model="sz-test") as emu:
        yield emu


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port nothing listens on (the gateway is not running). The port stays bound, not
    listening, for the whole test, so a connection is refused and no other process (another
    test worker's server) can take the port meanwhile."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


def emulator_port(emu: Any) -> int:
    """The emulator's port."""
    return int(emu.origin.rsplit(":", 1)[1])


def env_connection(
    monkeypatch: pytest.MonkeyPatch, conn_id: str, host: str, key: str = KEY, **extra: Any
) -> None:
    """A ``systemzero`` connection in the environment (what the hook outside a task reads)."""
    import json

    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}",
        json.dumps({"conn_type": "systemzero", "host": host, "password": key, "extra": extra}),
    )
