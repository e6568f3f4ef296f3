"""A file source: tails a local text file, on the operating system's file notifications.

See :class:`FileSource`; the notifications come from the process's one shared watcher
(:mod:`~airflow_provider_systemzero.triggers.file_watch`).
"""

from __future__ import annotations

import asyncio
import codecs
import errno
import logging
import os
import socket
import threading
from collections.abc import AsyncIterator
from typing import Any

from airflow_provider_systemzero.exceptions import SystemZeroArgumentError
from airflow_provider_systemzero.triggers import file_watch
from airflow_provider_systemzero.triggers.file_watch import Subscription
from airflow_provider_systemzero.triggers.state_source import DEFAULT_POLL_INTERVAL, StateSource

__all__ = ["FINGERPRINT_BYTES", "FileSource", "missing_file"]

log = logging.getLogger("airflow_provider_systemzero.triggers.sources")  # the sources' one log

#: A file source on notifications still checks its file this often (seconds), as a safety net.
NOTIFY_RECHECK_SECONDS = 60.0
#: Bytes at the start of a tailed file, and before the read position, compared on every read.
FINGERPRINT_BYTES = 1024
#: A notified file source reads at most this many new bytes on the event loop (more in a thread).
INLINE_READ_BYTES = 64 * 1024


class FileSource(StateSource):
    """Tails a local text file (see the module docstring).

    How it learns of a change (``watch``): ``notify`` waits for the operating system's file
    notifications through the process's one shared watcher
    (:mod:`~airflow_provider_systemzero.triggers.file_watch`) and checks the file again every
    ``max(poll_interval, 60)`` seconds as a safety net; ``poll`` checks every ``poll_interval``;
    ``auto`` (the default) chooses ``poll`` on network and FUSE filesystems and where the system
    has no inotify, ``notify`` elsewhere.

    The file counts as replaced — and is read again from its start — when its name now refers to
    another file (new inode; a notification of a create, delete or rename of the name), when it is
    shorter than what was read, or when the bytes already read changed: the first and the last
    :data:`FINGERPRINT_BYTES` before the read position are compared on every read, so a job re-run
    writing with shell ``>``, ``copytruncate`` followed by a fast writer, and ``rm`` + recreate that
    reuses the inode number are read afresh rather than spliced.

    :param path: the file.
    :param prefix: the initial state the file content is appended to.
    :param encoding: the file's text encoding.
    :param poll_interval: seconds between checks when polling.
    :param watch: ``auto``, ``notify`` or ``poll``.
    :param must_exist: fail when the file does not exist at the start (default: read it as empty).
    """

    def __init__(
        self,
        path: str,
        *,
        prefix: str = "",
        encoding: str = "utf-8",
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        watch: str = "auto",
        must_exist: bool = False,
    ) -> None:
        self.path = path
        self.must_exist = must_exist
        self._seen = False
        self.prefix = prefix
        self.encoding = encoding
        self.poll_interval = poll_interval
        self.watch = watch
        #: ``notify`` or ``poll`` once :meth:`changes` runs.
        self.mode: str | None = None
        #: what :func:`~.file_watch.watch_mode` chose once the file's directory existed: the mount
        #: table is read once per source, not at every stream and dormant wait
        self._chosen: str | None = None
        self._text = prefix
        self._offset = 0
        self._identity: tuple[int, int] | None = None
        self._head = b""
        self._tail = b""
        self._decoder = codecs.getincrementaldecoder(encoding)(errors="replace")
        self._replaced = False
        self._resubscribe = False
        #: a notification came since the last read (or nothing was read yet): the next
        #: ``changes()`` reads before it yields; otherwise it yields the text it has
        self._stale = True
        #: held by the one read in progress: a read runs to its end in its thread even when the
        #: refresh that started it is cancelled (a feeder closed when its stream went quiet), and
        #: the next read, from the next iterator, must start where that one ended
        self._reading = threading.Lock()
        #: one event per open ``changes()`` iterator, each set by a notification: a trigger's next
        #: iterator (a dormant wait, a new stream) may start before the last one is closed
        self._wakes: set[asyncio.Event] = set()
        #: the source's watch: kept from its first ``changes()`` until :meth:`aclose` (the
        #: trigger's cleanup), so the iterators of a trigger's streams and dormant waits, one
        #: after the other, cost no subscribe, no unsubscribe and no read of an unchanged file
        self._subscriptions: list[Subscription] = []
        #: the source's one timer while an iterator is open: the next poll, or on notifications the
        #: safety re-check; it wakes every open iterator (one timer per source, not one per wait)
        self._timer: asyncio.TimerHandle | None = None

    # ---------------------------------------------------------------- reading (in a worker thread)

    def _forget_file(self) -> None:
        self._offset, self._identity, self._head, self._tail = 0, None, b"", b""
        self._decoder.reset()

    def _same_prefix(self, fd: int) -> bool:
        """Whether the bytes already read are still there (their first and last bytes compared)."""
        if os.pread(fd, len(self._head), 0) != self._head:
            return False
        if self._offset <= len(self._head):
            return True
        return os.pread(fd, len(self._tail), self._offset - len(self._tail)) == self._tail

    def _remember(self, data: bytes) -> None:
        if len(self._head) < FINGERPRINT_BYTES:
            self._head += data[: FINGERPRINT_BYTES - len(self._head)]
        self._tail = (
            data[-FINGERPRINT_BYTES:]
            if len(data) >= FINGERPRINT_BYTES
            else (self._tail + data)[-FINGERPRINT_BYTES:]
        )

    def _read(self, replaced: bool, limit: int | None = None) -> bool | None:
        """Blocking part: read what changed and take it into the text (``True``: done).

        The read position and the text move together, under :attr:`_reading`: a read whose caller
        was cancelled meanwhile still leaves text that holds everything read (every iterator
        yields the text when it differs from what that iterator yielded last), never a position
        past bytes the text lacks.

        :param limit: with a limit, read nothing and return ``None`` when more than ``limit``
            bytes would be read, or when another read is in progress (the caller reads in a
            thread instead); without one, wait for the read in progress.
        """
        if not self._reading.acquire(blocking=limit is None):
            return None
        try:
            read = self._read_file(replaced, limit)
            if read is None:
                return None
            restart, new = read
            if restart:
                text = self.prefix + new
                if text != self._text:
                    self._text = text
                    log.info("%s was replaced or rewritten: read again from its start", self.path)
            elif new:
                self._text += new
            return True
        finally:
            self._reading.release()

    def _read_file(self, replaced: bool, limit: int | None) -> tuple[bool, str] | None:
        """``(restart, text)``: the new text, to append or (``restart``) to start over with."""
        try:
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:  # a missing file counts as empty
            if not self._seen:
                self._seen = True  # said once (or, with must_exist, raised)
                missing_file(self.path, self.must_exist)
            restart = self._identity is not None
            self._forget_file()
            return restart, ""
        self._seen = True
        try:
            stat = os.fstat(fd)
            identity = (stat.st_dev, stat.st_ino)
            restart = self._identity is not None and (
                replaced
                or identity != self._identity
                or stat.st_size < self._offset
                or (self._offset > 0 and not self._same_prefix(fd))
            )
            if limit is not None and stat.st_size - (0 if restart else self._offset) > limit:
                return None
            if restart:
                self._forget_file()
            self._identity = identity
            chunks = []
            while self._offset < stat.st_size:
                data = os.pread(fd, stat.st_size - self._offset, self._offset)
                if not data:
                    break
                self._remember(data)
                self._offset += len(data)
                chunks.append(data)
        finally:
            os.close(fd)
        return restart, self._decoder.decode(b"".join(chunks)) if chunks else ""

    async def _refresh(self) -> None:
        """Read what changed into the text."""
        replaced, self._replaced = self._replaced, False
        self._stale = False  # a notification during the read marks it again
        # A small read of a local file (one notifications work for) comes from the page cache in
        # microseconds: it is done here, saving the hop to a thread and back (a scheduling delay
        # of its own on a busy machine) and the executor's threads. Anything larger, and a file
        # that is polled (maybe on a network filesystem), is read in a thread.
        local = self._chosen == "notify" or (self._subscriptions and self._identity)
        done = self._read(replaced, INLINE_READ_BYTES) if local else None
        if done is None:
            await asyncio.to_thread(self._read, replaced)

    # ---------------------------------------------------------------- notifications

    def _on_event(self, mask: int) -> None:
        self._stale = True
        if mask & file_watch.REPLACED:
            self._replaced = True
        if mask & file_watch.LOST or (mask & file_watch.REPLACED and len(self._subscriptions) > 1):
            self._resubscribe = True  # the directory went away, or a symlink may point elsewhere now
        for wake in self._wakes:
            wake.set()

    def _subscribe(self) -> None:
        if self.mode != "notify" or self._subscriptions:
            return
        self._resubscribe = False
        try:
            watcher = file_watch.shared_watcher()
            for path in dict.fromkeys((os.path.abspath(self.path), os.path.realpath(self.path))):
                self._subscriptions.append(watcher.subscribe(path, self._on_event))
            self._stale = True  # unwatched until now: read once the watch is in place
        except OSError as exc:
            self._unsubscribe()
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
                log.warning(
                    "file notifications are unavailable for %s (%s): polling it every %.3g s",
                    self.path,
                    exc,
                    self.poll_interval,
                )
                self.mode = "poll"
            # else: the directory does not exist yet; poll until it does

    def _unsubscribe(self) -> None:
        subscriptions, self._subscriptions = self._subscriptions, []
        for subscription in subscriptions:
            subscription.watcher.unsubscribe(subscription)

    async def _next_change(self, wake: asyncio.Event) -> None:
        """Wait for a notification or the source's timer on ``wake`` (see :meth:`_arm`)."""
        if self._resubscribe or (self.mode == "notify" and not self._subscriptions):
            self._unsubscribe()
            self._subscribe()
            self._arm()  # polling or notified now: the timer's interval changed
            if self._subscriptions:
                return  # watching again: look at once, something may have changed meanwhile
        if self._timer is None:
            self._arm()
        await wake.wait()
        wake.clear()

    def _arm(self) -> None:
        """(Re)start the source's timer: ``poll_interval`` when polling, the safety re-check
        (``max(poll_interval, 60)`` s) on notifications. It is armed when an iterator waits and no
        timer is pending, so a poll comes ``poll_interval`` after the last one's read."""
        if self._timer is not None:
            self._timer.cancel()
        wait = max(self.poll_interval, NOTIFY_RECHECK_SECONDS) if self._subscriptions else self.poll_interval
        self._timer = asyncio.get_running_loop().call_later(wait, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        for wake in self._wakes:
            wake.set()

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _choose_mode(self) -> str:
        if self._chosen is not None:
            return self._chosen
        mode = file_watch.watch_mode(self.path, self.watch)
        if os.path.isdir(os.path.dirname(os.path.abspath(self.path))):
            self._chosen = mode  # judged by the directory itself, not by a parent: final
        return mode

    # ---------------------------------------------------------------- the source API

    async def current(self) -> str:
        if self.mode is None:
            self._choose_mode()  # known before the first read: a local file is read on the loop
        await self._refresh()
        return self._text

    async def changes(self) -> AsyncIterator[Any]:
        wake = asyncio.Event()
        self._wakes.add(wake)
        self.mode = self._choose_mode()
        if self._resubscribe:  # the directory went away while no iterator was open
            self._unsubscribe()
        self._subscribe()
        log.debug(
            "tailing %s (%s)",
            self.path,
            "file notifications" if self._subscriptions else f"polling every {self.poll_interval:.3g} s",
        )
        try:
            # read unless watched and unchanged since the last read, and no read is in progress
            # (one a cancelled iterator left running in a thread: wait for it)
            if self._stale or not self._subscriptions or self._reading.locked():
                await self._refresh()
            last = self._text
            yield last
            while True:
                await self._next_change(wake)
                await self._refresh()
                # what this iterator has not yielded yet (another iterator's read may have taken
                # the change into the text: the text is compared, not the read's result)
                if self._text is not last and self._text != last:
                    last = self._text
                    yield last
        finally:
            self._wakes.discard(wake)
            if not self._wakes:
                self._disarm()

    async def aclose(self) -> None:
        self._disarm()
        self._unsubscribe()


def missing_file(path: str, must_exist: bool) -> None:
    """A file source's file does not exist: fail (``must_exist``) or say so once and read it as empty.

    :raises SystemZeroArgumentError: with ``must_exist``.
    """
    host = socket.gethostname()
    if must_exist:
        raise SystemZeroArgumentError(
            f"source file {path!r} does not exist on host {host!r}: check the path (it is read "
            "on the triggerer's host, or the worker's in poke mode)",
            code="missing_file",
            field="source.path",
        )
    log.warning(
        "source file %r does not exist on host %r: it is read as empty until it appears; if the path is "
        'wrong, fix it, or set "must_exist": True to fail instead',
        path,
        host,
    )
