"""A deliberately small loopback gateway over the core's GatewaySession, for the cases the
emulator does not produce on purpose: a server that breaks the protocol, selects no
subprotocol or answers the upgrade oddly. Everything else is tested against the emulator."""

from __future__ import annotations

import asyncio
import contextlib
import http
import itertools
import time
from collections.abc import Callable
from typing import Any

from websockets.asyncio.server import Request, Response, ServerConnection, serve
from websockets.datastructures import Headers

from airflow_provider_systemzero.protocol import DecideSuccess, GatewaySession, Limits, encode_message
from airflow_provider_systemzero.protocol.gateway import CloseConnection, DispatchDecide, SendMessage

REPLY = {
    "id": "szd_" + "0" * 32,
    "model": "MODEL_ID",
    "answers": {"ready": {"type": "boolean", "probability": 0.9, "confidence": 0.9, "decision": True}},
}


class MiniGateway:
    """``async with MiniGateway(...) as gw``: ``gw.origin``; hooks change its behaviour.

    :param select_subprotocol: answer with the subprotocol (False: select none).
    :param first_frame: a raw frame sent instead of ``hello`` (a contract breach), or ``None``.
    :param refuse: ``(status, headers, body)`` to refuse every upgrade with, or ``None``.
    :param limits: the limits to advertise.
    :param close_after_hello: close with this code right after ``hello`` (a gateway that gives up at once).
    """

    def __init__(
        self,
        *,
        select_subprotocol: bool = True,
        first_frame: str | bytes | None = None,
        refuse: tuple[int, dict[str, str], bytes] | None = None,
        limits: Limits | None = None,
        on_frame: Callable[[str], None] | None = None,
        close_after_hello: int | None = None,
    ) -> None:
        self.close_after_hello = close_after_hello
        self.select_subprotocol = select_subprotocol
        self.first_frame = first_frame
        self.refuse = refuse
        self.limits = limits or Limits()
        self.on_frame = on_frame
        self.requests: list[Headers] = []
        self.connections = 0
        self.open = 0
        self._ids = itertools.count(1)
        self._server: Any = None

    @property
    def origin(self) -> str:
        port = self._server.sockets[0].getsockname()[1]
        return f"ws://127.0.0.1:{port}"

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        self.requests.append(request.headers)
        if self.refuse is not None:
            status, headers, body = self.refuse
            fields = Headers(headers)
            fields["Content-Length"] = str(len(body))
            return Response(status, http.HTTPStatus(status).phrase, fields, body)
        return None

    def _select(self, connection: ServerConnection, subprotocols: Any) -> Any:
        return subprotocols[0] if self.select_subprotocol and subprotocols else None

    async def _handler(self, ws: ServerConnection) -> None:
        self.connections += 1
        self.open += 1
        try:
            if self.first_frame is not None:
                await ws.send(self.first_frame)
                await ws.wait_closed()
                return
            gateway = GatewaySession(
                stream_id=f"szws_{next(self._ids):032x}", now=time.monotonic(), limits=self.limits
            )
            await self._perform(ws, gateway, gateway.actions())
            if self.close_after_hello is not None:
                await ws.close(self.close_after_hello)
                return
            while not gateway.closed:
                deadline = gateway.next_deadline()
                timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    async with asyncio.timeout(timeout):
                        text = await ws.recv()
                except TimeoutError:
                    await self._perform(ws, gateway, gateway.tick(time.monotonic()))
                    continue
                if self.on_frame is not None and isinstance(text, str):
                    self.on_frame(text)
                actions = (
                    gateway.receive_text(text, time.monotonic())
                    if isinstance(text, str)
                    else gateway.receive_binary(time.monotonic())
                )
                await self._perform(ws, gateway, actions)
        except Exception:  # the client went away
            pass
        finally:
            self.open -= 1

    async def _perform(self, ws: ServerConnection, gateway: GatewaySession, actions: list[Any]) -> None:
        await perform(ws, gateway, actions)

    async def __aenter__(self) -> MiniGateway:
        self._server = await serve(
            self._handler,
            "127.0.0.1",
            0,
            process_request=self._process_request,
            select_subprotocol=self._select,
            compression=None,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        with contextlib.suppress(Exception):
            await self._server.wait_closed()


async def perform(
    ws: ServerConnection, gateway: GatewaySession, actions: list[Any], reply: dict[str, Any] = REPLY
) -> None:
    """Carry out a GatewaySession's actions on a connection; every decide answers ``reply`` at once."""
    for action in actions:
        if isinstance(action, SendMessage):
            await ws.send(encode_message(action.message))
        elif isinstance(action, DispatchDecide):
            more = gateway.dispatch_finished(
                action.dispatch_id, DecideSuccess(reply, "req_mini"), time.monotonic()
            )
            await perform(ws, gateway, more, reply)
        elif isinstance(action, CloseConnection):
            await ws.close(action.code, action.reason)


async def serve_session(ws: ServerConnection, stream_id: str, reply: dict[str, Any] = REPLY) -> None:
    """The smallest gateway loop: a GatewaySession with default limits fed every text frame."""
    gateway = GatewaySession(stream_id=stream_id, now=time.monotonic(), limits=Limits())
    await perform(ws, gateway, gateway.actions(), reply)
    async for frame in ws:
        if isinstance(frame, str):
            await perform(ws, gateway, gateway.receive_text(frame, time.monotonic()), reply)
