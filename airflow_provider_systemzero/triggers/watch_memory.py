"""What an asset watch remembers across triggerer restarts: whether it already fired for the
current run of met decisions.

Theory of operation
-------------------

An asset watch fires on each transition from "not met" to "met"
(:class:`~airflow_provider_systemzero.decisions.watch.VerdictRules`, ``fired``). Held only in
the triggerer's memory, that flag is lost when the triggerer restarts (a deploy, a failover, a
trigger moved to another triggerer): the restarted trigger's first met decision looks like a
transition, and the consuming Dags are scheduled once more for a run they were already
scheduled for.

Airflow 3.3 gives a watcher trigger a key/value store per watched asset
(``BaseEventTrigger.asset_state_store``, rows in the ``asset_state_store`` table). The watch
keeps one key there, ``systemzero.watch:<watch_id>``, whose value is plain JSON:

``fired``
    the flag;
``identity``
    a digest of the trigger's kwargs: memory written by a watch whose request, condition or
    source has since been edited is not this watch's, and is not used;
``reply_id``, ``at``
    the decision that changed the flag and when (UTC), for the log and for a person reading
    the table.

When the value is written decides what a crash can cost. ``fired = False`` (a decision that
does not meet the condition ended the run) is written at once: until it is, a restart would
miss the next transition. ``fired = True`` is written only once the trigger has handed its event
to Airflow *and* :data:`SETTLE_S` has passed, the time Airflow needs to record the event: a
crash in between fires once more, never not at all (at least once, as the event's ``reply_id``
lets a consumer skip a repeat). A value stays pending until the store took it: a failed write
is tried again, and a trigger that stops gracefully writes a pending ``False`` on its way out
(also one whose write the stop interrupted) and drops a pending ``True``. A writer task exists
only while a value is pending, so a dormant watch holds no task.

Without a store (Airflow 3.1 and 3.2, or a trigger run outside a triggerer) the watch keeps no
memory and says so once, with the reason that applies; a trigger shared by two assets (the same kwargs in two watchers) keeps
none either, and says how to give each its own. A store that cannot be read: the watch starts
afresh (a repeat). A write that fails is logged and tried again: until a ``False`` is written a
restart would miss the next run, until a ``True`` is it may repeat one; the warning says which.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import json
import logging
from typing import Any, Protocol

from airflow_provider_systemzero.protocol.body import JSONValue
from airflow_provider_systemzero.protocol.reconnect import doubled
from airflow_provider_systemzero.protocol.reply import DecisionResult

__all__ = ["SETTLE_S", "WatchMemory"]

log = logging.getLogger(__name__)

#: Seconds between handing an event to Airflow and writing ``fired = True``: Airflow's trigger
#: runner sends its events to the triggerer's supervisor about once a second, which then records
#: them; a crash within this time fires once more.
SETTLE_S = 5.0

#: How long a graceful stop waits to write a pending ``fired = False``.
FLUSH_TIMEOUT_S = 2.0
#: After a failed write the value is tried again in this many seconds, twice as long after each
#: further failure, up to :data:`WRITE_RETRY_MAX_S`.
WRITE_RETRY_FIRST_S = 1.0
WRITE_RETRY_MAX_S = 60.0

#: The key's prefix in the asset's store.
KEY_PREFIX = "systemzero.watch:"


def kwargs_identity(kwargs: dict[str, Any]) -> str:
    """A short digest of a trigger's serialized kwargs: the memory's owner."""
    text = json.dumps(kwargs, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class AssetStateStore(Protocol):
    """What a watch uses of its asset's state store: ``aget`` and ``aset``, as Airflow 3.3's
    ``AssetStateStoreAccessors`` has them (a test may pass any object that has both)."""

    async def aget(self, key: str, default: JSONValue = None) -> JSONValue:
        """The value stored under ``key`` (``default``: none stored)."""
        ...

    async def aset(self, key: str, value: JSONValue) -> None:
        """Store ``value`` under ``key``."""
        ...


class WatchMemory:
    """One watch's ``fired`` flag, kept in the watched asset's store.

    :param store: the trigger's ``asset_state_store`` (``None``: no memory), with ``aget`` and
        ``aset`` as Airflow's ``AssetStateStoreAccessors`` has them.
    :param watch_id: the watch's name (the key).
    :param identity: :func:`kwargs_identity` of the trigger's kwargs.
    :param settle: seconds between an event handed over and ``fired = True`` written (default
        :data:`SETTLE_S`).
    :param stores_given: whether this Airflow gives a watcher trigger its asset's store (3.3: the
        triggerer sets ``asset_state_store`` before ``run()``), so that without one the log says the
        trigger runs outside a triggerer rather than that stores need Airflow 3.3.
    """

    def __init__(
        self,
        store: AssetStateStore | None,
        *,
        watch_id: str,
        identity: str,
        settle: float | None = None,
        stores_given: bool = False,
    ) -> None:
        self._store = store
        self._stores_given = stores_given
        self.watch_id = watch_id
        self.key = KEY_PREFIX + watch_id
        self.identity = identity
        self.settle = SETTLE_S if settle is None else settle
        #: the flag the store holds, as far as this trigger knows (``None``: unknown)
        self._stored: bool | None = None
        #: the value to write next, and the loop time it may be written at
        self._pending: dict[str, Any] | None = None
        self._due = 0.0
        #: a verdict that ended a run, waiting for its event to be handed over
        self._fired_by: DecisionResult | None = None
        #: failed writes in a row (the retry delay doubles with each)
        self._failed_writes = 0
        #: the task writing the pending value (only while one is pending), and what wakes it
        self._writer: asyncio.Future[None] | None = None
        self._wake = asyncio.Event()

    @property
    def kept(self) -> bool:
        """Whether this watch has a store to remember in."""
        return self._store is not None

    async def recall(self) -> bool:
        """The ``fired`` flag this watch left before a restart (``False`` when there is none)."""
        if self._store is None:
            why = (
                "no asset state store was given to this trigger: it runs outside a triggerer, which "
                "gives each asset's watcher its store"
                if self._stores_given
                else "an asset state store needs Airflow 3.3"
            )
            log.info(
                "asset watch %r keeps no memory across triggerer restarts (%s): after a restart a "
                "condition still met fires once more",
                self.watch_id,
                why,
            )
            return False
        try:
            value = await self._store.aget(self.key, None)
        except ValueError:  # Airflow: more than one asset, so no single store
            assets, self._store = self._store, None
            log.warning(
                "asset watch %r keeps no memory across triggerer restarts: Airflow runs one trigger "
                "for the watchers of several assets (%r) when their trigger kwargs are the same, and "
                "a memory needs one asset. Give each asset's watcher its own watch_id; until then a "
                "condition still met after a restart fires once more",
                self.watch_id,
                assets,
            )
            return False
        except Exception as exc:
            log.warning(
                "asset watch %r could not read its memory %r (%s): it starts afresh, so a "
                "condition still met fires once more",
                self.watch_id,
                self.key,
                exc,
            )
            return False
        if not isinstance(value, dict) or value.get("identity") != self.identity:
            if isinstance(value, dict):
                log.info(
                    "asset watch %r: its memory %r was written by other kwargs (request, condition "
                    "or source edited since): it starts afresh, so a condition still met fires once more",
                    self.watch_id,
                    self.key,
                )
            return False
        fired = value.get("fired") is True
        self._stored = fired
        if fired:
            log.info(
                "asset watch %r fired (reply %s, %s) for a run of met decisions that no decision "
                "has ended since: a decision still met does not fire again; the next event needs "
                "one that does not meet the condition first",
                self.watch_id,
                value.get("reply_id"),
                value.get("at"),
            )
        return fired

    def note(self, fired: bool, decision: DecisionResult) -> None:
        """:class:`VerdictRules`'s ``on_fired``: the flag changed with ``decision``."""
        if self._store is None:
            return
        if fired:
            self._fired_by = decision  # written once the event is handed over (handed_over)
            return
        self._fired_by = None
        self._want(False, decision, delay=0.0)

    def handed_over(self) -> None:
        """The trigger's event for the last verdict was taken by Airflow: remember it once settled."""
        decision, self._fired_by = self._fired_by, None
        if self._store is not None and decision is not None:
            self._want(True, decision, delay=self.settle)

    def _want(self, fired: bool, decision: DecisionResult, *, delay: float) -> None:
        """Write ``fired`` (with ``decision``) in ``delay`` seconds, unless a newer value comes first.

        A writer task lives only while a value is pending: a dormant watch holds none."""
        self._pending = {
            "fired": fired,
            "identity": self.identity,
            "reply_id": decision.reply_id,
            "at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        }
        self._due = asyncio.get_running_loop().time() + delay
        if self._writer is None:
            self._writer = asyncio.ensure_future(self._write_pending())
        else:
            self._wake.set()  # the newer value may be due sooner

    async def _write_pending(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._pending is not None:
                delay = self._due - loop.time()
                if delay <= 0:
                    await self._write()
                    continue
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._wake.wait()
        finally:
            self._writer = None

    async def aclose(self) -> None:
        """On the way out (the trigger ends or is cancelled): stop the writer, then write a pending
        ``fired = False`` (bounded) and drop a pending ``True``."""
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
        if self._pending is not None and self._pending["fired"] is False:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(FLUSH_TIMEOUT_S):
                    await self._write()
        self._pending = None

    async def _write(self) -> None:
        """Write the pending value. It stays pending until the store took it: a write cancelled
        on the way out is flushed by :meth:`aclose`, and one that failed is tried again (sooner
        for a newer value)."""
        value = self._pending
        if value is None:
            return
        if value["fired"] == self._stored:
            self._pending = None
            return
        try:
            await self._store.aset(self.key, value)
        except Exception as exc:
            self._failed_writes += 1
            retry = doubled(WRITE_RETRY_FIRST_S, WRITE_RETRY_MAX_S, self._failed_writes - 1)
            if self._pending is value:
                self._due = asyncio.get_running_loop().time() + retry
            log.warning(
                "asset watch %r could not write its memory %r (%s): %s; trying again in %.0f s",
                self.watch_id,
                self.key,
                exc,
                # what a restart before the write would cost, by direction
                "until then a triggerer restart would not fire for the next run of met decisions"
                if value["fired"] is False
                else "until then a triggerer restart may fire once more for the same run",
                retry,
            )
            return
        self._failed_writes = 0
        self._stored = value["fired"]
        if self._pending is value:
            self._pending = None
        log.info("asset watch %r remembered fired=%s (%s)", self.watch_id, value["fired"], self.key)
