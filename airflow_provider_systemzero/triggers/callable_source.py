"""A callable source: a function (sync, async or async generator) giving the full desired state.

See :class:`CallableSource`; sync functions run in daemon threads of their own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import inspect
import logging
import queue
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from airflow_provider_systemzero.dotted import check_dotted, import_dotted
from airflow_provider_systemzero.exceptions import SystemZeroArgumentError
from airflow_provider_systemzero.protocol.errors import LocalProtocolError
from airflow_provider_systemzero.protocol.reconnect import doubled
from airflow_provider_systemzero.protocol.validation import validate_state
from airflow_provider_systemzero.triggers.state_source import DEFAULT_POLL_INTERVAL, NO_CHANGE, StateSource

__all__ = ["CallableSource", "SourceFailed", "import_callable"]

log = logging.getLogger("airflow_provider_systemzero.triggers.sources")  # the sources' one log

#: A callable source's failures in a row that are retried, the first retry's delay and the
#: longest delay (seconds), and how long a sync call may run (seconds).
DEFAULT_RETRIES = 3
DEFAULT_RETRY_DELAY = 1.0
MAX_RETRY_DELAY = 30.0
DEFAULT_CALL_TIMEOUT = 60.0


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

    An async generator's next value is read by one task of the source's. A reader that may stop
    waiting while the trigger goes on (a stream's feeder, a wait a hysteresis timer bounds) waits
    for it shielded, so it never cancels the author's generator, which is called once for the
    trigger's life unless it fails or ends; only the unbounded dormant wait, which the trigger's
    end alone cancels, awaits it directly (:meth:`next_change`).

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
        self._push = inspect.isasyncgenfunction(function)
        #: the generator returned: the state stays as it is until the function is called again
        #: (by :meth:`current`, as the next wait or stream begins)
        self._ended = False
        #: the generator's next value, read by a task of the source's (:meth:`_read_ahead`); a
        #: reader that stops waiting while the trigger goes on leaves it running
        self._pending: asyncio.Future[Any] | None = None

    def _checked(self, value: Any) -> Any:
        """``value`` once it is a state; else the error names the function and the fix."""
        try:
            validate_state(value, field="source result")
        except LocalProtocolError as exc:
            raise LocalProtocolError(
                f"{exc.message} (from {self._name}()): return a string, a list or a dict of plain JSON values",
                code=exc.code,
                field=exc.field,
            ) from None
        return value

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

    def _live(self) -> AsyncIterator[Any] | None:
        """The generator, unless it finished (an exception, a cancellation thrown into it while a
        dormant trigger awaited it) or none was made yet."""
        generator = self._generator
        if generator is not None and generator.ag_frame is None:  # type: ignore[attr-defined]
            self._generator = generator = None
        return generator

    def _read_ahead(self) -> asyncio.Future[Any]:
        """The generator's next value, read by a task of the source's own. The readers that may
        stop waiting while the trigger goes on (a stream's feeder, :meth:`current`, a timer-bounded
        dormant wait) wait for it shielded: a stream given back, or a timer, cancels the reader,
        not the read, so the generator keeps its place (and whatever it built up) and is never
        called again because of leasing.

        The task runs the generator's own ``anext()`` awaitable, with no coroutine of the
        provider's around it (one object less per waiting trigger); the function is called here
        first, or once its generator finished, and a call that raises is a read that failed.
        """
        pending = self._pending
        if pending is None:
            loop = asyncio.get_running_loop()
            generator = self._live()
            try:
                if generator is None:
                    generator = self._generator = self.function(**self.kwargs)
                    self._ended = False
                pending = loop.create_task(anext(generator))  # type: ignore[arg-type]
            except Exception as exc:
                pending = loop.create_future()
                pending.set_exception(exc)
            self._pending = pending
        return pending

    def _read_done(self) -> None:
        """The read ahead, if any, has been taken (its value or its error)."""
        if self._pending is not None and self._pending.done():
            self._pending = None

    async def _drop_generator(self) -> None:
        """Close the generator after it raised (the next value calls the function again)."""
        generator, self._generator = self._generator, None
        if generator is not None:
            with contextlib.suppress(Exception):
                await generator.aclose()  # type: ignore[attr-defined]

    async def _next_generated(self) -> Any:
        """The generator's next value, through the read ahead (:meth:`_read_ahead`). A reader
        cancelled while it waits leaves the read, and its value or its error, to the next reader;
        a read that failed or ended closes the generator (the next value calls the function)."""
        try:
            value = await asyncio.shield(self._read_ahead())
        except asyncio.CancelledError:
            raise  # this reader was cancelled: the read goes on, untouched
        except BaseException:
            self._read_done()
            await self._drop_generator()
            raise
        self._read_done()
        return value

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

    def describe(self) -> str:
        """The callable, and how often it is asked."""
        how = "as its generator yields" if self._push else f"every {self.poll_interval:g} s"
        return f"{self._name}(), {how}"

    async def current(self) -> Any:
        if self._push:
            if self._pending is not None and self._pending.done():
                # a read that finished while nobody waited: the newest state, or its failure
                with contextlib.suppress(StopAsyncIteration):  # ended: called again just below
                    self._last = await self._value(self._next_generated)
            if self._live() is None:  # the first value the generator yields is the current state
                self._last = await self._value(self._next_generated)
            return self._last
        if inspect.iscoroutinefunction(self.function):
            return await self._value(lambda: self.function(**self.kwargs))
        return await self._value(self._call_sync)

    async def changes(self) -> AsyncIterator[Any]:
        if not self._push:
            async for value in super().changes():
                yield value
            return
        last = await self.current()
        yield last
        while True:
            try:
                value = self._checked(await self._next_generated())
            except StopAsyncIteration:
                break
            except LocalProtocolError:
                raise  # not a transient error: a bad value
            except Exception as exc:
                await self._failed(exc)
                continue
            self._failures = 0
            if value is not last and value != last:  # a generator called again yields its current state first
                last = self._last = value
                yield value
        await asyncio.Event().wait()  # the generator ended: the state stays as it is

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
        return self._checked(asyncio.run(value) if inspect.iscoroutine(value) else value)

    def next_change(self, *, kept: bool = False) -> Awaitable[Any]:
        """The generator's next value: the read ahead itself, or with ``kept`` a shield of it (a
        sync or ``async def`` function: polled).

        Unkept, the dormant trigger awaits the read with nothing in between (a shield costs a
        waiting trigger a dozen objects): only the trigger's end cancels that wait, and the
        source is closed next. Kept (a wait a hysteresis timer bounds), a wait that ends without
        a value leaves the read, and the generator's place, to the next reader.
        """
        if not self._push:
            return super().next_change(kept=kept)
        if self._ended:
            return asyncio.get_running_loop().create_future()  # the state stays as it is
        return asyncio.shield(self._read_ahead()) if kept else self._read_ahead()

    async def taken(self, value: Any) -> Any:
        """A value the generator yielded, checked (a bad value raises :class:`LocalProtocolError`)."""
        if self._push:
            self._read_done()
            self._checked(value)
            self._failures = 0
            self._last = value
        return value

    async def failed(self, exc: Exception) -> Any:
        """The generator (or the check of its value) raised ``exc``: a bad value raises again, the
        end of the generator leaves the state as it is, any other failure is counted and retried
        (the generator is called again after the back-off) until :class:`SourceFailed`."""
        self._read_done()
        if not self._push or isinstance(exc, LocalProtocolError):
            raise exc
        await self._drop_generator()
        if isinstance(exc, StopAsyncIteration):
            self._ended = True
        else:
            await self._failed(exc)
        return NO_CHANGE

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
