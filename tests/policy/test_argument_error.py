"""A DAG-argument mistake reads like a protocol error (code, field, message) without being one."""

from __future__ import annotations

import pytest

from airflow_provider_systemzero.exceptions import ARGUMENT_ERRORS, SystemZeroArgumentError
from airflow_provider_systemzero.protocol.errors import LocalProtocolError, ProtocolError


def test_an_argument_error_is_no_wire_error_but_reads_like_one() -> None:
    error = SystemZeroArgumentError(
        "min_confidence 2 is above 1", code="invalid_threshold", field="min_confidence"
    )
    wire = LocalProtocolError("min_confidence 2 is above 1", code="invalid_threshold", field="min_confidence")
    assert not isinstance(error, ProtocolError) and isinstance(error, ValueError)
    assert repr(error) == repr(wire).replace("LocalProtocolError", "SystemZeroArgumentError")
    assert (error.message, error.code, error.field) == (wire.message, wire.code, wire.field)
    with pytest.raises(ARGUMENT_ERRORS):
        raise error
