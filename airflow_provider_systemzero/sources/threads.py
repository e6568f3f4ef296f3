"""Where a DAG author's sync functions run in the triggerer: daemon threads of the provider's own.

A trigger calls two kinds of author code: a callable *source* (``{"type": "callable"}``, a sync
function giving the state) and a callable *gate* (``decide_when={"callable": ...}``, a sync function
judging a change). Either may hang — on a network call without a timeout, on a lock — and the
triggerer's event loop must not notice: no call runs on the loop, and none runs on the loop's
shared default executor, whose few threads every ``asyncio.to_thread`` of the process (other
triggers' file reads among them) waits for.

:class:`UserCall` is that rule, in one place: each caller (one per source, one per gate) runs its
function on a daemon thread of :data:`THREADS`, **one call at a time**, and waits at most
``timeout`` seconds for it. A call still running then counts as failed
(:class:`CallTimedOut`) and keeps its thread until it returns; the caller's next call waits for
that same call instead of starting another, so a hung function holds one thread, never more,
and a triggerer whose triggers ended does not wait for it to exit (the threads are daemons).
A source's next call takes that call's outcome (the state it read); a gate's, which is about the
change it was asked about, drops it and then runs with its own arguments.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["THREADS", "CallTimedOut", "DaemonThreads", "UserCall"]


class CallTimedOut(RuntimeError):
    """An author's function did not return within its timeout (it still runs in its thread).

    Not a :class:`TimeoutError`: it is a failure of the author's code, never the task's deadline.
    """


class DaemonThreads:
    """A pool of daemon threads that grows with the calls outstanding and shrinks when idle.

    Unlike :class:`concurrent.futures.ThreadPoolExecutor` it has no fixed size (every caller has
    at most one call outstanding, so a hung call cannot starve another caller) and its threads are
    daemons (a process whose work ended exits without joining a hung call).

    :param idle_seconds: how long an idle thread waits for work before it exits.
    """

    def __init__(self, idle_seconds: float = 30.0) -> None:
        self.idle_seconds = idle_seconds
        self._work: queue.SimpleQueue[tuple[concurrent.futures.Future[Any], Callable[[], Any]]] = (
            queue.SimpleQueue()
        )
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for work and not yet claimed by a submit
        self._threads = 0  # threads alive

    @property
    def threads(self) -> int:
        """Threads alive now (idle or running a call)."""
        return self._threads

    def submit(self, function: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        """Run ``function`` on a daemon thread; its outcome is the returned future's."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            self._work.put((future, function))
            if self._idle:
                self._idle -= 1
                return future
            self._threads += 1
        threading.Thread(target=self._worker, name="systemzero-user-call", daemon=True).start()
        return future

    def _worker(self) -> None:
        while True:
            try:
                future, function = self._work.get(timeout=self.idle_seconds)
            except queue.Empty:
                with self._lock:
                    if self._idle:  # nobody claimed this thread: it exits
                        self._idle -= 1
                        self._threads -= 1
                        return
                continue  # claimed by a submit whose work is on its way
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(function())
                except BaseException as exc:  # handed to the awaiting caller
                    future.set_exception(exc)
            del future, function
            with self._lock:
                self._idle += 1


#: The process's threads for authors' sync functions.
THREADS = DaemonThreads()


class UserCall:
    """One caller's calls of an author's sync function: on :data:`THREADS`, one at a time, each
    awaited at most ``timeout`` seconds.

    :param what: how messages name the function (``"the source my_pkg.f"``).
    :param timeout: seconds a call may take before it counts as failed.
    :param own_outcome: each call's outcome is about its own arguments (a ``decide_when``
        callable judging one change): when the last call is still running, it is waited for and
        its outcome dropped, then this call runs, both within ``timeout``. ``False`` (a source,
        whose outcome is the state now): the running call's outcome is this one's.
    """

    __slots__ = ("_call", "own_outcome", "timeout", "what")

    def __init__(self, what: str, timeout: float, *, own_outcome: bool = False) -> None:
        self.what = what
        self.timeout = timeout
        self.own_outcome = own_outcome
        self._call: concurrent.futures.Future[Any] | None = None

    @property
    def running(self) -> bool:
        """Whether a call is still running (one that timed out included)."""
        return self._call is not None and not self._call.done()

    async def __call__(self, function: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """``function(*args, **kwargs)`` on a daemon thread, with the caller's context (as
        :func:`asyncio.to_thread` passes it). When the last call is still running (it timed out),
        this waits for *that* call, and its outcome is this one's — or, with ``own_outcome``, is
        dropped and this call runs after it: never two calls at once.

        :raises CallTimedOut: no outcome within ``timeout`` seconds.
        """
        try:
            async with asyncio.timeout(self.timeout):
                call = self._call
                if call is not None and not call.done() and self.own_outcome:
                    with contextlib.suppress(Exception):  # about the arguments it was called with
                        await asyncio.shield(_outcome(call))
                if call is None or call.done():
                    context = contextvars.copy_context()
                    call = self._call = THREADS.submit(
                        functools.partial(context.run, function, *args, **kwargs)
                    )
                return await asyncio.shield(_outcome(call))
        except TimeoutError:
            raise CallTimedOut(
                f"{self.what} did not return within {self.timeout:.3g} s (it still runs in its own "
                "thread; no other call of it starts until it returns)"
            ) from None


def _outcome(call: concurrent.futures.Future[Any]) -> asyncio.Future[Any]:
    """``call``'s outcome on the running loop. A failure that comes after its caller stopped
    waiting (the call timed out, or the caller was cancelled) is taken here, so asyncio does not
    report it as never retrieved."""
    outcome = asyncio.wrap_future(call)
    outcome.add_done_callback(_taken)
    return outcome


def _taken(outcome: asyncio.Future[Any]) -> None:
    if not outcome.cancelled():
        outcome.exception()
