"""Constants and helpers shared by the stream and hook tests."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from airflow_provider_systemzero.emulator import Emulator
from airflow_provider_systemzero.protocol import Limits
from airflow_provider_systemzero.stream import Backoff, DecisionStream, StreamSettings

QUESTIONS = {"ready": {"type": "boolean", "instructions": "Is the job ready?"}}
#: The request of the stream tests.
REQUEST = {"model": "MODEL_ID", "questions": QUESTIONS}
#: Long enough for Airflow's secrets masker (it skips values under 5 characters).
SECRET_KEY = "sz-live-0123456789abcdef"

#: Limits for loopback tests: liveness in hundreds of milliseconds, account decision limits out of
#: the way, idle and lifetime long unless a test shrinks them. A pong has 2 s, as in the fault
#: matrix: a full collection of a test process holding Airflow pauses its loop for up to 200 ms,
#: longer on a loaded machine, which must not close a stream that a test expects to stay (the
#: tests of pongs shrink it: :data:`SHORT_PONG`).
TEST_LIMITS = Limits(
    start_timeout_ms=2_000,
    idle_timeout_ms=30_000,
    max_duration_ms=120_000,
    heartbeat_interval_ms=400,
    pong_timeout_ms=2_000,
    decision_settlement_timeout_ms=300,
    write_progress_timeout_ms=2_000,
    close_handshake_timeout_ms=500,
    account_decision_burst=1_000,
    account_decision_ceiling_per_minute=60_000,
)
#: The pong tests' limits: an unanswered ping closes the stream 300 ms later.
SHORT_PONG = TEST_LIMITS.replace(pong_timeout_ms=300)

EmulatorFactory = Callable[..., Awaitable[Emulator]]


def settings_for(emulator: Emulator, **kwargs: Any) -> StreamSettings:
    """Settings pointing at an emulator with the test key."""
    return StreamSettings(emulator.origin, SECRET_KEY, **kwargs)


def loopback_stream(
    emulator: Emulator,
    backoff: Backoff,
    identity: str,
    *,
    state: object = "Initial log\n",
    mode: str = "on_request",
) -> DecisionStream:
    """A stream to ``emulator`` with :data:`REQUEST`, ``backoff`` and a bounded opening (10 s).

    :param identity: the stream's identity (its derived ``prompt_cache_key``).
    :param state: its initial state.
    :param mode: its decision mode.
    """
    return DecisionStream(
        settings_for(emulator),
        REQUEST,
        state=state,
        decision_mode=mode,
        identity=identity,
        backoff=backoff,
        open_deadline=10,
    )


def make_stream(
    emu: Emulator,
    backoff: Backoff,
    *,
    identity: str = "test-stream",
    state: Any = "Initial log\n",
    mode: str = "on_request",
    **kwargs: Any,
) -> DecisionStream:
    """A stream to ``emu`` with :data:`REQUEST` and ``backoff`` (opening within 15 s unless
    ``open_deadline`` says otherwise); ``kwargs`` go to :class:`DecisionStream`.

    :param identity: the stream's identity (its derived ``prompt_cache_key``).
    :param state: its initial state.
    :param mode: its decision mode.
    """
    kwargs.setdefault("open_deadline", 15)
    return DecisionStream(
        settings_for(emu),
        REQUEST,
        state=state,
        decision_mode=mode,
        identity=identity,
        backoff=backoff,
        **kwargs,
    )
