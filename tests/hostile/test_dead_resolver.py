"""Deadlines hold with a dead resolver, and name resolution takes no thread of the loop's executor.

The client runs in a network namespace and a mount namespace of its own, where
``/etc/resolv.conf`` names ``127.0.0.1`` and a UDP socket there reads every query and answers
none: ``getaddrinfo`` meets exactly what it meets when the DNS server is down (glibc's defaults,
5 s per attempt, two attempts). The scenarios are in :mod:`tests.hostile.dead_resolver`.

Before, ``decide(timeout=2)`` took 10 s: the cancelled opening left ``getaddrinfo`` running on
the loop's default executor, and ``asyncio.run`` waited for it at exit. In a triggerer such
streams filled that executor, so another trigger's ``asyncio.to_thread`` waited seconds.

Skipped, with the reason, where the machine refuses the namespaces (``unshare``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Room for a loaded machine (the lookups it bounds take 10 s: glibc's 5 s, twice).
SLACK = 3.5


def _run_without_dns(scenario: str, tmp_path: Path) -> dict[str, Any]:
    for tool in ("unshare", "ip", "mount"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed: no network namespace with a dead resolver here")
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.1\n")
    command = (
        f"ip link set lo up && mount --bind {resolv} /etc/resolv.conf && "
        f"exec {sys.executable} -m tests.hostile.dead_resolver {scenario}"
    )
    done = subprocess.run(
        ["unshare", "--net", "--mount", "--map-root-user", "sh", "-c", command],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
    )
    if done.returncode != 0 and not done.stdout.strip():
        if "unshare" in done.stderr or "mount" in done.stderr or "Operation not permitted" in done.stderr:
            pytest.skip(f"network and mount namespaces are refused here: {done.stderr.strip()[-300:]}")
        raise AssertionError(f"the scenario failed: {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_hook_decide_timeout_holds_when_dns_does_not_answer(tmp_path: Path) -> None:
    """Each attempt ends at ``open_timeout`` (1 s) naming the name that did not resolve, and the
    decide at its own timeout (3 s)."""
    result = _run_without_dns("decide", tmp_path)
    assert result["queries"] > 0  # the name went to the dead resolver
    assert result["error"] and result["error"].startswith("DeadlineExceeded"), result
    assert "cannot resolve host 'gateway.example.com'" in result["error"], result
    assert result["seconds"] < 3 + SLACK, f"decide(timeout=3) took {result['seconds']:.1f} s"


def test_streams_resolving_a_dead_name_leave_the_loops_executor_free(tmp_path: Path) -> None:
    result = _run_without_dns("triggerer", tmp_path)
    assert result["queries"] > 0
    assert result["outcomes"] == ["DeadlineExceeded"], result
    assert result["to_thread_waited"] < 2.0, (
        f"another trigger's to_thread waited {result['to_thread_waited']:.1f} s"
    )
