"""Deadlines hold with a dead resolver, and name resolution takes no thread of the loop's executor.

The client runs in a network namespace and a mount namespace of its own, where
``/etc/resolv.conf`` names ``127.0.0.1`` and a UDP socket there reads every query and answers
none: ``getaddrinfo`` meets exactly what it meets when the DNS server is down (glibc's defaults,
5 s per attempt, two attempts). The scenarios are in :mod:`tests.helpers.dead_resolver`.

Before, ``decide(timeout=2)`` took 10 s: the cancelled opening left ``getaddrinfo`` running on
the loop's default executor, and ``asyncio.run`` waited for it at exit. In a triggerer such
streams filled that executor, so another trigger's ``asyncio.to_thread`` waited seconds.

Skipped, with the reason, where the machine refuses the namespaces (``unshare``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.helpers import run_in_network_namespace

#: Room for a loaded machine (the lookups it bounds take 10 s: glibc's 5 s, twice).
SLACK = 3.5


def _run_without_dns(scenario: str, tmp_path: Path) -> dict[str, Any]:
    return run_in_network_namespace(tmp_path, "tests.helpers.dead_resolver", arguments=scenario)


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
