"""May this stream start a decision now? The whole rule, on the asyncio side of :mod:`~airflow_provider_systemzero.protocol.starts`.

An account may start so many decisions at once and so many a minute, over all its streams and
processes (``account_decision_burst``, ``account_decision_ceiling``). Two classes hold what a
process does about it:

* :class:`AccountStarts` — one per account (gateway URL and API key) and event loop, shared by the
  process's streams to it (:func:`decision_starts`): the pure
  :class:`~airflow_provider_systemzero.protocol.starts.StartQueue` (the mirror of the account's
  bucket, who goes next, what a 429 changes) and the one timer that grants turns.
* :class:`StreamStarts` — one per stream: everything the stream does about its starts. Its
  connection takes the stream's turn in one place before it opens (:meth:`StreamStarts.turn`);
  the stream asks in one place before its session writes what starts a decision
  (:meth:`StreamStarts.admit`), and says how each start ended (:meth:`StreamStarts.ended`).

The rule: on_change a connection's ``start`` starts a decision (unless it replays a state already
decided) and cannot wait once the connection is open, so the turn comes *before* the connection
takes a slot of ``max_streams_per_process``; with no slot free, the turn goes back and the stream
waits for a slot first in line, then for the next token. On an open connection, what starts a
decision waits for a turn; a stream that waits after its connection had a decision offers its slot
to a stream waiting for one (a stream whose turn came and found no slot is first in line, so a
slot kept by a stream waiting for its own turn would stall every start of the process). A 429 —
another process spends the account — adapts the mirror: on_change the stream gives its connection
back instead of letting the gateway retry (and close it with 1013 at the third refusal), and opens
again on its turn; on_request the stream is first in line again, its ``decide`` asked again
without spending ``decide_retries``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from airflow_provider_systemzero.deprecations import Renamed, warn_once
from airflow_provider_systemzero.protocol.limits import Limits
from airflow_provider_systemzero.protocol.messages import ClientMessage, Error, Start
from airflow_provider_systemzero.protocol.starts import StartQueue
from airflow_provider_systemzero.stream.capacity import SlotOffer, StreamCapacity

if TYPE_CHECKING:
    from airflow_provider_systemzero.protocol.client import ClientSession
    from airflow_provider_systemzero.stream.stream_connection import StreamConnection

__all__ = [
    "AccountStarts",
    "StreamStarts",
    "decision_starts",
    "key_fingerprint",
    "running_starts",
]

log = logging.getLogger(__name__)


def key_fingerprint(api_key: str) -> str:
    """A short, non-secret tag of an API key (12 hex digits of its SHA-256): streams with the same
    key share the account's starts; the key itself is never kept."""
    return hashlib.sha256(api_key.strip().encode("utf-8")).hexdigest()[:12]


def _now() -> float:
    return asyncio.get_running_loop().time()


