"""The asyncio client of the System Zero stream protocol (no Airflow imports).

* :class:`DecisionStream` — one logical stream that survives reconnects (``async with``);
* :class:`StreamSettings` — where and how to connect (the API key is never shown or serialised);
* :class:`StreamCapacity` — the process-wide cap of open streams; :class:`Backoff` — reconnect delays;
* :mod:`.exceptions` — the error tree rooted at :class:`SystemZeroError`.
"""

from airflow_provider_systemzero.stream.capacity import Backoff, StreamCapacity, default_capacity
from airflow_provider_systemzero.stream.connection import (
    Decision,
    DecisionStream,
    Reconnect,
    StreamSettings,
    build_request,
    derive_prompt_cache_key,
    probe,
)
from airflow_provider_systemzero.stream.exceptions import (
    AuthenticationFailed,
    DeadlineExceeded,
    DecisionFailed,
    LocalProtocolError,
    ProtocolViolation,
    StreamClosed,
    StreamRejected,
    SystemZeroError,
    SystemZeroValidationError,
    UpgradeRefused,
)

__all__ = [
    "AuthenticationFailed",
    "Backoff",
    "DeadlineExceeded",
    "Decision",
    "DecisionFailed",
    "DecisionStream",
    "LocalProtocolError",
    "ProtocolViolation",
    "Reconnect",
    "StreamCapacity",
    "StreamClosed",
    "StreamRejected",
    "StreamSettings",
    "SystemZeroError",
    "SystemZeroValidationError",
    "UpgradeRefused",
    "build_request",
    "default_capacity",
    "derive_prompt_cache_key",
    "probe",
]
