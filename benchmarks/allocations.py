"""Who holds the memory of a waiting trigger: tracemalloc's allocations charged to an owner.

Each allocation is charged to the innermost frame of its call stack under one of the owners'
directories: the provider, Airflow's trigger runner (with greenback, OpenTelemetry and structlog,
which it uses per trigger), the benchmark's push source, or the benchmark harness. Used by
:func:`benchmarks.density.breakdown`.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["charge"]


def _owners() -> list[tuple[str, str]]:
    """Path prefix → owner, for charging an allocation to the innermost frame under one of them.

    ``benchmarks/runner.py`` stands in for the triggerer (it decodes each trigger's kwargs from
    JSON and keeps the runner's record of it), so it is charged to Airflow's trigger runner;
    ``benchmarks/fixtures.py`` is the push source; the rest of ``benchmarks/`` is the harness.
    """
    import airflow
    import greenback
    import opentelemetry
    import structlog

    import airflow_provider_systemzero
    import benchmarks
    from benchmarks import fixtures, runner

    trigger_runner = "Airflow trigger runner (with the trigger's decoded kwargs)"
    owners: list[tuple[Any, str]] = [
        (airflow_provider_systemzero, "provider"),
        (airflow, trigger_runner),
        (greenback, trigger_runner),
        (opentelemetry, trigger_runner),
        (structlog, trigger_runner),
    ]
    # __path__, not __file__: opentelemetry is a namespace package
    prefixes = [
        (os.path.abspath(path) + os.sep, owner) for module, owner in owners for path in module.__path__
    ]
    prefixes += [
        (os.path.abspath(runner.__file__), trigger_runner),
        (os.path.abspath(fixtures.__file__), "benchmark source (its push generator)"),
    ]
    prefixes += [(os.path.abspath(path) + os.sep, "benchmark harness") for path in benchmarks.__path__]
    return prefixes


def _owner(traceback: Any, owners: list[tuple[str, str]]) -> str:
    for frame in reversed(traceback):  # innermost first
        for directory, owner in owners:
            if frame.filename.startswith(directory):
                return owner
    return "other"


def charge(snapshot: Any) -> tuple[dict[str, int], dict[str, int]]:
    """Bytes still allocated by owner, and by allocation site within the provider."""
    directories = _owners()
    provider = directories[0][0]  # the provider package is listed first, as a directory
    owners: dict[str, int] = {}
    sites: dict[str, int] = {}
    for stat in snapshot.statistics("traceback"):  # one entry per distinct call stack
        owner = _owner(stat.traceback, directories)
        owners[owner] = owners.get(owner, 0) + stat.size
        if owner == "provider":
            frame = next(f for f in reversed(stat.traceback) if f.filename.startswith(provider))
            site = f"{frame.filename[len(provider) :]}:{frame.lineno}"
            sites[site] = sites.get(site, 0) + stat.size
    return owners, sites
