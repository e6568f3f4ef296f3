"""The deployment test runs only when asked for: ``make test-deployment`` (``pytest -m deployment
tests/deployment``). Under plain ``make test`` it is collected and skipped, with the reason shown.

``SZ_DEPLOYMENT_DB=postgres`` (``make test-deployment DEPLOYMENT_DB=postgres``) runs it on a
PostgreSQL cluster of its own instead of SQLite.

It starts the emulator and real Airflow components (see :mod:`tests.helpers.deployment.harness`) once
for the module; the component logs of a failed scenario are attached to its report, and a
summary of what each scenario measured is printed at the end of the run.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers.deployment.harness import (
    Deployment,
    database,
    running,
)
from tests.helpers.deployment.reporting import skip_unless_marked, with_logs_section, write_results


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "deployment: end-to-end test against real Airflow components (run with make test-deployment)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_unless_marked(config, items, "deployment", "deployment test: run it with 'make test-deployment'")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """The emulator, ``airflow db migrate``, api-server, scheduler, dag-processor and two triggerers."""
    with running(
        Deployment(tmp_path_factory.mktemp("airflow-deployment"), database=database())
    ) as deployment:
        yield deployment


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
    return with_logs_section(item, (yield))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    write_results(terminalreporter, "deployment scenarios", ui=False)
