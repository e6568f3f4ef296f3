"""The emulator's account decision limits hold across every connection of a key, and its stats
report the decision starts it refused (over a plain websockets client, real loopback sockets)."""

from __future__ import annotations

import json

from airflow_provider_systemzero.emulator import Emulator
from tests.helpers.wire import FAST, decide_once


async def _decide_once(emu: Emulator, key: str, state: str) -> dict:
    """One on_request decide on a new connection of ``key``: its decision or error message."""
    return await decide_once(emu, key, state, cache_key=f"ceiling-{state.strip()}")


async def test_the_bucket_is_the_keys_across_connections_and_refusals_are_counted() -> None:
    # two starts at once, then one every 10 minutes: the third start in a row is refused, whichever
    # connection of the key makes it; another key has its own bucket
    limits = FAST.replace(
        account_decision_burst=2, account_decision_ceiling_per_minute=6, idle_timeout_ms=5000
    )
    async with Emulator(api_keys={"fleet": 8, "other": 8}, limits=limits) as emu:
        first = await _decide_once(emu, "fleet", "one\n")
        second = await _decide_once(emu, "fleet", "two\n")
        third = await _decide_once(emu, "fleet", "three\n")
        elsewhere = await _decide_once(emu, "other", "four\n")
        assert [m["type"] for m in (first, second, elsewhere)] == ["decision"] * 3
        assert (third["type"], third["http_status"], third["error"]["envelope"]["error"]["code"]) == (
            "error",
            429,
            "rate_limited",
        )
        assert third["error"]["retry"]["retry_after_ms"] > 1000
        stats = emu.stats
        assert stats.peak_connections_by_account == {"fleet": 1, "other": 1}  # never two at once
        assert stats.decision_starts_refused == 1
        assert stats.decision_starts_refused_per_minute == 1
        assert stats.decisions_billed == 3
        body = stats.to_dict(mask_accounts=True)
        assert (body["decision_starts_refused"], body["decision_starts_refused_per_minute"]) == (1, 1)
        json.dumps(body)


async def test_refusals_leave_the_per_minute_figure_after_a_minute() -> None:
    limits = FAST.replace(
        account_decision_burst=1, account_decision_ceiling_per_minute=1, idle_timeout_ms=5000
    )
    async with Emulator(api_keys={"fleet": 8}, limits=limits) as emu:
        await _decide_once(emu, "fleet", "one\n")
        refused = await _decide_once(emu, "fleet", "two\n")
        assert refused["http_status"] == 429
        backend = emu.backend
        now = backend.last_refusal_at
        assert now is not None
        assert backend.starts_refused_per_minute(now + 59.999) == 1
        # a millisecond past the minute: exactly 60 s sits on the boundary, where now + 60.0 - 60.0
        # may round to just below the refusal's own time
        assert backend.starts_refused_per_minute(now + 60.001) == 0
        assert emu.stats.decision_starts_refused == 1  # the total stays
