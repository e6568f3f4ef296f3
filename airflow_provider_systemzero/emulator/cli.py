r"""``systemzero-emulator``: run the local System Zero stream gateway in the foreground.

    systemzero-emulator --api-key demo            # ws://127.0.0.1:8765/v1/system-zero/stream
    systemzero-emulator --port 0 --api-key demo:8 --idle-timeout-ms 5000 --decide-latency-ms 200

When it is ready it prints exactly one line on stdout::

    System Zero emulator listening on ws://127.0.0.1:PORT (stream path /v1/system-zero/stream)

SIGTERM or SIGINT shuts it down gracefully (WIRE.md §7: goodbye ``shutdown`` and close 1012 to
every stream), then it exits 0. Logs go to stderr; API keys and the admin token are never logged.

Plaintext ``ws://`` is for loopback only: bind to ``127.0.0.1`` / ``::1`` (the default). The
emulator has no TLS, so anything sent to it — the API key included — crosses the socket in the
clear; the provider's client refuses ``ws://`` to any host but a loopback one.

Trying the public example by hand, with any WebSocket client that can set a header and a
subprotocol, for instance `websocat <https://github.com/vi/websocat>`_::

    systemzero-emulator --api-key demo --start-timeout-ms 600000 --heartbeat-interval-ms 600000
    websocat -H 'Authorization: Bearer demo' --protocol system-zero.stream.v1 \
        ws://127.0.0.1:8765/v1/system-zero/stream

then paste the example's client messages one line each (compact JSON), for instance::

    {"type":"start","event_id":"evt_1","request":{"model":"MODEL_ID","state":"Initial log\n","questions":{"ready":{"type":"boolean","instructions":"Is the job ready?"}},"prompt_cache_key":"example-affinity"},"decision_mode":"on_request","min_interval_ms":0,"idempotency_key":"example-state-1"}
    {"type":"append_text","event_id":"evt_2","text":"Job is ready.\n","idempotency_key":"example-state-2"}
    {"type":"decide","state_version":2}

The acks say ``state_bytes`` 15 and 30 and ``synthesized_body_bytes`` 158 and 173, as in the
public document, and the decision answers ``ready: true``. The two timeout options only give a
human time to type: by default ``start`` is due within 10 s and a JSON ``ping`` comes every
30 s, to be answered with ``{"type":"pong","nonce":N}`` within 10 s.

The control surface shares the port (see :mod:`airflow_provider_systemzero.emulator.server`)::

    systemzero-emulator --api-key demo --admin-token s3cret
    curl -H 'Authorization: Bearer s3cret' http://127.0.0.1:8765/_emulator/stats
    curl -X POST -H 'Authorization: Bearer s3cret' \
        'http://127.0.0.1:8765/_emulator/faults?fail=3&status=503&retry_after_ms=500'
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Sequence
from dataclasses import fields
from typing import Any, NoReturn

from airflow_provider_systemzero.emulator.server import Emulator, parse_api_key
from airflow_provider_systemzero.protocol.limits import Limits
from airflow_provider_systemzero.protocol.upgrade import STREAM_PATH, is_loopback_host

__all__ = ["build_parser", "main"]

DEFAULT_PORT = 8765
log = logging.getLogger(__name__)


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value}")
    return value


def _api_key(text: str) -> tuple[str, int]:
    try:
        return parse_api_key(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class _Parser(argparse.ArgumentParser):
    """Says what is wrong in two lines, not below the usage of some fifty options."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\nrun '{self.prog} --help' for every option\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (every limit of the public document is an option)."""
    parser = _Parser(
        prog="systemzero-emulator",
        description="Local System Zero stream gateway (system-zero.stream.v1) for development and tests. "
        "Plaintext ws:// — bind to loopback only.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument(
        "--port",
        type=_non_negative,
        default=DEFAULT_PORT,
        help=f"port (default {DEFAULT_PORT}; 0 picks a free port, printed on the ready line)",
    )
    parser.add_argument(
        "--api-key",
        dest="api_keys",
        action="append",
        type=_api_key,
        metavar="KEY[:MAX_CONCURRENT]",
        help="accept this API key (repeatable); MAX_CONCURRENT sets the account's stream capacity "
        "max(1, floor(MAX_CONCURRENT / 2)), default 8 (4 streams). Default: demo",
    )
    parser.add_argument(
        "--decider", default="keyword", help="keyword (default), rules:FILE or python:module:function"
    )
    parser.add_argument(
        "--decide-latency-ms",
        type=_non_negative,
        default=0,
        help="simulated inference time of each fresh decision",
    )
    parser.add_argument(
        "--shutdown-retry-after-ms",
        type=_non_negative,
        default=500,
        help="goodbye.resume.retry_after_ms on shutdown (default 500)",
    )
    parser.add_argument(
        "--admin-token", default=None, help="token of the /_emulator/ control surface (default: random)"
    )
    parser.add_argument(
        "--print-admin-token", action="store_true", help="print the admin token on stderr once ready"
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="stderr log level (default INFO: one line per connection, refusal and decision)",
    )

    limits = parser.add_argument_group("limits", "every limit of the public document (defaults: its values)")
    defaults = Limits()
    for f in fields(Limits):
        limits.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f"limit_{f.name}",
            type=_non_negative,
            default=None,
            metavar="N",
            help=f"default {getattr(defaults, f.name)}",
        )

    faults = parser.add_argument_group(
        "faults", "fault injection at start (also at runtime via /_emulator/faults)"
    )
    # a scripted fault: its count, then options whose dest is the prefix and a keyword of its Faults method
    faults.add_argument(
        "--fail-decides",
        dest="decide_failures",
        type=_non_negative,
        default=0,
        metavar="N",
        help="fail the next N decide calls",
    )
    faults.add_argument("--fail-status", type=int, default=503, help="HTTP status of scripted failures (503)")
    faults.add_argument("--fail-code", default=None, help="envelope code (default from the status)")
    faults.add_argument(
        "--fail-type",
        dest="fail_error_type",
        metavar="FAIL_TYPE",
        default=None,
        help="envelope type (default from the status)",
    )
    faults.add_argument(
        "--fail-retry-after-ms", type=_non_negative, default=None, help="Retry-After-Ms header"
    )
    faults.add_argument("--fail-retry-after-s", type=_non_negative, default=None, help="Retry-After header")
    faults.add_argument(
        "--fail-not-retryable",
        dest="fail_retryable",
        action="store_false",
        help="scripted failures forbid a retry",
    )
    faults.add_argument(
        "--delay-decisions-ms", type=_non_negative, default=0, help="delay every decide answer"
    )
    faults.add_argument(
        "--silent",
        action="store_true",
        help="a silent peer: answer no native pings and send nothing after the upgrade",
    )
    faults.add_argument(
        "--refuse-upgrades",
        dest="upgrade_refusals",
        type=_non_negative,
        default=0,
        metavar="N",
        help="refuse the next N valid upgrades",
    )
    faults.add_argument(
        "--refuse-status", type=int, default=503, help="HTTP status of refused upgrades (503)"
    )
    faults.add_argument("--refuse-code", default=None, help="envelope code of refused upgrades")
    faults.add_argument(
        "--refuse-retry-after-s", type=_non_negative, default=1, help="Retry-After of refusals"
    )
    return parser


