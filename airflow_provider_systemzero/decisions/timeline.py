"""What a watch saw, decision by decision: the bounded history behind the "Decision timeline".

A sensor that waited three hours and then fired (or timed out) leaves one ``decision`` record;
:class:`DecisionTimeline` keeps the story that led to it, for one task try (or one asset event):

* **decisions** (:meth:`DecisionTimeline.decision`) — when the watch received each one (UTC),
  the state it was about (its *generation*: the wait's own count of the different states its
  source gave, which goes on across streams; and the stream's ``state_version``, which starts
  again with each stream), the state's size and hash, the answer with its probability and
  confidence, whether it was billed or a replay, whether it was about the current state or an
  outdated one, what the watch did with it (its *disposition*, :data:`DISPOSITIONS`) and why, in
  the words of the task's log (``confidence 0.55 is below 0.9``);
* **markers** (:meth:`DecisionTimeline.mark`) — what happened around them: a state change, a
  billed start, a reconnect, a stream opened or given back, a hold rule met (:data:`MARKS`);
* **the condition** it watched for (:meth:`DecisionTimeline.watching`), so the condition's bars
  can be drawn across the decisions.

It holds at most the last :data:`HISTORY_LIMIT` decisions (and as many markers), whatever the
length of the wait, and never the state's content unless content capture is on
(``capture_content``, the ``[systemzero] capture_content`` setting the Airflow side reads): then a
short view of each decided state, its newest end (:func:`state_tail`).

Pure: no Airflow, no I/O, no clock of its own (every time is given, in epoch seconds). Its plain
JSON form (:meth:`~DecisionTimeline.to_list`, :meth:`~DecisionTimeline.from_list`) is what the
trigger's events carry and what the ``decisions`` XCom holds: a list of rows, each with a
``kind`` (``condition``, ``decision`` or a marker's kind) and ``at`` (UTC ISO 8601).

A watch records with three calls::

    timeline.watching(condition)                       # once: what it waits for
    timeline.decision(result, question="ready", at=time.time(), disposition="waiting",
                      state_key=digest, state_bytes=size, billed=True)
    timeline.mark("reconnect", time.time(), close_code=1012)

Rows are kept as tuples of plain values, so a long history is a few objects for the collector,
and a short one costs what it holds (the lists grow with it; the condition is kept as its JSON text).

**Order.** Rows are listed in time order, and rows of the same millisecond in the order they were
recorded, before and after a round trip through JSON (each row keeps its place in the sequence of
recording). A billed start is never placed before the stream it started on was opened: the
gateway's own figures back-date it, and a clock read a millisecond apart must not put a decision's
start before its stream.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

import pendulum

from airflow_provider_systemzero.protocol.body import compact_json
from airflow_provider_systemzero.protocol.reply import DecisionResult
from airflow_provider_systemzero.timestamps import iso_time

__all__ = [
    "DISPOSITIONS",
    "ENDING_DISPOSITIONS",
    "HISTORY_LIMIT",
    "MARKS",
    "DecisionTimeline",
    "iso_time",
    "merge_histories",
    "parse_time",
    "settle_billed",
]

#: The most decisions (and the most markers) a history keeps: the newest ones.
HISTORY_LIMIT = 200

#: What a watch did with a decision, and what each disposition means.
DISPOSITIONS: dict[str, str] = {
    "waiting": "did not meet the condition: the wait went on",
    "declined": "met the condition about a state a person had already said no about, or is being asked about",
    "hysteresis": "met the condition while the hold rule (consecutive, min_true_for) was still running",
    "held": "met the condition, but this run of met decisions had already fired",
    "fired": "ended the wait",
    "review": "ended the wait by asking a person",
    "failed": "the policy failed the task",
    "skipped": "the policy skipped the task",
    "unmet": "did not meet the condition about a state that never changes: the wait ended",
    "decided": "the operator's one decision",
    "ignored": "was about a state already superseded: not judged",
}
#: The dispositions of a decision that ended the wait (or, for an operator, was the decision).
ENDING_DISPOSITIONS = frozenset({"fired", "review", "failed", "skipped", "unmet", "decided"})

#: What a marker records, by kind.
MARKS: dict[str, str] = {
    "state_change": "the state changed (a new state version)",
    "billed_start": "the gateway started a decision that is billed",
    "reconnect": "the stream reconnected and replayed the state",
    "stream_opened": "the stream was opened",
    "stream_released": "the stream was given back until the state changes (lease)",
    "hold_met": "a run of met decisions became long and old enough: the wait ended",
    "review_answered": "a person answered the review about the state it shows",
    "review_outdated": "a person answered the review after its state was replaced: recorded, decides nothing",
    "review_superseded": "a newer state was decided while a person was asked: the review was closed",
    "review_timed_out": "nobody answered the review in time",
}

#: The fields of a decision row, in the order of the tuple that keeps it (``at`` is epoch seconds).
_DECISION_FIELDS = (
    "at",
    "question",
    "answer",
    "probability",
    "confidence",
    "state_version",
    "state_bytes",
    "state_hash",
    "reply_id",
    "billed",
    "current",
    "disposition",
    "state",
    "generation",
    "reason",
    "seq",
)
_AT, _DISPOSITION, _REPLY, _VERSION, _BILLED, _SEQ = (
    _DECISION_FIELDS.index(name)
    for name in ("at", "disposition", "reply_id", "state_version", "billed", "seq")
)
#: The fields of a decision row that its plain JSON form leaves out when they are ``None``.
_OPTIONAL = ("state", "generation", "reason")
#: A marker field's value: plain JSON scalars only (a marker is a point in time, not a record).
_SCALARS = (str, int, float, bool, type(None))
#: The characters of a decided state a history keeps when content capture is on: its newest end.
PREVIEW_CHARS = 160


def parse_time(value: Any) -> float:
    """A row's ``at`` (ISO 8601; UTC when it names no offset) as epoch seconds.

    :param value: the row's ``at``.
    :raises ValueError: not an ISO 8601 time.
    """
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not an ISO 8601 time")
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{value!r} is not an ISO 8601 time") from None
    return (moment if moment.tzinfo is not None else moment.replace(tzinfo=pendulum.UTC)).timestamp()


def _epoch(value: Any, where: str) -> float:
    """A row's ``at`` as epoch seconds, or an error naming the row."""
    try:
        return parse_time(value)
    except ValueError as exc:
        raise ValueError(f"{where}.at must be an ISO 8601 time: {exc}") from None


