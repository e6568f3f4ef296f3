"""What every state source is: the desired state over time, read one way by every reader.

A source has one read interface, used the same way by a trigger in the triggerer and by a poking
sensor on its worker:

* :meth:`StateSource.read` — the state now, read where reading it cannot block the event loop
  (a file's new bytes, an author's function on a thread of its own, a push generator's newest
  value); :meth:`StateSource.read_now` is the same read in the calling thread, for a poke;
* :meth:`StateSource.changed` — a future that completes when the source *may* hold a new state
  (a file notification, the next poll, a value the push generator yielded); the reader then calls
  :meth:`~StateSource.read` and compares. It is the one thing a waiting trigger awaits: a
  notified file's future, a push generator's read — no task, and a timer only for a polled source;
* :meth:`StateSource.withheld` — whether a state holds nothing to decide (a file that does not
  exist yet, or is empty), so nothing is sent, decided or billed about it.

The watch (:mod:`~airflow_provider_systemzero.decisions.source_watch`) compares what it reads with
what it read last; a source need not yield only changes.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["DEFAULT_POLL_INTERVAL", "StateSource", "StaticSource", "after"]

#: Seconds between checks of a polled source.
DEFAULT_POLL_INTERVAL = 1.0


def after(seconds: float) -> asyncio.Future[None]:
    """A future that completes in ``seconds`` (its one timer is cancelled with it)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[None] = loop.create_future()
    timer = loop.call_later(seconds, _complete, future)
    future.add_done_callback(lambda _: timer.cancel())
    return future


def _complete(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class StateSource:
    """The desired state over time (see the module docstring).

    The default is a polled source: :meth:`changed` completes every :attr:`poll_interval`
    seconds and :meth:`read` asks again.
    """

    # a subclass may keep a __dict__; the provider's own sources, one per waiting trigger, do not
    __slots__ = ()

    #: seconds between polls (a push source ignores it).
    poll_interval: float = DEFAULT_POLL_INTERVAL

    async def read(self) -> Any:
        """The desired state now."""
        raise NotImplementedError

    def read_now(self) -> Any:
        """:meth:`read`, in the calling thread and without an event loop (a poking sensor's read on
        its worker, poke after poke with the same source: it reads what a trigger would)."""
        raise NotImplementedError

    def changed(self) -> asyncio.Future[None]:
        """A future that completes when the source may hold a new state (this default: after
        :attr:`poll_interval` seconds). Cancelling it stops nothing but the wait."""
        return after(self.poll_interval)

    def withheld(self, state: Any) -> bool:
        """Whether ``state`` holds nothing to decide (this default: it always holds something).

        A trigger opens no stream about a withheld state and sends none to an open stream; it
        waits for the source's next state instead, so nothing is decided or billed meanwhile.

        :param state: a state the source gave.
        """
        return False

    def waiting_on(self) -> str | None:
        """What a wait on this source may be stuck on, for the message of a deadline that passed
        (``None``: nothing this source knows of)."""
        return None

    def describe(self) -> str:
        """Where the state comes from, in a few words for the log line a wait starts with."""
        return f"a {type(self).__name__}"

    async def aclose(self) -> None:
        """Release what the source holds (watches, generators); safe to call twice."""


class StaticSource(StateSource):
    """A state that never changes.

    :param state: the state.
    """

    def __init__(self, state: Any) -> None:
        self.state = state

    async def read(self) -> Any:
        return self.state

    def read_now(self) -> Any:
        return self.state

    def changed(self) -> asyncio.Future[None]:
        return asyncio.get_running_loop().create_future()  # nothing ever completes it

    def describe(self) -> str:
        return "the task (it never changes)"
