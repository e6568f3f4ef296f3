"""Plaintext only where the address connected to is loopback, whatever the name (issue 54 item 6).

``ws://`` is allowed only to loopback, but the check trusted the *name*: ``ws://gateway.localhost``
whose DNS answer is not a loopback address (resolvers do forward ``*.localhost`` to DNS) received
the upgrade with ``Authorization: Bearer <key>`` in clear. Here the client runs in a network
namespace and a mount namespace of its own, where ``/etc/resolv.conf`` names ``127.0.0.1`` and a
DNS server there answers ``gateway.localhost`` with ``10.255.0.1``, an address of the namespace
that is not loopback, where a gateway listens (:mod:`tests.helpers.plaintext_resolver`). The real
resolver, a real socket: nothing replaced.

Skipped, with the reason, where the machine refuses the namespaces (``unshare``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers import run_in_network_namespace
from tests.helpers.plaintext_resolver import ELSEWHERE, KEY, NAME


def _run_with_a_resolver_that_answers_elsewhere(tmp_path: Path) -> dict[str, Any]:
    return run_in_network_namespace(
        tmp_path, "tests.helpers.plaintext_resolver", setup=f"ip addr add {ELSEWHERE}/32 dev lo"
    )


def test_a_loopback_name_that_resolves_elsewhere_gets_no_key_in_clear_text(tmp_path: Path) -> None:
    result = _run_with_a_resolver_that_answers_elsewhere(tmp_path)
    assert result["resolved"] == [ELSEWHERE] and result["queries"] > 0  # the name went to DNS
    assert result["authorizations"] == [], "the key went in clear text to an address beyond loopback"
    ok, button = result["button"]
    assert not ok
    assert f"'{NAME}' resolves to {ELSEWHERE}, not a loopback address" in button, button
    assert "use wss://" in button and KEY not in button
    # through a proxy on loopback, which resolves the gateway's name itself: refused all the same
    ok, proxied = result["proxied"]
    assert not ok and f"'{NAME}' resolves to {ELSEWHERE}, not a loopback address" in proxied, proxied
    assert result["decided"].startswith("DeadlineExceeded"), result["decided"]
    assert f"resolves to {ELSEWHERE}, not a loopback address" in result["decided"], result["decided"]


def test_a_plaintext_connection_goes_to_the_loopback_addresses_of_a_name_only() -> None:
    """Where namespaces are refused, the rule itself: by address, never by name."""
    import socket

    from airflow_provider_systemzero.stream.diagnosis import describe_connection_error
    from airflow_provider_systemzero.stream.resolver import PlaintextBeyondLoopback, loopback_only

    def found(*hosts: str) -> list[Any]:
        return [
            (socket.AF_INET6 if ":" in h else socket.AF_INET, socket.SOCK_STREAM, 6, "", (h, 80))
            for h in hosts
        ]

    kept = loopback_only(NAME, found("10.0.0.5", "::1", "127.0.0.2"))
    assert [address[4][0] for address in kept] == ["::1", "127.0.0.2"]
    with pytest.raises(PlaintextBeyondLoopback) as elsewhere:
        loopback_only(NAME, found(ELSEWHERE, "::ffff:127.0.0.1", "fe80::1"))
    said = describe_connection_error(elsewhere.value, f"ws://{NAME}:80/v1/system-zero/stream")
    assert f"'{NAME}' resolves to {ELSEWHERE}, ::ffff:127.0.0.1, fe80::1, not a loopback address" in said
    assert "use wss:// for a gateway elsewhere, or ws://127.0.0.1:80 for a local one" in said
