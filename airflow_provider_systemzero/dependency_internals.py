"""Every use of a dependency's undocumented state, in one place, each checked at import.

websockets documents its sans-I/O ``Protocol`` by its methods and a few attributes (``state``,
``handshake_exc``, ``close_code``, ``close_reason``, ``close_exc``); CPython documents asyncio's
transports by their methods. What this package reads or writes beyond that lives here and
nowhere else, each with a check that runs when this module is imported and the public path it
falls back to when the check fails. :data:`SHORTCUTS` says which are in use, and why not.

| shortcut | what it relies on | checked at import | when the check fails |
|---|---|---|---|
| :func:`close_frames`: the close frames of a connection still closing, which the emulator counts | websockets' ``Protocol.close_sent`` and ``close_rcvd`` (once the connection is closed, websockets' documented ``close_exc`` tells the same and is read instead) | a websockets 17 release, whose protocol has both attributes | ``(None, None)`` until the connection is closed |
| :func:`release_transport` on Python 3.11: a lost connection's transport freed by reference counting, not by the collector | ``_read_ready_cb`` of CPython's ``_SelectorSocketTransport``, a bound method of the transport itself (3.12 and later clear it in ``close()``, which is all that is called there) | Python 3.11, whose ``_SelectorSocketTransport.__init__`` sets ``_read_ready_cb`` | ``close()`` alone: the collector frees the transport |

What the release buys is measured in the benchmarks' documentation (*What each shortcut buys*),
and so is what a shortcut no longer here bought: text frames read straight from the received
bytes, which walked websockets' parser generator, dropped because it did not pay.
"""

from __future__ import annotations

import asyncio
import sys

import websockets
from websockets.frames import Close
from websockets.protocol import Protocol, Side, State

__all__ = ["SHORTCUTS", "close_frames", "release_transport"]

#: websockets' major release the shortcuts on its protocol were written against.
_WEBSOCKETS_MAJOR = 17
_CLOSED = State.CLOSED


def _websockets_checked() -> str | None:
    """Why websockets' release is not one the shortcuts were written against (``None``: it is)."""
    major = websockets.__version__.split(".", 1)[0]
    if major != str(_WEBSOCKETS_MAJOR):
        return f"websockets {websockets.__version__} is not a {_WEBSOCKETS_MAJOR}.x release"
    return None


# ---------------------------------------------------------------------------- close frames


def _close_frames_checked() -> str | None:
    unchecked = _websockets_checked()
    if unchecked is not None:
        return unchecked
    protocol = Protocol(Side.SERVER)
    missing = [name for name in ("close_sent", "close_rcvd") if not hasattr(protocol, name)]
    return f"websockets' Protocol has no {', '.join(missing)}" if missing else None


#: Why the close frames of a connection still closing are not read (``None``: they are).
_CLOSE_FRAMES_OFF = _close_frames_checked()


def close_frames(protocol: Protocol) -> tuple[Close | None, Close | None]:
    """The close frame sent and the one received on ``protocol`` so far: from websockets'
    ``close_exc`` once the connection is closed; before that, from the protocol's own record (or
    ``(None, None)`` when the check at import failed).

    :param protocol: a websockets sans-I/O protocol.
    """
    if protocol.state is _CLOSED:
        closed = protocol.close_exc
        return closed.sent, closed.rcvd
    if _CLOSE_FRAMES_OFF is not None:
        return None, None
    return protocol.close_sent, protocol.close_rcvd


# ---------------------------------------------------------------------------- asyncio's transport


def _transport_checked() -> str | None:
    """Why :func:`release_transport` does no more than ``close()`` (``None``: it does)."""
    if sys.version_info[:2] != (3, 11):
        return None if sys.version_info >= (3, 12) else f"Python {sys.version_info[:2]} is not 3.11"
    import asyncio.selector_events as selector_events

    transport = getattr(selector_events, "_SelectorSocketTransport", None)
    if transport is None or "_read_ready_cb" not in transport.__init__.__code__.co_names:
        return "asyncio's _SelectorSocketTransport does not keep _read_ready_cb"
    return None


#: Why a lost transport's bound method of itself is not dropped by hand (``None``: it is, on 3.11).
_TRANSPORT_OFF = _transport_checked()
_CLEAR_BY_HAND = _TRANSPORT_OFF is None and sys.version_info < (3, 12)


def release_transport(transport: asyncio.BaseTransport | None) -> None:
    """Let reference counting free a transport whose connection was lost.

    CPython's socket transport keeps bound methods of itself (``_read_ready_cb`` always and, from
    3.12, ``_write_ready``), so every transport is a reference cycle that only the cyclic garbage
    collector frees. 3.12 and later break it in ``close()``, also when the connection is already
    lost, which is what this calls; 3.11 never breaks it, so there the attribute is dropped here
    (CPython gh-87745, gh-106503). A triggerer opens and closes a connection for every cold
    change: in a crowd of 1,000 triggers one collector pass freed about 1,100 transports and held
    the event loop for 19 ms.

    Call it from the protocol's ``connection_lost()``: the transport has stopped reading and
    writing and will call neither method again.

    :param transport: the transport whose connection was lost (``None`` is ignored).
    """
    if transport is None or not transport.is_closing():
        return
    transport.close()  # closing already, so nothing more is done but, from 3.12, dropping the cycle
    if _CLEAR_BY_HAND:
        attributes = getattr(transport, "__dict__", None)
        if attributes and getattr(attributes.get("_read_ready_cb"), "__self__", None) is transport:
            attributes["_read_ready_cb"] = None


#: Each shortcut → why it is off, or ``None`` when it is in use.
SHORTCUTS: dict[str, str | None] = {
    "close_frames": _CLOSE_FRAMES_OFF,
    "release_transport": _TRANSPORT_OFF,
}
