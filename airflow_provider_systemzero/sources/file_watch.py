"""One operating-system file watcher per process, shared by every file source.

A file source (:class:`~airflow_provider_systemzero.sources.file.FileSource`) learns that
its file changed from Linux's inotify instead of checking it on a timer. Every source in an
event loop shares **one** inotify descriptor (:class:`FileWatcher`): a thousand triggers tailing
a thousand files cost one descriptor, no thread, and one watch per *directory* (the kernel
limit ``fs.inotify.max_user_watches`` counts directories here, not triggers). The descriptor is
read by a reader callback on the event loop (``loop.add_reader``): one read of the descriptor
takes every event queued since the last (a write alone is a ``MODIFY`` and a ``CLOSE_WRITE``;
under load, many files' events) and calls each source they name once, with their masks OR-ed —
no task, no thread, no scan of the other sources.

Directories are watched rather than files, so a file that appears later, a file that is
deleted and recreated (even with the same inode number), and a file renamed away and replaced
(rename rotation) are all seen: creations, deletions and renames of the watched name tell the
source to read the file again from its start.

Notifications only see changes made through this machine's kernel. Where they cannot work the
source polls instead (:func:`watch_mode`): on systems without inotify, and on network and FUSE
filesystems (NFS, SMB/CIFS, 9p, sshfs, …: the file is written by another machine), recognised
from the filesystem type of the mount that holds the directory (``/proc/self/mountinfo``).

The library is `inotify_simple <https://pypi.org/project/inotify-simple/>`_: a small, maintained
wrapper over the three inotify system calls with no dependencies and no thread; the descriptor
is driven by the event loop directly.

A notification can be missed where the kernel sees no write (a file changed through ``mmap``,
a bind mount written from elsewhere): the watcher re-checks **every** watched file once every
:data:`RECHECK_SECONDS`, with one timer for the whole process. Each subscriber is called with
:data:`RECHECK` (no event bits); a file source then compares one ``stat`` of its file with what it
last read and wakes only if they differ. The pass runs :data:`RECHECK_SLICE` subscribers per loop
iteration, so thousands of watched files never hold the loop for long; a source keeps no timer,
thread or descriptor of its own for it.

Nothing is torn down on the path of a change: when a source goes (its trigger fired), its
directory stays watched for up to :data:`IDLE_SECONDS` — the next source on it finds the watch in
place — and idle watches are then removed together. Closing an inotify descriptor makes the
kernel wait for a grace period (10–30 ms measured): the descriptor of a watcher left with nothing
to watch is closed by a short-lived thread, so the loop never stalls on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_systemzero.sources.mount_table import (
    MOUNTINFO,
    MountTable,
    MountTableWatch,
    filesystem_type,
)

__all__ = [
    "MOUNTINFO",
    "NETWORK_FILESYSTEMS",
    "RECHECK",
    "RECHECK_SECONDS",
    "WATCH_MODES",
    "FileWatcher",
    "MountTable",
    "MountTableWatch",
    "Subscription",
    "filesystem_type",
    "shared_watcher",
    "watch_mode",
]

log = logging.getLogger(__name__)

#: ``source.notifications`` values: ``auto`` (notifications where they work, else polling), ``notify``
#: (notifications; polling only when the directory cannot be watched) and ``poll``.
WATCH_MODES = ("auto", "notify", "poll")

#: Filesystem types whose files change without this kernel seeing it: notifications stay silent.
NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb",
        "smb2",
        "smb3",
        "smbfs",
        "ncpfs",
        "9p",
        "afs",
        "ceph",
        "coda",
        "glusterfs",
        "lustre",
        "gpfs",
        "beegfs",
        "ocfs2",
        "gfs2",
        "davfs",
        "vboxsf",
        "vmhgfs",
        "virtiofs",
        "prl_fs",
    }
)

try:
    import inotify_simple
except ImportError:  # pragma: no cover - not Linux
    inotify_simple = None  # type: ignore[assignment]

if inotify_simple is not None:
    _flags = inotify_simple.flags
    #: What makes the name refer to another file (or to none): the source reads from the start.
    REPLACED = _flags.CREATE | _flags.DELETE | _flags.MOVED_FROM | _flags.MOVED_TO
    #: The directory itself went away (or the kernel dropped the watch).
    LOST = _flags.IGNORED | _flags.DELETE_SELF | _flags.MOVE_SELF | _flags.UNMOUNT
    #: Events arrived faster than they were read and some were dropped.
    OVERFLOW = _flags.Q_OVERFLOW
    _DIRECTORY_MASK = (
        _flags.MODIFY
        | _flags.CLOSE_WRITE
        | _flags.ATTRIB
        | REPLACED
        | _flags.DELETE_SELF
        | _flags.MOVE_SELF
        | _flags.ONLYDIR
    )
else:  # pragma: no cover - not Linux
    REPLACED = LOST = OVERFLOW = _DIRECTORY_MASK = 0

#: Seconds a directory stays watched after its last source went; idle watches are removed (and a
#: watcher left with none closes) at most this long after.
IDLE_SECONDS = 5.0

#: How often the watcher re-checks every watched file (seconds), as a safety net under the notifications.
RECHECK_SECONDS = 60.0
#: Subscribers called per loop iteration during a re-check pass.
RECHECK_SLICE = 256
#: The mask a subscriber is called with by the re-check: no event was reported, look for yourself.
RECHECK = 0

#: The name of the short-lived thread that closes a watcher's descriptor.
CLOSING_THREAD = "systemzero-inotify-close"

#: A subscriber is told the event mask (``REPLACED``/``LOST``/``OVERFLOW`` bits or a write).
Callback = Callable[[int], None]


def watch_mode(path: str, requested: str = "auto") -> str:
    """``"notify"`` or ``"poll"``: how a file source learns that ``path`` changed.

    ``poll`` when asked, when the system has no inotify, or (``auto``) when the file's directory
    is on a network or FUSE filesystem; ``notify`` otherwise. A directory that does not exist yet
    is judged by its closest existing parent.

    :param path: the tailed file.
    :param requested: the source's ``watch`` field (:data:`WATCH_MODES`).
    """
    if requested == "poll" or inotify_simple is None or not sys.platform.startswith("linux"):
        return "poll"
    if requested == "notify":
        return "notify"
    directory = os.path.dirname(os.path.abspath(path))
    while directory and not os.path.isdir(directory):
        parent = os.path.dirname(directory)
        if parent == directory:
            break
        directory = parent
    kind = filesystem_type(directory) or ""
    if kind in NETWORK_FILESYSTEMS or kind.startswith("fuse") or kind.split(".")[0] in NETWORK_FILESYSTEMS:
        return "poll"
    return "notify"


@dataclass(eq=False, slots=True)
class _Directory:
    path: str
    wd: int
    #: each watched name's subscribers (tuples: a name's set of one is an object more per file)
    names: dict[str, tuple[Callback, ...]] = field(default_factory=dict)
    #: the paths it was subscribed under (one directory, several spellings: symlinks, ``..``)
    spellings: tuple[str, ...] = ()


@dataclass(eq=False, slots=True)
class Subscription:
    """What :meth:`FileWatcher.subscribe` hands back; give it to :meth:`FileWatcher.unsubscribe`."""

    watcher: FileWatcher
    directory: _Directory
    name: str
    callback: Callback

    @property
    def active(self) -> bool:
        """The directory is still watched (false once it was deleted, moved or unmounted)."""
        return self.watcher.watching(self)


class FileWatcher:
    """One inotify descriptor for every file source of an event loop (see the module docstring).

    Use :func:`shared_watcher`; the descriptor is closed when the last subscription goes.

    :param loop: the event loop whose reader callback reads the descriptor.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        assert inotify_simple is not None
        self._loop = loop
        self._inotify = inotify_simple.INotify(nonblocking=True)
        self._fd = self._inotify.fileno()
        #: closes the descriptor on :meth:`close`, or once the watcher is dropped: its loop ended first
        closing = threading.Thread(target=self._inotify.close, name=CLOSING_THREAD, daemon=True)
        self._finalizer = weakref.finalize(self, closing.start)
        self._finalizer.atexit = False  # the process's exit closes it
        self._directories: dict[str, _Directory] = {}
        self._by_wd: dict[int, _Directory] = {}
        self._closed = False
        self._sweep: asyncio.TimerHandle | None = None
        #: the one re-check timer of every watched file (armed while anything is subscribed)
        self._recheck: asyncio.TimerHandle | None = None
        #: events read from the descriptor, and subscriber calls made for them (one per subscriber
        #: per read, however many of the read's events named its file)
        self.events_read = 0
        self.wakes = 0
        #: re-check passes begun
        self.rechecks = 0
        loop.add_reader(self._fd, self._on_readable)

    @property
    def closed(self) -> bool:
        """The watcher stopped (no subscription left); its descriptor is closed or being closed."""
        return self._closed

    def stats(self) -> dict[str, int]:
        """``descriptors`` (0 or 1), watched ``directories``, ``subscriptions``, ``events_read``,
        ``wakes`` (subscriber calls), ``recheck_timers`` (0 or 1) and ``rechecks`` (passes begun)."""
        return {
            "descriptors": 0 if self.closed else 1,
            "directories": len(self._directories),
            "subscriptions": sum(len(s) for d in self._directories.values() for s in d.names.values()),
            "events_read": self.events_read,
            "wakes": self.wakes,
            "recheck_timers": 0 if self._recheck is None else 1,
            "rechecks": self.rechecks,
        }

    def subscribe(self, path: str, callback: Callback) -> Subscription:
        """Call ``callback(mask)`` from the event loop each time the file at ``path`` may have changed.

        :param path: the file (it need not exist; its directory must).
        :param callback: called with the event mask; it must not block.
        :raises OSError: the directory cannot be watched (missing, no permission, watch limit).
        """
        absolute = os.path.abspath(path)
        directory_path, name = os.path.split(absolute)
        # Asked of the kernel each time, not taken from the path's last watch: the directory at
        # this path may be another one now (the old one renamed away, its watch moving with it).
        # A directory already watched gets its own watch descriptor back.
        try:
            wd = self._inotify.add_watch(directory_path, _DIRECTORY_MASK)
        except OSError:
            self._idle_soon()  # a watcher made for this watch closes without it
            raise
        directory = self._by_wd.get(wd)  # the same directory, maybe under another spelling
        if directory is None:
            directory = _Directory(directory_path, wd)
            self._by_wd[wd] = directory
        self._directories[directory_path] = directory
        if directory_path not in directory.spellings:
            directory.spellings += (directory_path,)
        callbacks = directory.names.get(name, ())
        if callback not in callbacks:
            directory.names[name] = (*callbacks, callback)
        if self._recheck is None and not self._closed:
            self._recheck = self._loop.call_later(RECHECK_SECONDS, self.recheck_now)
        return Subscription(self, directory, name, callback)

    def watching(self, subscription: Subscription) -> bool:
        """Whether ``subscription``'s directory is still watched."""
        return self._by_wd.get(subscription.directory.wd) is subscription.directory

    def unsubscribe(self, subscription: Subscription) -> None:
        """Stop calling the subscription's callback (the watch goes within :data:`IDLE_SECONDS`
        of its last subscriber, and the descriptor with the last watch)."""
        self._drop(subscription.directory, subscription.name, subscription.callback)

    def remove(self, path: str, callback: Callback) -> None:
        """Stop calling ``callback`` for ``path`` (as :meth:`unsubscribe`, for a subscriber that kept
        the path rather than its :class:`Subscription`; a directory no longer watched has nothing
        to remove).

        :param path: the path given to :meth:`subscribe`.
        :param callback: the callback given with it.
        """
        directory_path, name = os.path.split(os.path.abspath(path))
        directory = self._directories.get(directory_path)
        if directory is not None and callback not in directory.names.get(name, ()):
            # subscribed before the path led to another directory: the one it was watched in
            directory = next(
                (
                    d
                    for d in self._by_wd.values()
                    if directory_path in d.spellings and callback in d.names.get(name, ())
                ),
                directory,
            )
        if directory is not None:
            self._drop(directory, name, callback)

    def _drop(self, directory: _Directory, name: str, callback: Callback) -> None:
        callbacks = directory.names.get(name)
        if callbacks is not None and callback in callbacks:
            kept = tuple(c for c in callbacks if c != callback)
            if kept:
                directory.names[name] = kept
            else:
                del directory.names[name]
        if not directory.names:
            self._idle_soon()

    def _idle_soon(self) -> None:
        """Arm the idle sweep: it removes idle watches, and closes a watcher left with none."""
        if self._sweep is None and not self._closed:
            self._sweep = self._loop.call_later(IDLE_SECONDS, self._remove_idle)

    def remove_idle_now(self) -> None:
        """Run the idle sweep now instead of when its timer is due (idle watches go, and the
        watcher closes when none is left)."""
        self._remove_idle()

    def recheck_now(self) -> None:
        """The safety re-check, which its timer runs every :data:`RECHECK_SECONDS` while anything
        is subscribed: call every subscriber with :data:`RECHECK` (each checks its file), a slice
        per loop iteration, and arm the next pass. Run early, the pass takes the timer's place:
        the next one is due :data:`RECHECK_SECONDS` later, and there is still one timer."""
        recheck, self._recheck = self._recheck, None
        if recheck is not None:
            recheck.cancel()  # run early (a no-op for the timer that runs it)
        callbacks = list(
            dict.fromkeys(c for d in self._by_wd.values() for cs in d.names.values() for c in cs)
        )
        if self._closed or not callbacks:
            return  # the next subscribe arms it again
        self.rechecks += 1
        self._recheck = self._loop.call_later(RECHECK_SECONDS, self.recheck_now)
        self._recheck_slice(callbacks, 0)

    def _recheck_slice(self, callbacks: list[Callback], start: int) -> None:
        end = start + RECHECK_SLICE
        for callback in callbacks[start:end]:
            if not self._closed:
                callback(RECHECK)
        if end < len(callbacks) and not self._closed:
            self._loop.call_soon(self._recheck_slice, callbacks, end)

    def _remove_idle(self) -> None:
        """Remove the watches nobody subscribes to any more; close the watcher when none is left."""
        self._sweep = None
        for directory in [d for d in self._by_wd.values() if not d.names]:
            self._forget(directory)
            with contextlib.suppress(OSError):
                self._inotify.rm_watch(directory.wd)
        if not self._by_wd:
            self.close()

    def close(self) -> None:
        """Stop reading and close the descriptor (in a thread of its own: see the module docstring)."""
        if self._closed:
            return
        self._closed = True
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        if self._recheck is not None:
            self._recheck.cancel()
            self._recheck = None
        with contextlib.suppress(Exception):
            self._loop.remove_reader(self._fd)
        if _watcher_of(self._loop) is self:
            del _WATCHERS[self._loop]
        self._finalizer()

    def _forget(self, directory: _Directory) -> None:
        self._by_wd.pop(directory.wd, None)
        for spelling in directory.spellings:
            if self._directories.get(spelling) is directory:
                del self._directories[spelling]
        if not self._by_wd:  # its last watch went away
            self._idle_soon()

    def _on_readable(self) -> None:
        """Read every pending event, then wake each subscriber once with its events' masks OR-ed.

        One read of the descriptor returns every event queued since the last one (a write is a
        ``MODIFY`` and a ``CLOSE_WRITE``; a busy second, many files' events): each source is called
        once per read, so it reads its file once, whatever number of events named it.
        """
        try:
            events = self._inotify.read(timeout=0)
        except OSError as exc:  # pragma: no cover - the descriptor broke: everyone falls back
            log.warning("file notifications failed (%s): every file source polls from now on", exc)
            self._wake_all(LOST)
            self.close()
            return
        masks: dict[Callback, int] = {}
        for event in events:
            self.events_read += 1
            if event.mask & OVERFLOW:
                log.warning("file notifications overflowed: every tailed file is checked again")
                for directory in self._by_wd.values():
                    _add(masks, directory.names.values(), OVERFLOW)
                continue
            directory = self._by_wd.get(event.wd)
            if directory is None:
                continue
            if event.mask & LOST and not event.name:
                # the directory went away: its sources poll until it exists again
                self._forget(directory)
                if not event.mask & _flags.IGNORED:
                    with contextlib.suppress(OSError):
                        self._inotify.rm_watch(event.wd)
                _add(masks, directory.names.values(), LOST | REPLACED)
                continue
            callbacks = directory.names.get(event.name)
            if callbacks:
                _add(masks, (callbacks,), event.mask)
        self.wakes += len(masks)
        for callback, mask in masks.items():
            callback(mask)

    def _wake_all(self, mask: int) -> None:
        masks: dict[Callback, int] = {}
        for directory in self._by_wd.values():
            _add(masks, directory.names.values(), mask)
        for callback, mask_of in masks.items():
            callback(mask_of)


