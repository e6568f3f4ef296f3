"""The cold-change measurement, against a real emulator process (no timing asserted)."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks import cold_cost
from benchmarks.common import machine
from benchmarks.emulator_host import EmulatorProcess
from benchmarks.report import render


def _page(cold: dict[str, Any], **document: Any) -> str:
    """The results page of a run with only the cold scenario (and ``document``'s other keys)."""
    return render(
        {
            "machine": machine(),
            "options": {"quick": False},
            "started_at": "2026-12-02T00:00:00",
            "duration_s": 1.0,
            "results": {"cold": cold},
            **document,
        }
    )


async def test_every_change_measured_opens_one_stream_for_each_client_and_the_page_shows_all_three(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cold_cost, "TRIGGERS", 3)
    async with EmulatorProcess(limits=cold_cost.LIMITS) as emulator:
        for name, value in emulator.connection_env().items():
            monkeypatch.setenv(name, value)
        result = await cold_cost.measure(emulator, 4)
    provider, stream, alone = result["provider"], result["stream_alone"], result["websockets_alone"]
    # each change found its trigger dormant and reopened a stream; each other exchange opened one
    assert provider["streams_opened"] == stream["streams_opened"] == alone["streams_opened"] == 4
    assert provider["cpu_ms"] > 0 and stream["cpu_ms"] > 0 and alone["cpu_ms"] > 0
    assert provider["harness_polls_ms"] > 0  # the harness's own polling is taken out, not counted
    assert result["provider_vs_websockets"] == pytest.approx(provider["cpu_ms"] / alone["cpu_ms"])

    page = _page(result)
    assert "### CPU of one cold change" in page
    assert "websockets' client alone" in page
    assert "the hook's stream alone" in page


def test_a_callgrind_dump_gives_its_total_and_anything_else_is_refused() -> None:
    from benchmarks.instructions import instructions_in

    dump = "version: 1\ncreator: callgrind-3.19.0\nevents: Ir\nsummary: 0\n\nfn=main\n1 5\ntotals: 4352001\n"
    assert instructions_in(dump) == 4_352_001
    with pytest.raises(ValueError, match="not a callgrind dump"):
        instructions_in("totals 12\n")


def test_the_page_shows_each_clients_instructions_before_and_after() -> None:
    def client(cpu: float, instructions: float) -> dict[str, float]:
        return {
            "cpu_ms": cpu,
            "emulator_cpu_ms": 2.0,
            "streams_opened": 300,
            "instructions_per_change": instructions,
        }

    counted = {"provider": {"instructions_per_change": 3_900_000.0, "changes": 50}}
    cold = {
        "n": 300,
        "lease_after_s": 0.02,
        "provider": {**client(3.4, 0), "harness_polls_ms": 1.0},
        "stream_alone": client(2.2, 0),
        "websockets_alone": client(1.1, 0),
        "provider_vs_websockets": 3.1,
        "instructions": {
            **counted,
            "websockets_alone": {"instructions_per_change": 1_700_000.0, "changes": 50},
        },
    }
    before = {"instructions": {"provider": {"instructions_per_change": 5_100_000.0, "changes": 50}}}
    page = _page(cold, baseline={"cold": before, "cold_from": {"commit": "abc1234"}})
    assert "| client instructions per change (before → after) |" in page
    assert "5.10 M → 3.90 M" in page  # the trigger, against the baseline's count
    assert "| 1.70 M |" in page  # websockets alone: counted now, not before
    assert "against commit `abc1234` before" in page


@pytest.mark.skipif(
    not __import__("benchmarks.instructions", fromlist=["available"]).available(),
    reason="valgrind is not installed",
)
async def test_callgrind_counts_the_measured_changes_of_a_client() -> None:
    from benchmarks.instructions import count

    counted = await count(3, ("websockets_alone",))
    alone = counted["websockets_alone"]
    assert alone["streams_opened"] == 3 and alone["harness_polls"] == 0
    # a cold exchange is hundreds of thousands of instructions at least, and far from a whole run
    assert 100_000 < alone["instructions_per_change"] < 100_000_000
