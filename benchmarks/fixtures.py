"""What every scenario shares: the request, the condition, the decider and the push sources.

* :func:`decide` is the emulator's decider (``--decider python:benchmarks.fixtures:decide``):
  zero work beyond looking for ``READY`` at the end of the state, so the numbers measure the
  stream and not a model.
* :func:`pushed` is an async-generator *callable source* (``{"type": "callable", "path":
  "benchmarks.fixtures.pushed", "kwargs": {"channel": ...}}``): it yields the channel's
  current state, then the newest state each time the benchmark publishes with :func:`publish`.
  It is the smallest correct push source: a waiting reader awaits one future of its own,
  resolved by the publish, and a publish while it is not waiting is seen at its next step (it
  yields the newest state; a state superseded meanwhile is skipped, as a trigger would skip it).
  No polling: the time a benchmark publishes a state is the time the change was produced.
* :func:`pushed_queue` is the same source written the common way, an ``asyncio.Queue`` per
  reader that keeps every published state (feed ``push-queue``): scenario 6 reports both, to
  show what a source's own objects cost a waiting trigger.
* :func:`decision_trigger` is the trigger every scenario waits with: this request and
  condition, on the benchmarks' connection.
* :class:`Feed` is how a scenario changes a trigger's source: a push source above, or a
  tailed file (``{"type": "file", ...}``) on notifications or polled — what DAG authors run.
  For a file, the time the write returned is the time the change was produced.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from airflow_provider_systemzero.decisions.conditions import DecisionCondition

__all__ = [
    "CONDITION",
    "CONN_ID",
    "DECIDER",
    "FEEDS",
    "READY",
    "REQUEST",
    "Feed",
    "decide",
    "decision_trigger",
    "publish",
    "pushed",
    "pushed_queue",
    "source_spec",
    "state_of",
]

#: The Airflow connection ID the benchmarks use (an ``AIRFLOW_CONN_*`` environment variable).
CONN_ID = "systemzero_bench"
#: The emulator's ``--decider`` value.
DECIDER = "python:benchmarks.fixtures:decide"
#: The marker that makes the decider answer ``ready = true``.
READY = "READY"
#: The decision request of every trigger and poke.
REQUEST: dict[str, Any] = {
    "model": "sz-bench",
    "questions": {"ready": {"type": "boolean", "instructions": "Is the job ready?"}},
}
#: The sensor's condition: ``ready`` is true with confidence 0.5 or more.
CONDITION: dict[str, Any] = DecisionCondition("ready", True, min_confidence=0.5).to_dict()
#: How much of the state's end the decider reads.
_TAIL = 256


def decide(request: Mapping[str, Any], *, now: float) -> dict[str, Any]:
    """The benchmark decider: ``ready`` is true when the state ends with a ``READY`` line.

    :param request: the decide body.
    :param now: the backend's clock (unused).
    """
    state = request.get("state")
    text = state if isinstance(state, str) else json.dumps(state)
    ready = READY in text[-_TAIL:]
    return {"ready": {"decision": ready, "probability": 0.97, "confidence": 0.94}}


class _Channel:
    """A channel's newest state, how many times it was published, and who waits for the next."""

    __slots__ = ("queues", "state", "version", "waiters")

    def __init__(self, state: Any) -> None:
        self.state = state
        self.version = 0
        #: the futures of the :func:`pushed` readers waiting now (a tuple: none kept between waits)
        self.waiters: tuple[asyncio.Future[None], ...] = ()
        #: the queues of the :func:`pushed_queue` readers (made by the first)
        self.queues: set[asyncio.Queue[Any]] | None = None


_CHANNELS: dict[str, _Channel] = {}


def state_of(channel: str) -> Any:
    """The channel's current state (``"waiting\\n"`` until something is published)."""
    entry = _CHANNELS.get(channel)
    return "waiting\n" if entry is None else entry.state


def _without(
    waiters: tuple[asyncio.Future[None], ...], waiter: asyncio.Future[None]
) -> tuple[asyncio.Future[None], ...]:
    """``waiters`` but ``waiter`` (a function, not a comprehension in the generator: that would make
    ``waiter`` a closure cell the waiting generator keeps)."""
    return tuple(w for w in waiters if w is not waiter)


def publish(channel: str, state: Any) -> float:
    """Make ``state`` the channel's current state and push it to every source reading it.

    :param channel: the channel name.
    :param state: the new state.
    :return: ``time.perf_counter()`` right after the state was handed to the sources (the
        moment the change counts as produced).
    """
    entry = _CHANNELS.setdefault(channel, _Channel(state))
    entry.state = state
    entry.version += 1
    waiters, entry.waiters = entry.waiters, ()
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(None)
    for queue in entry.queues or ():
        queue.put_nowait(state)
    return time.perf_counter()


def forget(channel: str) -> None:
    """Drop a channel (its sources keep their last state)."""
    _CHANNELS.pop(channel, None)


