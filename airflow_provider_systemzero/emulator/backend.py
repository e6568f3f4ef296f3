"""The emulator's ordinary decide API: ``decide(body, idempotency_key) -> reply or HTTP failure``.

The gateway session dispatches the synthesized body; this module plays the HTTP decide endpoint
behind it (no real HTTP: the outcome is the core's :class:`DecideSuccess` / :class:`DecideFailure`).
In order, a call goes through:

1. the fault injector (``delay_decisions_ms``, then any scripted failure);
2. the per-account idempotency ledger (WIRE.md §3): the same key and a byte-identical body
   returns the original reply, not billed again; a different body is 422
   ``idempotency_key_reused`` (not retryable); the same key while the first call still runs is
   409 ``idempotency_conflict`` (retryable, ``Retry-After-Ms``). Replies are kept 24 hours;
3. the account decision bucket (``account_decision_burst`` starts, refilled at
   ``account_decision_ceiling`` per minute): over it, 429 ``rate_limit_error``/``rate_limited``
   with ``Retry-After-Ms``;
4. ``decide_latency_ms`` of simulated inference, the decider, and a reply with the full shape of
   the public example, billed once.

:class:`IdempotencyLedger` is pure (time passed in); :class:`DecideBackend` is the async wrapper.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import logging
import math
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_provider_systemzero.emulator.deciders import Decider
from airflow_provider_systemzero.emulator.faults import Faults
from airflow_provider_systemzero.emulator.redaction import mask_secret
from airflow_provider_systemzero.protocol.errors import ErrorEnvelope, RetryHint
from airflow_provider_systemzero.protocol.gateway import DecideFailure, DecideOutcome, DecideSuccess
from airflow_provider_systemzero.protocol.limits import Limits
from airflow_provider_systemzero.protocol.ratelimit import TokenBucket

__all__ = [
    "CONFLICT_RETRY_AFTER_MS",
    "LEDGER_RETENTION_S",
    "SERVED_BY",
    "DecideBackend",
    "IdempotencyLedger",
    "LedgerEntry",
    "LedgerVerdict",
    "complete_answers",
    "new_reply_id",
]

log = logging.getLogger(__name__)

#: How long the ledger keeps an original reply (WIRE.md §3: 24 hours).
LEDGER_RETENTION_S = 24 * 3600
#: ``Retry-After-Ms`` of a 409 ``idempotency_conflict``.
CONFLICT_RETRY_AFTER_MS = 1000
#: The window of :meth:`DecideBackend.starts_refused_per_minute`, in seconds.
REFUSAL_WINDOW_S = 60.0
#: ``reply.served_by``.
SERVED_BY = "systemzero-emulator"
CALIBRATION_VERSION = "unpublished"
#: Media tokens counted per inline attachment.
MEDIA_TOKENS_PER_ITEM = 258
#: Input tokens above which ``long_input_tokens`` counts.
LONG_INPUT_THRESHOLD = 200_000
_CACHE_KEYS_PER_ACCOUNT = 1024


def new_reply_id() -> str:
    """``szd_`` + 32 lowercase hex."""
    return "szd_" + secrets.token_hex(16)


def _request_id() -> str:
    return "req_" + secrets.token_hex(12)


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One answered decide call of an account.

    :param account: the account (its API key name).
    :param idempotency_key: the call's ``Idempotency-Key`` (``None``: unkeyed).
    :param body_sha256: hex SHA-256 of the body's UTF-8 bytes.
    :param reply_id: ``reply.id`` returned.
    :param billed: ``True`` for a fresh decision, ``False`` for a replay of the original reply.
    :param time: wall-clock time of the answer (``time.time()``).
    :param usage: the reply's ``usage`` (a replay repeats the original's; it is not billed again).
    """

    account: str
    idempotency_key: str | None
    body_sha256: str
    reply_id: str
    billed: bool
    time: float
    usage: dict[str, int] | None = None


