"""Benchmarks of the provider against the gateway emulator over loopback (``make bench``).

Every scenario runs the real trigger, hook and stream code; the emulator runs in its own
process (:mod:`benchmarks.emulator_host`) so that the CPU, memory and event-loop numbers of the
measured process are its own. ``python -m benchmarks --help`` lists the options.

Importing this package gives the process a throwaway ``AIRFLOW_HOME`` (unless one is set) and
quiet logging, before anything imports Airflow, so a run never touches the developer's home.
"""

from __future__ import annotations

import os
import tempfile


def _isolate_airflow() -> None:
    if "AIRFLOW_HOME" not in os.environ:
        os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="systemzero-bench-airflow-")
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "False")
    # The triggerer logs every trigger start, event and decision at INFO; a benchmark keeps
    # warnings only, so the numbers do not depend on how fast a terminal renders log lines.
    os.environ.setdefault("AIRFLOW__LOGGING__LOGGING_LEVEL", "WARNING")


_isolate_airflow()
