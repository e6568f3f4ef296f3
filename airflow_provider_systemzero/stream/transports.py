"""What an asyncio transport leaves behind once its connection is lost.

CPython's socket transport (``asyncio.selector_events._SelectorSocketTransport``) keeps bound
methods of itself in its own attributes: ``_read_ready_cb`` always and, from Python 3.12,
``_write_ready``. A bound method refers to its object, so every transport is a reference cycle
that only the cyclic garbage collector frees. Python 3.11 never breaks it, and 3.12 and later
break it only in ``close()``, not when a connection is aborted or fails (CPython gh-87745,
gh-106503).

A triggerer opens and closes a connection for every cold change, so each change would leave a
transport, its socket and their dictionaries for the collector. Those collect in the young
generations and are freed in bulk: in a crowd of 1,000 triggers, one pass freed the cycles of
about 1,100 transports and held the event loop for 19 ms. :func:`release_transport` breaks the
cycle as ``close()`` does on the newer releases, so reference counting frees the transport as
soon as its protocol lets go of it.
"""

from __future__ import annotations

import asyncio

__all__ = ["release_transport"]

#: The attributes in which a selector transport keeps a bound method of itself.
_SELF_BOUND = ("_read_ready_cb", "_write_ready")


def release_transport(transport: asyncio.BaseTransport | None) -> None:
    """Drop the bound methods a transport keeps of itself (see the module docstring).

    Call it from the protocol's ``connection_lost()``: by then the transport has stopped
    reading and writing and will call neither method again. A transport of another kind, or
    an attribute that is not a bound method of the transport itself, is left alone.

    :param transport: the transport whose connection was lost (``None`` is ignored).
    """
    attributes = getattr(transport, "__dict__", None)
    if not attributes:
        return
    for name in _SELF_BOUND:
        if getattr(attributes.get(name), "__self__", None) is transport:
            attributes[name] = None
