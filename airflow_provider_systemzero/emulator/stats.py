"""What the emulator reports: the counts it keeps while it serves (:class:`Tally`), a snapshot of
them (:class:`EmulatorStats`), the last accepted state of a stream (:class:`AcceptedState`) and how
it answered each upgrade request (:class:`UpgradeRecord`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from airflow_provider_systemzero.emulator.backend import DecideBackend
from airflow_provider_systemzero.emulator.redaction import mask_secret
from airflow_provider_systemzero.protocol.gateway import GatewaySession
from airflow_provider_systemzero.protocol.state import StreamState

__all__ = ["AcceptedState", "EmulatorStats", "Tally", "UpgradeRecord", "session_totals"]


class AcceptedState(NamedTuple):
    """A stream's last accepted state.

    :ivar state: the state (string, array or object; read-only).
    :ivar attachments: the inline attachments in wire form (``{"name", "data"}``).
    """

    state: Any
    attachments: list[dict[str, str]]

    @classmethod
    def of(cls, state: StreamState) -> AcceptedState:
        """What the emulator reports of a stream's state.

        :param state: the gateway session's state.
        """
        return cls(state.state, [a.to_dict() for a in state.attachments])


@dataclass(frozen=True, slots=True)
class UpgradeRecord:
    """How the emulator answered one upgrade request on the stream path (see
    :attr:`Emulator.upgrades <airflow_provider_systemzero.emulator.server.Emulator.upgrades>`).

    :param at: when the request arrived, on the ``time.monotonic()`` clock (the event loop's), so
        it compares with times a client records.
    :param status: the HTTP status answered: 101 when the upgrade was accepted (handed to the
        WebSocket handshake), else the refusal's status.
    :param code: the refusal's error code (``invalid_api_key``, ``stream_capacity``,
        ``maintenance`` …), or ``None`` for an accepted upgrade.
    :param retry_after_s: the refusal's ``Retry-After`` in seconds, or ``None`` when it has none.
    """

    at: float
    status: int
    code: str | None = None
    retry_after_s: int | None = None

    @property
    def accepted(self) -> bool:
        """Whether the upgrade was accepted (status 101)."""
        return self.status == 101


@dataclass(frozen=True, slots=True)
class EmulatorStats:
    """A snapshot of what the emulator did (take a new one with :attr:`Emulator.stats`).

    :param streams_open: streams whose handler runs now.
    :param streams_total: streams ever opened (successful upgrades).
    :param max_streams_open: the most streams open at once.
    :param events_accepted: mutations acknowledged, over every stream.
    :param decisions_dispatched: decide calls started by the gateway sessions.
    :param decisions_delivered: ``decision`` messages sent.
    :param decisions_billed: fresh decisions billed by the backend.
    :param decisions_replayed: original replies returned unbilled for a replayed key and body.
    :param decide_failures: failed decide calls by HTTP status.
    :param upgrade_refusals: refused upgrades by HTTP status.
    :param protocol_refusals: protocol refusals (WIRE.md §2), over every stream.
    :param rejections: non-fatal rejections, over every stream.
    :param closes_by_code: finished streams by close code (the gateway's code when it closed,
        else the client's, else 1006 for a connection lost without a close frame).
    :param connections_by_account: open streams per account.
    :param peak_connections_by_account: the most streams each account held at once.
    :param messages_sent: server messages sent, by ``type``.
    :param native_pings_sent: WebSocket ping frames sent by the keepalive.
    :param native_pongs_received: WebSocket pong frames received.
    :param native_control_floods: connections closed 1008 for native pings and pongs over the
        advertised native control limits.
    :param decision_starts_refused: decision starts the account limits refused (429
        ``rate_limited``), over every connection of every key.
    :param decision_starts_refused_per_minute: the same, in the last 60 seconds.
    """

    streams_open: int = 0
    streams_total: int = 0
    max_streams_open: int = 0
    events_accepted: int = 0
    decisions_dispatched: int = 0
    decisions_delivered: int = 0
    decisions_billed: int = 0
    decisions_replayed: int = 0
    decide_failures: dict[int, int] = field(default_factory=dict)
    upgrade_refusals: dict[int, int] = field(default_factory=dict)
    protocol_refusals: int = 0
    rejections: int = 0
    closes_by_code: dict[int, int] = field(default_factory=dict)
    connections_by_account: dict[str, int] = field(default_factory=dict)
    peak_connections_by_account: dict[str, int] = field(default_factory=dict)
    messages_sent: dict[str, int] = field(default_factory=dict)
    native_pings_sent: int = 0
    native_pongs_received: int = 0
    native_control_floods: int = 0
    decision_starts_refused: int = 0
    decision_starts_refused_per_minute: int = 0

    def to_dict(self, *, mask_accounts: bool = False) -> dict[str, Any]:
        """JSON form (integer keys become strings).

        :param mask_accounts: replace account names (API keys) by :func:`mask_secret` tags.
        """
        data = asdict(self)
        for name in ("decide_failures", "upgrade_refusals", "closes_by_code"):
            data[name] = {str(k): v for k, v in data[name].items()}
        if mask_accounts:
            for name in ("connections_by_account", "peak_connections_by_account"):
                data[name] = {mask_secret(k): v for k, v in data[name].items()}
        return data


def session_totals(session: GatewaySession) -> dict[str, int]:
    """The counters of one gateway session that :class:`EmulatorStats` sums over every stream.

    :param session: the session (open or finished).
    """
    return {
        "events_accepted": session.accepted_events,
        "decisions_dispatched": session.dispatches,
        "protocol_refusals": session.refusal_count,
        "rejections": session.rejections,
    }


@dataclass(eq=False, slots=True)
class Tally:
    """The counts and records the emulator keeps while it serves. The emulator owns one and hands it
    to each websocket connection and stream it makes; each writes what happens where it happens,
    and :meth:`snapshot` reads it whole.

    :param on_change: called (no arguments) by whoever changed something observable (a stream
        after each event it handled): wakes the emulator's ``wait_for``.
    :ivar counters: ``streams_total`` and ``max_streams_open`` (the emulator), ``native_pings_sent``,
        ``native_pongs_received`` and ``native_control_floods`` (the websocket connections).
    :ivar messages_sent: server messages sent, by ``type`` (the streams).
    :ivar closes: finished streams by close code (the streams and the emulator).
    :ivar upgrade_refusals: refused upgrades by HTTP status (the emulator).
    :ivar reserved: open streams per account, reserved at the upgrade (the emulator) and released
        when the stream ends (its websocket connection).
    :ivar states: the last accepted state of every stream that accepted a ``start``, by stream ID.
    :ivar latest_by_cache_key: ``prompt_cache_key`` (a stream's ID without one) → the ID of the
        stream that most recently accepted a ``start`` with it.
    """

    on_change: Callable[[], None]
    counters: Counter[str] = field(default_factory=Counter)
    messages_sent: Counter[str] = field(default_factory=Counter)
    closes: Counter[int] = field(default_factory=Counter)
    upgrade_refusals: Counter[int] = field(default_factory=Counter)
    reserved: Counter[str] = field(default_factory=Counter)
    states: dict[str, StreamState] = field(default_factory=dict)
    latest_by_cache_key: dict[str, str] = field(default_factory=dict)
    #: Open streams per account, and the most each account held at once.
    by_account: Counter[str] = field(default_factory=Counter)
    peak_by_account: Counter[str] = field(default_factory=Counter)
    #: :func:`session_totals` of the streams that finished.
    finished_totals: Counter[str] = field(default_factory=Counter)

    def snapshot(self, sessions: list[GatewaySession], backend: DecideBackend) -> EmulatorStats:
        """The stats now.

        :param sessions: the gateway sessions of the streams open now.
        :param backend: the decide backend, for what it billed, replayed and refused.
        """
        totals = Counter(self.finished_totals)
        for session in sessions:
            totals.update(session_totals(session))
        counters = self.counters
        return EmulatorStats(
            streams_open=len(sessions),
            streams_total=counters["streams_total"],
            max_streams_open=counters["max_streams_open"],
            events_accepted=totals["events_accepted"],
            decisions_dispatched=totals["decisions_dispatched"],
            decisions_delivered=self.messages_sent["decision"],
            decisions_billed=backend.billed,
            decisions_replayed=backend.replayed,
            decide_failures=dict(backend.failures_by_status),
            upgrade_refusals=dict(self.upgrade_refusals),
            protocol_refusals=totals["protocol_refusals"],
            rejections=totals["rejections"],
            closes_by_code=dict(self.closes),
            connections_by_account={a: n for a, n in self.by_account.items() if n},
            peak_connections_by_account=dict(self.peak_by_account),
            messages_sent=dict(self.messages_sent),
            native_pings_sent=counters["native_pings_sent"],
            native_pongs_received=counters["native_pongs_received"],
            native_control_floods=counters["native_control_floods"],
            decision_starts_refused=backend.starts_refused,
            decision_starts_refused_per_minute=backend.starts_refused_per_minute(),
        )
