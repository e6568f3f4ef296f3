"""State sources for the sensor tests (importable in the triggerer: ``tests.helpers.policy_sources.…``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

#: how many times each ``stepping`` source was read
READS: Counter[str] = Counter()

#: The emulator the running test's sensors talk to (set by the fixture that starts it), whose
#: ledger :func:`paced` waits on.
GATEWAY: Any = None

#: How long :func:`paced` waits for the gateway to answer a state before it moves on regardless.
ANSWER_BOUND = 30.0


def _answered(gateway: Any) -> int:
    """Decide calls ``gateway`` has answered so far, billed and replayed."""
    return sum(len(entries) for entries in gateway.ledger.values())


async def paced(states: list[str], interval: float = 0.3) -> AsyncIterator[str]:
    """Each state in turn, ``interval`` seconds after the gateway answered the one before (then the
    last one stays).

    Waiting for the answer keeps the tests about what the sensor decides, not about how fast a
    machine opens its stream: a state the source has replaced before its stream opened is never
    sent, by design (docs/concepts.md, "Stale decisions"), and under ``dag.test()`` on a loaded
    machine the first open can take longer than ``interval``. Without :data:`GATEWAY` the states
    are only paced by ``interval``.
    """
    for index, state in enumerate(states):
        if index:
            await asyncio.sleep(interval)
        gateway = GATEWAY
        answered = None if gateway is None else await gateway.acall(_answered)
        yield state
        if answered is not None and index + 1 < len(states):
            with contextlib.suppress(TimeoutError):  # then the next state comes regardless
                await gateway.acall(partial(_answer_after, answered))


async def _answer_after(answered: int, emulator: Any) -> None:
    """Wait until ``emulator`` has answered more than ``answered`` decide calls (bounded)."""
    await emulator.wait_for(lambda emu: _answered(emu) > answered, ANSWER_BOUND)


def stepping(name: str, states: list[str]) -> str:
    """The next state on every read (a poking sensor's source); the last one stays."""
    READS[name] += 1
    return states[min(READS[name], len(states)) - 1]
