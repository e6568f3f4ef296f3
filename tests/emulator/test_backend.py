"""The decide backend without sockets: ledger, account buckets, scripted failures, reply shape."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from typing import Any

import pytest

from airflow_provider_systemzero.emulator.backend import (
    LEDGER_RETENTION_S,
    DecideBackend,
    IdempotencyLedger,
    complete_answers,
)
from airflow_provider_systemzero.emulator.deciders import KeywordDecider
from airflow_provider_systemzero.emulator.faults import Faults
from airflow_provider_systemzero.protocol import DecideFailure, DecideSuccess, Limits

EXAMPLE_QUESTIONS = {"ready": {"type": "boolean", "instructions": "Is the job ready?"}}

BODY = json.dumps(
    {"model": "m", "state": "Job is ready.", "questions": EXAMPLE_QUESTIONS, "prompt_cache_key": "k"},
    separators=(",", ":"),
)
OTHER = BODY.replace("ready.", "ready!")
SHA = hashlib.sha256(BODY.encode()).hexdigest()


def test_ledger_verdicts() -> None:
    ledger = IdempotencyLedger()
    assert ledger.check("a", "k1", "h1", 0.0).kind == "fresh"
    assert ledger.check("a", "k1", "h1", 1.0).kind == "conflict"
    assert ledger.check("a", "k1", "h2", 1.0).kind == "reused"
    assert ledger.check("b", "k1", "h2", 1.0).kind == "fresh"  # keys are per account
    ledger.complete("a", "k1", {"id": "szd_x"}, 2.0)
    verdict = ledger.check("a", "k1", "h1", 3.0)
    assert (verdict.kind, verdict.reply) == ("replay", {"id": "szd_x"})
    assert ledger.check("a", "k1", "h2", 3.0).kind == "reused"
    # After the retention the key is free again.
    assert ledger.check("a", "k1", "h2", 2.0 + LEDGER_RETENTION_S).kind == "fresh"


def test_ledger_abandon_frees_an_in_flight_key() -> None:
    ledger = IdempotencyLedger()
    ledger.check("a", "k", "h", 0.0)
    ledger.abandon("a", "k")
    assert not ledger.in_flight("a", "k")
    assert ledger.check("a", "k", "other", 0.0).kind == "fresh"


def backend(**kwargs: Any) -> DecideBackend:
    limits = kwargs.pop(
        "limits", Limits(account_decision_burst=100, account_decision_ceiling_per_minute=6000)
    )
    return DecideBackend(kwargs.pop("decider", KeywordDecider()), limits=limits, **kwargs)


async def test_fresh_decision_has_the_public_reply_shape() -> None:
    outcome = await backend().decide("demo", BODY, "key-1")
    assert isinstance(outcome, DecideSuccess)
    reply = outcome.reply
    assert list(reply) == ["id", "model", "served_by", "created", "context", "answers", "usage"]
    assert re.fullmatch(r"szd_[0-9a-f]{32}", reply["id"])
    assert list(reply["answers"]["ready"]) == [
        "type",
        "probability",
        "confidence",
        "calibration_version",
        "decision",
        "alternatives",
        "calibrated",
    ]
    assert reply["answers"]["ready"]["decision"] is True
    assert reply["usage"]["input_tokens"] == -(-len(BODY) // 4)
    assert reply["context"] == {"route": "direct", "tokens": reply["usage"]["input_tokens"]}
    assert outcome.request_id.startswith("req_")


async def test_replay_is_unbilled_and_identical() -> None:
    b = backend()
    first = await b.decide("demo", BODY, "key-1")
    again = await b.decide("demo", BODY, "key-1")
    assert isinstance(first, DecideSuccess) and isinstance(again, DecideSuccess)
    assert again.reply == first.reply
    assert (b.billed, b.replayed) == (1, 1)
    assert [(e.billed, e.body_sha256) for e in b.ledger["demo"]] == [(True, SHA), (False, SHA)]
    assert b.billed_bodies() == [SHA]
    changed = await b.decide("demo", OTHER, "key-1")
    assert isinstance(changed, DecideFailure)
    assert (changed.http_status, changed.envelope.code, changed.retry.retryable) == (
        422,
        "idempotency_key_reused",
        False,
    )
    # Unkeyed calls are billed every time.
    await b.decide("demo", BODY, None)
    await b.decide("demo", BODY, None)
    assert b.billed == 3


async def test_conflict_while_the_first_call_runs() -> None:
    b = backend(decide_latency_ms=200)
    first = asyncio.create_task(b.decide("demo", BODY, "key-1"))
    await asyncio.sleep(0)  # let the first call register in the ledger
    conflict = await b.decide("demo", BODY, "key-1")
    assert isinstance(conflict, DecideFailure)
    assert (conflict.http_status, conflict.envelope.type, conflict.envelope.code) == (
        409,
        "idempotency_error",
        "idempotency_conflict",
    )
    assert conflict.retry.retryable and conflict.retry.retry_after_ms == 1000
    assert isinstance(await first, DecideSuccess)


async def test_a_failed_call_releases_its_key() -> None:
    def broken(request: Any, *, now: float) -> Any:
        raise RuntimeError("boom")

    class Broken:
        decide = staticmethod(broken)

    b = backend(decider=Broken())
    failure = await b.decide("demo", BODY, "key-1")
    assert isinstance(failure, DecideFailure)
    assert (failure.http_status, failure.envelope.type, failure.retry.retryable) == (500, "api_error", False)
    b.decider = KeywordDecider()
    assert isinstance(await b.decide("demo", OTHER, "key-1"), DecideSuccess)


async def test_account_bucket_after_the_ledger() -> None:
    b = backend(limits=Limits(account_decision_burst=2, account_decision_ceiling_per_minute=60))
    assert isinstance(await b.decide("demo", BODY, "k1"), DecideSuccess)
    assert isinstance(await b.decide("demo", OTHER, "k2"), DecideSuccess)
    limited = await b.decide("demo", BODY, "k3")
    assert isinstance(limited, DecideFailure)
    assert (limited.http_status, limited.envelope.type, limited.envelope.code) == (
        429,
        "rate_limit_error",
        "rate_limited",
    )
    assert limited.retry.retryable and 900 <= (limited.retry.retry_after_ms or 0) <= 1000
    # A replay costs nothing, so it passes although the bucket is empty.
    assert isinstance(await b.decide("demo", BODY, "k1"), DecideSuccess)
    # Another account has its own bucket.
    assert isinstance(await b.decide("other", BODY, "k3"), DecideSuccess)
    assert b.failures_by_status == {429: 1}


async def test_scripted_failures_come_first_and_in_order() -> None:
    faults = Faults()
    faults.fail_decides(1, status=429, retry_after_s=2)
    faults.fail_decides(1, status=503, retry_after_s=2, retry_after_ms=250)
    faults.fail_decides(1, status=503, code="maintenance", retryable=False)
    b = backend(faults=faults)
    got = [await b.decide("demo", BODY, "k") for _ in range(4)]
    assert [
        (o.http_status, o.envelope.code, o.retry.retry_after_ms, o.retry.retryable)
        for o in got[:3]
        if isinstance(o, DecideFailure)
    ] == [
        (429, "rate_limited", 2000, True),
        (503, "overloaded", 250, True),
        (503, "maintenance", None, False),
    ]
    assert got[0].envelope.type == "rate_limit_error" and got[1].envelope.type == "overloaded_error"
    assert isinstance(got[3], DecideSuccess)
    assert faults.pending_decide_failures == 0


def test_complete_answers_fills_the_shape_and_checks_answers() -> None:
    questions = {
        "ready": {"type": "boolean", "instructions": "x"},
        "pick": {"type": "choice", "instructions": "y", "options": ["a", "b", "c"]},
    }
    answers = complete_answers(questions, {"ready": False, "pick": {"decision": "b", "probability": 0.7}})
    assert answers["ready"]["alternatives"] == [{"decision": True, "confidence": 0.0}]
    assert answers["pick"]["alternatives"] == [
        {"decision": "a", "confidence": 0.15},
        {"decision": "c", "confidence": 0.15},
    ]
    assert complete_answers(questions, {"answers": {"ready": True, "pick": "a"}})["pick"]["decision"] == "a"
    with pytest.raises(ValueError, match="no answer"):
        complete_answers(questions, {"ready": True})
    with pytest.raises(ValueError, match="not one of the options"):
        complete_answers(questions, {"ready": True, "pick": "z"})
    with pytest.raises(ValueError, match="boolean"):
        complete_answers(questions, {"ready": "yes", "pick": "a"})


@pytest.mark.parametrize(
    ("previous", "body", "expected"),
    [
        ("", "", 0),
        ("abc", "abcdef", 3),  # the body grew
        ("abcdef", "abc", 3),  # the body shrank
        ("abXdef", "abYdef", 2),  # one change in the middle
        ("xbc", "abc", 0),
        ("é" * 5 + "a", "é" * 5 + "b", 5),
    ],
)
def test_the_cached_prefix_is_the_longest_common_prefix(previous: str, body: str, expected: int) -> None:
    from airflow_provider_systemzero.emulator.backend import _common_prefix

    assert _common_prefix(previous, body) == expected
