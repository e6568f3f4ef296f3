"""A scripted hostile gateway: a small ``websockets`` server on loopback, on a thread of its own.

Not the emulator: each test hands it a *script*, an async function that plays one connection the
way a buggy, overloaded or impersonated gateway would (close right after the ack, stop reading,
flood pings, send values no gateway should). The client is driven through the public API only
(``SystemZeroHook.stream`` / ``.decide``, the deferrable trigger).

The gateway runs on its own event loop and thread so that synchronous callers (``hook.decide``)
and a client stuck on the test's loop cannot stall it. It records every connection's time.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future
from typing import Any

from websockets.asyncio.server import Request, Response, ServerConnection, serve

from airflow_provider_systemzero.protocol.limits import Limits
from airflow_provider_systemzero.protocol.messages import PROTOCOL

#: A key long enough for Airflow's secrets masker.
KEY = "sz-hostile-0123456789abcdef0123"
QUESTIONS = {"ready": {"type": "boolean", "instructions": "Is the job ready?"}}
REQUEST = {"model": "sz-test", "questions": QUESTIONS}
ANSWER = {
    "type": "boolean",
    "probability": 0.9,
    "confidence": 0.9,
    "decision": True,
    "alternatives": [{"decision": False, "confidence": 0.1}],
    "calibrated": False,
}


def reply(answers: dict[str, Any] | None = None) -> dict[str, Any]:
    """A decide reply (``answers`` default: ``ready`` true at 0.9)."""
    return {
        "id": "szd_" + "e" * 32,
        "model": "sz-test",
        "answers": {"ready": ANSWER} if answers is None else answers,
        "usage": {"input_tokens": 10},
    }


class Raw(str):
    """A value sent exactly as written, not as a JSON string: ``Raw("NaN")``, ``Raw("9" * 400)``."""


def encode(message: dict[str, Any]) -> str:
    """JSON text of ``message`` with every :class:`Raw` value spliced in verbatim."""
    raws: dict[str, str] = {}

    def mark(value: Any) -> Any:
        if isinstance(value, Raw):
            token = f"@raw{len(raws)}@"
            raws[json.dumps(token)] = str(value)
            return token
        if isinstance(value, dict):
            return {k: mark(v) for k, v in value.items()}
        if isinstance(value, list):
            return [mark(v) for v in value]
        return value

    text = json.dumps(mark(message))
    for token, raw in raws.items():
        text = text.replace(token, raw)
    return text


class Peer:
    """One connection as the script sees it: raw sends plus helpers that fill ``stream_id``/``seq``.

    :ivar number: this connection's number (1 for the first).
    """

    def __init__(self, ws: ServerConnection, number: int) -> None:
        self.ws = ws
        self.number = number
        self.stream_id = f"szws_{number:032x}"
        #: the server's next sequence numbers (a scenario may restart them: ``peer.seqs = iter(...)``)
        self.seqs: Iterator[int] = itertools.count(1)

    async def send(self, message: dict[str, Any] | str) -> None:
        """Send a message (a dict gets ``stream_id`` and the next ``seq`` unless it has them; its
        :class:`Raw` values are spliced in verbatim) or raw text."""
        if isinstance(message, dict):
            message = encode({"stream_id": self.stream_id, "seq": next(self.seqs), **message})
        await self.ws.send(message)

    async def recv(self) -> dict[str, Any]:
        """The next client message, decoded."""
        return json.loads(await self.ws.recv())

    async def hello(self, limits: dict[str, Any] | None = None, *, base: Limits | None = None) -> None:
        """Send ``hello`` with the document's limits (or ``base``), some replaced by ``limits``."""
        advertised: dict[str, Any] = (base or Limits()).advertised()
        advertised.update(limits or {})
        await self.send(
            {
                "type": "hello",
                "protocol": PROTOCOL,
                "request_id": "req_hello",
                "limits": advertised,
                "rate_limit": None,
            }
        )

    async def ack(self, event_id: str, version: int, *, scheduled: bool = False) -> None:
        """Acknowledge a mutation."""
        await self.send(
            {
                "type": "ack",
                "event_id": event_id,
                "state_version": version,
                "state_bytes": 4,
                "synthesized_body_bytes": 100,
                "scheduled": scheduled,
            }
        )

    async def open(self, limits: dict[str, Any] | None = None, **hello: Any) -> dict[str, Any]:
        """``hello``, read ``start``, acknowledge it; returns the ``start``."""
        await self.hello(limits, **hello)
        start = await self.recv()
        await self.ack(start["event_id"], 1, scheduled=start["decision_mode"] == "on_change")
        return start

    async def decision(
        self, version: int = 1, *, answers: dict[str, Any] | None = None, **fields: Any
    ) -> None:
        """Send a ``decision`` for ``version`` (fields override the defaults)."""
        message = {
            "type": "decision",
            "state_version": version,
            "covered_event_ids": [f"evt_{version}"],
            "reply": reply(answers),
            "request_id": "req_decision",
            "http_status": 200,
            "server_timing": None,
            "latency_ms": None,
            "rate_limit": None,
            "queue_ms": 0,
            "decide_ms": 5,
        }
        message.update(fields)
        await self.send(message)

    async def decide_then(self, **decision: Any) -> None:
        """Wait for ``decide``, answer ``scheduled`` and the decision built from ``decision``."""
        while True:
            message = await self.recv()
            if message["type"] == "decide":
                break
        await self.send({"type": "scheduled", "state_version": message["state_version"], "in_flight": False})
        await self.decision(message["state_version"], **decision)

    async def error(
        self,
        kind: str,
        code: str,
        message: str,
        *,
        http_status: Any = None,
        request_id: str = "r",
        fatal: bool = False,
        retryable: bool = False,
        retry_after_ms: Any = None,
    ) -> None:
        """Send an ``error`` about no event (a decide's failure when ``http_status`` is set, a
        refused ``decide`` when not) with the envelope ``kind``/``code``/``message``."""
        await self.send(
            {
                "type": "error",
                "event_id": None,
                "state_version": 1,
                "http_status": http_status,
                "request_id": request_id,
                "fatal": fatal,
                "error": {
                    "envelope": {"error": {"type": kind, "code": code, "message": message}},
                    "retry": {"retryable": retryable, "retry_after_ms": retry_after_ms},
                },
            }
        )

    async def goodbye(self, reason: str, retry_after_ms: Any = 0) -> None:
        """Send ``goodbye``."""
        await self.send(
            {
                "type": "goodbye",
                "reason": reason,
                "state_version": 1,
                "last_decision_state_version": None,
                "resume": {
                    "supported": False,
                    "action": "reconnect_and_replay",
                    "retry_after_ms": retry_after_ms,
                },
            }
        )

    async def drain(self) -> None:
        """Read (and drop) everything until the client goes away."""
        with contextlib.suppress(Exception):
            async for _ in self.ws:
                pass


