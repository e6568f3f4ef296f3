"""Where a decision trigger's state comes from.

A source is described by plain JSON (it travels in trigger kwargs) and built inside the
triggerer with :func:`build_source`. Three kinds:

``{"type": "static"}``
    The trigger's initial state never changes (the default).
``{"type": "file", "path": "/data/job.log", "encoding": "utf-8", "watch": "auto", "poll_interval": 1.0}``
    Tails a local text file: the state is the initial state (a string, usually ``""``) followed by
    the file's content. A change is noticed through the operating system's file notifications
    (one watcher per process, :mod:`~airflow_provider_systemzero.triggers.file_watch`) or, on
    network filesystems and where ``watch`` is ``"poll"``, every ``poll_interval`` seconds. New bytes
    are read incrementally off the event loop; a file that is replaced — renamed, deleted and
    recreated, rewritten in place or truncated — is read again from the start (see
    :class:`FileSource`). A missing file counts as empty, with
    one WARNING naming the path and the host; ``"must_exist": True`` fails instead.
``{"type": "callable", "path": "my_pkg.sources.job_state", "kwargs": {...}, "poll_interval": 5.0}``
    A function returning the full desired state (string, array or object). A sync function runs
    in a daemon thread of its own (one call at a time, at most ``timeout`` seconds), an ``async
    def`` is awaited; an async *generator* is iterated and each value it yields is the new state
    (push, no polling). Failures are retried ``retries`` times with backoff from ``retry_delay``
    (see :class:`CallableSource`). The module must be importable in the triggerer (not from a Dag
    bundle).

The trigger reconciles the desired state with what the gateway has through the core's minimal
mutation (text suffix → ``append_text``, array suffix → ``append_items``, otherwise ``replace``).
"""

from __future__ import annotations

import asyncio
import codecs
import concurrent.futures
import contextlib
import contextvars
import errno
import functools
import inspect
import logging
import os
import queue
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from importlib import import_module
from typing import Any

from airflow_provider_systemzero.exceptions import SystemZeroArgumentError
from airflow_provider_systemzero.protocol.errors import LocalProtocolError
from airflow_provider_systemzero.protocol.validation import validate_state
from airflow_provider_systemzero.triggers import file_watch
from airflow_provider_systemzero.triggers.file_watch import Subscription

__all__ = [
    "CallableSource",
    "FileSource",
    "SourceFailed",
    "StateSource",
    "StaticSource",
    "build_source",
    "validate_source_spec",
]

log = logging.getLogger(__name__)

log = logging.getLogger(__name__)

SOURCE_TYPES = ("static", "file", "callable")
DEFAULT_POLL_INTERVAL = 1.0
#: A file source on notifications still checks its file this often (seconds), as a safety net.
NOTIFY_RECHECK_SECONDS = 60.0
#: Bytes at the start of a tailed file, and before the read position, compared on every read.
FINGERPRINT_BYTES = 1024
#: A notified file source reads at most this many new bytes on the event loop (more in a thread).
INLINE_READ_BYTES = 64 * 1024
#: A callable source's failures in a row that are retried, the first retry's delay and the
#: longest delay (seconds), and how long a sync call may run (seconds).
DEFAULT_RETRIES = 3
DEFAULT_RETRY_DELAY = 1.0
MAX_RETRY_DELAY = 30.0
DEFAULT_CALL_TIMEOUT = 60.0


class StateSource:
    """The desired state over time: :meth:`changes` yields every new desired state."""

    #: seconds between polls (0 for push sources).
    poll_interval: float = DEFAULT_POLL_INTERVAL

    async def current(self) -> Any:
        """The desired state now."""
        raise NotImplementedError

    async def changes(self) -> AsyncIterator[Any]:
        """Yield the desired state each time it changes (never the same value twice in a row)."""
        last = await self.current()
        yield last
        while True:
            await asyncio.sleep(self.poll_interval)
            value = await self.current()
            if value is not last and value != last:
                last = value
                yield value

    async def aclose(self) -> None:
        """Release what the source holds (open files, generators)."""


