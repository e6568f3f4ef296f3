"""A place among the streams being built, held for a block, as a trigger's driver holds one."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from airflow_provider_systemzero.stream.capacity import StreamCapacity


@asynccontextmanager
async def building(capacity: StreamCapacity, origin: str | None = None) -> AsyncIterator[None]:
    """``async with building(capacity):`` wait for a place of ``capacity.ask_opening(origin)``,
    hold it for the block, and give it back with ``leave_opening`` however the block ends (the
    wait cancelled included)."""
    place = capacity.ask_opening(origin)
    try:
        await place.future
        yield
    finally:
        capacity.leave_opening(place)
