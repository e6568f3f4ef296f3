"""The account's decision limits in ``hello``: the public document lists them
(``account_decision_burst``, ``account_decision_ceiling``) but its example ``hello`` does not carry
them. A gateway may advertise them; the client paces by them, or by the published values."""

from __future__ import annotations

import pytest

from airflow_provider_systemzero.protocol.errors import RemoteProtocolError
from airflow_provider_systemzero.protocol.limits import ACCOUNT_LIMITS, ADVERTISED_LIMITS, Limits


def test_the_published_hello_carries_none_and_reads_as_the_published_values() -> None:
    advertised = Limits().advertised()
    assert tuple(advertised) == ADVERTISED_LIMITS  # the public example's object, as it is
    parsed = Limits.from_hello(advertised)
    assert (parsed.account_decision_burst, parsed.account_decision_ceiling_per_minute) == (5, 60)


def test_a_gateway_advertises_other_account_limits_and_the_client_reads_them() -> None:
    limits = Limits(account_decision_burst=2, account_decision_ceiling_per_minute=1200)
    advertised = limits.advertised()
    assert {k: advertised[k] for k in ACCOUNT_LIMITS} == {
        "account_decision_burst": 2,
        "account_decision_ceiling": 1200,
    }
    parsed = Limits.from_hello(advertised)
    assert (parsed.account_decision_burst, parsed.account_decision_ceiling_per_minute) == (2, 1200)
    # only what differs is advertised
    assert "account_decision_burst" not in Limits(account_decision_ceiling_per_minute=30).advertised()


def test_advertised_account_limits_are_clamped_to_what_can_pace() -> None:
    base = Limits().advertised()
    parsed = Limits.from_hello({**base, "account_decision_burst": 0, "account_decision_ceiling": 10**9})
    assert (parsed.account_decision_burst, parsed.account_decision_ceiling_per_minute) == (1, 100_000)


@pytest.mark.parametrize("value", ["60", 1.5, True, -1, None])
def test_a_wrong_account_limit_is_refused_naming_it(value: object) -> None:
    hello = {**Limits().advertised(), "account_decision_ceiling": value}
    if value is None:  # explicitly null: not advertised
        assert Limits.from_hello(hello).account_decision_ceiling_per_minute == 60
        return
    with pytest.raises(RemoteProtocolError) as caught:
        Limits.from_hello(hello)
    assert caught.value.field == "limits.account_decision_ceiling"
