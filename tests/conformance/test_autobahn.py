"""RFC 6455 as a suite this project did not write sees it: the Autobahn|Testsuite fuzzing server
against an echo client on :class:`~airflow_provider_systemzero.stream.gateway_socket.GatewaySocket`
and against the same echo on websockets' own asyncio client, on the oldest and the newest
websockets release the package allows, each pair in one run of the server.

The client is held to websockets' own: every case websockets' client passes (a verdict within
RFC 6455 for the exchange and for the close), the socket passes too. Which cases come out ``OK``
rather than ``NON-STRICT`` depends on how the server's frames fall into reads, so the counts
are shown, not compared. So are the durations of 9.7 and 9.8 (1,000 echoed text and binary
messages of 0 B to 128 KiB), as the run measured them: the timing itself is the benchmarks' job.
"""

from __future__ import annotations

import collections
import os
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.helpers.autobahn import (
    REPO,
    SUMMARY,
    FuzzingServer,
    Outcome,
    find_python27,
    fuzzing_server_env,
    results,
    websockets_env,
)
from tests.helpers.deployment.system import run_command

pytestmark = [pytest.mark.conformance, pytest.mark.timeout(1800)]


def _allowed_websockets(which: str) -> str:
    """The oldest websockets release the package allows (the lower bound in ``pyproject.toml``) or
    the newest (what ``constraints.txt``, resolved by ``make lock``, pins).

    :param which: ``oldest`` or ``newest``.
    """
    if which == "oldest":
        project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
        requirement = next(
            Requirement(d) for d in project["dependencies"] if Requirement(d).name == "websockets"
        )
        return next(spec.version for spec in requirement.specifier if spec.operator == ">=")
    constraints = REPO / "constraints.txt"
    if not constraints.is_file():
        pytest.skip(
            f"no {constraints} (a copy of the tests outside the checkout): run it from the repository"
        )
    pinned = re.search(r"^websockets==(\S+)$", constraints.read_text(), re.MULTILINE)
    assert pinned is not None, "constraints.txt pins no websockets release"
    return pinned.group(1)


@pytest.fixture(scope="module")
def fuzzing_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzingServer]:
    python27 = find_python27()
    if python27 is None:
        pytest.skip(
            "no Python 2.7 found (the Autobahn|Testsuite fuzzing server, autobahntestsuite 0.8.2, runs "
            "on nothing newer): looked for $PYTHON27, python2.7 on PATH and pyenv's versions; install "
            "one ('pyenv install 2.7.18') or set PYTHON27=/path/to/python2.7"
        )
    server = FuzzingServer(fuzzing_server_env(python27), tmp_path_factory.mktemp("autobahn"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _echo(python: Path, client: str, server: FuzzingServer, agent: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = run_command([str(python), "-m", "tests.conformance.echo", client, server.url, agent], env, 1200)
    SUMMARY.append(out.strip())


def _counts(outcomes: dict[str, Outcome]) -> str:
    behaviors = collections.Counter(outcome.behavior for outcome in outcomes.values())
    closes = collections.Counter(outcome.close for outcome in outcomes.values() if outcome.close != "OK")
    shown = ", ".join(f"{count} {verdict}" for verdict, count in behaviors.most_common())
    if closes:
        shown += "; close: " + ", ".join(f"{count} {verdict}" for verdict, count in closes.most_common())
    return shown


def _milliseconds(outcomes: dict[str, Outcome], prefix: str) -> int:
    return sum(outcome.duration_ms for case, outcome in outcomes.items() if case.startswith(prefix))


@pytest.mark.parametrize("which", ["oldest", "newest"], ids=lambda which: f"{which}-websockets")
def test_the_gateway_socket_passes_every_case_websockets_own_client_passes(
    fuzzing_server: FuzzingServer, which: str
) -> None:
    version = _allowed_websockets(which)
    python = websockets_env(version)
    ours, theirs = f"GatewaySocket on websockets {version}", f"websockets {version} asyncio client"
    _echo(python, "gateway", fuzzing_server, ours)
    _echo(python, "websockets", fuzzing_server, theirs)

    report = results(fuzzing_server.outdir)
    socket_outcomes, reference = report[ours], report[theirs]
    assert set(socket_outcomes) == set(reference) and len(reference) > 200, "both ran every case"
    for agent, outcomes in ((ours, socket_outcomes), (theirs, reference)):
        SUMMARY.append(
            f"{agent}: {_counts(outcomes)}; 9.7 {_milliseconds(outcomes, '9.7.')} ms, "
            f"9.8 {_milliseconds(outcomes, '9.8.')} ms"
        )
    worse = {
        case: (socket_outcomes[case], outcome)
        for case, outcome in reference.items()
        if outcome.passed and not socket_outcomes[case].passed
    }
    assert not worse, f"cases websockets' own client passes and the GatewaySocket does not: {worse}"
