"""scripts/rename_names.py renames a name only where it has the meaning being renamed, and a second
run changes nothing."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "rename_names.py"
PKG = "airflow_provider_systemzero"


def _script():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("rename_names", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_a_name_is_renamed_only_where_it_means_what_is_renamed(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            f"{PKG}/protocol/client_events.py": "class DecisionFailed:\n    pass\n",
            f"{PKG}/stream/exceptions.py": "class DecisionFailed(Exception):\n    pass\n",
            f"{PKG}/stream/decision_stream.py": (
                f"from {PKG}.protocol.client_events import DecisionFailed as DecisionFailedEvent\n"
                f"from {PKG}.stream.exceptions import DecisionFailed\n\n"
                "def gate(event: DecisionFailedEvent) -> DecisionFailed:\n    return DecisionFailed()\n"
            ),
            "tests/test_core.py": (
                f"from {PKG}.protocol.client_events import DecisionFailed\n\nEVENT = DecisionFailed\n"
                "session.dispatch_admission = None\n"
            ),
            "tests/test_stream.py": f"from {PKG}.stream import DecisionFailed\n\nERROR = DecisionFailed\n",
        },
    )
    script = _script()
    changed, notes = script.rename(tmp_path)
    assert not notes
    for path, text in changed.items():
        path.write_text(text, encoding="utf-8")
    read = {name: (tmp_path / name).read_text() for name in ("tests/test_core.py", "tests/test_stream.py")}
    assert "class DecisionFailedEvent:" in (tmp_path / f"{PKG}/protocol/client_events.py").read_text()
    assert "class DecisionFailed(Exception)" in (tmp_path / f"{PKG}/stream/exceptions.py").read_text()
    stream = (tmp_path / f"{PKG}/stream/decision_stream.py").read_text()
    assert "import DecisionFailedEvent\n" in stream and "-> DecisionFailed:" in stream
    assert "EVENT = DecisionFailedEvent" in read["tests/test_core.py"]
    assert "dispatch_admission = None" in read["tests/test_core.py"]
    assert "ERROR = DecisionFailed\n" in read["tests/test_stream.py"]
    assert script.rename(tmp_path) == ({}, [])  # a second run changes nothing
