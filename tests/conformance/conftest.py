"""The conformance test runs only when asked for: ``make test-conformance`` (``pytest -m
conformance tests/conformance``). Under plain ``make test`` it is collected and skipped, with the
reason shown; where no Python 2.7 is found it is skipped with what to install."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.autobahn import SUMMARY
from tests.helpers.deployment.reporting import skip_unless_marked


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "conformance: the Autobahn|Testsuite RFC 6455 run (run with make test-conformance)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_unless_marked(
        config, items, "conformance", "RFC 6455 conformance: run it with 'make test-conformance'"
    )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if SUMMARY:
        terminalreporter.section("Autobahn|Testsuite")
        for line in SUMMARY:
            terminalreporter.write_line(line)