async def pushed(channel: str) -> AsyncIterator[Any]:
    """An async-generator source: the channel's current state, then its newest state after each publish.

    Waiting, it keeps one future (resolved by :func:`publish`) and its own frame.

    :param channel: the channel name (a plain-JSON kwarg, so the trigger serializes).
    """
    entry = _CHANNELS.setdefault(channel, _Channel("waiting\n"))
    seen = entry.version
    yield entry.state
    while True:
        if entry.version == seen:  # nothing published since the last value: wait for the next
            waiter = asyncio.get_running_loop().create_future()
            entry.waiters = (*entry.waiters, waiter)
            try:
                await waiter
            finally:
                entry.waiters = _without(entry.waiters, waiter)
        seen = entry.version
        yield entry.state


async def pushed_queue(channel: str) -> AsyncIterator[Any]:
    """The same source through an ``asyncio.Queue`` per reader: the channel's current state, then
    every published state, in order.

    :param channel: the channel name.
    """
    entry = _CHANNELS.setdefault(channel, _Channel("waiting\n"))
    queue: asyncio.Queue[Any] = asyncio.Queue()
    if entry.queues is None:
        entry.queues = set()
    entry.queues.add(queue)
    try:
        yield entry.state
        while True:
            yield await queue.get()
    finally:
        entry.queues.discard(queue)


def decision_trigger(key_namespace: str, source: Any, *, state: Any = "", **options: Any) -> Any:
    """A ``SystemZeroDecisionTrigger`` on :data:`CONN_ID` asking :data:`REQUEST` until :data:`CONDITION`
    holds (pass it to :func:`benchmarks.runner.rebuild`, as the triggerer would).

    :param key_namespace: the trigger's key namespace.
    :param source: its ``source`` kwarg (:func:`source_spec`, or :meth:`Feed.start`).
    :param state: its initial state.
    :param options: the trigger's other kwargs (``lease_after`` …).
    """
    from airflow_provider_systemzero.triggers.decision import SystemZeroDecisionTrigger

    return SystemZeroDecisionTrigger(
        systemzero_conn_id=CONN_ID,
        request=REQUEST,
        condition=CONDITION,
        state=state,
        key_namespace=key_namespace,
        source=source,
        **options,
    )


def source_spec(channel: str, kind: str = "push") -> dict[str, Any]:
    """The trigger's ``source`` kwarg for a push channel.

    :param kind: ``push`` (:func:`pushed`) or ``push-queue`` (:func:`pushed_queue`).
    """
    path = "benchmarks.fixtures.pushed_queue" if kind == "push-queue" else "benchmarks.fixtures.pushed"
    return {"type": "callable", "path": path, "kwargs": {"channel": channel}}


#: Feed kinds: the push source, the push source through a queue, a tailed file on notifications
#: (``watch`` left at ``auto``), a tailed file polled every second (the default ``poll_interval``).
FEEDS = ("push", "push-queue", "file", "file-poll")
#: The push feeds.
PUSH_FEEDS = ("push", "push-queue")


class Feed:
    """How a scenario changes a trigger's source.

    :param kind: one of :data:`FEEDS`.
    :param poll_interval: the file source's ``poll_interval`` (the default, 1 s, unless told).
    """

    def __init__(self, kind: str = "push", poll_interval: float = 1.0) -> None:
        if kind not in FEEDS:
            raise ValueError(f"feed {kind!r} is not one of {FEEDS}")
        self.kind = kind
        self.poll_interval = poll_interval
        self._directory = tempfile.mkdtemp(prefix="sz-bench-") if kind not in PUSH_FEEDS else ""
        self._written: dict[str, str] = {}

    def path_of(self, channel: str) -> str:
        """The file a channel of a file feed writes."""
        return os.path.join(self._directory, channel, "job.log")

    def start(self, channel: str, state: str = "waiting\n") -> dict[str, Any]:
        """Give ``channel`` its first state; returns the trigger's ``source`` kwarg."""
        if self.kind in PUSH_FEEDS:
            publish(channel, state)
            return source_spec(channel, self.kind)
        os.makedirs(os.path.dirname(self.path_of(channel)), exist_ok=True)
        self.publish(channel, state)
        spec: dict[str, Any] = {
            "type": "file",
            "path": self.path_of(channel),
            "poll_interval": self.poll_interval,
        }
        if self.kind == "file-poll":
            spec["notifications"] = "poll"
        return spec

    def publish(self, channel: str, state: str) -> float:
        """Make ``state`` the channel's content (a file grows by an append when it can).

        :return: ``time.perf_counter()`` once the change is handed over (the write returned).
        """
        if self.kind in PUSH_FEEDS:
            return publish(channel, state)
        written = self._written.get(channel)
        if written is not None and state.startswith(written):
            with open(self.path_of(channel), "a", encoding="utf-8") as handle:
                handle.write(state[len(written) :])
        else:
            with open(self.path_of(channel), "w", encoding="utf-8") as handle:
                handle.write(state)
        stamp = time.perf_counter()
        self._written[channel] = state
        return stamp

    def close(self) -> None:
        """Remove the files."""
        if self._directory:
            shutil.rmtree(self._directory, ignore_errors=True)
