"""The emulator logs every upgrade at DEBUG (through websockets) but never a secret: not the API
key a client sent (valid or not), not the control surface's admin token."""

from __future__ import annotations

import logging
import urllib.request

import pytest

from airflow_provider_systemzero.emulator import Emulator
from airflow_provider_systemzero.stream import AuthenticationFailed, DecisionStream, StreamSettings

KEY = "sz-emulator-log-0123456789abcdef"
WRONG = "sz-not-a-key-fedcba9876543210"
ADMIN = "admin-token-0123456789abcdef"
REQUEST = {"model": "m", "questions": {"ready": {"type": "boolean", "instructions": "Is the job ready?"}}}


async def test_no_secret_in_the_emulators_debug_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with Emulator(api_keys={KEY: 8}, admin_token=ADMIN) as emu:
        async with DecisionStream(
            StreamSettings(emu.origin, KEY), REQUEST, state="x\n", decision_mode="on_request", identity="logs"
        ) as stream:
            await stream.decide(timeout=10)
        with pytest.raises(AuthenticationFailed):
            async with DecisionStream(
                StreamSettings(emu.origin, WRONG),
                REQUEST,
                decision_mode="on_request",
                identity="logs",
                open_deadline=5,
            ):
                pass

        def control() -> int:
            request = urllib.request.Request(
                f"http://127.0.0.1:{emu.port}/_emulator/stats", headers={"Authorization": f"Bearer {ADMIN}"}
            )
            with urllib.request.urlopen(request, timeout=5) as response:
                return int(response.status)

        import asyncio

        assert await asyncio.to_thread(control) == 200
    server_lines = [
        r.getMessage() for r in caplog.records if r.name.startswith("airflow_provider_systemzero.emulator")
    ]
    assert any("Authorization" in line for line in server_lines)  # the headers were logged …
    for secret in (KEY, WRONG, ADMIN):  # … never their secret values
        assert not [line for line in server_lines if secret in line], secret
