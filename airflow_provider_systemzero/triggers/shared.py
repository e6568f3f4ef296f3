"""One stream for the asset watches of one source: Airflow 3.3's shared streams.

Theory of operation
-------------------

Ten ``AssetWatcher`` s that read the same job log through the same connection, model and questions,
each waiting for its own answer, bar, policy or hysteresis, would each hold a stream, send every
change and be billed a decision for it: ten decisions per change. Airflow 3.3's triggerer lets
event triggers whose ``shared_stream_key()`` values are equal share one stream
(``airflow.triggers.shared_stream``): it opens the group's stream once, from one member's kwargs
(``open_shared_stream``), broadcasts what it yields to every member, and each member turns that
into its own events (``filter_shared_stream``). Here:

* **what makes two watches share** (:func:`shared_key`): their trigger kwargs are equal but for
  ``condition`` and ``watch_id`` — the connection, the request (model, questions), the state and
  its source, ``decision_mode``, ``lease``, ``lease_after``, ``max_staleness`` and the
  ``decide_when`` filter, which together shape the stream and what it is billed for. The key is a
  digest of them: it holds no secret (the kwargs hold none).
* **the group's stream** is one watch of the source that decides every change once
  (:class:`~airflow_provider_systemzero.decisions.source_watch.EveryDecision`, through the same
  :class:`~airflow_provider_systemzero.decisions.source_watch.SourceWatch` and
  :class:`~airflow_provider_systemzero.triggers.driver.WatchDriver` a watch alone runs), yielding
  each current decision as a :class:`SharedDecision`. It never raises (a raise would fail every
  member): a failure is said, waited out and tried again, as a watch alone does. Its key
  namespace derives from the digest (:func:`group_watch_id`), so a restarted triggerer, or a second
  one running the same group (HA), replays the same keys for the same state and is billed once.
* **each member** judges every decision by its own
  :class:`~airflow_provider_systemzero.decisions.watch.VerdictRules` (condition, policy,
  hysteresis, and its memory of whether it fired, kept per ``watch_id`` across restarts), exactly
  as it would alone (:func:`shared_verdicts`): one event per transition of its own rule.
* **a member that joins late** gets no decision broadcast before it joined (Airflow's rule), so
  the group posts its newest decision on a board (:class:`DecisionBoard`, one per group in the
  triggerer's process) and a joining member starts from it, if it is still about what the source
  holds now. Decisions are numbered once per process, so one both posted and queued is judged once.
* A member leaving does not disturb the others; the triggerer cancels the group's stream when the
  last one leaves, which closes the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any

from airflow_provider_systemzero.decisions.source_watch import Judged
from airflow_provider_systemzero.decisions.watch import VerdictRules
from airflow_provider_systemzero.triggers.watch_memory import kwargs_identity

__all__ = [
    "PER_WATCH_KWARGS",
    "DecisionBoard",
    "SharedDecision",
    "group_watch_id",
    "posted",
    "shared_digest",
    "shared_key",
    "shared_verdicts",
]

log = logging.getLogger(__name__)

#: The kwargs of an asset watch that are its own: two watches whose other kwargs are equal share
#: one stream.
PER_WATCH_KWARGS = frozenset({"condition", "watch_id"})
#: The first part of a shared stream's key (the second is :func:`shared_digest`).
KEY_KIND = "systemzero.asset-watch"

#: The numbers of shared decisions, unique in the process (a group started again after its last
#: member left continues the count, so a member never takes a newer decision for one it judged).
_NUMBERS = itertools.count(1)


def shared_digest(kwargs: dict[str, Any]) -> str:
    """A digest of an asset watch's kwargs but its own (:data:`PER_WATCH_KWARGS`).

    :param kwargs: the trigger's serialized kwargs.
    """
    return kwargs_identity({name: value for name, value in kwargs.items() if name not in PER_WATCH_KWARGS})


def shared_key(kwargs: dict[str, Any]) -> tuple[str, str]:
    """The ``shared_stream_key`` of an asset watch with these kwargs: equal for the watches that
    share one stream.

    :param kwargs: the trigger's serialized kwargs.
    """
    return (KEY_KIND, shared_digest(kwargs))


def group_watch_id(digest: str) -> str:
    """The ``watch_id`` of a group's own watch: its keys and cache key derive from it, the same in
    every process.

    :param digest: the group's :func:`shared_digest`.
    """
    return f"shared-{digest}"


@dataclass(frozen=True, slots=True)
class SharedDecision:
    """What a group's stream broadcasts: a current decision, numbered in the process.

    :param number: its number (increasing: a member judges each number once).
    :param judged: the decision, the state it covers and that state's hash and generation.
    """

    number: int
    judged: Judged


class DecisionBoard:
    """What a group's stream has decided, for the members that join it: its newest decision, and
    whether a decision is still about what the source holds now.

    :param current: whether a decision about a generation of the group's watch is current.
    """

    __slots__ = ("current", "latest")

    def __init__(self, current: Callable[[int], bool]) -> None:
        self.current = current
        #: the newest decision broadcast (``None`` before the first)
        self.latest: SharedDecision | None = None

    def publish(self, judged: Judged) -> SharedDecision:
        """Number a current decision and post it as the newest; what the stream broadcasts."""
        self.latest = shared = SharedDecision(next(_NUMBERS), judged)
        return shared


#: The boards of the groups running in this process, by shared stream key.
_BOARDS: dict[Hashable, DecisionBoard] = {}


@contextlib.contextmanager
def posted(key: Hashable, board: DecisionBoard) -> Iterator[DecisionBoard]:
    """Post ``board`` as the group ``key``'s while its stream runs.

    :param key: the group's shared stream key.
    :param board: its board.
    """
    _BOARDS[key] = board
    try:
        yield board
    finally:
        if _BOARDS.get(key) is board:
            del _BOARDS[key]


async def shared_verdicts(
    rules: VerdictRules, key: Hashable, shared_stream: AsyncIterator[Any]
) -> AsyncIterator[Any]:
    """One member's verdicts from its group's decisions: ``rules`` judge each decision the group
    judged current, in order — the group's newest first, when the group runs already and it is
    still about what the source holds now — and a run of met decisions whose only lack is time
    (``min_true_for``) ends when its time passes, if no change came meanwhile. Runs until cancelled.

    :param rules: the member's rules (its condition, policy, hysteresis and memory).
    :param key: the group's shared stream key.
    :param shared_stream: the group's decisions, as the triggerer broadcasts them.
    """
    loop = asyncio.get_running_loop()
    seen = 0  # the number of the newest decision judged
    held: Judged | None = None  # the newest decision judged, while a hold may end on time
    upcoming: asyncio.Future[Any] | None = None  # the next decision, while waited for with a timer

    def judge(shared: SharedDecision, *, joining: bool = False) -> Any:
        """Judge a decision the group broadcast: each one, in order, as the group's watch judged it
        current when it came (so this watch's rules see every transition the group saw, a
        decision that did not qualify included, exactly as a watch alone would); the group's
        newest decision when joining only while it is still current."""
        nonlocal seen, held
        seen = shared.number
        judged = shared.judged
        if joining:
            board = _BOARDS.get(key)
            if board is not None and not board.current(judged.generation):
                return None  # the source changed since: the decision about its newer state is coming
        held = judged
        return rules.observe(
            judged.decision, judged.state_key, judged.state, loop.time(), generation=judged.generation
        )

    board = _BOARDS.get(key)
    if board is not None and board.latest is not None:
        log.info("the shared stream decided before this watch joined: it starts from its newest decision")
        if (verdict := judge(board.latest, joining=True)) is not None:
            yield verdict
    stream = aiter(shared_stream)
    try:
        while True:
            wait = None if held is None else rules.wait_time(loop.time())
            if wait is None and upcoming is None:
                shared = await anext(stream)
            else:
                # cancelling the stream's read would end it: a read waited for with a timer is a task
                if upcoming is None:
                    upcoming = asyncio.ensure_future(anext(stream))
                done, _ = await asyncio.wait((upcoming,), timeout=wait)
                if not done:
                    board = _BOARDS.get(key)
                    current = held is not None and board is not None and board.current(held.generation)
                    if current and (verdict := rules.due(loop.time())) is not None:
                        yield verdict
                        continue
                    if (rules.wait_time(loop.time()) or 0.0) <= 0:
                        held = None  # nothing more can end on time until the next decision
                    continue
                shared, upcoming = upcoming.result(), None
            if shared.number <= seen:
                continue  # judged already (posted on the board when this watch joined)
            if (verdict := judge(shared)) is not None:
                yield verdict
    finally:
        if upcoming is not None:
            upcoming.cancel()
