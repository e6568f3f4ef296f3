"""A file source: tails a local regular text file, on the operating system's file notifications.

See :class:`FileSource`; the notifications come from the process's one shared watcher
(:mod:`~airflow_provider_systemzero.sources.file_watch`).
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import errno
import logging
import os
import socket
import stat as stat_module
import threading
from functools import lru_cache
from typing import Any

from airflow_provider_systemzero.deprecations import warn_once
from airflow_provider_systemzero.exceptions import SystemZeroArgumentError
from airflow_provider_systemzero.sources import file_watch
from airflow_provider_systemzero.sources.base import DEFAULT_POLL_INTERVAL, StateSource, after

__all__ = ["FINGERPRINT_BYTES", "INLINE_READ_BYTES", "FileSource", "missing_file", "not_a_regular_file"]

log = logging.getLogger(__name__)

#: Bytes at the start of a tailed file, and before the read position, compared on every read.
FINGERPRINT_BYTES = 1024
#: A notified file source reads at most this many new bytes on the event loop (more in a thread).
INLINE_READ_BYTES = 64 * 1024


class FileSource(StateSource):
    """Tails a local regular text file (see the module docstring).

    How it learns of a change (``notifications``): ``notify`` waits for the operating system's file
    notifications through the process's one shared watcher
    (:mod:`~airflow_provider_systemzero.sources.file_watch`), whose one re-check timer also
    compares every watched file with what was read every :data:`~.file_watch.RECHECK_SECONDS`
    as a safety net (the source keeps no timer of its own); ``poll`` checks every
    ``poll_interval`` (one timer per wait); ``auto`` (the default) chooses ``poll`` on network and
    FUSE filesystems and where the system has no inotify, ``notify`` elsewhere.

    A waiting trigger on notifications awaits one future of the source's, resolved by the
    watcher (:meth:`changed`); the source is its own subscriber (:meth:`__call__`), and keeps no
    decoder while no partial character is pending.

    Only a regular file is read. A FIFO, a device, a socket or a directory at the path is refused
    with an error naming the path (opening a FIFO for reading would wait for a writer, and a
    device may never end): the path is checked with ``stat`` before it is opened, the file is
    opened without blocking, and what was opened is checked again.

    The file counts as replaced — and is read again from its start — when its name now refers to
    another file (new inode; a notification of a create, delete or rename of the name), when it is
    shorter than what was read, or when the bytes already read changed: the first and the last
    :data:`FINGERPRINT_BYTES` before the read position are compared on every read, so a job re-run
    writing with shell ``>``, ``copytruncate`` followed by a fast writer, and ``rm`` + recreate that
    reuses the inode number are read afresh rather than spliced.

    While the file does not exist or is empty, the source's state holds none of it; such a state
    is withheld (:meth:`withheld`: a trigger opens no stream about it and sends it to none), so
    nothing is decided or billed until the file has content, unless ``decide_empty``.

    :param path: the file.
    :param prefix: the initial state the file content is appended to.
    :param encoding: the file's text encoding.
    :param poll_interval: seconds between checks when polling.
    :param notifications: ``auto``, ``notify`` or ``poll`` (``watch`` before 0.2, still read).
    :param must_exist: fail when the file does not exist at the start (default: wait for it).
    :param decide_empty: decide a state that holds none of the file (it does not exist, or it is
        empty); by default such a state is withheld (:meth:`withheld`): nothing is decided or
        billed until the file has content.
    """

    def __init__(
        self,
        path: str,
        *,
        prefix: str = "",
        encoding: str = "utf-8",
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        notifications: str = "auto",
        must_exist: bool = False,
        decide_empty: bool = False,
        watch: str | None = None,
    ) -> None:
        if watch is not None:  # its name before 0.2
            warn_once("FileSource(watch=...)", "FileSource(notifications=...)")
            notifications = watch
        self.path = path
        self.must_exist = must_exist
        self.decide_empty = decide_empty
        self._seen = False
        #: the last read found no file (read as empty)
        self._missing = False
        #: a withheld state was said so (once per stretch without content; see :meth:`withheld`)
        self._said_empty = False
        self.prefix = prefix
        self.encoding = encoding
        self.poll_interval = poll_interval
        self.notifications = notifications
        #: ``notify`` or ``poll`` once the source was first read or waited on.
        self.mode: str | None = None
        #: what :func:`~.file_watch.watch_mode` chose once the file's directory existed: the mount
        #: table is read once per source, not at every wait
        self._chosen: str | None = None
        self._text = prefix
        self._offset = 0
        self._identity: tuple[int, int] | None = None
        self._mtime = 0  # the file's st_mtime_ns as last read (the watcher's re-check compares it)
        self._head = b""
        self._tail = b""
        #: made for a read, kept only while it holds part of a character (or a byte-order mark's choice)
        self._decoder: codecs.IncrementalDecoder | None = None
        self._replaced = False
        self._resubscribe = False
        #: a notification came since the last read (or nothing was read yet): the next
        #: :meth:`read` reads the file; otherwise it returns the text it has
        self._stale = True
        #: held by the one read in progress: a read runs to its end in its thread even when the
        #: reader that started it is cancelled, and the next read must start where that one ended
        self._reading = threading.Lock()
        #: the future a waiting reader awaits (:meth:`changed`), resolved by a notification
        self._waiter: asyncio.Future[None] | None = None
        #: the source's watch: the paths it subscribed to the watcher under, kept from its first
        #: read until :meth:`aclose` (the trigger's cleanup), so a trigger's streams and waits,
        #: one after the other, cost no subscribe, no unsubscribe and no read of an unchanged file
        self._watcher: file_watch.FileWatcher | None = None
        self._watched: tuple[str, ...] = ()

    @property
    def subscribed(self) -> bool:
        """Whether the source holds its subscriptions to the file notifications (from its first
        read in ``notify`` mode until :meth:`aclose`, or until it falls back to polling)."""
        return bool(self._watched)

    # ---------------------------------------------------------------- reading (in a worker thread)

    def _forget_file(self) -> None:
        self._offset, self._identity, self._head, self._tail = 0, None, b"", b""
        self._decoder = None

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
        was cancelled meanwhile still leaves text that holds everything read (the next
        :meth:`read` returns it), never a position past bytes the text lacks.

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

    def read_now(self) -> str:
        """The file read as a trigger reads it (the same bytes kept, line endings included; a
        replaced file read from its start; a missing file said once), in the calling thread."""
        self._read(self._replaced)
        self._replaced = False
        return self._text

    def describe(self) -> str:
        """The file and the host it is read on."""
        return f"the file {self.path!r} on host {socket.gethostname()!r}"

    def withheld(self, state: Any) -> bool:
        """Whether ``state`` holds none of the file — it does not exist, or it is empty (truncated,
        or between a rotation and the new file's first write) — and so is not decided, unless
        ``decide_empty``. Without content there is no evidence to decide: a decision would be
        billed, and a condition such as ``failed = False`` could end a wait on a log not written
        yet. Said once each time the file goes without content.

        :param state: a state the source gave (the initial state followed by the file's content).
        """
        if self.decide_empty or state != self.prefix:
            self._said_empty = False
            return False
        if not self._said_empty:
            self._said_empty = True
            log.info(
                "%s: nothing is sent or decided (or billed) until it has content; "
                'set "decide_empty": True in the source to decide it anyway',
                self._without_content(),
            )
        return True

    def _without_content(self) -> str:
        where = f"the file {self.path!r} on host {socket.gethostname()!r}"
        return f"{where} does not exist" if self._missing else f"{where} is empty"

    def waiting_on(self) -> str | None:
        if self._text != self.prefix:
            return None
        if self.decide_empty:
            if not self._missing:
                return None
            return (
                f"source file {self.path!r} does not exist on host {socket.gethostname()!r} (read "
                'as empty all along): check the path, or set "must_exist": True to fail at the start'
            )
        if self._missing:
            return (
                f"{self._without_content()} (nothing is decided until it has content): check the "
                'path, or set "must_exist": True to fail at the start'
            )
        return (
            f"{self._without_content()} (nothing is decided until it has content): if an empty "
            'file is itself the answer, set "decide_empty": True in the source'
        )

    def _read_file(self, replaced: bool, limit: int | None) -> tuple[bool, str] | None:
        """``(restart, text)``: the new text, to append or (``restart``) to start over with."""
        try:
            # stat first: opening a FIFO for reading would wait for a writer (a blocked loop, or
            # a thread, for as long as nobody writes)
            not_a_regular_file(self.path, os.stat(self.path).st_mode)
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:  # a missing file counts as empty
            if not self._seen:
                self._seen = True  # said once (or, with must_exist, raised)
                missing_file(self.path, self.must_exist, self.decide_empty)
            self._missing = True
            restart = self._identity is not None
            self._forget_file()
            return restart, ""
        self._seen, self._missing = True, False
        try:
            stat = os.fstat(fd)
            not_a_regular_file(self.path, stat.st_mode)  # replaced between the stat and the open
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
            self._identity, self._mtime = identity, stat.st_mtime_ns
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
        return restart, self._decode(b"".join(chunks)) if chunks else ""

    def _decode(self, data: bytes) -> str:
        """``data`` decoded, continuing a character the last read cut (the decoder is kept only
        while it holds one: a waiting source keeps none)."""
        decoder = self._decoder or codecs.getincrementaldecoder(self.encoding)(errors="replace")
        text = decoder.decode(data)
        self._decoder = None if decoder.getstate() == _fresh_state(self.encoding) else decoder
        return text

    async def _refresh(self) -> None:
        """Read what changed into the text."""
        replaced, self._replaced = self._replaced, False
        self._stale = False  # a notification during the read marks it again
        # A small read of a local file (one notifications work for) comes from the page cache in
        # microseconds: it is done here, saving the hop to a thread and back (a scheduling delay
        # of its own on a busy machine) and the executor's threads. Anything larger, and a file
        # that is polled (maybe on a network filesystem), is read in a thread.
        local = self._chosen == "notify" or (self._watched and self._identity)
        done = self._read(replaced, INLINE_READ_BYTES) if local else None
        if done is None:
            try:
                await asyncio.to_thread(self._read, replaced)
            except asyncio.CancelledError:
                # the read may not have started (every worker busy): the next wait reads again
                self._stale = True
                self._replaced = self._replaced or replaced
                raise

    # ---------------------------------------------------------------- notifications

    def __call__(self, mask: int) -> None:
        """The watcher's callback: the source subscribes itself (no bound method kept per watch)."""
        self._on_event(mask)

    def _on_event(self, mask: int) -> None:
        if mask == file_watch.RECHECK:  # the watcher's safety re-check: nothing was reported
            if self._stale or self._reading.locked() or self._unchanged_on_disk():
                return
            log.info("%s changed without a notification: reading it again", self.path)
            # the watch may be on a directory renamed away (``mv data data.old; mkdir data``)
            self._resubscribe = True
        self._stale = True
        if mask & file_watch.REPLACED:
            self._replaced = True
        if mask & (file_watch.LOST | file_watch.REPLACED):
            # the directory went away, or the name (or a link on the path) may lead elsewhere now
            self._resubscribe = True
        self._wake()

    def _wake(self) -> None:
        """Wake the reader waiting on :meth:`changed`."""
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _unchanged_on_disk(self) -> bool:
        """Whether the file is as the last read left it (one ``stat``: same file, size and
        modification time; a file still missing is unchanged)."""
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            return self._identity is None
        except OSError:
            return True  # nothing to learn here: the next notified read says what is wrong
        return (
            (stat.st_dev, stat.st_ino) == self._identity
            and stat.st_size == self._offset
            and stat.st_mtime_ns == self._mtime
        )

    def _subscribe(self) -> None:
        if self.mode != "notify" or self._watched:
            return
        self._resubscribe = False
        try:
            watcher = file_watch.shared_watcher()
            for path in dict.fromkeys((os.path.abspath(self.path), os.path.realpath(self.path))):
                watcher.subscribe(path, self)
                self._watcher, self._watched = watcher, (*self._watched, path)
            # each symbolic link on the way too, under its own name: a link pointed elsewhere (a
            # `current` directory switched to the next release) changes the file behind the path
            for link in _links(self.path):
                if link not in self._watched:
                    with contextlib.suppress(OSError):  # its directory may not be readable
                        watcher.subscribe(link, self)
                        self._watched += (link,)
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
        watcher, watched = self._watcher, self._watched
        self._watcher, self._watched = None, ()
        for path in watched:
            assert watcher is not None
            watcher.remove(path, self)

    def _watch_again(self) -> bool:
        """Subscribe again when the directory went away or was not there (``True``: watching
        again, so look at once: something may have changed meanwhile)."""
        if self._resubscribe or (self.mode == "notify" and not self._watched):
            self._unsubscribe()
            self._subscribe()
            return bool(self._watched)
        return False

    def _choose_mode(self) -> str:
        if self._chosen is not None:
            return self._chosen
        mode = file_watch.watch_mode(self.path, self.notifications)
        if os.path.isdir(os.path.dirname(os.path.abspath(self.path))):
            self._chosen = mode  # judged by the directory itself, not by a parent: final
        return mode

    # ---------------------------------------------------------------- the source API

    def _start(self) -> None:
        """Choose how changes are noticed, and watch the file when notifications work (once: the
        watch is kept until :meth:`aclose`, across the trigger's streams and waits)."""
        if self.mode is None:
            self.mode = self._choose_mode()
            self._subscribe()
            log.debug(
                "tailing %s (%s)",
                self.path,
                "file notifications" if self._watched else f"polling every {self.poll_interval:.3g} s",
            )

    async def read(self) -> str:
        """The text now: the file is read unless it is watched and nothing changed since the last
        read (a read left running by a cancelled reader is waited for)."""
        self._start()
        if self._stale or not self._watched or self._reading.locked():
            await self._refresh()
        return self._text

    def changed(self) -> asyncio.Future[None]:
        """On notifications, a future the watcher resolves (a change, or its re-check finding one),
        done at once when a change is already known; polled (or while the file's directory does
        not exist), the next poll in ``poll_interval`` seconds."""
        self._start()
        if not self._watch_again() and not self._watched:
            return after(self.poll_interval)
        waiter = asyncio.get_running_loop().create_future()
        if self._stale or self._reading.locked():
            waiter.set_result(None)  # already changed (or a read ends): read at once
        else:
            if self._waiter is not None and not self._waiter.done():
                self._waiter.cancel()  # one reader: the last wait is over
            self._waiter = waiter
        return waiter

    async def aclose(self) -> None:
        self._unsubscribe()
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.cancel()


def _links(path: str) -> list[str]:
    """The symbolic links that resolving ``path`` goes through, in order (at most 40, as the kernel)."""
    links: list[str] = []
    pending = os.path.abspath(path)
    while len(links) < 40:
        head, parts = os.sep, pending.split(os.sep)[1:]
        for index, part in enumerate(parts):
            step = os.path.join(head, part)
            try:
                target = os.readlink(step)
            except OSError:  # not a link (or not there)
                head = step
                continue
            links.append(step)
            pending = os.path.normpath(os.path.join(head, target, *parts[index + 1 :]))
            break
        else:
            break
    return links


@lru_cache(maxsize=16)
def _fresh_state(encoding: str) -> tuple[bytes, int]:
    """The state of a new incremental decoder of ``encoding`` (a decoder back at it holds nothing)."""
    return codecs.getincrementaldecoder(encoding)().getstate()  # type: ignore[return-value]


def missing_file(path: str, must_exist: bool, decide_empty: bool = False) -> None:
    """A file source's file does not exist: fail (``must_exist``) or say so once and read it as empty
    (which is not decided, unless ``decide_empty``).

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
        "source file %r does not exist on host %r: %s until it appears; if the path is wrong, fix it, "
        'or set "must_exist": True to fail instead',
        path,
        host,
        "it is read as empty" if decide_empty else "nothing is decided",
    )


#: What a file that is not regular is called in messages, by its ``stat`` type.
_FILE_KINDS = (
    (stat_module.S_ISFIFO, "a FIFO (named pipe)"),
    (stat_module.S_ISDIR, "a directory"),
    (stat_module.S_ISCHR, "a character device"),
    (stat_module.S_ISBLK, "a block device"),
    (stat_module.S_ISSOCK, "a socket"),
)


def not_a_regular_file(path: str, mode: int) -> None:
    """Refuse a path that is not a regular file (``mode``: its ``st_mode``).

    :raises SystemZeroArgumentError: naming the path, what it is and the fix.
    """
    if stat_module.S_ISREG(mode):
        return
    kind = next((name for test, name in _FILE_KINDS if test(mode)), "not a regular file")
    raise SystemZeroArgumentError(
        f"source.path {path!r} on host {socket.gethostname()!r} is {kind}: a file source tails a "
        "regular file only (reading anything else may never end); point source.path at the log "
        "file itself, or use a callable source to read other kinds of input",
        code="not_a_regular_file",
        field="source.path",
    )
