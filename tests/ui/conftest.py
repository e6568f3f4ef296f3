"""The UI test runs only when asked for: ``make test-ui`` (``pytest -m ui tests/ui``). Under plain
``make test`` it is collected and skipped, with the reason shown.

It starts the emulator and real Airflow components (api-server, scheduler, dag-processor, one
triggerer: :class:`tests.helpers.deployment.harness.Deployment` with the Dags of ``tests/ui/dags``) and
Debian's Chromium, driven by Playwright. Both are installed when missing: ``chromium`` with
apt-get (as root), Playwright from PyPI with pip (``tests/ui/requirements.txt``); Playwright never
downloads a browser here, it launches ``/usr/bin/chromium``.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.deployment.harness import (
    Deployment,
    running,
    wait_for,
)
from tests.helpers.deployment.reporting import skip_unless_marked, with_logs_section, write_results
from tests.helpers.deployment.system import apt_install, ensure_python_packages
from tests.helpers.ui import TIMELINE_DAG_ID, UI_DAG_ID

HERE = Path(__file__).resolve().parent
CHROMIUM = Path("/usr/bin/chromium")
#: Chromium without anything that reaches out on its own; a fresh profile each run.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "ui: drives the Airflow UI in Chromium (run with make test-ui)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_unless_marked(config, items, "ui", "UI test: run it with 'make test-ui'")


@pytest.fixture(scope="module")
def ui_deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """The emulator (rules of ``emulator_rules.json``) and Airflow with one triggerer, the Test
    button enabled."""
    deployment = Deployment(
        tmp_path_factory.mktemp("airflow-ui"),
        parallelism=2,
        dags=HERE / "dags",
        dag_ids=(UI_DAG_ID, TIMELINE_DAG_ID),
        rules=HERE / "emulator_rules.json",
        triggerers=("triggerer",),
        extra_env={"AIRFLOW__CORE__TEST_CONNECTION": "Enabled"},
    )
    with running(deployment):
        yield deployment


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's Chromium under Playwright, headless, with a fresh profile."""
    if not CHROMIUM.exists():
        apt_install(["chromium", "fonts-liberation"])  # a font, for readable screenshots
    ensure_python_packages(HERE / "requirements.txt", ["playwright"])
    from playwright.sync_api import sync_playwright

    profile = Path(tempfile.mkdtemp(prefix="sz-ui-chromium-"))
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile),
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1000},
            timeout=120_000,
        )
        try:
            yield context
        finally:
            context.close()
            shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def page(browser: Any, ui_deployment: Deployment) -> Iterator[Any]:
    """A new tab on the deployment's UI, with generous timeouts (Airflow answers slowly on a busy machine)."""
    tab = browser.new_page()
    tab.set_default_timeout(60_000)
    tab.goto(ui_deployment.api + "/")
    wait_for(lambda: tab.title() != "", 60, "the UI to load")
    try:
        yield tab
    finally:
        tab.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
    return with_logs_section(item, (yield))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    write_results(terminalreporter, "UI scenarios", ui=True)
