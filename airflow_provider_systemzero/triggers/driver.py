"""The asyncio driver of a :class:`~airflow_provider_systemzero.decisions.source_watch.SourceWatch`:
it does the I/O the watch asks for, and feeds back what happened.

A trigger's ``run()`` is a short loop over :meth:`WatchDriver.next_verdict`. The driver owns every
piece of work under way — the read of the source, the stream being opened or closed, an
on_request decide, a ``decide_when`` check — each a future whose completion wakes the driver's one
task; between wake-ups it awaits one future. A waiting trigger with no stream and no timer awaits
its source's own future (a notified file's, a push generator's read), and holds nothing else of
its wait; when the watch also waits on time, one timer and the driver's wake-up future. A run
that wants a stream while every place among the streams being opened is taken holds its place
(:meth:`StreamCapacity.ask_opening <airflow_provider_systemzero.stream.capacity.StreamCapacity.ask_opening>`)
and the wake-up future its grant completes, and builds the stream only once the place is its own.

What is read next, and on which thread, is decided here once:

* the source is read whenever its :meth:`~airflow_provider_systemzero.sources.base.StateSource.changed`
  future completes, in every phase (dormant, opening, streaming, releasing), and each read goes to
  the watch; a decision is judged only once no read is under way (reads first: a decision is
  judged against what the source holds now);
* a ``decide_when`` callable runs on a daemon thread of the provider's with a timeout
  (:class:`~airflow_provider_systemzero.sources.threads.UserCall`), never on the loop or its
  shared executor, as a callable source does.

:meth:`WatchDriver.aclose` cancels and awaits every piece of work and closes the stream: nothing of
the run outlives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, TypeVar

from airflow_provider_systemzero.decisions.source_watch import (
    Action,
    Check,
    Decide,
    Fire,
    Offer,
    Open,
    Phase,
    Release,
    Send,
    SourceWatch,
    Withdraw,
)
from airflow_provider_systemzero.sources.threads import UserCall
from airflow_provider_systemzero.timestamps import back_dated

if TYPE_CHECKING:
    from airflow_provider_systemzero.decisions.relevance import Relevance
    from airflow_provider_systemzero.protocol.reply import DecisionResult
    from airflow_provider_systemzero.sources.base import StateSource
    from airflow_provider_systemzero.stream.capacity import OpeningPlace, SlotOffer
    from airflow_provider_systemzero.stream.decision_stream import DecisionStream
    from airflow_provider_systemzero.triggers.streaming import TriggerStream

__all__ = ["DECIDE_WHEN_TIMEOUT", "WatchDriver"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds a ``decide_when`` callable may run before the wait fails with an error naming it.
DECIDE_WHEN_TIMEOUT = 60.0
#: How many decision durations a wait keeps, for the message of a deadline that passed.
_DURATIONS_KEPT = 5


class _Wakeup:
    """Wakes the driver's one task: every piece of work calls it when it completes.

    A call before the driver waits is remembered, so no completion is lost between two waits.
    """

    __slots__ = ("_future", "_pending")

    def __init__(self) -> None:
        self._future: asyncio.Future[None] | None = None
        self._pending = False

    def wait(self) -> asyncio.Future[None]:
        future = self._future = asyncio.get_running_loop().create_future()
        if self._pending:
            self._pending = False
            future.set_result(None)
        return future

    def __call__(self, *_: Any) -> None:
        future, self._future = self._future, None  # the task that awaits it holds it until it wakes
        if future is not None and not future.done():
            future.set_result(None)
        else:
            self._pending = True


def _covers(stream: DecisionStream, decision: DecisionResult) -> bool:
    """Whether ``decision`` covers the complete state ``stream`` holds now (in sync, same
    connection, same version): a decide that waited for its start under the account ceiling names
    the newest version when it starts, so it may cover a state sent after it was asked."""
    return (
        stream.in_sync
        and decision.stream_id == stream.stream_id
        and decision.state_version == stream.state_version
    )


class WatchDriver:
    """Runs a :class:`SourceWatch` against a source and the trigger's streams.

    :param watch: the watch (its phase says where the run is).
    :param source: the state source (closed by the trigger's cleanup, not here).
    :param streams: the trigger's :class:`~airflow_provider_systemzero.triggers.streaming.TriggerStream`.
    :param stream_kwargs: what every stream is built with besides the state and the watch's
        ``decision_mode`` (``min_interval_ms`` …).
    :param relevance: the ``decide_when`` callable's holder, for :class:`Check` s.
    """

    # one per waiting trigger, and a triggerer holds thousands: no per-instance __dict__
    __slots__ = (
        "_after_fire",
        "_asked_at",
        "_billed_noted",
        "_change",
        "_change_linked",
        "_checking",
        "_checks",
        "_closing",
        "_deciding",
        "_offer",
        "_opening",
        "_place",
        "_reading",
        "_reconnects_noted",
        "_slot_wanted",
        "_timer",
        "_wake",
        "decision_seconds",
        "relevance",
        "source",
        "stream",
        "stream_kwargs",
        "streams",
        "watch",
    )

    def __init__(
        self,
        watch: SourceWatch,
        source: StateSource,
        streams: TriggerStream,
        *,
        stream_kwargs: dict[str, Any] | None = None,
        relevance: Relevance | None = None,
    ) -> None:
        self.watch = watch
        self.source = source
        self.streams = streams
        self.stream_kwargs = stream_kwargs or None
        self.relevance = relevance
        self._checks = (
            UserCall(
                f"decide_when.callable {relevance.spec['callable']!r}",  # type: ignore[index]
                DECIDE_WHEN_TIMEOUT,
                own_outcome=True,  # an answer is about the change it was asked about
            )
            if relevance is not None and relevance.is_callable
            else None
        )
        self._wake = _Wakeup()
        #: the actions the watch asked for after the verdict :meth:`next_verdict` returned last, carried
        #: out when it is called again (an asset watch goes on; a sensor's wait ended with it)
        self._after_fire: tuple[Action, ...] = ()
        #: the stream held now (being opened, open, or being closed)
        self.stream: DecisionStream | None = None
        #: the pieces of work under way (``None``: none)
        self._change: asyncio.Future[None] | None = None
        #: the wake-up is among the callbacks of :attr:`_change` (it is awaited itself otherwise)
        self._change_linked = False
        self._reading: asyncio.Task[Any] | None = None
        #: opening a stream: the connection's lookup, then (with :attr:`_place` held) the stream
        #: built and entered
        self._opening: asyncio.Task[None] | None = None
        #: the place among the streams being built and opened: asked for once the connection is
        #: known, waited for through its future alone, held until the stream is open
        self._place: OpeningPlace | None = None
        self._closing: asyncio.Task[None] | None = None
        self._deciding: asyncio.Task[DecisionResult] | None = None
        self._checking: asyncio.Task[bool] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._offer: SlotOffer | None = None
        self._slot_wanted = False
        #: when the decision the watch waits for was asked, and how long the last ones took
        self._asked_at: float | None = None
        self.decision_seconds: tuple[float, ...] = ()
        #: the reconnects of the stream held now that the history has heard of
        self._reconnects_noted = 0
        #: the billed reply ids of the stream held now whose start the history has marked (made
        #: with the first)
        self._billed_noted: set[str] | None = None

    @property
    def dormant(self) -> bool:
        """Whether the watch holds no stream and waits for its source (or for time)."""
        return self.watch.phase is Phase.DORMANT and self.stream is None

    # ------------------------------------------------------------------ the loop

    async def next_verdict(self) -> Any:
        """Run the watch until it fires; its verdict.

        :raises Exception: the source, the stream or a ``decide_when`` callable failed (the
            trigger turns it into its error event).
        """
        loop = asyncio.get_running_loop()
        if self._reading is None and self._change is None:
            self._reading = self._started(self.source.read())  # the first read, or a fresh one
        while True:
            fire = await self._carry_out(loop)
            if fire is not None:
                return fire.verdict
            self._listen(loop)
            try:
                await self._waited()
            finally:
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None

    async def _carry_out(self, loop: asyncio.AbstractEventLoop) -> Fire | None:
        """Carry out what the watch asks for now — the actions a verdict came before (an asset
        watch's) first — up to a :class:`Fire`, which is returned (the actions after it wait for
        the next :meth:`next_verdict`); ``None`` once every action is carried out. The actions
        are this call's alone: none stays with the run while it waits."""
        if not (actions := self._after_fire):  # what completed, fed to the watch; what it asks for now
            now = loop.time()
            self._collect(now)
            actions = tuple(self.watch.actions(now))
        self._after_fire = ()
        for index, action in enumerate(actions):
            if isinstance(action, Fire):
                self._after_fire = actions[index + 1 :]
                if self.watch.ended and self.stream is not None:
                    # the event goes out first; the close frame follows in the next loop turn
                    loop.call_soon(self.stream.close_soon)
                return action
            await self._do(action)
        return None

    def _started(self, work: Awaitable[T]) -> asyncio.Task[T]:
        task = asyncio.ensure_future(work)
        task.add_done_callback(self._wake)
        return task

    def _listen(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wait on the source when no read is under way, and on the watch's next time."""
        if self._reading is None and self._change is None:
            self._change = self.source.changed()
            self._change_linked = False
        at = self.watch.next_wakeup(loop.time())
        if at is not None:
            self._timer = loop.call_at(at, self._wake)

    def _waited(self) -> asyncio.Future[None]:
        """What the driver awaits until something completes: the source's own future when the run
        waits on nothing else (a dormant watch with no timer: no wake-up future of the driver's
        is made for it), else the wake-up future that every piece of work completes."""
        change = self._change
        if change is not None and self._timer is None and self.stream is None and not self._under_way():
            if self._change_linked:  # asked for while the run held a stream
                change.remove_done_callback(self._wake)
                self._change_linked = False
            return change
        if change is not None and not self._change_linked:
            change.add_done_callback(self._wake)
            self._change_linked = True
        waited = self._wake.wait()
        if self._takes_decisions():
            # on_change decisions, a failure, the stream's end (a read under way first)
            self.stream.wake_on_decision(waited)  # type: ignore[union-attr]
        return waited

    def _under_way(self) -> bool:
        """Whether a piece of work besides the wait on the source is under way."""
        return self._place is not None or any(task is not None for task in self._tasks())

    def _tasks(self) -> tuple[asyncio.Task[Any] | None, ...]:
        """The pieces of work besides the wait on the source, each ``None`` when none is under way."""
        return (self._reading, self._opening, self._closing, self._deciding, self._checking)

    def _collect(self, now: float) -> None:
        """Feed what completed to the watch: the source first, then the rest."""
        watch = self.watch
        change = self._change
        if change is not None and change.done():
            self._change = None
            self._reading = self._started(self.source.read())
        reading = self._reading
        if reading is not None and reading.done():
            self._reading = None
            state = reading.result()  # a source that failed ends the run
            watch.read(state, now, withheld=self.source.withheld(state))
        if self._opening is not None and self._opening.done():
            opening, self._opening = self._opening, None
            place, self._place = self._place, None  # given back already, if it was held
            opening.result()  # a connection that cannot be looked up, or a stream that cannot open, ends the run
            if place is None:  # the connection is known: wait for a place to build the stream in
                self._place = place = self.streams.ask_opening()
                place.future.add_done_callback(self._wake)
            else:
                watch.opened(now)
        place = self._place
        if place is not None and self._opening is None and place.future.done():
            # the slot is near: build the stream now; the place goes back the moment it is open
            # (or its opening failed), before the run looks at it
            self._opening = opening = self._started(self._open())
            opening.add_done_callback(lambda _: self.streams.leave_opening(place))
        if self._closing is not None and self._closing.done():
            self._closing = None
            watch.released(now)
        if self._checking is not None and self._checking.done():
            checking, self._checking = self._checking, None
            watch.checked(checking.result(), now)
        if self._slot_wanted:
            self._slot_wanted = False
            watch.slot_wanted(now)
        if not self._takes_decisions():
            return  # a read is under way: decisions are judged against what it returns
        stream = self.stream
        assert stream is not None
        if self._deciding is not None and self._deciding.done():
            deciding, self._deciding = self._deciding, None
            self._decided(stream, deciding.result(), now)
        while (decision := stream.take_decision()) is not None:  # on_change; raises a final failure
            self._decided(stream, decision, now)

    def _takes_decisions(self) -> bool:
        """Whether the stream's decisions are taken now: it is open, and no read of the source is
        under way (a decision is judged against what the source holds now)."""
        return (
            self.stream is not None
            and self._reading is None
            and self._opening is None
            and self._closing is None
        )

    def _decided(self, stream: DecisionStream, decision: DecisionResult, now: float) -> None:
        if self._asked_at is not None:
            self.decision_seconds = (*self.decision_seconds, round(now - self._asked_at, 3))[
                -_DURATIONS_KEPT:
            ]
        # what the stream did before the decision is marked first: the history's times then keep
        # their order (a billed start is back-dated from a clock read before the decision's own)
        self._note_stream(stream, decision)
        self.watch.decided(decision, now, covers=_covers(stream, decision), state_hash=stream.state_hash)
        self._asked_at = now if self.watch.deciding else None

    def _note_stream(self, stream: DecisionStream, decision: DecisionResult) -> None:
        """Tell the wait's history what the stream did around ``decision``: the reconnects since the
        last one, and a billed start (back-dated by the time the gateway says it took).

        The stream counts a decision's bill when it arrives, before the driver takes it: a decision
        was billed when its reply id is among the stream's billed ones (a replay never is) and no
        earlier decision of the stream was marked with it."""
        timeline = self.watch.timeline
        if timeline is None:
            return
        now = time.time()
        reconnects = getattr(stream, "reconnects", ())
        for reconnect in reconnects[self._reconnects_noted :]:
            timeline.mark("reconnect", now, reason=reconnect.reason, close_code=reconnect.close_code)
        self._reconnects_noted = len(reconnects)
        usage = getattr(stream, "usage", None)
        reply_id = decision.reply_id
        noted = self._billed_noted
        if usage is not None and reply_id in usage.reply_ids and (noted is None or reply_id not in noted):
            if noted is None:
                noted = self._billed_noted = set()
            noted.add(reply_id)
            took = (decision.queue_ms or 0.0) + (decision.decide_ms or 0.0)
            timeline.mark("billed_start", back_dated(now, took), state_version=decision.state_version)

    # ------------------------------------------------------------------ actions

    async def _do(self, action: Action) -> None:
        loop = asyncio.get_running_loop()
        if isinstance(action, Send):
            if self.watch.decision_mode == "on_change" and self._asked_at is None:
                self._asked_at = loop.time()
            if self.stream is not None:  # else the stream is built with it (Open)
                await self.stream.set_state(action.state)
        elif isinstance(action, Decide):
            assert self.stream is not None
            self._asked_at = loop.time()
            self._deciding = self._started(self.stream.decide())
        elif isinstance(action, Open):
            if self.watch.decision_mode == "on_change":
                self._asked_at = loop.time()
            # the connection first (once per run); then the run waits for a place holding nothing
            # of the stream (:meth:`_collect`), and builds it only there
            self._opening = self._started(self.streams.resolve_settings())
        elif isinstance(action, Release):
            stream, self.stream = self.stream, None
            self._withdraw()
            self._billed_noted = None  # its decisions are all taken
            if stream is not None:
                stream.close_soon()  # the close frame goes out now; its slot comes back when it is done
                self._closing = self._started(self.streams.close(stream))
            else:
                self.watch.released(loop.time())
        elif isinstance(action, Check):
            assert self._checks is not None and self.relevance is not None
            self._checking = self._started(self._checks(self.relevance.matches, action.previous, action.new))
        elif isinstance(action, Offer):
            if self.stream is not None:
                self._offer = self.stream.capacity.offer(self._on_offer)
                if self._offer.called:
                    self._on_offer()
        elif isinstance(action, Withdraw):
            self._withdraw()

    async def _open(self) -> None:
        """Build the stream about the watch's state, its place among the streams being opened
        held (its slot is near), and enter it; what the source gave while the run waited for the
        place is in the watch's state it is built with, and what it gives meanwhile is sent into
        it (:class:`Send`), so it opens with the newest state."""
        stream = self.stream = self.streams.build(
            self.watch.sent, decision_mode=self.watch.decision_mode, **(self.stream_kwargs or {})
        )
        self._reconnects_noted = 0
        self._billed_noted = None
        await self.streams.enter(stream)

    def _on_offer(self) -> None:
        self._slot_wanted = True
        self._wake()

    def _withdraw(self) -> None:
        offer, self._offer = self._offer, None
        if offer is not None and self.stream is not None:
            self.stream.capacity.withdraw(offer)

    # ------------------------------------------------------------------ the end

    async def reset(self) -> None:
        """Stop everything under way and give the stream up (an asset watch after a failure): the
        watch undoes what it counted as under way and asks again what that was for
        (:meth:`SourceWatch.lost <airflow_provider_systemzero.decisions.source_watch.SourceWatch.lost>`),
        and the next :meth:`next_verdict` starts reading afresh."""
        await self.aclose()
        self.watch.lost(asyncio.get_running_loop().time())

    async def aclose(self) -> None:
        """Stop everything under way and close the stream (the trigger's cleanup): nothing of the
        run is left."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._after_fire = ()  # counted as under way by the watch, which a reset tells
        self._slot_wanted = False
        self._asked_at = None
        self._withdraw()
        change, self._change = self._change, None
        if change is not None:
            change.cancel()
        tasks = [task for task in self._tasks() if task is not None]
        self._reading = self._opening = self._closing = self._deciding = self._checking = None
        for task in tasks:
            task.cancel()
        stream, self.stream = self.stream, None
        place, self._place = self._place, None
        try:
            if tasks:
                await asyncio.wait(tasks)
        finally:
            for task in tasks:
                _retrieved(task)
            if place is not None:  # after the task that built a stream in it ended
                self.streams.leave_opening(place)
            if stream is not None:
                await self.streams.close(stream)


def _retrieved(task: asyncio.Future[Any]) -> None:
    """Take a stopped task's outcome (its error no longer matters), so none is reported unretrieved."""
    if task.cancelled():
        return
    with contextlib.suppress(BaseException):
        task.exception()
