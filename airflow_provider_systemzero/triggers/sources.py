"""Where a decision trigger's state comes from.

A source is described by plain JSON (it travels in trigger kwargs) and built inside the
triggerer with :func:`build_source`. Three kinds:

``{"type": "static"}``
    The trigger's initial state never changes (the default).
``{"type": "file", "path": "/data/job.log", "encoding": "utf-8", "poll_interval": 1.0}``
    Tails a local text file: the state is the initial state (a string, usually ``""``) followed by
    the file's content. New bytes are read incrementally off the event loop; a file that shrinks
    or is replaced (new inode) is read again from the start. A missing file counts as empty, with
    one WARNING naming the path and the host; ``"must_exist": True`` fails instead.
``{"type": "callable", "path": "my_pkg.sources.job_state", "kwargs": {...}, "poll_interval": 5.0}``
    A function returning the full desired state (string, array or object). A sync function runs
    in a worker thread, an ``async def`` is awaited; an async *generator* is iterated and each
    value it yields is the new state (push, no polling). The module must be importable in the
    triggerer (not from a Dag bundle).

The trigger reconciles the desired state with what the gateway has through the core's minimal
mutation (text suffix → ``append_text``, array suffix → ``append_items``, otherwise ``replace``).
"""

from __future__ import annotations

import asyncio
import codecs
import inspect
import logging
import os
import socket
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from importlib import import_module
from typing import Any

from airflow_provider_systemzero.protocol.errors import LocalProtocolError
from airflow_provider_systemzero.protocol.validation import validate_state

__all__ = ["CallableSource", "FileSource", "StateSource", "StaticSource", "build_source", "validate_source_spec"]

log = logging.getLogger(__name__)

