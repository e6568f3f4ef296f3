"""Echo clients for the Autobahn|Testsuite fuzzing server: every message received is sent back.

``python -m tests.conformance.echo CLIENT URL AGENT`` runs every case the server offers with one
client, then has the server write its report for ``AGENT``:

* ``gateway`` — :class:`~airflow_provider_systemzero.stream.gateway_socket.GatewaySocket`, made by
  websockets' opener as :mod:`airflow_provider_systemzero.stream.connection` makes it, its messages
  echoed from the transport callback that parsed them (a text message with
  :meth:`~GatewaySocket.send_texts`; a binary one, which a stream never sends, through the
  socket's websockets protocol and the same write path);
* ``websockets`` — websockets' own asyncio client (``async for message in ws: await
  ws.send(message)``), the reference the first is held to.

Both use the same options: no compression, websockets' default ``max_size`` (1 MiB, above every
case run), no keepalive pings of their own. The server's case count, and its report, are asked
for with websockets' client: they are not under test. Only websockets and this package (no
Airflow) are imported, so the module runs in a virtualenv that holds websockets alone, with the
repository on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from urllib.parse import quote

import websockets
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from airflow_provider_systemzero.stream.gateway_socket import GatewaySocket

__all__ = ["CLIENTS", "main", "run_cases"]

#: Seconds one case may take before the client gives up on it (the server's own timeouts are
#: shorter: a case that reaches this is a client that stopped reading).
CASE_TIMEOUT = 60.0
#: Options both clients connect with.
OPTIONS = {"compression": None, "ping_interval": None, "close_timeout": 2.0}


class _Echo:
    """The :class:`~airflow_provider_systemzero.stream.gateway_socket.SocketHandler` that sends
    every message back from the callback that handed it over."""

    def __init__(self) -> None:
        self.socket: GatewaySocket | None = None

    def socket_opened(self, socket: GatewaySocket) -> None:
        self.socket = socket

    def socket_message(self, message: str | bytes) -> None:
        socket = self.socket
        if socket is None or not socket.open:
            return
        if isinstance(message, str):
            socket.send_texts([message])
        else:
            socket.protocol.send_binary(message)
            socket.send_texts([])  # writes what the protocol has to send

    def socket_writable(self) -> None:
        return None


async def _gateway_case(url: str) -> None:
    opener = connect(url, create_connection=GatewaySocket, **OPTIONS)  # type: ignore[arg-type]
    socket = await opener.open_tcp_connection()  # as stream.connection.open_socket opens one
    assert isinstance(socket, GatewaySocket)
    echo = _Echo()
    socket.handler = echo
    try:
        await socket.handshake()
    except Exception:
        socket.abort()
        raise
    await socket.lost


async def _websockets_case(url: str) -> None:
    async with connect(url, **OPTIONS) as ws:  # type: ignore[arg-type]
        try:
            async for message in ws:
                await ws.send(message)
        except ConnectionClosed:
            pass


#: The clients by name: each runs one case at a URL until its connection is closed.
CLIENTS = {"gateway": _gateway_case, "websockets": _websockets_case}


async def _case_count(base: str) -> int:
    async with connect(f"{base}/getCaseCount", **OPTIONS) as ws:  # type: ignore[arg-type]
        return int(await ws.recv())


async def _update_reports(base: str, agent: str) -> None:
    async with connect(f"{base}/updateReports?agent={quote(agent)}", **OPTIONS) as ws:  # type: ignore[arg-type]
        async with asyncio.timeout(CASE_TIMEOUT):
            await ws.wait_closed()


async def run_cases(client: str, base: str, agent: str) -> int:
    """Run every case of the fuzzing server at ``base`` with ``client``; the number of cases.

    :param client: a key of :data:`CLIENTS`.
    :param base: the fuzzing server's URL (``ws://127.0.0.1:PORT``).
    :param agent: the name the server files the results under.
    """
    case = CLIENTS[client]
    count = await _case_count(base)
    started = time.monotonic()
    for number in range(1, count + 1):
        try:
            async with asyncio.timeout(CASE_TIMEOUT):
                await case(f"{base}/runCase?case={number}&agent={quote(agent)}")
        except (OSError, ConnectionClosed, TimeoutError) as exc:
            # the server judges the case from what it saw; the run goes on with the next one
            print(f"case {number}: {type(exc).__name__}: {exc}", file=sys.stderr)
    await _update_reports(base, agent)
    print(
        f"{agent}: {count} cases in {time.monotonic() - started:.1f} s (websockets {websockets.__version__})"
    )
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("client", choices=sorted(CLIENTS))
    parser.add_argument("url", help="the fuzzing server, ws://HOST:PORT")
    parser.add_argument("agent", help="the name its report files the results under")
    args = parser.parse_args(argv)
    asyncio.run(run_cases(args.client, args.url.rstrip("/"), args.agent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
