"""Test-wide setup: an isolated AIRFLOW_HOME with a real SQLite metadata DB.

The environment is set before anything imports Airflow, so every test process uses a throwaway
home and never the developer's own.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
_HOME = Path(tempfile.mkdtemp(prefix="systemzero-airflow-home-"))
os.environ["AIRFLOW_HOME"] = str(_HOME)
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(REPO / "example_dags")
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "False")
os.environ["AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE"] = "True"
os.environ["AIRFLOW__LOGGING__LOGGING_LEVEL"] = os.environ.get("AIRFLOW__LOGGING__LOGGING_LEVEL", "INFO")


@pytest.fixture(autouse=True)
def _reset_default_capacity() -> Iterator[None]:
    """Every test starts and ends with the document's process-wide cap (4 streams) and no cap a
    gateway advertised."""
    from airflow_provider_systemzero.stream import default_capacity

    default_capacity().set_limit(4)
    yield
    default_capacity().set_limit(4)


@pytest.fixture(scope="session")
def airflow_home() -> Path:
    """The throwaway AIRFLOW_HOME of this test run."""
    return _HOME


@pytest.fixture(scope="session")
def airflow_db(airflow_home: Path) -> Iterator[None]:
    """A migrated SQLite metadata DB (``airflow db reset``), once per test run."""
    from airflow.utils import db

    db.resetdb(skip_init=False)
    yield