def _add(masks: dict[Callback, int], groups: Iterable[tuple[Callback, ...]], mask: int) -> None:
    """OR ``mask`` into the pending mask of every callback in ``groups``."""
    for callbacks in groups:
        for callback in callbacks:
            masks[callback] = masks.get(callback, 0) | mask


#: Each loop's watcher, held weakly: its loop's reader keeps it alive, and nothing once the loop
#: ended (``asyncio.run`` returns before idle watches go): its descriptor does not outlive the loop.
_WATCHERS: weakref.WeakKeyDictionary[Any, weakref.ref[FileWatcher]] = weakref.WeakKeyDictionary()


def _watcher_of(loop: asyncio.AbstractEventLoop) -> FileWatcher | None:
    ref = _WATCHERS.get(loop)
    return None if ref is None else ref()


def shared_watcher() -> FileWatcher:
    """The running loop's watcher, created on first use.

    :raises OSError: inotify cannot be initialised (e.g. ``fs.inotify.max_user_instances`` reached).
    """
    loop = asyncio.get_running_loop()
    watcher = _watcher_of(loop)
    if watcher is None or watcher.closed:
        close_ended()
        watcher = FileWatcher(loop)
        _WATCHERS[loop] = weakref.ref(watcher)
    return watcher


def close_ended() -> None:
    """Close the watchers of loops that ended (each new loop's first watch does, before its own)."""
    for ref in list(_WATCHERS.values()):
        if (watcher := ref()) is not None and watcher._loop.is_closed():
            watcher.close()


def current_watcher() -> FileWatcher | None:
    """The running loop's watcher if one is open (for tests and the benchmarks)."""
    watcher = _watcher_of(asyncio.get_running_loop())
    return None if watcher is None or watcher.closed else watcher
