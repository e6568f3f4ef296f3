"""What a trigger's driver runs against in its tests, scripted by the test: a source, a gateway's
streams (decisions, failures, reconnects, slots), the threads an author's function runs on, and
an event loop whose clock moves only when the test moves it.

Each piece does what the real one does at the seam the driver uses, and no more:

* :class:`ScriptedSource` — a :class:`~airflow_provider_systemzero.sources.base.StateSource`
  whose state the test sets; a read can be held (as a slow read in a thread is), and
  ``changed()`` completes at once when the state differs from the last one read (no change is
  lost while a read runs);
* :class:`ScriptedStreams` / :class:`ScriptedStream` — the trigger's streams and a
  ``DecisionStream`` as the driver sees them: a stream takes a slot of its
  :class:`~airflow_provider_systemzero.stream.capacity.StreamCapacity` when it is entered and
  gives it back when closed; the test opens it, fails it, answers its decisions (on_change: one
  in flight and one pending, as the gateway dispatches; on_request: each ``decide()``), fails
  them, and reconnects it (a new stream id: what was dispatched before is late);
* :class:`ScriptedThreads` — stands in for the provider's daemon threads
  (:data:`~airflow_provider_systemzero.sources.threads.THREADS`): a call runs when the test
  answers it, raises, or hangs;
* :class:`ClockLoop` — an asyncio loop whose ``time()`` is the test's: timers (the watch's
  wake-ups, a ``decide_when`` call's timeout, an asset watch's wait before it tries again) fire
  when the test moves the clock past them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_systemzero.identity import state_hash
from airflow_provider_systemzero.protocol.errors import ErrorEnvelope, RetryHint
from airflow_provider_systemzero.protocol.reply import Answer, DecisionResult
from airflow_provider_systemzero.protocol.state import same_json
from airflow_provider_systemzero.sources.base import StateSource
from airflow_provider_systemzero.stream.capacity import StreamCapacity
from airflow_provider_systemzero.stream.exceptions import DeadlineExceeded, DecisionFailed, StreamClosed

__all__ = [
    "ClockLoop",
    "ScriptedSource",
    "ScriptedStream",
    "ScriptedStreams",
    "ScriptedThreads",
    "decision_failed",
    "ready_decision",
]

_NOTHING: Any = object()
_REPLIES = itertools.count(1)


def ready_decision(
    met: bool, version: int, *, stream_id: str = "s", confidence: float = 0.9
) -> DecisionResult:
    """A decision answering ``ready`` as ``met`` (probability 0.9, and ``confidence``) about
    ``version`` of stream ``stream_id``, with a reply id of its own."""
    reply = f"szd_{next(_REPLIES):032x}"
    return DecisionResult(
        reply={"id": reply, "answers": {"ready": {"decision": met}}},
        state_version=version,
        covered_event_ids=(),
        request_id=f"req-{reply}",
        stream_id=stream_id,
        answers={"ready": Answer("ready", "boolean", met, 0.9, confidence)},
    )


def decision_failed(version: int, status: int = 500) -> DecisionFailed:
    """The gateway's final failure of the decision about ``version`` (HTTP ``status``, not retried)."""
    envelope = ErrorEnvelope("api_error", "internal_error", "the decider failed")
    return DecisionFailed(status, envelope, RetryHint(False), False, state_version=version)


class ClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock is :attr:`now`, moved by the test (:meth:`advance`); it keeps
    every timer it was asked for (:meth:`next_timer`, :meth:`live_timers`)."""

    def __init__(self, start: float = 1000.0) -> None:
        super().__init__()
        self.now = start
        self._timers: list[tuple[asyncio.TimerHandle, Callable[..., Any]]] = []

    def time(self) -> float:
        return self.now

    def call_at(
        self, when: float, callback: Callable[..., Any], *args: Any, context: Any = None
    ) -> asyncio.TimerHandle:
        handle = super().call_at(when, callback, *args, context=context)
        self._timers.append((handle, callback))
        return handle

    def live_timers(self) -> list[tuple[asyncio.TimerHandle, Callable[..., Any]]]:
        """The timers not cancelled and not due yet, with their callbacks."""
        self._timers = [(h, cb) for h, cb in self._timers if not h.cancelled() and h.when() > self.now]
        return list(self._timers)

    def next_timer(self) -> float | None:
        """When the next live timer fires (``None``: none is set)."""
        return min((h.when() for h, _ in self.live_timers()), default=None)

    def advance(self, seconds: float) -> None:
        """Move the clock (what is due runs at the next :meth:`turns`)."""
        self.now += seconds

    def turns(self, count: int) -> None:
        """Run ``count`` iterations of the loop at the current time (never waiting in real time:
        something is always ready)."""

        async def turning() -> None:
            for _ in range(count):
                await asyncio.sleep(0)

        self.run_until_complete(turning())


# ------------------------------------------------------------------ the source


class ScriptedSource(StateSource):
    """A source the test changes (:meth:`set`); a file without content is ``""`` (withheld).

    :param state: the state it starts with.
    """

    def __init__(self, state: Any = "waiting\n") -> None:
        self.state = state
        #: the value the last read returned (``changed()`` completes at once when the state differs)
        self.last_read: Any = _NOTHING
        self.waiters: list[asyncio.Future[None]] = []
        #: reads wait for the test (:meth:`finish_read`) while set
        self.hold_reads = False
        self.held: deque[asyncio.Future[None]] = deque()
        self.reads = 0
        self.closed = False

    def set(self, state: Any) -> None:
        self.state = state
        self._wake()

    def _wake(self) -> None:
        waiters, self.waiters = self.waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def read(self) -> Any:
        self.reads += 1
        state = self.state
        if self.hold_reads:
            held = asyncio.get_running_loop().create_future()
            self.held.append(held)
            await held
        self.last_read = state
        return state

    def finish_read(self) -> None:
        """Let the oldest held read return (what the source held when it started)."""
        while self.held:
            held = self.held.popleft()
            if not held.done():
                held.set_result(None)
                return

    def changed(self) -> asyncio.Future[None]:
        waiter = asyncio.get_running_loop().create_future()
        if self.last_read is _NOTHING or not same_json(self.state, self.last_read):
            waiter.set_result(None)
        else:
            self.waiters.append(waiter)
        return waiter

    def withheld(self, state: Any) -> bool:
        return state == ""

    async def aclose(self) -> None:
        self.closed = True


# ------------------------------------------------------------------ the streams


@dataclass
class Request:
    """An on_request ``decide()`` the gateway owes an answer."""

    version: int
    state: Any
    future: asyncio.Future[DecisionResult]


@dataclass
class Dispatch:
    """An on_change decision the gateway dispatched (or will), about ``version`` of connection ``stream_id``."""

    version: int
    state: Any
    stream_id: str


@dataclass
class ScriptedStream:
    """A ``DecisionStream`` as the driver uses it, scripted by the test."""

    state: Any
    decision_mode: str
    capacity: StreamCapacity
    connections: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    state_version: int = 1
    in_sync: bool = True
    stream_id: str = ""
    queued: deque[DecisionResult | BaseException] = field(default_factory=deque)
    waiter: asyncio.Future[Any] | None = None
    #: on_change: what the gateway dispatched and will deliver, oldest first
    owed: list[Dispatch] = field(default_factory=list)
    #: on_request: the ``decide()`` calls waiting for an answer
    requests: list[Request] = field(default_factory=list)
    #: the failure that ended it (each call raises it)
    failure: BaseException | None = None
    holds_slot: bool = False
    opened: bool = False
    closing: bool = False
    closed: bool = False
    #: the close handshake waits for the test (:meth:`ScriptedStreams.finish_close`) while set
    slow_close: bool = False
    closing_future: asyncio.Future[None] | None = None

    def __post_init__(self) -> None:
        self.stream_id = f"szws_{id(self):x}_{next(self.connections)}"

    @property
    def state_hash(self) -> str:
        return state_hash(self.state)

    # -- what the driver calls

    def close_soon(self) -> None:
        self.closing = True

    async def aclose(self) -> None:
        self.closing = True
        for request in self.requests:
            if not request.future.done():
                request.future.set_exception(StreamClosed(None, "closed", message="the stream is closed"))
        try:
            if self.slow_close and not self.closed:
                self.closing_future = asyncio.get_running_loop().create_future()
                await self.closing_future
        finally:
            self.closed = True
            if self.holds_slot:
                self.holds_slot = False
                self.capacity.release()

    def take_decision(self) -> DecisionResult | None:
        if self.queued:
            item = self.queued.popleft()
            if isinstance(item, BaseException):
                raise item
            return item
        if self.failure is not None:
            raise self.failure
        return None

    def wake_on_decision(self, waiter: asyncio.Future[Any]) -> None:
        self.waiter = waiter
        if self.queued or self.failure is not None:
            self._wake()

    async def set_state(self, state: Any) -> None:
        if self.failure is not None:
            raise self.failure
        if not same_json(state, self.state):
            self.state = state
            self.state_version += 1
            if self.decision_mode == "on_change" and self.opened:
                self._dispatch()
        await asyncio.sleep(0)  # accepted: a turn of the loop follows, where a cancellation may land

    async def decide(self) -> DecisionResult:
        if self.failure is not None:
            raise self.failure
        future: asyncio.Future[DecisionResult] = asyncio.get_running_loop().create_future()
        self.requests.append(Request(self.state_version, self.state, future))
        return await future

    # -- what the test does

    def enter(self) -> None:
        """The gateway acknowledged ``start``: on_change, the state it opened with is dispatched."""
        self.opened = True
        if self.decision_mode == "on_change":
            self._dispatch()

    def _dispatch(self) -> None:
        """The gateway dispatches a decision about the newest state: one in flight, one pending."""
        self.owed = [*self.owed[:1], Dispatch(self.state_version, self.state, self.stream_id)]

    def _wake(self) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def decision(self, met: bool, version: int | None = None) -> DecisionResult:
        """A decision about ``version`` (default: the newest) on the connection open now."""
        return ready_decision(
            met, self.state_version if version is None else version, stream_id=self.stream_id
        )

    def deliver(self, item: DecisionResult | BaseException) -> None:
        """A decision (or a dispatch's final failure) reaches the stream's reader."""
        self.queued.append(item)
        self._wake()

    def answer_dispatch(self, met: bool, *, confidence: float = 0.9) -> tuple[DecisionResult, Any]:
        """on_change: the oldest dispatch is answered; the decision and the state it is about."""
        dispatch = self.owed.pop(0)
        decision = ready_decision(met, dispatch.version, stream_id=dispatch.stream_id, confidence=confidence)
        self.deliver(decision)
        return decision, dispatch.state

    def fail_dispatch(self) -> None:
        """on_change: the oldest dispatch fails for good."""
        dispatch = self.owed.pop(0)
        self.deliver(decision_failed(dispatch.version))

    def answer_request(self, met: bool, *, confidence: float = 0.9) -> tuple[DecisionResult, Any]:
        """on_request: the oldest ``decide()`` is answered (on the connection open now)."""
        request = self.requests.pop(0)
        decision = ready_decision(met, request.version, stream_id=self.stream_id, confidence=confidence)
        request.future.set_result(decision)
        return decision, request.state

    def fail_request(self, *, timed_out: bool) -> None:
        """on_request: the oldest ``decide()`` fails (HTTP 500), or its deadline passes."""
        request = self.requests.pop(0)
        request.future.set_exception(
            DeadlineExceeded(f"no decision for state version {request.version}")
            if timed_out
            else decision_failed(request.version)
        )

    def reconnect(self) -> None:
        """The connection dropped and the stream replayed on a new one: a decision dispatched on
        the old one may still arrive (late, about the old connection); on_change, the replayed
        state is dispatched anew; on_request, a ``decide()`` waiting is re-sent (its answer comes
        on the new connection)."""
        self.stream_id = f"szws_{id(self):x}_{next(self.connections)}"
        if self.decision_mode == "on_change" and self.opened:
            self.owed = self.owed[:1]
            self._dispatch()

    def fail(self) -> None:
        """The stream ends with a failure no reconnect fixes."""
        self.failure = StreamClosed(1008, "policy_violation")
        for request in self.requests:
            if not request.future.done():
                request.future.set_exception(self.failure)
        self.requests.clear()
        self.owed.clear()
        self._wake()


class ScriptedStreams:
    """The trigger's streams as the driver sees them (``TriggerStream``): each built stream is a
    :class:`ScriptedStream`; entering one takes a slot of ``capacity`` and, with ``manual_open``,
    waits for the test (:meth:`finish_open`, :meth:`fail_open`)."""

    def __init__(
        self, capacity: StreamCapacity | None = None, *, manual_open: bool = False, slow_close: bool = False
    ) -> None:
        self.capacity = capacity or StreamCapacity(4)
        self.manual_open = manual_open
        self.slow_close = slow_close
        self.built: list[ScriptedStream] = []
        self.stream: ScriptedStream | None = None
        self.entering: tuple[ScriptedStream, asyncio.Future[None]] | None = None

    async def resolve_settings(self) -> None:
        return None

    def ask_opening(self) -> Any:
        return self.capacity.ask_opening()

    def leave_opening(self, place: Any) -> None:
        self.capacity.leave_opening(place)

    def build(self, state: Any, **kwargs: Any) -> ScriptedStream:
        stream = ScriptedStream(
            state, kwargs.get("decision_mode", "on_change"), self.capacity, slow_close=self.slow_close
        )
        self.stream = stream
        self.built.append(stream)
        return stream

    async def enter(self, stream: ScriptedStream) -> None:
        await self.capacity.acquire()
        stream.holds_slot = True
        if self.manual_open:
            opened = asyncio.get_running_loop().create_future()
            self.entering = (stream, opened)
            try:
                await opened
            finally:
                self.entering = None
        else:
            await asyncio.sleep(0)
        stream.enter()

    def finish_open(self) -> None:
        assert self.entering is not None
        self.entering[1].set_result(None)

    def fail_open(self) -> None:
        assert self.entering is not None
        self.entering[1].set_exception(ConnectionRefusedError("the gateway refused the connection"))

    def closing(self) -> list[ScriptedStream]:
        """The streams whose close handshake waits for the test."""
        return [s for s in self.built if s.closing_future is not None and not s.closing_future.done()]

    def finish_close(self) -> None:
        stream = self.closing()[0]
        assert stream.closing_future is not None
        stream.closing_future.set_result(None)

    async def close(self, stream: ScriptedStream, *, grace: float = 5.0) -> None:
        if self.stream is stream:
            self.stream = None
        await stream.aclose()


# ------------------------------------------------------------------ the threads


@dataclass
class Call:
    """An author's function submitted to run on a thread."""

    function: Callable[[], Any]
    future: concurrent.futures.Future[Any]
    hung: bool = False


class ScriptedThreads:
    """The provider's daemon threads, as the test runs them: a call submitted waits until the
    test answers it (runs it here), makes it raise, or leaves it hanging."""

    def __init__(self) -> None:
        self.calls: list[Call] = []

    def submit(self, function: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.calls.append(Call(function, future))
        return future

    def pending(self) -> list[Call]:
        return [call for call in self.calls if not call.future.done()]

    def answer(self, call: Call) -> None:
        """The call runs (the function is called here) and returns (or raises what it raises)."""
        self.calls.remove(call)
        if call.future.set_running_or_notify_cancel():
            try:
                call.future.set_result(call.function())
            except Exception as exc:
                call.future.set_exception(exc)

    def fail(self, call: Call) -> None:
        """The call raises (the author's function failed)."""
        self.calls.remove(call)
        if call.future.set_running_or_notify_cancel():
            call.future.set_exception(ConnectionError("the author's lookup failed"))
