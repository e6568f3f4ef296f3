"""Packaging checks: provider metadata, entry points and import cost.

None of these tests import Airflow in the test process; the installed schemas are read as
files, located without executing ``airflow/__init__.py``.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import jsonschema
import pytest

import airflow_provider_systemzero
from airflow_provider_systemzero import get_provider_info

DIST_NAME = "airflow-provider-systemzero"
HEAVY_MODULES = ("asyncio", "websockets", "airflow")


def _airflow_package_dir() -> Path:
    spec = importlib.util.find_spec("airflow")  # does not run airflow/__init__.py
    assert spec is not None and spec.submodule_search_locations, "apache-airflow is not installed"
    for location in spec.submodule_search_locations:
        if (Path(location) / "provider_info.schema.json").is_file():
            return Path(location)
    pytest.fail("provider_info.schema.json not found in the installed airflow package")


def _load_schema(name: str) -> dict:
    path = _airflow_package_dir() / name
    if not path.is_file():
        pytest.skip(f"{name} is not shipped by the installed Airflow")
    return json.loads(path.read_text(encoding="utf-8"))


def _validate(instance: object, schema: dict) -> None:
    validator_cls = jsonschema.validators.validator_for(schema)
    validator_cls.check_schema(schema)
    errors = sorted(validator_cls(schema).iter_errors(instance), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)


def test_provider_info_matches_runtime_schema():
    _validate(get_provider_info(), _load_schema("provider_info.schema.json"))


def test_connection_form_matches_provider_yaml_schema():
    # The runtime schema does not describe conn-fields / ui-field-behaviour; the stricter
    # provider.yaml schema does, and ProvidersManager reads them in that shape.
    schema = _load_schema("provider.yaml.schema.json")
    _validate(get_provider_info()["connection-types"], schema["properties"]["connection-types"])


def test_ui_field_behaviour_matches_form_behaviour_schema():
    # ProvidersManager converts the kebab-case keys, then validates with this schema.
    behaviour = get_provider_info()["connection-types"][0]["ui-field-behaviour"]
    converted = {
        "hidden_fields": behaviour.get("hidden-fields", []),
        "relabeling": behaviour.get("relabeling", {}),
        "placeholders": behaviour.get("placeholders", {}),
    }
    _validate(converted, _load_schema("customized_form_field_behaviours.schema.json"))


def test_connection_type_declaration():
    info = get_provider_info()
    (conn,) = info["connection-types"]
    assert conn["connection-type"] == "systemzero"
    assert conn["hook-class-name"] == "airflow_provider_systemzero.hooks.systemzero.SystemZeroHook"
    assert conn["hook-name"] == "System Zero"
    assert set(conn["ui-field-behaviour"]["hidden-fields"]) == {"login", "schema"}
    assert conn["ui-field-behaviour"]["relabeling"] == {
        "host": "API origin",
        "password": "API key",
        "port": "Port (store it: the Test button needs one)",
    }
    fields = conn["conn-fields"]
    assert set(fields) == {
        "model",
        "prompt_cache_key_prefix",
        "open_timeout",
        "ca_bundle",
        "client_cert",
        "client_key",
        "proxy",
        "budget_decisions_per_hour",
        "budget_input_tokens_per_hour",
    }
    for name, field in fields.items():
        assert field["label"] and field["description"], name
    assert fields["open_timeout"]["schema"]["exclusiveMinimum"] == 0  # as the hook: any positive number
    assert fields["open_timeout"]["schema"]["default"] == 10
    # Airflow marks a field sensitive when its format is "password"; the API key lives in the
    # connection password instead, so no extra field should be sensitive.
    assert all(field["schema"].get("format") != "password" for field in fields.values())


def test_module_references_are_in_package():
    info = get_provider_info()
    modules = [
        m
        for kind in ("hooks", "operators", "sensors", "triggers")
        for e in info[kind]
        for m in e["python-modules"]
    ]
    assert modules == [
        "airflow_provider_systemzero.hooks.systemzero",
        "airflow_provider_systemzero.operators.decide",
        "airflow_provider_systemzero.operators.branch",
        "airflow_provider_systemzero.sensors.decision",
        "airflow_provider_systemzero.triggers.decision",
    ]
    integrations = {i["integration-name"] for i in info["integrations"]}
    for kind in ("hooks", "operators", "sensors", "triggers"):
        assert {e["integration-name"] for e in info[kind]} <= integrations


def test_package_name_matches_distribution():
    dist = metadata.distribution(DIST_NAME)
    assert get_provider_info()["package-name"] == dist.metadata["Name"]
    assert dist.version in get_provider_info()["versions"]
    assert airflow_provider_systemzero.__version__ == dist.version


def test_entry_point_resolves_to_get_provider_info():
    eps = [
        ep
        for ep in metadata.entry_points(group="apache_airflow_provider")
        if ep.dist is not None and ep.dist.metadata["Name"] == DIST_NAME
    ]
    assert len(eps) == 1, eps
    assert eps[0].value == "airflow_provider_systemzero:get_provider_info"
    assert eps[0].load() is get_provider_info


def test_console_script_declared():
    (ep,) = [
        ep
        for ep in metadata.entry_points(group="console_scripts", name="systemzero-emulator")
        if ep.dist is not None and ep.dist.metadata["Name"] == DIST_NAME
    ]
    assert ep.value == "airflow_provider_systemzero.emulator.cli:main"


def test_py_typed_marker_present():
    assert (Path(airflow_provider_systemzero.__file__).parent / "py.typed").is_file()


def _heavy_modules_after_import(module: str) -> list[str]:
    code = (
        "import sys\n"
        f"import {module}\n"
        f"heavy = {HEAVY_MODULES!r}\n"
        "print('\\n'.join(sorted(m for m in sys.modules if m.split('.')[0] in heavy)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_package_import_is_light():
    assert _heavy_modules_after_import("airflow_provider_systemzero") == []


@pytest.mark.skipif(
    importlib.util.find_spec("airflow_provider_systemzero.protocol") is None,
    reason="airflow_provider_systemzero.protocol does not exist yet",
)
def test_protocol_import_is_light():
    assert _heavy_modules_after_import("airflow_provider_systemzero.protocol") == []
