"""A scenario run inside a network namespace whose DNS answers ``gateway.localhost`` with an
address that is not loopback (``test_plaintext_address``).

``python -m tests.helpers.plaintext_resolver`` expects ``/etc/resolv.conf`` to name ``127.0.0.1``
(the test bind-mounts one over it in a mount namespace of its own) and the address
:data:`ELSEWHERE` on the namespace's interface. It answers DNS itself on ``127.0.0.1``, UDP port 53:
``gateway.localhost`` is :data:`ELSEWHERE` — what a resolver that forwards ``*.localhost`` to DNS
may return. A gateway listens there and writes down the ``Authorization`` of every upgrade it gets.

It prints one JSON object: what the Test button said (directly, and through an HTTP proxy on
loopback that resolves the name itself, as a real proxy does), what ``hook.decide`` raised, every
``Authorization`` the gateway read, and how many DNS queries it answered.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
import sys
import threading
from typing import Any

KEY = "sz-plaintext-0123456789abcdef"
CONN_ID = "systemzero_plaintext"
NAME = "gateway.localhost"
#: Where the name resolves: an address of this machine that is not loopback.
ELSEWHERE = "10.255.0.1"
REQUEST = {"model": "m", "questions": {"ready": {"type": "boolean", "instructions": "Is the job ready?"}}}


def _reply(query: bytes) -> bytes:
    """The DNS answer to ``query``: ``A`` :data:`ELSEWHERE` for :data:`NAME`, no ``AAAA``, no other name."""
    labels, at = [], 12
    while query[at]:
        labels.append(query[at + 1 : at + 1 + query[at]].decode())
        at += 1 + query[at]
    end = at + 5  # the name's end, its type and class
    kind = struct.unpack("!H", query[at + 1 : at + 3])[0]
    known = ".".join(labels).lower() == NAME
    answers = b""
    if known and kind == 1:
        answers = b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 60, 4) + socket.inet_aton(ELSEWHERE)
    flags = 0x8180 if known else 0x8183  # NOERROR, or NXDOMAIN
    header = query[:2] + struct.pack("!HHHHH", flags, 1, 1 if answers else 0, 0, 0)
    return header + query[12:end] + answers


def _answer_dns() -> list[int]:
    """A DNS server on 127.0.0.1:53 answering :func:`_reply`; the count of queries it answered."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 53))
    seen = [0]

    def serve() -> None:
        while True:
            query, peer = sock.recvfrom(4096)
            seen[0] += 1
            sock.sendto(_reply(query), peer)

    threading.Thread(target=serve, daemon=True).start()
    return seen


def _gateway(authorizations: list[str]) -> int:
    """A gateway on :data:`ELSEWHERE` that sends ``hello`` to whoever upgrades; its port."""
    from websockets.asyncio.server import serve

    from airflow_provider_systemzero.protocol.limits import Limits
    from airflow_provider_systemzero.protocol.messages import PROTOCOL

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    def record(connection: Any, request: Any) -> None:
        authorizations.append(request.headers.get("Authorization", ""))

    async def handler(ws: Any) -> None:
        hello = {"type": "hello", "stream_id": "szws_" + "0" * 32, "seq": 1, "protocol": PROTOCOL}
        await ws.send(json.dumps({**hello, "request_id": "r", "limits": Limits().advertised()}))
        async for _ in ws:
            pass

    async def start() -> Any:
        return await serve(
            handler,
            ELSEWHERE,
            0,
            process_request=record,
            select_subprotocol=lambda _c, offered: PROTOCOL if PROTOCOL in offered else None,
        )

    server = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    return int(server.sockets[0].getsockname()[1])


def _connect_proxy() -> int:
    """An HTTP ``CONNECT`` proxy on 127.0.0.1 that resolves the name it is asked for with the
    system's resolver and tunnels to it, as a real proxy does; its port."""
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
        finally:
            sink.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        host, _, port = head.split(b" ")[1].decode().rpartition(":")
        upstream_reader, upstream_writer = await asyncio.open_connection(host, int(port))
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

    async def start() -> Any:
        return await asyncio.start_server(handle, "127.0.0.1", 0)

    server = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    return int(server.sockets[0].getsockname()[1])


def _connection(conn_id: str, port: int, **extra: Any) -> None:
    os.environ[f"AIRFLOW_CONN_{conn_id.upper()}"] = json.dumps(
        {
            "conn_type": "systemzero",
            "host": f"ws://{NAME}:{port}",
            "password": KEY,
            "extra": {"model": "m", "open_timeout": 2, **extra},
        }
    )


def main() -> None:
    seen = _answer_dns()
    authorizations: list[str] = []
    port = _gateway(authorizations)
    os.environ["_AIRFLOW_PROCESS_CONTEXT"] = "server"
    _connection(CONN_ID, port)
    _connection(f"{CONN_ID}_proxied", port, proxy=f"http://127.0.0.1:{_connect_proxy()}")
    from airflow_provider_systemzero.hooks.systemzero import SystemZeroHook

    hook = SystemZeroHook(CONN_ID)
    resolved = sorted({info[4][0] for info in socket.getaddrinfo(NAME, port, type=socket.SOCK_STREAM)})
    ok, button = hook.test_connection()
    proxied = SystemZeroHook(f"{CONN_ID}_proxied").test_connection()
    try:
        hook.decide(REQUEST, "log\n", timeout=4)
        decided = None
    except Exception as exc:
        decided = f"{type(exc).__name__}: {exc}"
    result = {
        "resolved": resolved,
        "button": [ok, button],
        "proxied": list(proxied),
        "decided": decided,
        "authorizations": authorizations,
        "queries": seen[0],
    }
    print(json.dumps(result), flush=True)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