@dataclass(frozen=True, slots=True)
class LedgerVerdict:
    """What the ledger says about a keyed call.

    :param kind: ``fresh`` (go ahead), ``replay`` (answer ``reply`` unbilled), ``conflict``
        (409: the first call still runs) or ``reused`` (422: the key named a different body).
    :param reply: the original reply for ``replay``.
    """

    kind: str
    reply: dict[str, Any] | None = None


@dataclass(slots=True)
class _Record:
    body_sha256: str
    started: float
    reply: dict[str, Any] | None = None
    finished: float | None = None


class IdempotencyLedger:
    """Per-account idempotency records (pure: time is passed in, seconds on any monotonic origin).

    :param retention_s: how long a finished record is kept.
    """

    def __init__(self, retention_s: float = LEDGER_RETENTION_S) -> None:
        self.retention_s = retention_s
        self._records: dict[tuple[str, str], _Record] = {}

    def check(self, account: str, key: str, body_sha256: str, now: float) -> LedgerVerdict:
        """Look a keyed call up; ``fresh`` also marks it in flight (finish with :meth:`complete`
        or :meth:`abandon`).

        :param account: the account.
        :param key: the idempotency key.
        :param body_sha256: hex SHA-256 of the body.
        :param now: the current time.
        """
        record = self._records.get((account, key))
        if record is not None and record.finished is not None and now - record.finished >= self.retention_s:
            del self._records[(account, key)]
            record = None
        if record is None:
            self._records[(account, key)] = _Record(body_sha256, now)
            return LedgerVerdict("fresh")
        if record.body_sha256 != body_sha256:
            return LedgerVerdict("reused")
        if record.reply is None:
            return LedgerVerdict("conflict")
        return LedgerVerdict("replay", record.reply)

    def complete(self, account: str, key: str, reply: dict[str, Any], now: float) -> None:
        """Store the original reply of an in-flight call."""
        record = self._records.get((account, key))
        if record is not None and record.reply is None:
            record.reply, record.finished = reply, now

    def abandon(self, account: str, key: str) -> None:
        """Forget an in-flight call that failed (the key may be used again)."""
        record = self._records.get((account, key))
        if record is not None and record.reply is None:
            del self._records[(account, key)]

    def in_flight(self, account: str, key: str) -> bool:
        """Whether a call with this key is running."""
        record = self._records.get((account, key))
        return record is not None and record.reply is None


