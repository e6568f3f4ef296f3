"""A stream's decision starts: what a gateway's hello sets for them, and that once the stream
closes it waits in no queue of the account any more.

A closing stream may still write what starts a decision in its last writer's turn, and may still
hear how an earlier start ended (a 429 that arrives during its close handshake). Neither may leave
it queued: a closed stream left in the account's queue would be granted turns nobody takes, each
held for the grant's lifetime before the next stream may start. (The rule itself, turn by turn,
is exercised against the emulator in ``tests/ceiling/test_streams_under_ceiling.py``.)
"""

from __future__ import annotations

from airflow_provider_systemzero.protocol import ClientSession, StreamRequest
from airflow_provider_systemzero.protocol.errors import ErrorEnvelope, RetryHint
from airflow_provider_systemzero.protocol.limits import Limits
from airflow_provider_systemzero.protocol.messages import Decide, Error
from airflow_provider_systemzero.stream import StreamCapacity
from airflow_provider_systemzero.stream.starts import AccountStarts, StreamStarts
from tests.helpers.stream import QUESTIONS

ORIGIN = "ws://127.0.0.1:1/v1/stream"


def _starts(
    mode: str = "on_request", capacity: StreamCapacity | None = None
) -> tuple[AccountStarts, StreamStarts]:
    import asyncio

    account = AccountStarts("test account", asyncio.get_running_loop().time())
    request = StreamRequest.build(model="m", questions=QUESTIONS, prompt_cache_key="pck")
    session = ClientSession(request=request, state="log\n", decision_mode=mode, admission=True)
    return account, StreamStarts(account, session, capacity or StreamCapacity(1), origin=ORIGIN)


async def test_a_hello_bounds_the_streams_to_its_gateway_and_the_accounts_starts() -> None:
    capacity = StreamCapacity(4)
    account, starts = _starts(capacity=capacity)
    starts.hello(
        Limits(max_streams_per_process=2, account_decision_burst=3, account_decision_ceiling_per_minute=30)
    )
    assert capacity.limit_for(ORIGIN) == 2 and capacity.limit_for("ws://127.0.0.1:2/v1/stream") == 4
    assert account.queue.burst == 3 and round(account.queue.ceiling * 60) == 30


def _rate_limited() -> Error:
    return Error(
        "szws_" + "0" * 32,
        3,
        None,
        1,
        429,
        "req_1",
        False,
        ErrorEnvelope("rate_limit_error", "rate_limited", "slow down"),
        RetryHint(True, 1_000),
    )


async def test_a_429_heard_while_the_stream_closes_does_not_queue_it_again() -> None:
    account, starts = _starts()
    assert starts.admit(Decide(1))  # the one start before the account's hello
    assert not starts.admit(Decide(1)) and starts.waiting  # the next waits for its turn
    starts.leave()
    assert not starts.waiting
    starts.ended(_rate_limited())  # the first start's 429, heard during the close
    assert not starts.waiting and account.queue.waiting == 0
    assert account.queue.rate_limited == 1  # the mirror still learned from it


async def test_a_closed_streams_last_write_waits_in_no_queue() -> None:
    account, starts = _starts()
    assert starts.admit(Decide(1))
    starts.leave()
    assert not starts.admit(Decide(1))  # no token now: held, as any start without one
    assert not starts.waiting and account.queue.waiting == 0
