"""Benchmarks of the provider against the gateway emulator over loopback (``make bench``).

Every scenario runs the real trigger, hook and stream code; the emulator runs in its own
process (:mod:`benchmarks.emulator_host`) so that the CPU, memory and event-loop numbers of the
measured process are its own. ``python -m benchmarks --help`` lists the options.

Importing this package gives the process a throwaway ``AIRFLOW_HOME`` (unless one is set; it is
removed on exit) and quiet logging, before anything imports Airflow, so a run never touches the
developer's home.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile


def _isolate_airflow() -> None:
    if "AIRFLOW_HOME" not in os.environ:
        # child processes inherit it; the process that made it removes it on exit
        home = tempfile.mkdtemp(prefix="systemzero-bench-airflow-")
        os.environ["AIRFLOW_HOME"] = home
        atexit.register(shutil.rmtree, home, ignore_errors=True)
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "False")
    # The triggerer logs every trigger start, event and decision at INFO; a benchmark keeps
    # warnings only, so the numbers do not depend on how fast a terminal renders log lines.
    os.environ.setdefault("AIRFLOW__LOGGING__LOGGING_LEVEL", "WARNING")


_isolate_airflow()
