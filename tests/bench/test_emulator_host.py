"""The emulator host's collector and frame-timing commands, against a real host process (no timing
target asserted: only what the figures are made of)."""

from __future__ import annotations

import time

import pytest

from benchmarks.emulator_host import EmulatorProcess


async def test_the_host_freezes_what_it_holds_and_reports_its_collector_pauses_since_a_moment() -> None:
    async with EmulatorProcess() as emulator:
        before_freeze = time.perf_counter()
        frozen = await emulator.call("freeze")
        assert frozen["frozen"] > 10_000  # the emulator and its imports, moved out of the collector's view
        pauses = await emulator.call("collections", since=0.0)
        assert all(len(pause) == 3 and pause[1] >= 1.0 and pause[2] in (0, 1, 2) for pause in pauses)
        # "since" is the parent's perf_counter(): the same monotonic clock in both processes
        assert all(
            start >= before_freeze for start, _, _ in await emulator.call("collections", since=before_freeze)
        )
        assert await emulator.call("collections", since=time.perf_counter() + 3600) == []


async def test_the_host_times_each_frame_its_streams_handle_once_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow_provider_systemzero.hooks.systemzero import SystemZeroHook
    from benchmarks.fixtures import CONN_ID, REQUEST

    async with EmulatorProcess() as emulator:
        for name, value in emulator.connection_env().items():
            monkeypatch.setenv(name, value)
        async with SystemZeroHook(CONN_ID).stream(REQUEST, state="a\n") as stream:
            decisions = stream.decisions().__aiter__()
            await decisions.__anext__()
            assert await emulator.call("frames", since=0.0) == []  # the start went by untimed
            assert await emulator.call("time_frames") is True
            assert await emulator.call("time_frames") is True  # asked twice: still one timer
            before = time.perf_counter()
            await stream.append_text("b\n")
            await decisions.__anext__()
            after = time.perf_counter()
        frames = await emulator.call("frames", since=before)
        answered = time.perf_counter()
        # The append alone, timed in the host on the parent's clock: it starts after the parent
        # sent it and before the reply came back. Its callback may still be running when the
        # reply arrives (the reply is written inside it), but it has returned before the host
        # answers the next command, which its event loop handles after it.
        (start, wall_ms, cpu_ms), *later = frames
        assert before <= start <= after and all(frame[0] > after for frame in later)
        assert cpu_ms > 0 and wall_ms > 0 and start + wall_ms / 1000 <= answered
        assert await emulator.call("frames", since=0.0) == []  # handed over once, then forgotten
