"""The asyncio client of the System Zero stream protocol (no Airflow imports).

* :class:`DecisionStream` — one logical stream that survives reconnects (``async with``);
* :class:`StreamSettings` — where and how to connect (the API key is never shown or serialised);
* :class:`StreamCapacity` — the process-wide cap of open streams; :class:`Backoff` — reconnect delays;
* the modules by job: :mod:`.settings`, :mod:`.request` (the request and its cache key),
  :mod:`.connection` (the upgrade, refusals, :func:`probe`), :mod:`.decision_stream` (the stream's
  public API, and the parts it owns), :mod:`.life` (where a stream is in its life, and every signal
  its parts wake each other with), :mod:`.delivery` (``decide()`` and ``decisions()``),
  :mod:`.run_loop` (its reconnect loop), :mod:`.serving` (one connection served),
  :mod:`.core_events` (what the core's events do), :mod:`.accounting` (what a stream's dispatches
  cost the budget), :mod:`.diagnosis` (which failures are the network's, in words to act on), :mod:`.gateway_socket` (the WebSocket on its transport; what it reads of
  websockets' and asyncio's undocumented state is in
  :mod:`airflow_provider_systemzero.dependency_internals`);
* :mod:`.exceptions` — the error tree rooted at :class:`SystemZeroError`.
"""

from airflow_provider_systemzero.stream.capacity import Backoff, StreamCapacity, default_capacity
from airflow_provider_systemzero.stream.connection import probe
from airflow_provider_systemzero.stream.decision_stream import DecisionResult, DecisionStream, Reconnect
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
from airflow_provider_systemzero.stream.request import build_request, derive_prompt_cache_key
from airflow_provider_systemzero.stream.settings import StreamSettings

__all__ = [
    "AuthenticationFailed",
    "Backoff",
    "DeadlineExceeded",
    "DecisionFailed",
    "DecisionResult",
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