SOURCE_TYPES = ("static", "file", "callable")
DEFAULT_POLL_INTERVAL = 1.0


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

    :param path: the file.
    :param prefix: the initial state the file content is appended to.
    :param encoding: the file's text encoding.
    :param poll_interval: seconds between checks.
    :param must_exist: fail when the file does not exist at the start (default: read it as empty).
    """

    def __init__(self, path: str, *, prefix: str = "", encoding: str = "utf-8",
                 poll_interval: float = DEFAULT_POLL_INTERVAL, must_exist: bool = False) -> None:
        self.path = path
        self.must_exist = must_exist
        self._seen = False
        self.prefix = prefix
        self.encoding = encoding
        self.poll_interval = poll_interval
        self._text = prefix
        self._offset = 0
        self._inode: tuple[int, int] | None = None
        self._decoder = codecs.getincrementaldecoder(encoding)(errors="replace")

    def _read_new(self) -> str | None:
        """Blocking part: returns the new text, or ``None`` when the file must be read again."""
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            if not self._seen:
                self._seen = True  # warn once
                missing_file(self.path, self.must_exist)
            return None if self._offset else ""
        self._seen = True
        identity = (stat.st_dev, stat.st_ino)
        if self._inode is not None and (identity != self._inode or stat.st_size < self._offset):
            return None
        self._inode = identity
        if stat.st_size == self._offset:
            return ""
        with open(self.path, "rb") as handle:
            handle.seek(self._offset)
            data = handle.read(stat.st_size - self._offset)
        self._offset += len(data)
        return self._decoder.decode(data)

    def _reset(self) -> None:
        self._text, self._offset, self._inode = self.prefix, 0, None
        self._decoder.reset()

    async def current(self) -> str:
        new = await asyncio.to_thread(self._read_new)
        if new is None:  # truncated, rotated or deleted: start over
            self._reset()
            new = await asyncio.to_thread(self._read_new) or ""
        if new:
            self._text += new
        return self._text


class CallableSource(StateSource):
    """A function (sync, async or async generator) giving the full desired state.

    :param function: the callable.
    :param kwargs: keyword arguments for it (plain JSON).
    :param poll_interval: seconds between calls (ignored for async generators).
    """

    def __init__(self, function: Callable[..., Any], *, kwargs: Mapping[str, Any] | None = None,
                 poll_interval: float = DEFAULT_POLL_INTERVAL) -> None:
        self.function = function
        self.kwargs = dict(kwargs or {})
        self.poll_interval = poll_interval
        self._generator: AsyncIterator[Any] | None = None
        self._last: Any = None

    @staticmethod
    def _checked(value: Any) -> Any:
        validate_state(value, field="source result")
        return value

    async def current(self) -> Any:
        if inspect.isasyncgenfunction(self.function):
            if self._generator is None:  # the first value the generator yields is the current state
                self._generator = self.function(**self.kwargs)
                self._last = self._checked(await anext(self._generator))
            return self._last
        if inspect.iscoroutinefunction(self.function):
            return self._checked(await self.function(**self.kwargs))
        return self._checked(await asyncio.to_thread(self.function, **self.kwargs))

    async def changes(self) -> AsyncIterator[Any]:
        if inspect.isasyncgenfunction(self.function):
            yield await self.current()
            assert self._generator is not None
            async for value in self._generator:
                self._last = self._checked(value)
                yield self._last
            await asyncio.Event().wait()  # the generator ended: the state stays as it is
        else:
            async for value in super().changes():
                yield value

    async def aclose(self) -> None:
        generator, self._generator = self._generator, None
        if generator is not None:
            await generator.aclose()  # type: ignore[attr-defined]


def missing_file(path: str, must_exist: bool) -> None:
    """A file source's file does not exist: fail (``must_exist``) or say so once and read it as empty.

    :raises LocalProtocolError: with ``must_exist``.
    """
    host = socket.gethostname()
    if must_exist:
        raise LocalProtocolError(f"source file {path!r} does not exist on host {host!r}: check the path (it is read "
                                 "on the triggerer's host, or the worker's in poke mode)", code="missing_file",
                                 field="source.path")
    log.warning("source file %r does not exist on host %r: it is read as empty until it appears; if the path is "
                "wrong, fix it, or set \"must_exist\": True to fail instead", path, host)


def import_callable(path: str) -> Callable[..., Any]:
    """Import ``package.module.function`` (also ``package.module:function``).

    :raises LocalProtocolError: naming the path when it cannot be imported or is not callable.
    """
    module_name, sep, attribute = path.replace(":", ".").rpartition(".")
    if not sep or not module_name:
        raise LocalProtocolError(f"source.path {path!r} is not a dotted path 'package.module.function'",
                                 code="invalid_source", field="source.path")
    try:
        target = getattr(import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise LocalProtocolError(f"source.path {path!r} cannot be imported in the triggerer: {exc}. The module must "
                                 "be installed where the triggerer runs, not only in a Dag bundle",
                                 code="invalid_source", field="source.path") from None
    if not callable(target):
        raise LocalProtocolError(f"source.path {path!r} is not callable", code="invalid_source",
                                 field="source.path")
    return target


def validate_source_spec(spec: Any, initial_state: Any) -> dict[str, Any]:
    """Check a source description (before deferring, so bad input fails on the worker).

    :param spec: ``None`` or a dict as described in the module docstring.
    :param initial_state: the trigger's initial state.
    :return: the normalised description.
    :raises LocalProtocolError: naming the field.
    """
    if spec is None:
        return {"type": "static"}
    if not isinstance(spec, Mapping):
        raise LocalProtocolError("source must be an object such as {'type': 'file', 'path': ...}",
                                 code="invalid_source", field="source")
    kind = spec.get("type")
    if kind not in SOURCE_TYPES:
        raise LocalProtocolError(f"source.type {kind!r} is not one of {list(SOURCE_TYPES)}", code="invalid_source",
                                 field="source.type")
    allowed = {"static": {"type"}, "file": {"type", "path", "encoding", "poll_interval", "must_exist"},
               "callable": {"type", "path", "kwargs", "poll_interval"}}[kind]
    unknown = sorted(set(spec) - allowed)
    if unknown:
        raise LocalProtocolError(f"source has unknown field {unknown[0]!r} for type {kind!r}; allowed: "
                                 f"{sorted(allowed)}", code="invalid_source", field=f"source.{unknown[0]}")
    poll = spec.get("poll_interval", DEFAULT_POLL_INTERVAL)
    if isinstance(poll, bool) or not isinstance(poll, int | float) or poll <= 0:
        raise LocalProtocolError(f"source.poll_interval {poll!r} must be a positive number of seconds",
                                 code="invalid_source", field="source.poll_interval")
    if kind in ("file", "callable") and (not isinstance(spec.get("path"), str) or not spec["path"]):
        raise LocalProtocolError(f"source.path is required for a {kind} source", code="invalid_source",
                                 field="source.path")
    if kind == "file":
        if not isinstance(spec.get("must_exist", False), bool):
            raise LocalProtocolError("source.must_exist must be true or false", code="invalid_source",
                                     field="source.must_exist")
        if not isinstance(initial_state, str):
            raise LocalProtocolError("a file source needs a string initial state (the file content is appended "
                                     "to it)", code="invalid_source", field="state")
        try:
            codecs.lookup(spec.get("encoding", "utf-8"))
        except (LookupError, TypeError):
            raise LocalProtocolError(f"source.encoding {spec.get('encoding')!r} is not a known text encoding",
                                     code="invalid_source", field="source.encoding") from None
    if kind == "callable" and not isinstance(spec.get("kwargs", {}), Mapping):
        raise LocalProtocolError("source.kwargs must be an object", code="invalid_source", field="source.kwargs")
    return dict(spec)


def build_source(spec: Mapping[str, Any] | None, initial_state: Any) -> StateSource:
    """Build a source from its description (in the triggerer).

    :param spec: the description (see the module docstring).
    :param initial_state: the trigger's initial state.
    """
    spec = validate_source_spec(spec, initial_state)
    poll = float(spec.get("poll_interval", DEFAULT_POLL_INTERVAL))
    if spec["type"] == "file":
        return FileSource(spec["path"], prefix=initial_state, encoding=spec.get("encoding", "utf-8"),
                          poll_interval=poll, must_exist=spec.get("must_exist", False))
    if spec["type"] == "callable":
        return CallableSource(import_callable(spec["path"]), kwargs=spec.get("kwargs"), poll_interval=poll)
    return StaticSource(initial_state)


def read_source_once(spec: Mapping[str, Any] | None, initial_state: Any) -> Any:
    """The desired state now, read synchronously (a sensor's poke on a worker).

    :param spec: the source description.
    :param initial_state: the initial state.
    :raises LocalProtocolError: for an async generator source (it needs the triggerer).
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
            raise LocalProtocolError("an async generator source needs deferrable=True (it streams in the triggerer)",
                                     code="invalid_source", field="source.path")
        kwargs = dict(spec.get("kwargs") or {})
        value = asyncio.run(function(**kwargs)) if inspect.iscoroutinefunction(function) else function(**kwargs)
        return CallableSource._checked(value)
    return initial_state