@dataclass
class StaticSource(StateSource):
    """A state that never changes."""

    state: Any

    async def current(self) -> Any:
        return self.state

    async def changes(self) -> AsyncIterator[Any]:
        yield self.state
        await asyncio.Event().wait()  # nothing ever changes


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
        self._text = prefix
        self._offset = 0
        self._identity: tuple[int, int] | None = None
        self._head = b""
        self._tail = b""
        self._decoder = codecs.getincrementaldecoder(encoding)(errors="replace")
        self._replaced = False
        self._resubscribe = False
        self._wake: asyncio.Event | None = None
        self._subscriptions: list[Subscription] = []

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

    def _read(self, replaced: bool, limit: int | None = None) -> tuple[bool, str] | None:
        """Blocking part: ``(restart, text)`` — the new text, to append or (``restart``) to start over with.

        :param limit: with a limit, read nothing and return ``None`` when more than ``limit``
            bytes would be read (the caller reads them in a thread instead).
        """
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

    async def _refresh(self) -> bool:
        """Read what changed; whether the text changed."""
        replaced, self._replaced = self._replaced, False
        # Notified of a write to a local file, a small read comes from the page cache in
        # microseconds: it is done here, saving the hop to a thread and back (a scheduling delay
        # of its own on a busy machine). Anything larger, and every poll, is read in a thread.
        read = self._read(replaced, INLINE_READ_BYTES) if self._subscriptions and self._identity else None
        restart, new = read if read is not None else await asyncio.to_thread(self._read, replaced)
        if restart:
            text = self.prefix + new
            changed, self._text = text != self._text, text
            if changed:
                log.info("%s was replaced or rewritten: read again from its start", self.path)
            return changed
        if new:
            self._text += new
            return True
        return False

    # ---------------------------------------------------------------- notifications

    def _on_event(self, mask: int) -> None:
        if mask & file_watch.REPLACED:
            self._replaced = True
        if mask & file_watch.LOST or (mask & file_watch.REPLACED and len(self._subscriptions) > 1):
            self._resubscribe = True  # the directory went away, or a symlink may point elsewhere now
        if self._wake is not None:
            self._wake.set()

    def _subscribe(self) -> None:
        if self.mode != "notify" or self._subscriptions:
            return
        self._resubscribe = False
        try:
            watcher = file_watch.shared_watcher()
            for path in dict.fromkeys((os.path.abspath(self.path), os.path.realpath(self.path))):
                self._subscriptions.append(watcher.subscribe(path, self._on_event))
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

    async def _next_change(self) -> None:
        """Wait for a notification (or the safety re-check), or poll."""
        if self._resubscribe or (self.mode == "notify" and not self._subscriptions):
            self._unsubscribe()
            self._subscribe()
            if self._subscriptions:
                return  # watching again: look at once, something may have changed meanwhile
        assert self._wake is not None
        wait = max(self.poll_interval, NOTIFY_RECHECK_SECONDS) if self._subscriptions else self.poll_interval
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait):
                await self._wake.wait()
        self._wake.clear()

    # ---------------------------------------------------------------- the source API

    async def current(self) -> str:
        await self._refresh()
        return self._text

    async def changes(self) -> AsyncIterator[Any]:
        self._wake = asyncio.Event()
        self.mode = file_watch.watch_mode(self.path, self.watch)
        self._subscribe()
        log.debug(
            "tailing %s (%s)",
            self.path,
            "file notifications" if self._subscriptions else f"polling every {self.poll_interval:.3g} s",
        )
        try:
            await self._refresh()
            yield self._text
            while True:
                await self._next_change()
                if await self._refresh():
                    yield self._text
        finally:
            self._unsubscribe()

    async def aclose(self) -> None:
        self._unsubscribe()


class SourceFailed(RuntimeError):
    """A callable source kept failing: its retries are spent (the message names the last cause)."""


