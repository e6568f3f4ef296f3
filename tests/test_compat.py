"""What each supported Airflow release gets, checked on the Airflow this suite runs against.

The matrix (``make test-matrix``) runs this file on Airflow 3.1, 3.2 and 3.3: every test states
what its release should do, so a fallback that stops working fails on the corner that needs it.
"""

from __future__ import annotations

import logging
from importlib import metadata
from typing import Any

import pytest

from airflow_provider_systemzero import compat
from airflow_provider_systemzero.provider_info import get_provider_info

CONNECTION = get_provider_info()["connection-types"][0]


def _installed_airflow() -> tuple[int, int]:
    major, minor = metadata.version("apache-airflow-core").split(".")[:2]
    return int(major), int(minor)


def test_version_detection_matches_the_installed_airflow() -> None:
    import airflow

    assert ".".join(map(str, compat.airflow_version())) == airflow.__version__.split("+")[0]
    assert compat.has_conn_fields() is (_installed_airflow() >= (3, 2))
    assert compat.has_awaiting_input() is (_installed_airflow() >= (3, 3))


def test_the_connection_form_is_complete_on_this_airflow() -> None:
    """The React UI's form (``/ui/connections/hook_meta``) on every release: from ``conn-fields``
    on 3.2+, from the hook's two methods on 3.1 — the same fields, labels and behaviour."""
    from airflow.api_fastapi.core_api.services.ui.connections import HookMetaService

    (meta,) = [m for m in HookMetaService.hook_meta_data() if m.connection_type == "systemzero"]
    shown = meta.model_dump()
    extra = shown["extra_fields"] or {}
    assert set(extra) == set(CONNECTION["conn-fields"])
    for name, field in CONNECTION["conn-fields"].items():
        assert extra[name]["schema"]["title"] == field["label"], name
    assert extra["open_timeout"]["value"] == 10
    # Only the declarative path carries the schema's bounds: 3.2+ must not fall back to the hook.
    declared = CONNECTION["conn-fields"]["open_timeout"]["schema"]["minimum"]
    assert (extra["open_timeout"]["schema"].get("minimum") == declared) is compat.has_conn_fields()
    behaviour = CONNECTION["ui-field-behaviour"]
    standard = shown["standard_fields"]
    assert standard["host"]["title"] == behaviour["relabeling"]["host"]
    assert standard["password"]["title"] == behaviour["relabeling"]["password"]
    assert standard["host"]["placeholder"] == behaviour["placeholders"]["host"]
    assert all(standard[name]["hidden"] for name in ("port", "login"))
    assert standard["url_schema"]["hidden"]


def test_the_hook_methods_mirror_the_provider_info() -> None:
    from airflow_provider_systemzero.hooks.systemzero import SystemZeroHook

    behaviour = SystemZeroHook.get_ui_field_behaviour()
    assert behaviour["hidden_fields"] == CONNECTION["ui-field-behaviour"]["hidden-fields"]
    assert behaviour["relabeling"] == CONNECTION["ui-field-behaviour"]["relabeling"]
    assert behaviour["placeholders"] == CONNECTION["ui-field-behaviour"]["placeholders"]


class _Store:
    def __init__(self) -> None:
        self.data: dict[str, Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def set(self, key: str, value: Any, **_: Any) -> None:
        self.data[key] = value


def _budget_warnings(caplog: pytest.LogCaptureFixture, context: dict[str, Any]) -> list[str]:
    from airflow_provider_systemzero.budget import TaskUsageLedger

    logger = logging.getLogger("tests.compat.budget")
    with caplog.at_level(logging.WARNING, logger=logger.name):
        TaskUsageLedger(context, max_decisions=2, task_label="'d.t'", logger=logger)
    return [r.getMessage() for r in caplog.records if r.name == logger.name]


def test_a_budget_without_a_task_state_store_says_it_covers_one_try(caplog: pytest.LogCaptureFixture) -> None:
    messages = _budget_warnings(caplog, {"ti": None})
    if compat.airflow_version()[:2] >= compat.AIRFLOW_TASK_STATE_STORE:
        # Airflow 3.3 hands every task a store; a bare context is a test double, not a notice-worthy release.
        assert messages == []
    else:
        (message,) = messages
        assert "no task state store" in message and "cover this try only" in message and "'d.t'" in message


def test_a_budget_with_a_task_state_store_gives_no_notice(caplog: pytest.LogCaptureFixture) -> None:
    assert _budget_warnings(caplog, {"ti": None, "task_state_store": _Store()}) == []


def test_has_task_state_store_reads_the_context() -> None:
    assert compat.has_task_state_store({"task_state_store": _Store()})
    assert not compat.has_task_state_store({"task_state_store": None})
    assert not compat.has_task_state_store({})
    assert not compat.has_task_state_store(None)