class AccountStarts:
    """One account's decision starts in this process (on the running event loop; see the module).

    It holds no reference to its loop (the loop's time is read when asked), so a loop that ends —
    a sync ``SystemZeroHook.decide()``'s — is collected even while this object is kept for it.

    :param label: how the log names the account (the gateway URL and the key's fingerprint).
    :param now: the loop's time when it is made.
    """

    def __init__(self, label: str, now: float) -> None:
        self.label = label
        #: The mirror of the account's bucket and the streams waiting for a start (pure).
        self.queue = StartQueue(now=now)
        #: What wakes each waiting stream when its turn comes (keyed as the queue keys it).
        self._wake: dict[Any, Callable[[], None]] = {}
        #: The one timer, weakly: the loop holds it while it is scheduled, and a timer holds its loop.
        self._timer: weakref.ref[asyncio.TimerHandle] | None = None

    def adopt(self, limits: Limits) -> None:
        """A ``hello``: the account's burst and ceiling it advertises (the published ones if none).

        :param limits: the connection's limits.
        """
        queue = self.queue
        before = (queue.burst, queue.ceiling)
        queue.adopt(limits.account_decision_burst, limits.account_decision_ceiling_per_minute, _now())
        if (queue.burst, queue.ceiling) != before:
            log.info(
                "the gateway advertises the account's decision limits (%s): %d starts at once, %d a minute",
                self.label,
                queue.burst,
                round(queue.ceiling * 60),
            )
        self._schedule()

    def may_start(self, stream: Any, version: int, wake: Callable[[], None]) -> bool:
        """Asked before ``stream`` writes what starts a decision about ``version`` (or opens the
        connection whose ``start`` will).

        :param stream: the waiting stream's key in the queue.
        :param version: the stream's newest version (its session's generation: it grows across
            connections).
        :param wake: called (no arguments) when the stream's turn comes.
        :returns: whether it may go now; if not, ``wake`` is called when it may.
        """
        now = _now()
        if self.queue.request(stream, version, now):
            self._wake.pop(stream, None)
            return True
        first = stream not in self._wake
        self._wake[stream] = wake
        if first:
            log.info(
                "decision start waits its turn under the account's decision ceiling (%s): %d stream(s) "
                "of this process wait, next start in %.3f s",
                self.label,
                self.queue.waiting,
                max(0.0, (self.queue.wakeup(now) or now) - now),
            )
        self._schedule()
        return False

    def start_sent(self, stream: Any, version: int) -> None:
        """An on_change ``start`` that starts a decision about ``version`` goes out (it cannot be
        held once the connection is open): its token is the grant the stream waited for before
        opening, or one taken now (owed, if the mirror has none)."""
        now = _now()
        if not (self.queue.holds_grant(stream) and self.queue.request(stream, version, now)):
            self.queue.withdraw(stream)
            self.queue.note_start(now)
        self._wake.pop(stream, None)

    def postpone(self, stream: Any, version: int, *, counted: bool) -> None:
        """``stream``'s turn came, but its start cannot go out yet (its connection waits for a
        socket): the token goes back, and the stream is first in line when it asks again.

        :param version: the stream's newest version.
        :param counted: its turn was a start counted at once (not a grant it waited for).
        """
        self.queue.postpone(stream, version, _now(), counted=counted)
        self._wake.pop(stream, None)
        self._schedule()

    def changed(self, stream: Any, version: int) -> None:
        """``stream`` changed its state to ``version``: if it waits for a start, the start is
        for that one and its newest change counts from now."""
        self.queue.changed(stream, version, _now())

    def ended(self, stream: Any, error: Error | None, version: int, *, requeue: bool) -> None:
        """A start of ``stream`` ended: a decision arrived (``error`` ``None``) or it failed.

        :param version: the stream's newest version now.
        :param requeue: on a 429, put the stream back at the front (the client asks again);
            ``False`` when the gateway retries it itself.
        """
        now = _now()
        if error is None or error.http_status != 429:
            self.queue.accepted(now)
            return
        delay_ms = error.retry.retry_after_ms
        first = not self.queue.limited
        self.queue.refused(
            stream, version, None if delay_ms is None else delay_ms / 1000, now, requeue=requeue
        )
        if first:
            log.info(
                "the account's decision ceiling was reached (%s, 429 rate_limited): another process "
                "spends the account too; this one waits %.3f s, then starts at most one decision every "
                "%.3f s, longest waiting first, and less as long as the gateway refuses",
                self.label,
                max(0.0, self.queue.blocked_until - now),
                self.queue.pace,
            )
        self._schedule()

    def withdraw(self, stream: Any) -> None:
        """``stream`` wants no start any more (it closed, or its connection ended)."""
        self.queue.withdraw(stream)
        self._wake.pop(stream, None)
        self._schedule()

    def _schedule(self) -> None:
        timer = self._timer() if self._timer is not None else None
        if timer is not None:
            timer.cancel()
        self._timer = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        at = self.queue.wakeup(now)
        if at is not None:
            self._timer = weakref.ref(loop.call_at(max(at, now), self._fire))

    def _fire(self) -> None:
        self._timer = None
        now = _now()
        while (grant := self.queue.grant(now)) is not None:
            wake = self._wake.pop(grant.stream, None)  # a stream requeued by a 429 is woken by asking again
            log.debug("decision start granted after %.3f s (%s)", grant.waited, self.label)
            if wake is not None:
                wake()
        self._schedule()


