"""The ``systemzero-emulator`` command, as a real process."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from airflow_provider_systemzero.emulator.cli import build_parser
from airflow_provider_systemzero.protocol import PROTOCOL
from tests.helpers.wire import close_of, recv, send, start_message, until_closed

READY = re.compile(
    r"System Zero emulator listening on (ws://127\.0\.0\.1:(\d+)) "
    r"\(stream path /v1/system-zero/stream\)\n\Z"
)


def command() -> list[str]:
    script = Path(sys.executable).parent / "systemzero-emulator"
    if script.exists():
        return [str(script)]
    found = shutil.which("systemzero-emulator")
    return [found] if found else [sys.executable, "-m", "airflow_provider_systemzero.emulator"]


@asynccontextmanager
async def emulator_process(
    *args: str, module: bool = False
) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    argv = [sys.executable, "-m", "airflow_provider_systemzero.emulator"] if module else command()
    process = await asyncio.create_subprocess_exec(
        *argv,
        "--port",
        "0",
        *args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(30):
            line = (await process.stdout.readline()).decode()
        match = READY.match(line)
        assert match, f"unexpected ready line {line!r}"
        yield process, match.group(1)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_sigterm_says_goodbye_and_closes_1012() -> None:
    async with emulator_process("--api-key", "demo", "--print-admin-token") as (process, origin):
        url = origin + "/v1/system-zero/stream"
        async with connect(
            url,
            subprotocols=[PROTOCOL],
            additional_headers={"Authorization": "Bearer demo"},
            compression=None,
        ) as ws:
            hello = await recv(ws)
            assert hello["limits"]["idle_timeout_ms"] == 120_000
            await send(ws, start_message())
            assert (await recv(ws))["type"] == "ack"
            process.send_signal(signal.SIGTERM)
            messages = await until_closed(ws, within=15)
        assert [(m["type"], m["reason"]) for m in messages] == [("goodbye", "shutdown")]
        assert messages[0]["resume"] == {
            "supported": False,
            "action": "reconnect_and_replay",
            "retry_after_ms": 500,
        }
        assert messages[0]["state_version"] == 1
        assert close_of(ws) == (1012, "shutdown")
        async with asyncio.timeout(15):
            assert await process.wait() == 0
        assert process.stdout is not None and process.stderr is not None
        assert await process.stdout.read() == b""  # exactly one line on stdout
        stderr = (await process.stderr.read()).decode()
        assert "admin token: " in stderr
        assert "Bearer demo" not in stderr


async def test_module_entry_point_sigint_and_limit_options() -> None:
    async with emulator_process(
        "--api-key",
        "k1:2",
        "--idle-timeout-ms",
        "300",
        "--decide-latency-ms",
        "10",
        "--decider",
        "keyword",
        module=True,
    ) as (process, origin):
        url = origin + "/v1/system-zero/stream"
        async with connect(
            url, subprotocols=[PROTOCOL], additional_headers={"Authorization": "Bearer k1"}, compression=None
        ) as ws:
            hello = await recv(ws)
            assert hello["limits"]["idle_timeout_ms"] == 300
            await send(ws, start_message())
            messages = await until_closed(ws)
            assert [m["type"] for m in messages] == ["ack", "goodbye"]
            assert close_of(ws) == (1000, "idle_timeout")
        process.send_signal(signal.SIGINT)
        async with asyncio.timeout(15):
            assert await process.wait() == 0


def test_parser_covers_every_limit_and_rejects_bad_keys(capsys: pytest.CaptureFixture[str]) -> None:
    from dataclasses import fields

    from airflow_provider_systemzero.protocol import Limits

    parser = build_parser()
    args = parser.parse_args(["--api-key", "demo:8", "--api-key", "other", "--max-message-bytes", "1024"])
    assert args.api_keys == [("demo", 8), ("other", 8)]
    assert args.limit_max_message_bytes == 1024
    options = set(re.findall(r"--[a-z0-9-]+", parser.format_help()))
    assert {"--" + f.name.replace("_", "-") for f in fields(Limits)} <= options
    with pytest.raises(SystemExit):
        parser.parse_args(["--api-key", "has space"])
    with pytest.raises(SystemExit):
        parser.parse_args(["--idle-timeout-ms", "-1"])
    assert "has space" not in capsys.readouterr().out
    assert parser.parse_args(["--api-key", "a:b:3"]).api_keys == [("a:b", 3)]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["--api-key", "demo:abc"],
            "argument --api-key: 'demo:abc' ends in ':abc', which is not a number: give KEY or "
            "KEY:MAX_CONCURRENT (such as demo:8; a key that holds a colon ends in its number too)",
        ),
        (["--api-key", "demo:"], "'demo:' ends in ':', which is not a number"),
        (["--idle-timeout-ms", "-1"], "argument --idle-timeout-ms: expected a non-negative integer, got -1"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_a_bad_argument_is_said_in_two_lines(
    capsys: pytest.CaptureFixture[str], argv: list[str], said: str
) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(argv)
    assert info.value.code == 2
    error = capsys.readouterr().err
    first, second = error.splitlines()  # the error and where to look, not the usage of every option
    assert first.startswith("systemzero-emulator: error: ") and said in first
    assert second == "run 'systemzero-emulator --help' for every option"