def _unit(value: Any, default: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ValueError(f"must be a number between 0 and 1, got {value!r}")
    return float(value)


def complete_answers(questions: Mapping[str, Any], answers: Mapping[str, Any]) -> dict[str, Any]:
    """The ``reply.answers`` object: each decider answer completed to the public example's shape
    (``type``, ``probability``, ``confidence``, ``calibration_version``, ``decision``,
    ``alternatives``, ``calibrated``), in question order.

    :param questions: the body's questions.
    :param answers: the decider's answers (bare decisions or mappings with ``decision``).
    :raises ValueError: a question is unanswered or an answer does not fit its question.
    """
    if not isinstance(answers, Mapping):
        raise ValueError(f"the decider returned {type(answers).__name__}, not a mapping of answers")
    if "answers" not in questions and isinstance(answers.get("answers"), Mapping):
        answers = answers["answers"]  # a decider that returned a reply-shaped object
    result: dict[str, Any] = {}
    for name, question in questions.items():
        if name not in answers:
            raise ValueError(f"the decider gave no answer for question {name!r}")
        raw = answers[name]
        raw = raw if isinstance(raw, Mapping) else {"decision": raw}
        decision = raw.get("decision")
        kind = question.get("type")
        options = list(question.get("options") or ())
        if kind == "choice":
            if not isinstance(decision, str) or decision not in options:
                raise ValueError(f"answer {name!r}: {decision!r} is not one of the options {options}")
        elif not isinstance(decision, bool):
            raise ValueError(f"answer {name!r}: a boolean question needs true or false, got {decision!r}")
        try:
            probability = _unit(raw.get("probability"), 1.0)
            confidence = _unit(raw.get("confidence"), 1.0)
        except ValueError as exc:
            raise ValueError(f"answer {name!r}: probability/confidence {exc}") from None
        alternatives = raw.get("alternatives")
        if alternatives is None:
            others: list[Any] = [not decision] if kind != "choice" else [o for o in options if o != decision]
            share = round((1 - probability) / len(others), 4) if others else 0.0
            alternatives = [{"decision": other, "confidence": share} for other in others]
        elif not isinstance(alternatives, list):
            raise ValueError(f"answer {name!r}: alternatives must be a list")
        result[name] = {
            "type": kind,
            "probability": probability,
            "confidence": confidence,
            "calibration_version": CALIBRATION_VERSION,
            "decision": decision,
            "alternatives": alternatives,
            "calibrated": False,
        }
    return result


def _common_prefix(a: str, b: str) -> int:
    """The length of the longest common prefix of ``a`` and ``b``, by string comparisons rather
    than a loop over characters (a body that only grew is found at once)."""
    if b.startswith(a):
        return len(a)
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:  # the longest equal prefix: a[:lo] == b[:lo], and not beyond hi
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class DecideBackend:
    """The ordinary decide API the gateway dispatches to (see the module docstring).

    :param decider: answers the questions.
    :param limits: for ``account_decision_burst`` and ``account_decision_ceiling_per_minute``.
    :param faults: the standing faults to apply.
    :param decide_latency_ms: simulated inference time of a fresh (billed) decision.
    :param on_change: called (no arguments) whenever the ledger or counters change.
    """

    def __init__(
        self,
        decider: Decider,
        *,
        limits: Limits | None = None,
        faults: Faults | None = None,
        decide_latency_ms: int = 0,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.decider = decider
        self.limits = limits or Limits()
        self.faults = faults or Faults()
        self.decide_latency_ms = decide_latency_ms
        self.ledger_records = IdempotencyLedger()
        self.ledger: dict[str, list[LedgerEntry]] = {}
        self.calls = 0
        self.billed = 0
        self.replayed = 0
        self.failures_by_status: dict[int, int] = {}
        #: Decision starts refused by the account bucket (429 ``rate_limited``), over every account.
        self.starts_refused = 0
        self._refused_at: deque[float] = deque()  # monotonic times of the refusals of the last minute
        self._buckets: dict[str, TokenBucket] = {}
        self._last_bodies: dict[str, OrderedDict[str, str]] = {}
        self._on_change = on_change or (lambda: None)
        decide = getattr(decider, "function", None) or getattr(decider, "decide", None)
        self._plain_decider = not inspect.iscoroutinefunction(decide)

    def decides_at_once(self) -> bool:
        """Whether :meth:`decide` may be started outside a task: no simulated wait is set and the
        decider is a plain function (a coroutine decider runs only inside a task)."""
        return self._plain_decider and self.decide_latency_ms <= 0 and self.faults.delay_decisions_ms <= 0

    # ------------------------------------------------------------------ the call

    async def decide(self, account: str, body: str, idempotency_key: str | None) -> DecideOutcome:
        """One decide call.

        :param account: the calling account.
        :param body: the decide body (compact JSON).
        :param idempotency_key: the ``Idempotency-Key``, or ``None``.
        :return: a success with the reply, or a failure with the HTTP status, envelope and retry hint.
        """
        started = time.monotonic()
        self.calls += 1
        request_id = _request_id()
        delay_ms = self.faults.delay_decisions_ms
        if delay_ms > 0:
            await asyncio.sleep(delay_ms / 1000)
        scripted = self.faults.take_decide_failure()
        if scripted is not None:
            return self._fail(scripted.status, scripted.envelope(), scripted.retry(), request_id)
        raw = body.encode("utf-8")
        sha = hashlib.sha256(raw).hexdigest()
        now = time.monotonic()
        if idempotency_key is not None:
            verdict = self.ledger_records.check(account, idempotency_key, sha, now)
            if verdict.kind == "reused":
                return self._fail(
                    422,
                    ErrorEnvelope(
                        "idempotency_error",
                        "idempotency_key_reused",
                        "this Idempotency-Key was used with a different request body: a key names one "
                        "byte-identical request",
                    ),
                    RetryHint(False),
                    request_id,
                )
            if verdict.kind == "conflict":
                return self._fail(
                    409,
                    ErrorEnvelope(
                        "idempotency_error",
                        "idempotency_conflict",
                        "a request with this Idempotency-Key is still in progress: retry after Retry-After-Ms",
                    ),
                    RetryHint.from_headers({"Retry-After-Ms": str(CONFLICT_RETRY_AFTER_MS)}, retryable=True),
                    request_id,
                )
            if verdict.kind == "replay":
                assert verdict.reply is not None
                self.replayed += 1
                if log.isEnabledFor(logging.INFO):
                    log.info(
                        "decision %s replayed, not billed (account %s: the same key and body as before)",
                        verdict.reply["id"],
                        mask_secret(account),
                    )
                self._record(
                    account,
                    idempotency_key,
                    sha,
                    verdict.reply["id"],
                    billed=False,
                    usage=verdict.reply.get("usage"),
                )
                return DecideSuccess(
                    reply=verdict.reply, request_id=request_id, decide_ms=(time.monotonic() - started) * 1000
                )
        try:
            outcome = await self._fresh(account, body, len(raw), request_id, started, now)
        except BaseException:
            if idempotency_key is not None:
                self.ledger_records.abandon(account, idempotency_key)
            raise
        if isinstance(outcome, DecideFailure):
            if idempotency_key is not None:
                self.ledger_records.abandon(account, idempotency_key)
            return outcome
        if idempotency_key is not None:
            self.ledger_records.complete(account, idempotency_key, outcome.reply, time.monotonic())
        self.billed += 1
        if log.isEnabledFor(logging.INFO):
            log.info("decision %s billed (account %s)", outcome.reply["id"], mask_secret(account))
        self._record(
            account, idempotency_key, sha, outcome.reply["id"], billed=True, usage=outcome.reply.get("usage")
        )
        return outcome

    async def _fresh(
        self, account: str, body: str, size: int, request_id: str, started: float, now: float
    ) -> DecideOutcome:
        bucket = self._bucket(account, now)
        if not bucket.try_take(now):
            wait_ms = max(1, math.ceil(bucket.delay(now) * 1000))
            self.starts_refused += 1
            self._refused_at.append(now)
            return self._fail(
                429,
                ErrorEnvelope(
                    "rate_limit_error",
                    "rate_limited",
                    f"the account started more than account_decision_burst ({self.limits.account_decision_burst}) "
                    f"decisions at once / account_decision_ceiling "
                    f"({self.limits.account_decision_ceiling_per_minute}) per minute: retry after {wait_ms} ms",
                ),
                RetryHint.from_headers(
                    {"Retry-After-Ms": str(wait_ms), "Retry-After": str(math.ceil(wait_ms / 1000))},
                    retryable=True,
                ),
                request_id,
            )
        if self.decide_latency_ms > 0:
            await asyncio.sleep(self.decide_latency_ms / 1000)
        try:
            request = json.loads(body)
            answers = self.decider.decide(request, now=time.monotonic())
            if inspect.isawaitable(answers):
                answers = await answers
            reply = self._reply(account, request, body, size, complete_answers(request["questions"], answers))
        except Exception as exc:  # the decider is user code: any failure is the API's 500
            log.warning("decider failed: %s", exc)
            return self._fail(
                500,
                ErrorEnvelope("api_error", "internal_error", f"the emulator's decider failed: {exc}"),
                RetryHint(False),
                request_id,
            )
        return DecideSuccess(
            reply=reply, request_id=request_id, decide_ms=(time.monotonic() - started) * 1000
        )

    # ------------------------------------------------------------------ helpers

    def _bucket(self, account: str, now: float) -> TokenBucket:
        bucket = self._buckets.get(account)
        if bucket is None:
            lim = self.limits
            bucket = self._buckets[account] = TokenBucket(
                lim.account_decision_ceiling_per_minute / 60, max(1, lim.account_decision_burst), now
            )
        return bucket

    def account_bucket(self, account: str) -> TokenBucket | None:
        """The account's decision-start bucket (``None`` before its first start): when its next
        token is there (``tokens(now)``).

        :param account: the account, as the API key names it.
        """
        return self._buckets.get(account)

    @property
    def last_refusal_at(self) -> float | None:
        """The ``time.monotonic()`` of the newest start refused in the last minute, or ``None``."""
        return self._refused_at[-1] if self._refused_at else None

    def starts_refused_per_minute(self, now: float | None = None) -> int:
        """Decision starts the account buckets refused (429 ``rate_limited``) in the last minute.

        :param now: the current ``time.monotonic()`` (default: now).
        """
        now = time.monotonic() if now is None else now
        while self._refused_at and self._refused_at[0] <= now - REFUSAL_WINDOW_S:
            self._refused_at.popleft()
        return len(self._refused_at)

    def _fail(self, status: int, envelope: ErrorEnvelope, retry: RetryHint, request_id: str) -> DecideFailure:
        self.failures_by_status[status] = self.failures_by_status.get(status, 0) + 1
        self._on_change()
        return DecideFailure(http_status=status, envelope=envelope, retry=retry, request_id=request_id)

    def _record(
        self, account: str, key: str | None, sha: str, reply_id: str, *, billed: bool, usage: Any = None
    ) -> None:
        self.ledger.setdefault(account, []).append(
            LedgerEntry(
                account,
                key,
                sha,
                reply_id,
                billed,
                time.time(),
                dict(usage) if isinstance(usage, dict) else None,
            )
        )
        self._on_change()

    def _reply(
        self, account: str, request: Mapping[str, Any], body: str, size: int, answers: dict[str, Any]
    ) -> dict[str, Any]:
        input_tokens = math.ceil(size / 4)
        cached = 0
        cache_key = request.get("prompt_cache_key")
        if isinstance(cache_key, str):
            previous_bodies = self._last_bodies.setdefault(account, OrderedDict())
            previous = previous_bodies.pop(cache_key, None)
            if previous is not None:
                prefix = _common_prefix(previous, body)
                shared = prefix if body.isascii() else len(body[:prefix].encode("utf-8"))
                cached = min(input_tokens, shared // 4)
            previous_bodies[cache_key] = body
            while len(previous_bodies) > _CACHE_KEYS_PER_ACCOUNT:
                previous_bodies.popitem(last=False)
        media_items = len(request.get("attachments") or ())
        thought = 32 * len(answers) if request.get("mode") == "deliberate" else 0
        return {
            "id": new_reply_id(),
            "model": request.get("model"),
            "served_by": SERVED_BY,
            "created": int(time.time()),
            "context": {"route": request.get("route") or "direct", "tokens": input_tokens},
            "answers": answers,
            "usage": {
                "input_tokens": input_tokens,
                "cached_input_tokens": cached,
                "media_tokens": MEDIA_TOKENS_PER_ITEM * media_items,
                "long_input_tokens": max(0, input_tokens - LONG_INPUT_THRESHOLD),
                "media_items": media_items,
                "thought_tokens": thought,
            },
        }

    def billed_bodies(self) -> list[str]:
        """Body SHA-256 of every billed decision, in order (one per fresh decision)."""
        return [entry.body_sha256 for entries in self.ledger.values() for entry in entries if entry.billed]
