"""The package's modules, by dotted name, as the tests that read the package's source find them."""

from __future__ import annotations

from pathlib import Path

import airflow_provider_systemzero

PACKAGE = "airflow_provider_systemzero"
#: The package's directory.
ROOT = Path(airflow_provider_systemzero.__file__).parent


def module_name(path: Path) -> str:
    """The dotted name of the package's module at ``path``.

    :param path: a ``.py`` file under :data:`ROOT`.
    """
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


#: Every module of the package: its dotted name and its file.
MODULES = {module_name(path): path for path in sorted(ROOT.rglob("*.py"))}