class _DaemonThreads:
    """Where sync callable sources run: daemon threads, never the loop's shared executor.

    Each source has at most one call outstanding, so a hung call holds one thread of its own and
    no other trigger waits behind it; threads are daemons, so a process whose triggers ended does
    not wait for a hung call to return. A thread that is idle for ``idle_seconds`` exits.

    :param idle_seconds: how long an idle thread waits for work before it exits.
    """

    def __init__(self, idle_seconds: float = 30.0) -> None:
        self.idle_seconds = idle_seconds
        self._work: queue.SimpleQueue[tuple[concurrent.futures.Future[Any], Callable[[], Any]]] = (
            queue.SimpleQueue()
        )
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for work and not yet claimed by a submit

    def submit(self, function: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        """Run ``function`` in a daemon thread."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            self._work.put((future, function))
            if self._idle:
                self._idle -= 1
                return future
        threading.Thread(target=self._worker, name="systemzero-source", daemon=True).start()
        return future

    def _worker(self) -> None:
        while True:
            try:
                future, function = self._work.get(timeout=self.idle_seconds)
            except queue.Empty:
                with self._lock:
                    if self._idle:  # nobody claimed this thread: it exits
                        self._idle -= 1
                        return
                continue  # claimed by a submit whose work is on its way
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(function())
                except BaseException as exc:  # handed to the awaiting source
                    future.set_exception(exc)
            del future, function
            with self._lock:
                self._idle += 1


_THREADS = _DaemonThreads()


class CallableSource(StateSource):
    """A function (sync, async or async generator) giving the full desired state.

    A failing call (an exception, or a sync call still running after ``timeout`` seconds) is
    retried ``retries`` times, ``retry_delay`` seconds after the first failure and twice as long
    after each next one (at most :data:`MAX_RETRY_DELAY`), each logged with its cause; a success
    starts the count again. Then :class:`SourceFailed` ends the trigger. A sync function runs in a
    daemon thread of its own, one call at a time: a call that hangs is waited for, never run twice
    at once, and never keeps another trigger or the process's exit waiting. An async generator
    that fails is called again.

    :param function: the callable.
    :param kwargs: keyword arguments for it (plain JSON).
    :param poll_interval: seconds between calls (ignored for async generators).
    :param retries: how many failures in a row are retried before the trigger fails.
    :param retry_delay: seconds before the first retry (doubling after each next failure).
    :param timeout: seconds a sync call may take before it counts as failed.
    """

    def __init__(
        self,
        function: Callable[..., Any],
        *,
        kwargs: Mapping[str, Any] | None = None,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        retries: int = DEFAULT_RETRIES,
        retry_delay: float = DEFAULT_RETRY_DELAY,
        timeout: float = DEFAULT_CALL_TIMEOUT,
    ) -> None:
        self.function = function
        self.kwargs = dict(kwargs or {})
        self.poll_interval = poll_interval
        self.retries = retries
        self.retry_delay = retry_delay
        self.timeout = timeout
        self._name = f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', function)}"
        self._generator: AsyncIterator[Any] | None = None
        self._last: Any = None
        self._call: concurrent.futures.Future[Any] | None = None  # the sync call outstanding, if any
        self._failures = 0

    @staticmethod
    def _checked(value: Any) -> Any:
        validate_state(value, field="source result")
        return value

    async def _failed(self, exc: BaseException) -> None:
        """Count a failure: wait before the retry, or raise :class:`SourceFailed` when none is left."""
        self._failures += 1
        cause = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if self._failures > self.retries:
            raise SourceFailed(
                f"the source {self._name} failed {self._failures} time(s) in a row; last: {cause}"
            ) from exc
        delay = min(self.retry_delay * 2 ** (self._failures - 1), MAX_RETRY_DELAY)
        log.warning(
            "the source %s failed (%s); retry %d of %d in %.3g s",
            self._name,
            cause,
            self._failures,
            self.retries,
            delay,
        )
        await asyncio.sleep(delay)

    async def _call_sync(self) -> Any:
        call = self._call
        if call is None or call.done():
            # the caller's context goes along, as with asyncio.to_thread (Airflow keeps some there)
            context = contextvars.copy_context()
            call = self._call = _THREADS.submit(functools.partial(context.run, self.function, **self.kwargs))
        try:
            async with asyncio.timeout(self.timeout):
                return await asyncio.shield(asyncio.wrap_future(call))
        except TimeoutError:
            raise TimeoutError(
                f"the call did not return within {self.timeout:.3g} s (it still runs; no other "
                "call of this source starts until it returns)"
            ) from None

    async def _next_generated(self) -> Any:
        if self._generator is None:
            self._generator = self.function(**self.kwargs)
        try:
            return await anext(self._generator)
        except BaseException:
            generator, self._generator = self._generator, None
            with contextlib.suppress(Exception):
                await generator.aclose()  # type: ignore[attr-defined]
            raise

    async def _value(self, call: Callable[[], Awaitable[Any]]) -> Any:
        """``call()``'s checked value, retrying failures (a StopAsyncIteration is not one)."""
        while True:
            try:
                value = self._checked(await call())
            except (LocalProtocolError, StopAsyncIteration):
                raise  # not a transient error: a bad value, or the generator ended
            except Exception as exc:
                await self._failed(exc)
                continue
            self._failures = 0
            return value

    async def current(self) -> Any:
        if inspect.isasyncgenfunction(self.function):
            if self._generator is None:  # the first value the generator yields is the current state
                self._last = await self._value(self._next_generated)
            return self._last
        if inspect.iscoroutinefunction(self.function):
            return await self._value(lambda: self.function(**self.kwargs))
        return await self._value(self._call_sync)

    async def changes(self) -> AsyncIterator[Any]:
        if not inspect.isasyncgenfunction(self.function):
            async for value in super().changes():
                yield value
            return
        last = await self.current()
        yield last
        while True:
            try:
                value = await self._value(self._next_generated)
            except StopAsyncIteration:
                break
            if value is not last and value != last:  # a generator called again yields its current state first
                last = self._last = value
                yield value
        await asyncio.Event().wait()  # the generator ended: the state stays as it is

    async def aclose(self) -> None:
        generator, self._generator = self._generator, None
        if generator is not None:
            await generator.aclose()  # type: ignore[attr-defined]


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


def import_callable(path: str) -> Callable[..., Any]:
    """Import ``package.module.function`` (also ``package.module:function``).

    :raises SystemZeroArgumentError: naming the path when it cannot be imported or is not callable.
    """
    module_name, sep, attribute = path.replace(":", ".").rpartition(".")
    if not sep or not module_name:
        raise SystemZeroArgumentError(
            f"source.path {path!r} is not a dotted path 'package.module.function'",
            code="invalid_source",
            field="source.path",
        )
    try:
        target = getattr(import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise SystemZeroArgumentError(
            f"source.path {path!r} cannot be imported in the triggerer: {exc}. The module must "
            "be installed where the triggerer runs, not only in a Dag bundle",
            code="invalid_source",
            field="source.path",
        ) from None
    if not callable(target):
        raise SystemZeroArgumentError(
            f"source.path {path!r} is not callable", code="invalid_source", field="source.path"
        )
    return target


def validate_source_spec(spec: Any, initial_state: Any) -> dict[str, Any]:
    """Check a source description (before deferring, so bad input fails on the worker).

    :param spec: ``None`` or a dict as described in the module docstring.
    :param initial_state: the trigger's initial state.
    :return: the normalised description.
    :raises SystemZeroArgumentError: naming the field.
    """
    if spec is None:
        return {"type": "static"}
    if not isinstance(spec, Mapping):
        raise SystemZeroArgumentError(
            "source must be an object such as {'type': 'file', 'path': ...}",
            code="invalid_source",
            field="source",
        )
    kind = spec.get("type")
    if kind not in SOURCE_TYPES:
        raise SystemZeroArgumentError(
            f"source.type {kind!r} is not one of {list(SOURCE_TYPES)}",
            code="invalid_source",
            field="source.type",
        )
    allowed = {
        "static": {"type"},
        "file": {"type", "path", "encoding", "poll_interval", "watch", "must_exist"},
        "callable": {"type", "path", "kwargs", "poll_interval", "retries", "retry_delay", "timeout"},
    }[kind]
    unknown = sorted(set(spec) - allowed)
    if unknown:
        raise SystemZeroArgumentError(
            f"source has unknown field {unknown[0]!r} for type {kind!r}; allowed: {sorted(allowed)}",
            code="invalid_source",
            field=f"source.{unknown[0]}",
        )
    for name in ("poll_interval", "retry_delay", "timeout"):
        value = spec.get(name, 1.0)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
            raise SystemZeroArgumentError(
                f"source.{name} {value!r} must be a positive number of seconds",
                code="invalid_source",
                field=f"source.{name}",
            )
    retries = spec.get("retries", DEFAULT_RETRIES)
    if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= 100:
        raise SystemZeroArgumentError(
            f"source.retries {retries!r} must be a whole number from 0 to 100",
            code="invalid_source",
            field="source.retries",
        )
    if spec.get("watch", "auto") not in file_watch.WATCH_MODES:
        raise SystemZeroArgumentError(
            f"source.watch {spec.get('watch')!r} is not one of {list(file_watch.WATCH_MODES)}",
            code="invalid_source",
            field="source.watch",
        )
    if kind in ("file", "callable") and (not isinstance(spec.get("path"), str) or not spec["path"]):
        raise SystemZeroArgumentError(
            f"source.path is required for a {kind} source", code="invalid_source", field="source.path"
        )
    if kind == "file":
        if not isinstance(spec.get("must_exist", False), bool):
            raise SystemZeroArgumentError(
                "source.must_exist must be true or false", code="invalid_source", field="source.must_exist"
            )
        if not isinstance(initial_state, str):
            raise SystemZeroArgumentError(
                "a file source needs a string initial state (the file content is appended to it)",
                code="invalid_source",
                field="state",
            )
        try:
            codecs.lookup(spec.get("encoding", "utf-8"))
        except (LookupError, TypeError):
            raise SystemZeroArgumentError(
                f"source.encoding {spec.get('encoding')!r} is not a known text encoding",
                code="invalid_source",
                field="source.encoding",
            ) from None
    if kind == "callable" and not isinstance(spec.get("kwargs", {}), Mapping):
        raise SystemZeroArgumentError(
            "source.kwargs must be an object", code="invalid_source", field="source.kwargs"
        )
    return dict(spec)


def build_source(spec: Mapping[str, Any] | None, initial_state: Any) -> StateSource:
    """Build a source from its description (in the triggerer).

    :param spec: the description (see the module docstring).
    :param initial_state: the trigger's initial state.
    """
    spec = validate_source_spec(spec, initial_state)
    poll = float(spec.get("poll_interval", DEFAULT_POLL_INTERVAL))
    if spec["type"] == "file":
        return FileSource(
            spec["path"],
            prefix=initial_state,
            encoding=spec.get("encoding", "utf-8"),
            poll_interval=poll,
            watch=spec.get("watch", "auto"),
            must_exist=spec.get("must_exist", False),
        )
    if spec["type"] == "callable":
        return CallableSource(
            import_callable(spec["path"]),
            kwargs=spec.get("kwargs"),
            poll_interval=poll,
            retries=spec.get("retries", DEFAULT_RETRIES),
            retry_delay=float(spec.get("retry_delay", DEFAULT_RETRY_DELAY)),
            timeout=float(spec.get("timeout", DEFAULT_CALL_TIMEOUT)),
        )
    return StaticSource(initial_state)


def read_source_once(spec: Mapping[str, Any] | None, initial_state: Any) -> Any:
    """The desired state now, read synchronously (a sensor's poke on a worker).

    :param spec: the source description.
    :param initial_state: the initial state.
    :raises SystemZeroArgumentError: for an async generator source (it needs the triggerer).
    """
    spec = validate_source_spec(spec, initial_state)
    if spec["type"] == "file":
        try:
            with open(spec["path"], encoding=spec.get("encoding", "utf-8"), errors="replace") as handle:
                return initial_state + handle.read()
        except FileNotFoundError:
            missing_file(spec["path"], spec.get("must_exist", False))
            return initial_state
    if spec["type"] == "callable":
        function = import_callable(spec["path"])
        if inspect.isasyncgenfunction(function):
            raise SystemZeroArgumentError(
                "an async generator source needs deferrable=True (it streams in the triggerer)",
                code="invalid_source",
                field="source.path",
            )
        kwargs = dict(spec.get("kwargs") or {})
        value = (
            asyncio.run(function(**kwargs)) if inspect.iscoroutinefunction(function) else function(**kwargs)
        )
        return CallableSource._checked(value)
    return initial_state
