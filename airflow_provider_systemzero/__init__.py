"""Apache Airflow provider for the System Zero streaming decision API.

Importing this package is deliberately cheap: it pulls in neither Airflow, asyncio nor
websockets. ``__version__`` is resolved lazily from the installed distribution's metadata.
"""

from __future__ import annotations

from airflow_provider_systemzero.provider_info import get_provider_info

__all__ = ["__version__", "get_provider_info"]

_DIST_NAME = "airflow-provider-systemzero"
_FALLBACK_VERSION = "0.1.0"


def _read_version() -> str:
    # importlib.metadata costs tens of milliseconds to import, so it is only loaded on demand.
    from importlib import metadata

    try:
        return metadata.version(_DIST_NAME)
    except metadata.PackageNotFoundError:  # running from a source tree that is not installed
        return _FALLBACK_VERSION


def __getattr__(name: str) -> str:
    if name == "__version__":
        version = _read_version()
        globals()["__version__"] = version
        return version
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
