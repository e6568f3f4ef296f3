"""A callable source: an author's function (sync, async or async generator) giving the full desired state.

See :class:`CallableSource`; a sync function runs on a daemon thread of the provider's
(:mod:`~airflow_provider_systemzero.sources.threads`), never on the event loop or its executor.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from airflow_provider_systemzero.dotted import check_dotted, import_dotted
from airflow_provider_systemzero.exceptions import SystemZeroArgumentError
from airflow_provider_systemzero.protocol.body import compact_json
from airflow_provider_systemzero.protocol.errors import LocalProtocolError
from airflow_provider_systemzero.protocol.reconnect import doubled
from airflow_provider_systemzero.protocol.validation import validate_state
from airflow_provider_systemzero.sources.base import DEFAULT_POLL_INTERVAL, StateSource, after
from airflow_provider_systemzero.sources.threads import UserCall

__all__ = [
    "DEFAULT_CALL_TIMEOUT",
    "DEFAULT_RETRIES",
    "DEFAULT_RETRY_DELAY",
    "CallableSource",
    "SourceFailed",
    "check_source_path",
    "import_callable",
]

log = logging.getLogger(__name__)

#: A callable source's failures in a row that are retried, the first retry's delay and the
#: longest delay (seconds), and how long a sync call may run (seconds).
DEFAULT_RETRIES = 3
DEFAULT_RETRY_DELAY = 1.0
MAX_RETRY_DELAY = 30.0
DEFAULT_CALL_TIMEOUT = 60.0


class SourceFailed(RuntimeError):
    """A callable source kept failing: its retries are spent (the message names the last cause)."""


class CallableSource(StateSource):
    """An author's function (sync, async or async generator) giving the full desired state.

    Every value is checked (a string, an array or an object of plain JSON values) and kept as a
    copy of its own: a function that returns the same list each time, appended to in place, is
    seen to change, and nothing the author's code does later changes a state already read.

    A failing call (an exception, or a sync call still running after ``timeout`` seconds) is
    retried ``retries`` times, ``retry_delay`` seconds after the first failure and twice as long
    after each next one (at most :data:`MAX_RETRY_DELAY`), each logged with its cause; a success
    starts the count again. Then :class:`SourceFailed` ends the trigger. A sync function runs on a
    daemon thread of its own, one call at a time (:class:`~airflow_provider_systemzero.sources.threads.UserCall`):
    a call that hangs is waited for, never run twice at once, and never keeps another trigger or
    the process's exit waiting.

    An async generator is *pushed*: its next value is read by one task of the source's (the read
    ahead), which a reader that stops waiting never cancels, so the generator keeps its place —
    and whatever it built up — across the trigger's streams and waits; it is called once for the
    trigger's life unless it fails (then it is called again, after the back-off) or ends (then the
    state stays as it was last yielded).

    :param function: the callable.
    :param kwargs: keyword arguments for it (plain JSON).
    :param poll_interval: seconds between calls (ignored for async generators).
    :param retries: how many failures in a row are retried before the trigger fails.
    :param retry_delay: seconds before the first retry (doubling after each next failure).
    :param timeout: seconds a sync call may take before it counts as failed.
    """

    # one per waiting trigger, and a triggerer holds thousands: no per-instance __dict__
    __slots__ = (
        "_calls",
        "_changed",
        "_ended",
        "_failures",
        "_generator",
        "_has_last",
        "_last",
        "_name",
        "_pending",
        "_push",
        "_sync",
        "function",
        "kwargs",
        "poll_interval",
        "retries",
        "retry_delay",
        "timeout",
    )

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
        self._push = inspect.isasyncgenfunction(function)
        self._sync = not self._push and not inspect.iscoroutinefunction(function)
        #: the sync function's calls: a thread of their own, one at a time, ``timeout`` each
        self._calls = UserCall(f"the source {self._name}()", timeout) if self._sync else None
        self._failures = 0
        #: the newest value read (a copy of the source's own)
        self._last: Any = None
        self._has_last = False
        #: a push source: its generator, and the read of its next value (a task of the source's)
        self._generator: AsyncIterator[Any] | None = None
        self._pending: asyncio.Future[Any] | None = None
        #: a push source: what :meth:`changed` returned, until the read ahead completes it
        self._changed: asyncio.Future[None] | None = None
        #: the generator returned: the state stays as it was last yielded
        self._ended = False

    @property
    def reading_ahead(self) -> asyncio.Future[Any] | None:
        """A push source: the read of its generator's next value while one is in progress, else
        ``None``. It completes when the generator yields (or fails, or returns); the value is
        taken with :meth:`read`."""
        return self._pending

    @property
    def calling(self) -> bool:
        """A function that is not async: whether a call of it runs in its thread now (one that
        timed out runs on until it returns, and no other call starts meanwhile)."""
        return self._calls is not None and self._calls.running

    @property
    def failures(self) -> int:
        """Calls or reads that failed in a row, since the last value the function gave."""
        return self._failures

    # ---------------------------------------------------------------- values and failures

    def _checked(self, value: Any) -> Any:
        """A copy of ``value`` once it is a state; else the error names the function and the fix."""
        try:
            validate_state(value, field="source result")
            if isinstance(value, str):
                return value  # immutable
            return json.loads(compact_json(value))  # plain JSON, and a copy the author cannot change
        except LocalProtocolError as exc:
            raise LocalProtocolError(
                f"{exc.message} (from {self._name}()): return a string, a list or a dict of plain JSON values",
                code=exc.code,
                field=exc.field,
            ) from None
        except (TypeError, ValueError) as exc:
            raise LocalProtocolError(
                f"source result from {self._name}() is not plain JSON ({exc}): return strings, "
                "numbers, booleans, None, lists and dicts with string keys (turn other values into "
                "strings first, e.g. str() or .isoformat())",
                code="invalid_state",
                field="source result",
            ) from None

    async def _failed(self, exc: BaseException) -> None:
        """Count a failure: wait before the retry, or raise :class:`SourceFailed` when none is left."""
        self._failures += 1
        cause = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if self._failures > self.retries:
            raise SourceFailed(
                f"the source {self._name} failed {self._failures} time(s) in a row; last: {cause}"
            ) from exc
        delay = doubled(self.retry_delay, MAX_RETRY_DELAY, self._failures - 1)
        log.warning(
            "the source %s failed (%s); retry %d of %d in %.3g s",
            self._name,
            cause,
            self._failures,
            self.retries,
            delay,
        )
        await asyncio.sleep(delay)

    async def _value(self, call: Callable[[], Awaitable[Any]]) -> Any:
        """``call()``'s checked value, retrying failures (a value that is not a state is not one)."""
        while True:
            try:
                value = self._checked(await call())
            except LocalProtocolError:
                raise  # not a transient error: a bad value
            except Exception as exc:
                await self._failed(exc)
                continue
            self._failures = 0
            return value

    def _keep(self, value: Any) -> Any:
        self._last, self._has_last = value, True
        return value

    # ---------------------------------------------------------------- a push source

    def _read_ahead(self) -> asyncio.Future[Any]:
        """The generator's next value, read by a task of the source's own (the function is called
        first when there is no live generator; a call that raises is a read that failed)."""
        pending = self._pending
        if pending is None:
            loop = asyncio.get_running_loop()
            try:
                # a generator that raised was dropped (:meth:`_drop_generator`); one that returned
                # ended the source: the one held now is live
                generator = self._generator
                if generator is None:
                    generator = self._generator = self.function(**self.kwargs)
                pending = loop.create_task(anext(generator))  # type: ignore[arg-type]
            except Exception as exc:
                pending = loop.create_future()
                pending.set_exception(exc)
            self._pending = pending
        return pending

    async def _drop_generator(self) -> None:
        """Close the generator after it raised (the next read calls the function again)."""
        generator, self._generator = self._generator, None
        if generator is not None:
            with contextlib.suppress(Exception):
                await generator.aclose()  # type: ignore[attr-defined]

    async def _pushed(self, *, wait: bool) -> None:
        """Take the read ahead's outcome into :attr:`_last` (``wait``: wait for it; else only when
        it is done). A failure is counted and retried: the generator is called again."""
        while not self._ended:
            pending = self._read_ahead()
            if not pending.done() and not wait:
                return
            try:
                # shielded: a reader cancelled here leaves the read, and the generator's place, to
                # the next reader
                value = self._checked(await asyncio.shield(pending))
            except StopAsyncIteration:
                self._pending = None
                self._ended = True
                log.info("the source %s ended: the state stays as it was last yielded", self._name)
                return
            except LocalProtocolError:
                self._pending = None
                raise
            except Exception as exc:
                self._pending = None
                await self._drop_generator()
                await self._failed(exc)
                wait = True  # the function is called again: its first value is the current state
                continue
            self._pending = None
            self._failures = 0
            self._keep(value)
            wait = False  # take every value already read, without waiting for the next

    # ---------------------------------------------------------------- the source API

    def describe(self) -> str:
        """The callable, and how often it is asked."""
        how = "as its generator yields" if self._push else f"every {self.poll_interval:g} s"
        return f"{self._name}(), {how}"

    async def read(self) -> Any:
        """The state now: a new call of the function (retried on failure), or, for a push source,
        the newest value its generator yielded (its first value, the first time)."""
        if self._push:
            await self._pushed(wait=not self._has_last)
            return self._last
        if self._sync:
            calls = self._calls
            assert calls is not None
            return self._keep(await self._value(lambda: calls(self.function, **self.kwargs)))
        return self._keep(await self._value(lambda: self.function(**self.kwargs)))

    def changed(self) -> asyncio.Future[None]:
        """A push source: a future that completes when its generator yielded (never once it ended);
        it waits on the read ahead without owning it, so cancelling it never reaches the author's
        generator. Until it completes, every call returns the same future (the one reader, the
        trigger's driver, asks once per wait); once cancelled, the next call makes a new one.
        Otherwise the next poll."""
        if not self._push:
            return after(self.poll_interval)
        future = self._changed
        if future is not None and not future.done():
            return future
        future = self._changed = asyncio.get_running_loop().create_future()
        if not self._ended:  # once it ended, the state stays as it is
            self._read_ahead().add_done_callback(self._yielded)
        return future

    def _yielded(self, _: asyncio.Future[Any]) -> None:
        """The read ahead completed: what :meth:`changed` returned completes."""
        future, self._changed = self._changed, None
        if future is not None and not future.done():
            future.set_result(None)

    def read_now(self) -> Any:
        """One call, in the calling thread (an ``async def`` function in an event loop of its own),
        its value checked; a failure is raised as it is (each poke is a try of its own).

        :raises SystemZeroArgumentError: for an async generator (it streams: it needs the triggerer).
        """
        if self._push:
            raise SystemZeroArgumentError(
                "an async generator source needs deferrable=True (it streams in the triggerer)",
                code="invalid_source",
                field="source.path",
            )
        value = self.function(**self.kwargs)
        return self._keep(self._checked(asyncio.run(value) if inspect.iscoroutine(value) else value))

    async def aclose(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            if not pending.done():
                pending.cancel()  # the trigger ends: the generator is cancelled where it waits
                await asyncio.wait((pending,))
            if not pending.cancelled():
                pending.exception()  # a failure nobody will take now: not reported as unretrieved
        generator, self._generator = self._generator, None
        if generator is not None:
            with contextlib.suppress(Exception):
                await generator.aclose()  # type: ignore[attr-defined]


#: What a source's function is called with and returns (for messages).
_SOURCE_TAKES = "taking the source's kwargs and returning the state"


def check_source_path(path: Any) -> str:
    """A callable source's ``path``, checked for its form (:func:`~airflow_provider_systemzero.dotted.check_dotted`)."""
    return check_dotted(path, field="source.path", code="invalid_source", takes=_SOURCE_TAKES)


def import_callable(path: str) -> Callable[..., Any]:
    """Import a callable source's function (:func:`~airflow_provider_systemzero.dotted.import_dotted`).

    :raises SystemZeroArgumentError: naming the path when it cannot be imported or is not callable.
    """
    return import_dotted(path, field="source.path", code="invalid_source", takes=_SOURCE_TAKES)