Script = Callable[[Peer], Awaitable[None]]


class HostileGateway:
    """``with HostileGateway(script) as gw``: ``gw.origin``; ``gw.connections`` counts connections.

    :param script: plays each connection.
    :param respond: when set, answers every upgrade with this ``(status, headers, body)`` instead.
    :param receive_buffer: when set, the listening socket's ``SO_RCVBUF`` (inherited by every
        connection, so a gateway that stops reading stops the client's writes within a few KiB).
    """

    def __init__(
        self,
        script: Script | None = None,
        *,
        respond: tuple[int, dict[str, str], bytes] | None = None,
        receive_buffer: int | None = None,
    ) -> None:
        self.script = script
        self.respond = respond
        self.receive_buffer = receive_buffer
        self.connected_at: list[float] = []
        self.upgrades = 0
        self.errors: list[BaseException] = []
        self._numbers = itertools.count(1)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="hostile-gateway", daemon=True)
        self._server: Any = None
        self.handlers: set[asyncio.Task[Any]] = set()

    @property
    def connections(self) -> int:
        """Connections opened so far."""
        return len(self.connected_at)

    @property
    def origin(self) -> str:
        """``ws://127.0.0.1:PORT``."""
        return f"ws://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        self.upgrades += 1
        if self.respond is None:
            return None
        from websockets.datastructures import Headers

        status, headers, body = self.respond
        fields = Headers(headers)
        fields["Content-Length"] = str(len(body))
        return Response(status, "Hostile", fields, body)

    async def _handler(self, ws: ServerConnection) -> None:
        self.connected_at.append(time.monotonic())
        task = asyncio.current_task()
        assert task is not None
        self.handlers.add(task)
        try:
            if self.script is not None:
                await self.script(Peer(ws, next(self._numbers)))
        except Exception as exc:  # the client went away (or the script broke: kept for the test)
            self.errors.append(exc)
        finally:
            self.handlers.discard(task)

    def call(self, make: Callable[[], Awaitable[Any]]) -> Any:
        """Run a coroutine on the gateway's loop and return its result."""
        future: Future[Any] = asyncio.run_coroutine_threadsafe(make(), self._loop)  # type: ignore[arg-type]
        return future.result(timeout=30)

    def __enter__(self) -> HostileGateway:
        self._thread.start()

        async def start() -> Any:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if self.receive_buffer is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.receive_buffer)
            sock.bind(("127.0.0.1", 0))
            return await serve(
                self._handler,
                sock=sock,
                compression=None,
                max_size=None,
                ping_interval=None,
                process_request=self._process_request,
                select_subprotocol=lambda _c, offered: PROTOCOL if PROTOCOL in offered else None,
            )

        self._server = self.call(start)
        return self

    def __exit__(self, *exc_info: object) -> None:
        async def stop() -> None:
            self._server.close(close_connections=False)
            for task in list(self.handlers):
                task.cancel()
            for ws in list(self._server.connections):
                ws.transport.abort()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await self._server.wait_closed()

        try:
            self.call(stop)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()

    def rate(self, since: float) -> float:
        """Connections per second opened since ``since`` (monotonic)."""
        recent = [t for t in self.connected_at if t >= since]
        return len(recent) / max(1e-9, time.monotonic() - since)


async def decide_and_fail(
    hook: Any, *, within: float = 20, decide_timeout: float | None = None
) -> BaseException:
    """Open an on_request stream through ``hook`` and decide; return what the caller gets, which
    must be a :class:`~airflow_provider_systemzero.stream.exceptions.SystemZeroError`.

    :param within: seconds for opening and for the whole call.
    :param decide_timeout: the decide's own timeout (default: ``within``).
    """
    from airflow_provider_systemzero.stream.exceptions import SystemZeroError

    try:
        async with asyncio.timeout(within):
            async with hook.stream(
                REQUEST, decision_mode="on_request", state="log\n", open_deadline=within
            ) as s:
                await s.decide(timeout=decide_timeout or within)
    except Exception as exc:
        assert isinstance(exc, SystemZeroError), f"{type(exc).__name__}: {exc}"
        return exc
    raise AssertionError("the decide succeeded")
