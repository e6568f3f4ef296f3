"""A sans-I/O core of the System Zero stream protocol (``system-zero.stream.v1``).

No sockets, no asyncio, no Airflow: data in, events and actions out, time passed in. The
gateway emulator and the hook's client are thin adapters over the same core.

Where each rule of WIRE.md lives:

* §1 upgrade — :mod:`.upgrade` (URL, headers, refusal table);
* §2 frames — :mod:`.messages` (types, strict decode, canonical encode);
* §2–3 value rules — :mod:`.validation`; §3 byte counts and the decide body — :mod:`.body`;
* §3 state and mutations — :mod:`.state`; limits — :mod:`.limits`; buckets — :mod:`.ratelimit`;
* §4–7 gateway behaviour — :mod:`.gateway`; §7–8 client behaviour — :mod:`.client` (its phases
  and the one function that says what may be sent now) and :mod:`.client_events`;
* §5, §7–8 close codes, the reconnect plan per close code and goodbye, the backoff, and the
  retry classification of decide failures for both sides — :mod:`.reconnect`;
* §6 error envelope and retry hints — :mod:`.errors`; the decide reply — :mod:`.reply`;
* §3, §8 every derived key (cache key, key namespace, per-state key) — :mod:`.keys`.
"""

from airflow_provider_systemzero.protocol.body import compact_json, state_bytes, synthesize_decide_body
from airflow_provider_systemzero.protocol.client import ClientSession, Phase
from airflow_provider_systemzero.protocol.errors import (
    ErrorEnvelope,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    RetryHint,
)
from airflow_provider_systemzero.protocol.gateway import (
    CloseConnection,
    DecideFailure,
    DecideSuccess,
    DispatchDecide,
    GatewaySession,
    SendMessage,
)
from airflow_provider_systemzero.protocol.keys import derive_state_key
from airflow_provider_systemzero.protocol.limits import Limits
from airflow_provider_systemzero.protocol.messages import (
    PROTOCOL,
    Attachment,
    Question,
    StreamRequest,
    decode_client_message,
    decode_server_message,
    encode_message,
)
from airflow_provider_systemzero.protocol.reconnect import (
    Backoff,
    CloseCode,
    ConnectionOutcome,
    DecideRetry,
    PlanKind,
    ReconnectPlan,
    ReconnectPlanner,
    classify_decide_failure,
)
from airflow_provider_systemzero.protocol.reply import Answer, DecisionResult

__all__ = [
    "PROTOCOL",
    "Answer",
    "Attachment",
    "Backoff",
    "ClientSession",
    "CloseCode",
    "CloseConnection",
    "ConnectionOutcome",
    "DecideFailure",
    "DecideRetry",
    "DecideSuccess",
    "DecisionResult",
    "DispatchDecide",
    "ErrorEnvelope",
    "GatewaySession",
    "Limits",
    "LocalProtocolError",
    "Phase",
    "PlanKind",
    "ProtocolError",
    "Question",
    "ReconnectPlan",
    "ReconnectPlanner",
    "RemoteProtocolError",
    "RetryHint",
    "SendMessage",
    "StreamRequest",
    "classify_decide_failure",
    "compact_json",
    "decode_client_message",
    "decode_server_message",
    "derive_state_key",
    "encode_message",
    "state_bytes",
    "synthesize_decide_body",
]
