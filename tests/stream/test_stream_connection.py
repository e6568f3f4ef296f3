"""Serving a connection from the transport's callbacks (``stream/stream_connection.py``): what
happens at the edges of that, where no task of the stream's is there to catch it.

An upgrade answered in the very loop turn in which ``open_timeout`` ends the opening leaves no
half-adopted connection behind; and a failure inside a writer's turn run by a callback or a
timer — a bug — fails the stream, as it would have failed the task that used to serve it,
instead of being logged by the event loop and forgotten.
"""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_systemzero.stream import Backoff
from tests.helpers import until
from tests.helpers.stream import EmulatorFactory, loopback_stream


async def test_an_upgrade_answered_as_its_opening_times_out_is_let_go_and_the_next_one_serves(
    make_emulator: EmulatorFactory, fast_backoff: Backoff, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The upgrade's answer (and its ``hello``) may reach the stream in the very loop turn in which
    ``open_timeout`` ends the opening: the stream lets go of that socket as of any lost connection
    (the session replays on the next one) rather than keeping it as its connection."""
    from airflow_provider_systemzero.stream import stream_connection

    real_open = stream_connection.open_socket
    attempts: list[Any] = []

    async def open_then_time_out(*args: Any, **kwargs: Any) -> Any:
        socket = await real_open(*args, **kwargs)
        attempts.append(socket)
        if len(attempts) == 1:  # answered, adopted, and the timeout fires all the same
            socket.abort()
            raise TimeoutError("timed out during opening handshake")
        return socket

    monkeypatch.setattr(stream_connection, "open_socket", open_then_time_out)
    emu = await make_emulator()
    async with loopback_stream(emu, fast_backoff, "answered-as-timed-out") as stream:
        decision = await stream.decide(timeout=10)
        assert stream.connection is not None and stream.connection.socket is attempts[-1]
        assert len(attempts) == 2
        assert [r.reason for r in stream.reconnects] == ["network"]
    assert decision.state_version == stream.state_version


async def test_a_failure_in_a_writers_turn_run_by_a_timer_fails_the_stream(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    emu = await make_emulator()
    stream = loopback_stream(emu, fast_backoff, "a-turn-that-fails")
    async with stream:

        def broken(now: float) -> list[str]:
            raise RuntimeError("a bug in the writer's turn")

        stream.session.data_to_send = broken  # type: ignore[method-assign]
        assert stream.connection is not None
        stream.connection.kick()  # a turn run by the loop, as a timer or a callback runs one
        await until(lambda: stream.failure is not None, 10, what="the stream to fail")
        assert isinstance(stream.failure, RuntimeError) and "a bug" in str(stream.failure)
        with pytest.raises(RuntimeError, match="a bug in the writer's turn"):
            await stream.decide(timeout=5)
