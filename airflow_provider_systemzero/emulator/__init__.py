"""A local System Zero stream gateway for development, tests and benchmarks.

``systemzero-emulator --api-key demo`` (or ``python -m airflow_provider_systemzero.emulator``)
serves ``ws://127.0.0.1:8765/v1/system-zero/stream``; in-process::

    async with Emulator(api_keys={"demo": 8}, limits=Limits(idle_timeout_ms=500)) as emu:
        ...  # connect to emu.url; assert on emu.stats, emu.ledger, emu.final_states
        emu.faults.fail_decides(3, status=503)
        await emu.restart(retry_after_ms=500)

Each connection runs the protocol core's
:class:`~airflow_provider_systemzero.protocol.gateway.GatewaySession`; the emulator is only the
I/O around it (:mod:`.server`), a decide backend with the idempotency and billing ledger
(:mod:`.backend`), deciders (:mod:`.deciders`) and fault injection (:mod:`.faults`).

Plaintext ``ws://`` is for loopback only.
"""

from airflow_provider_systemzero.emulator.backend import DecideBackend, IdempotencyLedger, LedgerEntry
from airflow_provider_systemzero.emulator.deciders import (
    Decider,
    KeywordDecider,
    RulesDecider,
    load_decider,
)
from airflow_provider_systemzero.emulator.faults import Faults
from airflow_provider_systemzero.emulator.server import (
    AcceptedState,
    Emulator,
    EmulatorStats,
    UpgradeRecord,
    mask_secret,
    parse_api_key,
)

__all__ = [
    "AcceptedState",
    "DecideBackend",
    "Decider",
    "Emulator",
    "EmulatorStats",
    "Faults",
    "IdempotencyLedger",
    "KeywordDecider",
    "LedgerEntry",
    "RulesDecider",
    "UpgradeRecord",
    "load_decider",
    "mask_secret",
    "parse_api_key",
]