def state_tail(state: Any) -> str:
    """The newest end of a state (its last :data:`PREVIEW_CHARS` characters), what a history shows
    of it when content capture is on.

    :param state: the state (text, or any JSON value, shown as compact JSON).
    """
    text = state if isinstance(state, str) else compact_json(state)
    return text if len(text) <= PREVIEW_CHARS else "…" + text[-(PREVIEW_CHARS - 1) :]


def _scalar(value: Any) -> Any:
    """A plain JSON scalar, or its text (a marker keeps nothing else)."""
    return value if isinstance(value, _SCALARS) else str(value)


class DecisionTimeline:
    """The last decisions a watch saw and what happened around them (see the module docstring).

    :param capture_content: keep a short preview of each decided state (off: never any content).
    :param limit: the most decisions kept (and the most markers): the newest.
    """

    __slots__ = ("_condition", "_decisions", "_limit", "_markers", "_opened_at", "_seq", "capture_content")

    def __init__(self, *, capture_content: bool = False, limit: int = HISTORY_LIMIT) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be a positive number of decisions, got {limit!r}")
        self.capture_content = bool(capture_content)
        self._limit = limit
        #: the condition watched for, as compact JSON text (a copy: the caller's dict may change)
        self._condition: str | None = None
        #: the newest ``limit`` decisions and markers, oldest first
        self._decisions: list[tuple[Any, ...]] = []
        #: a marker is one flat tuple: ``(kind, at, seq, name, value, name, value, …)``
        self._markers: list[tuple[Any, ...]] = []
        #: the place of the next row recorded, in the order of recording (ties of time keep it)
        self._seq = 0
        #: when the newest stream was opened (a billed start is not placed before it)
        self._opened_at = -math.inf

    # ------------------------------------------------------------------ recording

    def watching(self, condition: Mapping[str, Any]) -> None:
        """What the watch waits for: the condition's plain form (question, expected answer, bars,
        policy, hold rule), drawn across the decisions.

        :param condition: :meth:`DecisionCondition.to_dict
            <airflow_provider_systemzero.decisions.conditions.DecisionCondition.to_dict>`.
        """
        self._condition = compact_json(dict(condition))

    def decision(
        self,
        decision: DecisionResult,
        *,
        question: str,
        at: float,
        disposition: str,
        state_key: str | None = None,
        state_bytes: int | None = None,
        state: Any = None,
        billed: bool | None = None,
        current: bool = True,
        generation: int | None = None,
        reason: str | None = None,
    ) -> None:
        """Record a decision the watch received.

        :param decision: the decision.
        :param question: the watched question (its answer is recorded).
        :param at: when the watch received it (epoch seconds).
        :param disposition: what the watch did with it (one of :data:`DISPOSITIONS`).
        :param state_key: the decided state's hash.
        :param state_bytes: the decided state's size (compact JSON bytes).
        :param state: the decided state: its newest end is kept only with ``capture_content``.
        :param billed: ``True`` billed, ``False`` a replay of an earlier reply, ``None`` not known here.
        :param current: about the current state (``False``: an outdated one).
        :param generation: the decided state's generation (the wait's count of its source's states),
            ``None`` when not known.
        :param reason: why the watch did what it did, in the words of the task's log.
        :raises ValueError: an unknown disposition.
        """
        if disposition not in DISPOSITIONS:
            raise ValueError(f"disposition must be one of {sorted(DISPOSITIONS)}, got {disposition!r}")
        answer = decision.answers.get(question)
        preview = state_tail(state) if self.capture_content and state is not None else None
        self._keep(
            self._decisions,
            (
                float(at),
                question,
                _scalar(answer.decision) if answer is not None else None,
                answer.probability if answer is not None else None,
                answer.confidence if answer is not None else None,
                decision.state_version,
                state_bytes,
                state_key,
                decision.reply_id,
                billed,
                bool(current),
                disposition,
                preview,
                generation,
                reason,
                self._next_seq(),
            ),
        )

    def _next_seq(self) -> int:
        seq, self._seq = self._seq, self._seq + 1
        return seq

    def settle(self, decision: DecisionResult, disposition: str) -> bool:
        """A decision recorded earlier ended the wait later (a hold rule met once time passed):
        its row takes ``disposition``.

        :param decision: the decision (found by its reply id and state version, newest first).
        :param disposition: what it became (one of :data:`DISPOSITIONS`).
        :return: whether its row is still held (an older one may have left the history).
        """
        if disposition not in DISPOSITIONS:
            raise ValueError(f"disposition must be one of {sorted(DISPOSITIONS)}, got {disposition!r}")
        rows = self._decisions
        for index in range(len(rows) - 1, -1, -1):
            row = rows[index]
            if row[_REPLY] == decision.reply_id and row[_VERSION] == decision.state_version:
                rows[index] = (*row[:_DISPOSITION], disposition, *row[_DISPOSITION + 1 :])
                return True
        return False

    def mark(self, kind: str, at: float, **fields: Any) -> None:
        """Record what happened at ``at`` (epoch seconds) around the decisions.

        :param kind: one of :data:`MARKS` (``state_change``, ``billed_start``, ``reconnect``,
            ``stream_opened``, ``stream_released``, ``hold_met``).
        :param fields: details, plain JSON scalars (e.g. ``state_version=4``, ``close_code=1012``);
            never the state's content.
        :raises ValueError: an unknown kind.
        """
        if kind not in MARKS:
            raise ValueError(f"a marker's kind must be one of {sorted(MARKS)}, got {kind!r}")
        at = float(at)
        if kind == "stream_opened":
            self._opened_at = at
        elif kind == "billed_start":
            at = max(at, self._opened_at)  # started on the stream opened then, not before it
        self._keep(
            self._markers,
            (
                kind,
                at,
                self._next_seq(),
                *(item for key, value in fields.items() for item in (key, _scalar(value))),
            ),
        )

    def _keep(self, rows: list[Any], row: Any) -> None:
        """Append ``row``; the oldest goes once ``rows`` holds more than the limit."""
        rows.append(row)
        if len(rows) > self._limit:
            del rows[0]

    def restart(self) -> None:
        """Start the next story (an asset watcher after each event): the decisions and markers go,
        the condition stays."""
        self._decisions.clear()
        self._markers.clear()
        self._opened_at = -math.inf

    # ------------------------------------------------------------------ reading

    def __len__(self) -> int:
        """The decisions held."""
        return len(self._decisions)

    @property
    def limit(self) -> int:
        """The most decisions (and markers) held."""
        return self._limit

    def to_list(self) -> list[dict[str, Any]]:
        """Plain JSON rows, oldest first: the condition (when known), then the decisions and the
        markers in time order. A marker older than the oldest decision held is left out once older
        decisions have left the history (it would explain nothing shown)."""
        rows: list[tuple[float, int, dict[str, Any]]] = []
        decisions = [dict(zip(_DECISION_FIELDS, row, strict=True)) for row in self._decisions]
        oldest = decisions[0]["at"] if decisions and len(decisions) == self.limit else None
        for row in decisions:
            seq = row.pop("seq")
            for name in _OPTIONAL:
                if row[name] is None:
                    del row[name]
            rows.append((row["at"], seq, {"kind": "decision", **row, "at": iso_time(row["at"])}))
        for kind, at, seq, *fields in self._markers:
            if oldest is None or at >= oldest:
                details = dict(zip(fields[::2], fields[1::2], strict=True))
                rows.append((at, seq, {"kind": kind, "at": iso_time(at), **details}))
        # in time order; a tie (the same millisecond once written out) in the order of recording
        rows.sort(key=lambda item: (round(item[0], 3), item[1]))
        head = [{"kind": "condition", **json.loads(self._condition)}] if self._condition is not None else []
        return head + [row for _, _, row in rows]

    @classmethod
    def from_list(cls, rows: Iterable[Mapping[str, Any]], *, limit: int = HISTORY_LIMIT) -> DecisionTimeline:
        """Read :meth:`to_list` rows back (the newest ``limit`` decisions and markers are kept).

        A row of a kind this version does not know is kept as a marker, so a history written by a
        newer version reads back whole.

        :param rows: the plain JSON rows.
        :param limit: the most decisions (and markers) kept.
        :raises ValueError: naming the row that is not a history row.
        """
        timeline = cls(limit=limit)
        for index, row in enumerate(rows):
            where = f"decisions[{index}]"
            if not isinstance(row, Mapping) or not isinstance(row.get("kind"), str):
                raise ValueError(f"{where} must be an object with a 'kind', got {row!r}")
            kind = row["kind"]
            if kind == "condition":
                timeline.watching({key: value for key, value in row.items() if key != "kind"})
                continue
            at = _epoch(row.get("at"), where)
            seq = timeline._next_seq()  # the rows' order, ties of time included, is kept
            if kind == "decision":
                values = {**{name: row.get(name) for name in _DECISION_FIELDS}, "at": at, "seq": seq}
                values["current"] = row.get("current", True) is not False
                if values["disposition"] not in DISPOSITIONS:
                    raise ValueError(f"{where}.disposition {values['disposition']!r} is not a disposition")
                timeline._keep(timeline._decisions, tuple(values[name] for name in _DECISION_FIELDS))
            else:
                fields = (
                    item
                    for key, value in row.items()
                    if key not in ("kind", "at")
                    for item in (key, _scalar(value))
                )
                timeline._keep(timeline._markers, (kind, at, seq, *fields))
        return timeline


