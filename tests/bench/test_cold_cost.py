"""The cold-change measurement, against a real emulator process (no timing asserted)."""

from __future__ import annotations

import pytest

from benchmarks import cold_cost
from benchmarks.common import machine
from benchmarks.emulator_host import EmulatorProcess
from benchmarks.report import render


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

    document = {
        "machine": machine(),
        "options": {"quick": True},
        "started_at": "2026-12-02T00:00:00",
        "duration_s": 1.0,
        "results": {"cold": result},
    }
    page = render(document)
    assert "### CPU of one cold change" in page
    assert "websockets' client alone" in page
    assert "the hook's stream alone" in page
