"""The reconnect backoff is product configuration (``[systemzero]``), which is also how the fault
matrix shrinks it: the triggers build their own hooks, so a test cannot hand them a ``Backoff``."""

from __future__ import annotations

import pytest

from airflow_provider_systemzero.hooks.systemzero import SystemZeroHook, reconnect_backoff
from airflow_provider_systemzero.stream import Backoff, SystemZeroValidationError

QUESTIONS = {"ready": {"type": "boolean", "instructions": "Is the job ready?"}}


def test_the_default_is_half_a_second_capped_at_thirty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW__SYSTEMZERO__RECONNECT_BACKOFF_BASE", raising=False)
    monkeypatch.delenv("AIRFLOW__SYSTEMZERO__RECONNECT_BACKOFF_CAP", raising=False)
    backoff = reconnect_backoff()
    assert (backoff.base, backoff.cap) == (0.5, 30.0)


def test_the_configuration_sets_base_and_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__SYSTEMZERO__RECONNECT_BACKOFF_BASE", "0.02")
    monkeypatch.setenv("AIRFLOW__SYSTEMZERO__RECONNECT_BACKOFF_CAP", "0.1")
    backoffs = [reconnect_backoff() for _ in range(20)]
    assert {(b.base, b.cap) for b in backoffs} == {(0.02, 0.1)}
    assert len({b.delay(0) for b in backoffs}) == 20  # each stream draws its own jitter


@pytest.mark.parametrize("value", ["-1", "soon", "nan", "inf"])
def test_a_bad_value_is_refused_naming_the_option(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("AIRFLOW__SYSTEMZERO__RECONNECT_BACKOFF_BASE", value)
    with pytest.raises(SystemZeroValidationError, match=r"\[systemzero\] reconnect_backoff_base"):
        reconnect_backoff()


def test_streams_of_a_hook_use_the_configuration_unless_given_a_backoff(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AIRFLOW__SYSTEMZERO__RECONNECT_BACKOFF_BASE", "0.25")
    request = {"model": "m", "questions": QUESTIONS}
    configured = SystemZeroHook("any").stream(request)
    assert configured.backoff.base == 0.25
    explicit = Backoff(base=3, cap=3)
    assert SystemZeroHook("any", backoff=explicit).stream(request).backoff is explicit