def settle_billed(
    rows: Iterable[Mapping[str, Any]],
    billed: Mapping[str, bool] | None = None,
    counted: Iterable[str] | None = None,
) -> list[dict[str, Any]]:
    """Rows whose ``billed`` was not known when they were recorded, told by whoever counted the bill.

    :param rows: the plain JSON rows.
    :param billed: reply id → billed (``True``) or a replay (``False``), as a task's budget counted them.
    :param counted: the billed reply ids of a run whose budget counted every decision of the rows
        (a trigger's): a decision whose reply id is not among them was a replay. ``None``: no such run.
    """
    known = dict(billed or {})
    ids = None if counted is None else set(counted)
    out = []
    for row in rows:
        row = dict(row)
        reply = row.get("reply_id")
        if row.get("kind") == "decision" and row.get("billed") is None and isinstance(reply, str):
            if reply in known:
                row["billed"] = known[reply]
            elif ids is not None:
                row["billed"] = reply in ids
        out.append(row)
    return out


def merge_histories(
    earlier: Iterable[Mapping[str, Any]], later: Iterable[Mapping[str, Any]], *, limit: int = HISTORY_LIMIT
) -> list[dict[str, Any]]:
    """One history of two (a task's earlier deferral and its next one, or the same event read
    twice): the rows of both, each once, in time order, bounded as one history (the later
    condition kept).

    :param earlier: the rows held so far.
    :param later: the new rows.
    :param limit: the most decisions (and markers) kept.
    :raises ValueError: naming a row that is not a history row.
    """
    seen: set[str] = set()
    conditions: list[Mapping[str, Any]] = []
    timed: list[tuple[float, int, Mapping[str, Any]]] = []
    for index, row in enumerate([*earlier, *later]):
        if not isinstance(row, Mapping):
            raise ValueError(f"decisions[{index}] must be an object with a 'kind', got {row!r}")
        key = json.dumps(row, sort_keys=True, default=str)
        if key in seen:
            continue
        seen.add(key)
        if row.get("kind") == "condition":
            conditions.append(row)
        else:  # in time order before the bound applies, so the newest rows are the ones kept
            timed.append((_epoch(row.get("at"), f"decisions[{index}]"), index, row))
    timed.sort(key=lambda item: (item[0], item[1]))
    return DecisionTimeline.from_list(
        [*conditions[-1:], *(row for _, _, row in timed)], limit=limit
    ).to_list()
