"""What the client session tells its I/O adapter (the events of :mod:`~.client`).

:meth:`ClientSession.receive_text <airflow_provider_systemzero.protocol.client.ClientSession.receive_text>`
returns them for each server frame; a caller change that settles something at once (a change back
to the acknowledged state) returns them too. The adapter acts on each: it resolves waiters,
counts usage and logs.

One event asks for an answer: :class:`AdmissionWanted` (from
:attr:`ClientSession.admission_wanted <airflow_provider_systemzero.protocol.client.ClientSession.admission_wanted>`),
the session's question before it writes what can start a dispatch, which the adapter answers with
:meth:`ClientSession.admit <airflow_provider_systemzero.protocol.client.ClientSession.admit>`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from airflow_provider_systemzero.protocol.messages import Ack, ClientMessage, Error, Goodbye, Hello
from airflow_provider_systemzero.protocol.reply import DecisionResult

__all__ = [
    "Acknowledged",
    "AdmissionWanted",
    "ClientEvent",
    "DecisionFailedEvent",
    "DecisionReceived",
    "DecisionRepeated",
    "GoodbyeReceived",
    "HelloReceived",
    "MutationRejected",
    "ServerError",
    "StreamFailed",
]


@dataclass(frozen=True, slots=True)
class HelloReceived:
    """The gateway said ``hello``; its limits now apply."""

    hello: Hello


@dataclass(frozen=True, slots=True)
class Acknowledged:
    """A mutation (``start`` included) was accepted; ``replayed`` for a reconnect's ``start``."""

    ack: Ack
    message_type: str
    replayed: bool = False


@dataclass(frozen=True, slots=True)
class DecisionReceived:
    """A decision arrived.

    :param result: the typed decision.
    :param current: it covers the complete desired state (nothing newer was asked for locally).
    :param intents: the decide intents it resolves.
    :param repeated: see the attribute.
    """

    result: DecisionResult
    current: bool
    intents: tuple[int, ...] = ()
    #: The decision was delivered before; it is handed again only to resolve waiting intents
    #: (the caller changed the state back to the one it covers), not to be counted or queued.
    repeated: bool = False


@dataclass(frozen=True, slots=True)
class DecisionFailedEvent:
    """A dispatch failed (``error`` with an HTTP status).

    :param error: the error message (envelope, retry hint, ``fatal``).
    :param intents: the intents it fails: on_request, those asked about the version the decide
        named or an older one; on_change, when the gateway will not retry, those asked about the
        failed state or an older one; otherwise none (the dispatch is retried).
    :param current: it is about the complete desired state; ``False`` when the caller has changed
        the state since, and the newer state is dispatched on its own.
    :param repeated: a failure received before, handed again because the caller returned to the
        state it settled: it answers ``intents`` (and, when ``current``, is reported as the
        current state's for the first time), but is not counted again.
    """

    error: Error
    intents: tuple[int, ...] = ()
    current: bool = True
    repeated: bool = False


@dataclass(frozen=True, slots=True)
class MutationRejected:
    """A mutation was rejected for a passing reason (rate, pending events); it is sent again later."""

    error: Error


@dataclass(frozen=True, slots=True)
class ServerError:
    """Any other ``error`` the session absorbed (a stale decide it re-sends, a fatal error before a close)."""

    error: Error


@dataclass(frozen=True, slots=True)
class StreamFailed:
    """The desired state cannot be streamed (a non-retryable rejection): the caller must be told."""

    error: Error


@dataclass(frozen=True, slots=True)
class GoodbyeReceived:
    """The gateway will close; reconnect after at least ``goodbye.retry_after_ms``."""

    goodbye: Goodbye


@dataclass(frozen=True, slots=True)
class DecisionRepeated:
    """on_change: the gateway sent a decision for a version already decided on this connection
    (each dispatch freezes newer changes, so versions only grow): it was dropped, not delivered twice."""

    state_version: int


@dataclass(frozen=True, slots=True)
class AdmissionWanted:
    """The session would write ``message``, which can start a dispatch at the gateway (on_change
    every mutation, ``start`` included; on_request a ``decide``), and waits for the adapter's
    answer before it writes it or anything after it: :meth:`ClientSession.admit
    <airflow_provider_systemzero.protocol.client.ClientSession.admit>` (``True``: written at the
    next :meth:`~airflow_provider_systemzero.protocol.client.ClientSession.outgoing`; ``False``:
    held until the adapter asks it again with :meth:`~airflow_provider_systemzero.protocol.client.ClientSession.retry_admission`).

    Asked only of a session made with ``admission=True``; the adapter answers in the turn it was
    asked (what it answers with — the account's decision starts, a budget — is the adapter's).
    """

    message: ClientMessage


ClientEvent: TypeAlias = (
    HelloReceived
    | Acknowledged
    | DecisionReceived
    | DecisionRepeated
    | DecisionFailedEvent
    | MutationRejected
    | ServerError
    | StreamFailed
    | GoodbyeReceived
    | AdmissionWanted
)
