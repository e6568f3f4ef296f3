"""How the stream speaks about network failures (when, and in which words), and the emulator's
own log level: the pure checks on top of the end-to-end mistakes."""

from __future__ import annotations

import logging
import socket
import ssl
from typing import Any

import pytest

from airflow_provider_systemzero.emulator.cli import build_parser
from airflow_provider_systemzero.hooks.systemzero import SystemZeroHook
from airflow_provider_systemzero.stream.diagnosis import (
    WARN_EVERY,
    NetworkFailures,
    describe_connection_error,
)
from tests.helpers.mistakes import env_connection

URL = "ws://127.0.0.1:8765/v1/system-zero/stream"


def _refused() -> OSError:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError as exc:
        return exc
    raise AssertionError("a closed port accepted a connection")


def test_network_failures_are_warned_first_on_a_new_cause_and_every_nth_repeat(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failures = NetworkFailures(URL)
    refused = _refused()
    with caplog.at_level(logging.INFO, logger="airflow_provider_systemzero"):
        for _ in range(WARN_EVERY + 1):
            failures.record(refused)
        failures.record(TimeoutError())  # the cause changed
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 3
    assert "is the gateway (or `systemzero-emulator`) running on port 8765?" in warnings[0]
    assert f"the same failure {WARN_EVERY + 1} times in a row" in warnings[1]
    assert "did not complete the opening handshake" in warnings[2] and URL in warnings[2]
    assert failures.give_up() is None  # a timeout once: something may be there, keep trying


@pytest.mark.parametrize(
    ("error", "url", "says"),
    [
        (
            ConnectionResetError(),
            "wss://127.0.0.1:8765/v1/system-zero/stream",
            "port 8765 speaks plaintext, as the local emulator does; set the connection's host to ws://127.0.0.1:8765",
        ),
        (
            ConnectionRefusedError(111, "Connect call failed"),
            "wss://api.example.com/v1/system-zero/stream",
            "nothing listens on api.example.com:443",
        ),
        (
            socket.gaierror(-2, "Name or service not known"),
            "wss://api.exampel.com/v1/system-zero/stream",
            "cannot resolve host 'api.exampel.com'",
        ),
        (
            ssl.SSLCertVerificationError(1, "certificate verify failed"),
            "wss://gw.example/v1/system-zero/stream",
            "set the connection's ca_bundle extra",
        ),
    ],
)
def test_each_cause_has_its_fix(error: BaseException, url: str, says: str) -> None:
    assert says in describe_connection_error(error, url)


@pytest.mark.parametrize(
    ("error", "says"),
    [
        (
            ConnectionRefusedError(111, "Connect call failed"),
            "connection to the proxy http://proxy.corp:3128 refused on the way to",
        ),
        (socket.gaierror(-2, "Name or service not known"), "cannot resolve the proxy's host 'proxy.corp'"),
    ],
)
def test_a_failure_to_reach_the_proxy_is_named_as_the_proxys(error: BaseException, says: str) -> None:
    text = describe_connection_error(
        error, "wss://api.example.com/v1/system-zero/stream", proxy="http://user:s3cret@proxy.corp:3128"
    )
    assert says in text and "check the connection's proxy extra" in text
    assert "s3cret" not in text and "user" not in text


def test_a_dead_proxy_is_blamed_not_the_running_gateway(
    emulator: Any, monkeypatch: pytest.MonkeyPatch, closed_port: int
) -> None:
    port = closed_port
    env_connection(
        monkeypatch, "sz_wording_proxy", emulator.origin, proxy=f"http://user:s3cret@127.0.0.1:{port}"
    )
    ok, message = SystemZeroHook("sz_wording_proxy").test_connection()
    assert not ok
    assert (
        f"connection to the proxy http://127.0.0.1:{port} refused on the way to {emulator.origin}" in message
    )
    assert "s3cret" not in message and "gateway (or" not in message


def test_the_emulator_logs_at_info_by_default(
    emulator: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert "default INFO" in build_parser().format_help()
    assert build_parser().parse_args([]).log_level == "INFO"
    env_connection(monkeypatch, "sz_wording_ok", emulator.origin)
    env_connection(monkeypatch, "sz_wording_bad", emulator.origin, "wrong-key")
    with caplog.at_level(logging.INFO, logger="airflow_provider_systemzero.emulator"):
        assert SystemZeroHook("sz_wording_ok").test_connection()[0]
        assert not SystemZeroHook("sz_wording_bad").test_connection()[0]
    said = [r.getMessage() for r in caplog.records if r.name == "airflow_provider_systemzero.emulator.server"]
    assert any(" opened (account " in line for line in said)
    assert any(" closed with 1000" in line for line in said)
    assert any("upgrade refused with HTTP 401 (invalid_api_key)" in line for line in said)


def test_a_loopback_origin_that_never_answered_is_given_up_on_time(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_systemzero.stream import diagnosis

    now = [100.0]
    monkeypatch.setattr(diagnosis.time, "monotonic", lambda: now[0])
    refused = _refused()
    local, remote, reached = (
        NetworkFailures(URL),
        NetworkFailures("wss://gw.example/v1/system-zero/stream"),
        NetworkFailures(URL),
    )
    reached.answered()  # it reached the gateway once: a later outage is a restart, waited out
    for failures in (local, remote, reached):
        for _ in range(diagnosis.LOOPBACK_GIVE_UP_ATTEMPTS):
            failures.record(refused)
    now[0] += 2.0
    assert local.give_up() is None  # 2 s: a local gateway may still be starting
    assert local.bound_delay(30.0) == pytest.approx(diagnosis.LOOPBACK_GIVE_UP_SECONDS - 2.0)  # no 30 s sleep
    assert remote.bound_delay(30.0) == 30.0 and reached.bound_delay(30.0) == 30.0
    now[0] += diagnosis.LOOPBACK_GIVE_UP_SECONDS
    error = local.give_up()
    assert error is not None and "is the gateway (or `systemzero-emulator`) running on port 8765?" in str(
        error
    )
    assert remote.give_up() is None and reached.give_up() is None


@pytest.mark.parametrize(
    ("errors", "why"),
    [
        ([ConnectionRefusedError(111, "Connect call failed")], "nothing listens there"),
        ([ConnectionResetError()], "the port speaks plaintext, not TLS"),
        (
            [ConnectionRefusedError(111, "Connect call failed"), ConnectionResetError()],
            "nothing listens there, or the port speaks plaintext, not TLS",
        ),
    ],
)
def test_giving_up_on_a_loopback_origin_says_the_cause_it_diagnosed(
    monkeypatch: pytest.MonkeyPatch, errors: list[BaseException], why: str
) -> None:
    from airflow_provider_systemzero.stream import diagnosis

    now = [100.0]
    monkeypatch.setattr(diagnosis.time, "monotonic", lambda: now[0])
    failures = NetworkFailures("wss://127.0.0.1:8765/v1/system-zero/stream")
    for attempt in range(diagnosis.LOOPBACK_GIVE_UP_ATTEMPTS):
        failures.record(errors[attempt % len(errors)])
    now[0] += diagnosis.LOOPBACK_GIVE_UP_SECONDS
    error = failures.give_up()
    assert error is not None
    assert str(error).endswith(
        f"(every attempt since the stream started failed so, {diagnosis.LOOPBACK_GIVE_UP_ATTEMPTS} in "
        f"{diagnosis.LOOPBACK_GIVE_UP_SECONDS:.0f} s: {why}, so the stream stops retrying)"
    ), str(error)
