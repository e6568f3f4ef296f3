"""The mount table of this process, for telling network and FUSE filesystems from local ones.

A file source polls a file whose directory is on a filesystem notifications do not work for
(:func:`~airflow_provider_systemzero.sources.file_watch.watch_mode`); the filesystem type comes
from the mount that holds the directory.
"""

from __future__ import annotations

import contextlib
import io
import os
import select
import threading
from collections.abc import Callable

__all__ = ["MOUNTINFO", "MountTable", "MountTableWatch", "filesystem_type"]


#: The mount table of this process (proc(5)); a change of it shows as ``POLLPRI``/``POLLERR``.
MOUNTINFO = "/proc/self/mountinfo"

#: One mount: its mount point, the prefix of the paths beneath it, and its filesystem type.
_Mount = tuple[str, str, str]


def _parse_mounts(text: str) -> tuple[_Mount, ...]:
    """The mounts of a ``mountinfo`` text, longest mount point first.

    Among mounts of equal length the later line comes first (it is mounted over the earlier), so
    the first mount whose prefix matches a path is the one that holds it.
    """
    mounts: list[tuple[int, int, _Mount]] = []
    for index, line in enumerate(io.StringIO(text, newline=None)):
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) < 5 or not right:
            continue
        mount = fields[4].replace("\\040", " ")
        mounts.append((-len(mount), -index, (mount, mount.rstrip("/") + "/", right.split()[0])))
    mounts.sort()
    return tuple(entry for _, _, entry in mounts)


class MountTableWatch:
    """An open descriptor of :data:`MOUNTINFO`, polled for changes of the mount table.

    The kernel reports a mount or unmount in this process's mount namespace as ``POLLPRI`` and
    ``POLLERR`` on the descriptor (proc(5)); a poll that reports it also clears it.

    :param path: the file to open.
    :raises OSError: the file cannot be opened.
    """

    def __init__(self, path: str = MOUNTINFO) -> None:
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self._poll = select.poll()
        self._poll.register(self._fd, select.POLLPRI | select.POLLERR)

    def changed(self) -> bool:
        """Whether the mount table changed since the last call (or since the descriptor was opened)."""
        return bool(self._poll.poll(0))

    def read(self) -> str:
        """The whole mount table, as it is now."""
        os.lseek(self._fd, 0, os.SEEK_SET)
        chunks = []
        while chunk := os.read(self._fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks).decode("utf-8", errors="replace")

    def close(self) -> None:
        """Close the descriptor."""
        with contextlib.suppress(OSError):
            os.close(self._fd)


class MountTable:
    """The mount table of this process, parsed once and parsed again only when it changed.

    Before each use one zero-timeout poll of an open :data:`MOUNTINFO` descriptor (one system
    call) says whether the kernel changed the table; the table is read again only then. Where
    ``poll`` is missing or the descriptor cannot be opened, the file is read on every lookup.
    Safe to use from several threads.

    :param path: the mount table file.
    :param watch: makes the :class:`MountTableWatch` (or an object with its methods) for ``path``.
    """

    def __init__(
        self, path: str = MOUNTINFO, watch: Callable[[str], MountTableWatch] = MountTableWatch
    ) -> None:
        self._path = path
        self._make_watch = watch
        self._lock = threading.Lock()
        self._watch: MountTableWatch | None = None
        self._mounts: tuple[_Mount, ...] | None = None
        #: how many times the table was read and parsed
        self.parses = 0

    def after_fork(self) -> None:
        """In a forked child: a new lock, and the parent's descriptor (``/proc/<parent>``) dropped."""
        self._lock = threading.Lock()
        if self._watch is not None:
            self._watch.close()
        self._watch, self._mounts = None, None

    def _current_watch(self) -> MountTableWatch | None:
        """The open descriptor (a forked child drops the parent's in :meth:`after_fork`), or ``None``."""
        if self._watch is None and hasattr(select, "poll"):
            try:
                self._watch = self._make_watch(self._path)
            except OSError:
                return None
        return self._watch

    def mounts(self) -> tuple[_Mount, ...]:
        """The mounts, longest mount point first (see :func:`_parse_mounts`).

        :raises OSError: the mount table cannot be read.
        """
        with self._lock:
            watch = self._current_watch()
            if watch is None:
                with open(self._path, encoding="utf-8", errors="replace", newline="") as handle:
                    text = handle.read()
                self.parses += 1
                return _parse_mounts(text)
            if watch.changed() or self._mounts is None:
                try:
                    text = watch.read()
                except OSError:
                    watch.close()
                    self._watch, self._mounts = None, None
                    raise
                self._mounts = _parse_mounts(text)
                self.parses += 1
            return self._mounts

    def filesystem_type(self, directory: str) -> str | None:
        """The filesystem type of the mount holding ``directory`` (``None`` when unknown).

        :param directory: an existing directory.
        """
        try:
            target = os.path.realpath(directory)
            for mount, prefix, kind in self.mounts():
                if target == mount or target.startswith(prefix):
                    return kind
            return None
        except OSError:
            return None


_MOUNT_TABLE = MountTable()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_MOUNT_TABLE.after_fork)


def filesystem_type(directory: str) -> str | None:
    """The filesystem type of the mount holding ``directory`` (``None`` when unknown).

    :param directory: an existing directory.
    """
    return _MOUNT_TABLE.filesystem_type(directory)
