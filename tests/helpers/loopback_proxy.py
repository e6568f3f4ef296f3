"""A proxy of the tests' own on loopback: it tunnels to loopback only, so nothing leaves the machine.

A subclass speaks the proxy's protocol in :meth:`LoopbackProxy.negotiate` (HTTP ``CONNECT``,
SOCKS5 …) and returns the port on ``127.0.0.1`` to tunnel to, or ``None`` to hang up; the bytes
then flow both ways until either side closes.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any


class LoopbackProxy:
    """``async with Proxy() as proxy``: a listener on ``127.0.0.1`` (TLS when ``context`` is given).

    :param context: the server's TLS context (``None``: plain TCP).
    """

    def __init__(self, context: ssl.SSLContext | None = None) -> None:
        self.context = context
        self.server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    async def negotiate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int | None:
        """Speak the proxy's protocol up to the tunnel; the loopback port to tunnel to."""
        raise NotImplementedError

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        try:
            port = await self.negotiate(reader, writer)
            if port is None:
                raise ConnectionError("refused")
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", port)
        except Exception:
            writer.close()
            return
        await self.established(writer)

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            finally:
                sink.close()

        await asyncio.gather(
            pipe(reader, upstream_writer), pipe(upstream_reader, writer), return_exceptions=True
        )

    async def established(self, writer: asyncio.StreamWriter) -> None:
        """Tell the client that the tunnel is open (the protocol's success answer)."""
        raise NotImplementedError

    async def __aenter__(self) -> Any:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self.context)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self._writers:
            writer.transport.abort()
        await self.server.wait_closed()