class StreamStarts:
    """One stream's decision starts under its account's ceiling: the whole rule of "may this
    stream start a decision now?" (see the module). The stream is known to the account's queue by
    this object.

    :param account: the account's starts shared in this process.
    :param session: the stream's session (its decision mode and generation; whether its
        ``start`` starts a decision; asked again when a held start's turn comes).
    :param capacity: the stream cap whose slot each connection holds.
    :param origin: the gateway, as the stream cap counts it.
    :param decision_mode: deprecated: the session's mode is the stream's (a different one is
        refused).
    """

    def __init__(
        self,
        account: AccountStarts,
        session: ClientSession,
        capacity: StreamCapacity,
        *,
        origin: str,
        decision_mode: str | None = None,
    ) -> None:
        if decision_mode is not None:
            warn_once("StreamStarts(decision_mode=...)", "the session's decision_mode, which it reads")
            if decision_mode != session.decision_mode:
                raise ValueError(
                    f"StreamStarts(decision_mode={decision_mode!r}) differs from its session's "
                    f"{session.decision_mode!r}: a stream's starts follow its session; leave it out"
                )
        self.account = account
        self._session = session
        self._capacity = capacity
        self._origin = origin
        self._on_change = session.decision_mode == "on_change"
        #: The connection that holds this stream's slot now (set and cleared by :meth:`turn`):
        #: the one whose start is held, whose slot is offered and which a 429 gives back.
        self._connection: StreamConnection | None = None
        #: on_change: the opening's turn counted the start its connection sends (set by
        #: :meth:`_turn_to_open`, cleared when that ``start`` is admitted or the turn goes back).
        self._opening_counted = False
        #: The offer of the connection's slot while its next start waits for its turn (made by
        #: :meth:`admit`; it ends when the turn comes unasked, else once the slot is free).
        self._slot_offer: SlotOffer | None = None
        #: The budget stopped the stream: no held start is asked again (set by :meth:`budget_exceeded`).
        self._stopped = False
        #: The stream closed: it waits in no queue any more (set by :meth:`leave`).
        self._left = False

    @property
    def waiting(self) -> bool:
        """Whether the stream waits for its turn (queued, or granted and not started yet)."""
        return self.account.queue.is_waiting(self)

    def hello(self, limits: Limits) -> None:
        """The gateway said ``hello``: its cap on the streams to it (``max_streams_per_process``)
        bounds this stream's slots, and its account's decision limits the account's starts.

        :param limits: the limits it advertised.
        """
        self._capacity.adopt_advertised(limits.max_streams_per_process, self._origin)
        self.account.adopt(limits)

    # ------------------------------------------------------------------ the connection's turn

    @asynccontextmanager
    async def turn(self, connection: StreamConnection) -> AsyncIterator[None]:
        """``async with starts.turn(connection):`` open and serve ``connection`` in the block: it
        is entered once this stream's turn came (on_change, when the connection's ``start`` starts
        a decision) and the connection holds a slot of ``max_streams_per_process``; the slot is
        given back when the block ends, and an offer of it with it.

        :param connection: the stream's connection, which holds the slot for the block.
        """
        await self._slot_after_turn(await self._turn_to_open())
        self._connection = connection
        try:
            yield
        finally:
            self._connection = None
            self._capacity.release(self._origin)
            # an offer of the slot ends with it: not before, so that an offer the capacity asked
            # counts as the hand-over to a waiting stream until the slot is free
            self._withdraw_slot_offer()
            if not self._on_change:
                self.account.withdraw(self)  # a decide is granted to a connected stream only
            # (on_change keeps its place: its next connection waits for its turn before it opens)
            self._ask_again()  # a held start is asked anew on the next connection

    async def _turn_to_open(self) -> bool:
        """on_change: wait for this stream's turn before a connection whose ``start`` starts a
        decision takes a slot (once open, the ``start`` cannot wait); returns whether a turn came
        (counted or granted)."""
        self._opening_counted = False
        if not self._on_change or self._left or not self._start_decides():
            return False
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not turn.done():
                turn.set_result(None)

        if self.account.may_start(self, self._session.generation, wake):
            self._opening_counted = True  # counted now: its start is not counted again
        else:
            await turn  # granted: the start spends the grant
        return True

    async def _slot_after_turn(self, turn_taken: bool) -> None:
        """Take a slot for the connection whose turn came (``turn_taken``: on_change, a turn its
        ``start`` would spend). When none is free, the turn goes back (its token returns, and the
        stream stays first in line) while it waits for one, and is taken again once it holds the
        slot: a start's token is spent when its ``start`` can go out, not a socket's wait earlier,
        so the starts reach the gateway as the mirror spaced them."""
        capacity, origin = self._capacity, self._origin
        if capacity.try_acquire(origin):
            return
        if turn_taken:
            self.account.postpone(self, self._session.generation, counted=self._opening_counted)
        self._opening_counted = False
        await capacity.acquire(origin)
        try:
            await self._turn_to_open()  # first in line: at most the wait for the next token
        except BaseException:
            capacity.release(origin)
            raise

    # ------------------------------------------------------------------ the stream's starts

    def admit(self, message: ClientMessage) -> bool:
        """Whether the stream's session may write ``message``, which can start a dispatch, now.

        An on_change ``start`` spends the turn its connection took before opening (it cannot
        wait); anything else waits for a turn of the account's queue when it has none: the
        session is asked again when the turn comes, and a connection that had its decision offers
        its slot meanwhile.

        :param message: what the session would write.
        """
        version = self._session.generation
        if isinstance(message, Start):
            # on_change: a start replaying a state already decided starts none (the gateway's
            # idempotency ledger answers it with the original reply)
            if self._start_decides():
                if not self._opening_counted:
                    self.account.start_sent(self, version)
                self._opening_counted = False
            return True
        # a mutation counts even when a decision is pending behind the one in flight: by the time
        # it arrives, that one may have been dispatched, and the mutation makes the next
        if self.account.may_start(self, version, self._turn_came):
            return True
        if self._left:
            self.account.withdraw(self)  # a closed stream's last write waits in no queue
            return False
        connection = self._connection
        if connection is not None and connection.open and connection.decided and self._slot_offer is None:
            # its slot goes to a stream waiting for one: now, or as soon as one waits. The
            # capacity asks one holder per waiter, so several streams waiting for their turns do
            # not all give their slots back for one stream waiting for a slot
            self._slot_offer = self._capacity.offer(self._slot_wanted)
        return False

    def _start_decides(self) -> bool:
        """on_change: whether the next ``start`` starts a decision (its state was not decided)."""
        return self._session.current_decision is None

    def _turn_came(self) -> None:
        """The account granted the start the session holds: it is asked again on its newest state,
        on the connection it has; an offer of the slot ends — unless the capacity already asked
        for the slot: then it ends once the slot is given back."""
        connection = self._connection
        if connection is None or not connection.giving_back:
            self._withdraw_slot_offer()
        self._ask_again()
        if connection is not None:
            connection.kick()

    def _ask_again(self) -> None:
        """Let the session ask for its start again (unless the budget stopped the stream)."""
        if not self._stopped:
            self._session.retry_admission()

    def _slot_wanted(self) -> None:
        """A stream waits for a slot while this one waits for its turn: the connection is given
        back (the next one opens when the turn comes)."""
        connection = self._connection
        if (
            self._slot_offer is not None
            and connection is not None
            and connection.open
            and not connection.giving_back
        ):
            log.info(
                "another stream waits for a socket while this one waits for its turn under the "
                "account's decision ceiling: the connection is given back, and the newest state is "
                "decided on a new one"
            )
            connection.give_back()

    def _withdraw_slot_offer(self) -> None:
        offer, self._slot_offer = self._slot_offer, None
        self._capacity.withdraw(offer)

    def ended(self, error: Error | None) -> bool:
        """A start of this stream ended: a decision arrived (``error`` ``None``) or its dispatch
        failed. Returns whether the stream gives its connection back for it: on_change, a 429 the
        gateway would retry by itself, closing the stream with 1013 at its third refusal in a row
        for the version (WIRE.md §5) — the stream does not wait for that: with the connection
        closed, its start waits for its turn under the account's ceiling, and its newest state is
        decided on a new connection.

        :param error: the dispatch's failure, or ``None`` for a decision.
        """
        version = self._session.generation
        if error is None:
            self.account.ended(self, None, version, requeue=False)
            return False
        connection = self._connection
        give_back = (
            self._on_change
            and error.http_status == 429
            and not error.fatal
            and connection is not None
            and connection.open
        )
        self.account.ended(self, error, version, requeue=not self._on_change or give_back)
        if self._left:
            self.account.withdraw(self)  # a 429 heard while the stream closes requeues nothing
            return False
        if give_back and connection is not None:
            log.info(
                "decision refused with HTTP 429 (another process spends the account too): the "
                "connection is given back before the gateway retries it, and the state is decided "
                "again on a new one when this process's turn comes"
            )
            connection.give_back()
        return give_back

    def asks_again(self, http_status: int | None) -> bool:
        """on_request: whether a ``decide()`` that failed with ``http_status`` is asked again
        through the account's queue rather than retried by the caller: a 429 puts the stream first
        in line, and the queue waits out its Retry-After once for every stream of the process
        (``decide_retries`` is not spent).

        :param http_status: the failure's status.
        """
        return http_status == 429 and not self._left

    def changed(self) -> None:
        """The caller changed the state: if the stream waits for its start, the start is for the
        newest state, and its newest change counts from now."""
        if not self._left:
            self.account.changed(self, self._session.generation)

    def budget_exceeded(self) -> None:
        """The budget refused a dispatch of the stream: a held start is not asked again (its turn
        coming, or a new connection, lifts no hold)."""
        self._stopped = True

    def leave(self) -> None:
        """The stream closes: it wants no start any more (an offer of its slot ends when the
        connection gives the slot back)."""
        self._left = True
        self.account.withdraw(self)


