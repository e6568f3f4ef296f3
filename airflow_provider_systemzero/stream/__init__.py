"""The asyncio client of the System Zero stream protocol (no Airflow imports).

* :class:`DecisionStream` — one logical stream that survives reconnects (``async with``);
* :class:`StreamSettings` — where and how to connect (the API key is never shown or serialised);
* :class:`StreamCapacity` — the process-wide cap of open streams; :class:`Backoff` — reconnect delays;
* the modules by job: :mod:`.settings`, :mod:`.request` (the request and its cache key),
  :mod:`.decision_stream` (the stream: its public API, and what every event means for the caller),
  :mod:`.stream_connection` (its connection: the socket, the writer, the reconnect loop),
  :mod:`.connection` (opening one: the upgrade, proxies, refusals, :func:`probe`),
  :mod:`.starts` (may the stream start a decision now, under the account's ceiling),
  :mod:`.delivery` (what ``decide()`` and ``decisions()`` wait for), :mod:`.accounting` (what a
  stream's dispatches cost the budget), :mod:`.life` (where a stream is in its life),
  :mod:`.diagnosis` (which failures are the network's, in words to act on), :mod:`.gateway_socket`
  (the WebSocket on its transport; what it reads of websockets' and asyncio's undocumented state
  is in :mod:`airflow_provider_systemzero.dependency_internals`);
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
