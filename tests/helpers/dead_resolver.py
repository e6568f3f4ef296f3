"""Scenarios run inside a network namespace whose DNS server never answers (``test_dead_resolver``).

``python -m tests.helpers.dead_resolver SCENARIO`` expects ``/etc/resolv.conf`` to name
``127.0.0.1`` (the test bind-mounts one over it in a mount namespace of its own) and listens there
itself, on UDP port 53, reading every query and answering none: to ``getaddrinfo`` this is a DNS
server that is down. It prints one JSON object with what it measured and the queries it swallowed.

* ``decide`` — ``hook.decide(timeout=3)`` to ``wss://gateway.example.com`` with an ``open_timeout``
  of 1 s: the seconds it took, ``asyncio.run``'s own end included, and the error;
* ``triggerer`` — eight streams to that gateway opening on one event loop (as triggers in a
  triggerer), and meanwhile another trigger's ``asyncio.to_thread``: how long that one waited.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import threading
import time
from typing import Any

KEY = "sz-dead-resolver-0123456789abcdef"
CONN_ID = "systemzero_dead_dns"
ORIGIN = "wss://gateway.example.com"
REQUEST = {"model": "m", "questions": {"ready": {"type": "boolean", "instructions": "Is the job ready?"}}}


def _swallow_queries() -> list[int]:
    """A DNS server on 127.0.0.1:53 that reads every query and answers none; the count it read."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 53))
    seen = [0]

    def read() -> None:
        while True:
            sock.recvfrom(4096)
            seen[0] += 1

    threading.Thread(target=read, daemon=True).start()
    return seen


def _decide() -> dict[str, Any]:
    from airflow_provider_systemzero.hooks.systemzero import SystemZeroHook

    hook = SystemZeroHook(CONN_ID)
    hook.get_settings()  # Airflow's first connection lookup (imports, the masker) is not the decide's
    started = time.monotonic()
    try:
        hook.decide(REQUEST, "log\n", timeout=3)
        error = None
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    return {"seconds": time.monotonic() - started, "error": error}


async def _triggerer() -> dict[str, Any]:
    from airflow_provider_systemzero.stream import Backoff, DecisionStream, StreamSettings

    settings = StreamSettings(ORIGIN, KEY, open_timeout=0.5)

    async def one_stream(number: int) -> str:
        try:
            async with DecisionStream(
                settings,
                REQUEST,
                decision_mode="on_request",
                identity=f"dead-dns-{number}",
                backoff=Backoff(base=0.05, cap=0.1),
                open_deadline=3,
            ):
                return "opened"
        except Exception as exc:
            return type(exc).__name__

    streams = [asyncio.create_task(one_stream(n)) for n in range(8)]
    await asyncio.sleep(1.0)  # the streams' openings are resolving the gateway's name by now
    asked = time.monotonic()
    await asyncio.to_thread(lambda: None)  # another trigger's work on the loop's shared executor
    waited = time.monotonic() - asked
    outcomes = await asyncio.gather(*streams)
    return {"to_thread_waited": waited, "outcomes": sorted(set(outcomes))}


def main() -> None:
    seen = _swallow_queries()
    os.environ["_AIRFLOW_PROCESS_CONTEXT"] = "server"
    os.environ[f"AIRFLOW_CONN_{CONN_ID.upper()}"] = json.dumps(
        {
            "conn_type": "systemzero",
            "host": ORIGIN,
            "password": KEY,
            "extra": {"model": "m", "open_timeout": 1},
        }
    )
    scenario = sys.argv[1]
    result = _decide() if scenario == "decide" else asyncio.run(_triggerer())
    result["queries"] = seen[0]
    print(json.dumps(result), flush=True)
    os._exit(0)  # the result is out: the interpreter's exit is not what is measured


if __name__ == "__main__":
    main()