_BY_LOOP: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, str], AccountStarts]] = (
    weakref.WeakKeyDictionary()
)


def decision_starts(url: str, api_key: str) -> AccountStarts:
    """The running loop's :class:`AccountStarts` for the account behind ``api_key`` at ``url``.

    :param url: the gateway's stream URL.
    :param api_key: the account's key (only its fingerprint is kept).
    """
    loop = asyncio.get_running_loop()
    fingerprint = key_fingerprint(api_key)
    per_loop = _BY_LOOP.setdefault(loop, {})
    starts = per_loop.get((url, fingerprint))
    if starts is None:
        starts = per_loop[(url, fingerprint)] = AccountStarts(f"{url} key {fingerprint}", loop.time())
    return starts


def running_starts() -> list[AccountStarts]:
    """Every account's :class:`AccountStarts` on the running loop (what a process reports: the
    fleet and ceiling benchmarks read each account's queue through it)."""
    return list(_BY_LOOP.get(asyncio.get_running_loop(), {}).values())


#: ``DecisionStarts``, the name :class:`AccountStarts` had before :class:`StreamStarts` carried the
#: rule for a stream, still imports (warning once per process).
__getattr__ = Renamed(__name__, {"DecisionStarts": ("AccountStarts", lambda: AccountStarts)})
