"""Every connection setting is checked before the first connection, with the field named and
nothing secret quoted — in the error a task raises, the event a trigger stores in Airflow's
database, the Test button's text and the log.

Before, a ``proxy`` extra without a scheme or with a path was retried as a network failure until
the task's deadline, and its password appeared in ``DeadlineExceeded``, the trigger event and the
Test button; a ``socks5://`` proxy without ``python-socks`` crashed the stream loop with a raw
``ImportError``; an unreadable or non-PEM ``ca_bundle`` raised a raw ``OSError`` /
``ssl.SSLError`` naming neither the field nor the file; and a ``ws://`` origin went through any
proxy, the key in clear text.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_systemzero.hooks.systemzero import SystemZeroHook
from airflow_provider_systemzero.identity import task_namespace
from airflow_provider_systemzero.stream import StreamSettings
from airflow_provider_systemzero.stream.exceptions import SystemZeroValidationError
from airflow_provider_systemzero.triggers.decision import SystemZeroDecideTrigger
from tests.helpers import first_event, rebuilt
from tests.helpers.hostile_gateway import HostileGateway, Peer

KEY = "sz-settings-test-0123456789abcdef"
PASSWORD = "pw-S3CRET-proxy-9f8e7d"
CONN_ID = "systemzero_settings"
REQUEST = {"model": "m", "questions": {"ready": {"type": "boolean", "instructions": "Is the job ready?"}}}


def _set_connection(monkeypatch: pytest.MonkeyPatch, host: str, **extra: Any) -> None:
    monkeypatch.setenv("_AIRFLOW_PROCESS_CONTEXT", "server")
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{CONN_ID.upper()}",
        json.dumps({"conn_type": "systemzero", "host": host, "password": KEY, "extra": extra}),
    )


def _trigger() -> SystemZeroDecideTrigger:
    return rebuilt(
        SystemZeroDecideTrigger(
            systemzero_conn_id=CONN_ID,
            request=REQUEST,
            state="log\n",
            key_namespace=task_namespace("settings", "decide", "r", -1),
            deadline=time.time() + 60,
        )
    )


async def _every_sink(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, host: str, **extra: Any
) -> list[tuple[str, str]]:
    """What each sink says of the connection ``host`` + ``extra``: the task's error (the sync
    hook, as a worker reads it), the trigger's event (as Airflow stores it), the Test button's text
    and everything logged; every one must refuse at once, before any connection."""
    _set_connection(monkeypatch, host, **extra)
    caplog.set_level(logging.DEBUG)
    hook = SystemZeroHook(CONN_ID)
    with pytest.raises(SystemZeroValidationError) as checked:
        await asyncio.to_thread(hook.check_connection, "m")
    started = time.monotonic()
    event = await first_event(_trigger(), within=20)
    took = time.monotonic() - started
    ok, button = await asyncio.to_thread(hook.test_connection)
    assert not ok
    assert event["status"] == "error" and event["error_type"] == "validation", event
    assert took < 5, f"the trigger took {took:.1f} s: retried instead of refused"
    logged = "\n".join(f"{r.getMessage()} {r.exc_text or ''}" for r in caplog.records)
    return [
        ("task", f"{checked.value!s} {checked.value!r}"),
        ("event", json.dumps(event)),
        ("button", button),
        ("log", logged),
    ]


#: Proxy extras that are not proxy URLs, each holding the password.
MALFORMED_PROXIES = {
    "no_scheme": f"corpuser:{PASSWORD}@127.0.0.1:3128",
    "a_path": f"http://corpuser:{PASSWORD}@127.0.0.1:3128/proxy",
    "a_query": f"http://corpuser:{PASSWORD}@127.0.0.1:3128?x=1",
    "an_unknown_scheme": f"ftp://corpuser:{PASSWORD}@127.0.0.1:3128",
    "a_port_that_is_no_number": f"http://corpuser:{PASSWORD}@127.0.0.1:31x8",
    "no_host": f"http://corpuser:{PASSWORD}@:3128",
}


@pytest.mark.parametrize("name", sorted(MALFORMED_PROXIES))
async def test_a_malformed_proxy_is_refused_at_once_and_its_password_appears_nowhere(
    name: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    gateway: Any,
) -> None:
    gw: HostileGateway = gateway(Peer.open)
    sinks = await _every_sink(monkeypatch, caplog, gw.origin, proxy=MALFORMED_PROXIES[name])
    for sink, text in sinks:
        assert PASSWORD not in text, f"{sink}: {text}"
        if sink != "log":
            assert "extra 'proxy'" in text, f"{sink}: {text}"
    assert gw.connections == 0


async def test_a_socks_proxy_without_python_socks_is_refused_naming_the_package(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, gateway: Any
) -> None:
    """Where ``python-socks`` is not installed (here: it cannot be imported, as when it is absent)."""
    for module in ("python_socks", "python_socks.async_", "python_socks.async_.asyncio"):
        monkeypatch.setitem(sys.modules, module, None)  # an import of it raises ImportError
    _forget_socks()
    gw: HostileGateway = gateway(Peer.open)
    sinks = await _every_sink(
        monkeypatch, caplog, gw.origin, proxy=f"socks5://corpuser:{PASSWORD}@127.0.0.1:1080"
    )
    for sink, text in sinks:
        assert PASSWORD not in text and "ImportError" not in text, f"{sink}: {text}"
        if sink != "log":
            assert "python-socks" in text and "extra 'proxy'" in text, f"{sink}: {text}"
    assert gw.connections == 0


def _forget_socks() -> None:
    """Ask again whether python-socks imports (the answer is cached per process)."""
    try:
        from airflow_provider_systemzero.stream.settings import socks_available
    except ImportError:  # before the check existed
        return
    socks_available.cache_clear()


@pytest.fixture(autouse=True)
def _socks_asked_afresh() -> Iterator[None]:
    yield
    _forget_socks()


def _not_pem(tmp_path: Path) -> Path:
    path = tmp_path / "notes.txt"
    path.write_text("this is not a certificate\n")
    return path


def _broken_pem(tmp_path: Path) -> Path:
    path = tmp_path / "broken.pem"
    path.write_text("-----BEGIN CERTIFICATE-----\nMIIBroken==\n-----END CERTIFICATE-----\n")
    return path


BAD_BUNDLES = {
    "missing": (lambda tmp: tmp / "missing.pem", "does not exist"),
    "a_directory": (lambda tmp: tmp, "is a directory"),
    "not_pem": (_not_pem, "holds no PEM certificate"),
    "broken_pem": (_broken_pem, "is not a valid PEM bundle"),
}


@pytest.mark.parametrize("name", sorted(BAD_BUNDLES))
async def test_a_ca_bundle_that_cannot_be_used_is_refused_naming_the_field_and_the_file(
    name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    gateway: Any,
) -> None:
    make, problem = BAD_BUNDLES[name]
    path = make(tmp_path)
    gw: HostileGateway = gateway(Peer.open)
    # a wss:// origin on loopback whose port nothing serves TLS on: nothing may be tried at all
    origin = gw.origin.replace("ws://", "wss://")
    sinks = await _every_sink(monkeypatch, caplog, origin, ca_bundle=str(path))
    for sink, text in sinks[:3]:
        assert "extra 'ca_bundle'" in text and str(path) in text and problem in text, f"{sink}: {text}"
        assert "SSLError" not in text and "Errno" not in text, f"{sink}: {text}"
    assert gw.upgrades == 0


@pytest.mark.parametrize("proxy", ["http://proxy.corp.example:3128", "https://10.1.2.3:3128"])
def test_a_plaintext_origin_goes_through_no_proxy_off_this_machine(proxy: str) -> None:
    """``ws://`` to loopback through a proxy elsewhere would carry the key across the network in
    clear text (the loopback rule looked at the origin, not at where the bytes go)."""
    with pytest.raises(SystemZeroValidationError) as refused:
        StreamSettings("ws://127.0.0.1:8765", KEY, proxy=proxy)
    assert refused.value.field == "proxy" and "clear text" in str(refused.value)
    # through a proxy on this machine, and to a TLS origin through any proxy: allowed
    StreamSettings("ws://127.0.0.1:8765", KEY, proxy="http://127.0.0.1:3128")
    StreamSettings("wss://api.example.com", KEY, proxy="http://proxy.corp.example:3128")


def test_a_proxy_password_is_masked_in_the_log_like_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.log import mask_secret

    masked: list[str] = []
    monkeypatch.setattr("airflow.sdk.log.mask_secret", lambda value, *a, **k: masked.append(value))
    _set_connection(monkeypatch, "wss://api.example.com", proxy=f"http://corp%40user:{PASSWORD}@proxy:3128")
    SystemZeroHook(CONN_ID).get_settings()
    assert mask_secret is not None and PASSWORD in masked and KEY in masked
