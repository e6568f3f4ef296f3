"""A loopback TCP proxy that delays every byte by a fixed one-way latency, both ways, in order:
the emulator as a gateway a WAN away, where a change can land during every round trip."""

from __future__ import annotations

import asyncio
import contextlib


class LatencyProxy:
    """Forwards each connection to ``target_host:target_port``, ``one_way_s`` late each way.

    :param target_host: where to forward to.
    :param target_port: its port.
    :param one_way_s: the delay each way, in seconds.
    """

    def __init__(self, target_host: str, target_port: int, one_way_s: float) -> None:
        self.target = (target_host, target_port)
        self.one_way = one_way_s
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    @property
    def origin(self) -> str:
        """The proxy's ``ws://`` origin."""
        assert self.server is not None
        return f"ws://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def start(self) -> LatencyProxy:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        return self

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for task in list(self.tasks):
            task.cancel()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(5):
                await self.server.wait_closed()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection(*self.target)
        a = asyncio.ensure_future(self._pipe(reader, up_w))
        b = asyncio.ensure_future(self._pipe(up_r, writer))
        self.tasks.update({a, b})
        await asyncio.wait({a, b}, return_when=asyncio.FIRST_COMPLETED)
        for t in (a, b):
            t.cancel()
        for w in (writer, up_w):
            w.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                at, data = await queue.get()
                if not data:
                    writer.write_eof() if writer.can_write_eof() else None
                    return
                delay = at - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                writer.write(data)
                await writer.drain()

        sender = asyncio.ensure_future(deliver())
        try:
            while True:
                data = await reader.read(65536)
                await queue.put((loop.time() + self.one_way, data))
                if not data:
                    break
            await sender
        finally:
            sender.cancel()