def _build_emulator(args: argparse.Namespace) -> Emulator:
    overrides = {
        f.name: getattr(args, f"limit_{f.name}")
        for f in fields(Limits)
        if getattr(args, f"limit_{f.name}") is not None
    }
    emulator = Emulator(
        host=args.host,
        port=args.port,
        api_keys=dict(args.api_keys or [("demo", 8)]),
        limits=Limits(**overrides),
        decider=args.decider,
        decide_latency_ms=args.decide_latency_ms,
        admin_token=args.admin_token,
        shutdown_retry_after_ms=args.shutdown_retry_after_ms,
    )
    faults = emulator.faults
    if args.decide_failures:
        faults.fail_decides(args.decide_failures, **_keywords(args, "fail_"))
    faults.delay_decisions_ms = args.delay_decisions_ms
    faults.answer_pings = not args.silent
    if args.upgrade_refusals:
        faults.refuse_upgrades(args.upgrade_refusals, **_keywords(args, "refuse_"))
    return emulator


def _keywords(args: argparse.Namespace, prefix: str) -> dict[str, Any]:
    """What the options of one scripted fault set, by keyword (``--fail-status`` → ``status``)."""
    return {dest.removeprefix(prefix): value for dest, value in vars(args).items() if dest.startswith(prefix)}


async def _serve(emulator: Emulator, *, print_admin_token: bool) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not on every platform
            loop.add_signal_handler(signum, stop.set)
    await emulator.start()
    try:
        print(f"System Zero emulator listening on {emulator.origin} (stream path {STREAM_PATH})", flush=True)
        if print_admin_token:
            print(f"admin token: {emulator.admin_token}", file=sys.stderr, flush=True)
        await stop.wait()
        log.info("shutting down")
    finally:
        await emulator.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the emulator until SIGTERM/SIGINT; returns the exit status.

    :param argv: the arguments (default ``sys.argv[1:]``).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        emulator = _build_emulator(args)
    except ValueError as exc:
        parser.error(str(exc))
    if not is_loopback_host(args.host):
        log.warning("binding %s: the emulator speaks plaintext ws://, meant for loopback only", args.host)
    try:
        asyncio.run(_serve(emulator, print_admin_token=args.print_admin_token))
    except OSError as exc:
        print(f"systemzero-emulator: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # a second Ctrl-C during shutdown
        return 130
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
