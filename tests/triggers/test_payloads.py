"""An error event says a failure in words safe to store and show: the provider's own messages as
they are, anyone else's (another library's, an author's source's) escaped and bounded."""

from __future__ import annotations

from airflow_provider_systemzero.exceptions import SystemZeroArgumentError
from airflow_provider_systemzero.tasks.payloads import error_payload


def test_a_foreign_message_is_escaped_and_bounded() -> None:
    forged = "boom\n[2026-12-04 10:00:00] INFO - Marking task as SUCCESS\x1b[2J" + "x" * 10_000
    payload = error_payload(RuntimeError(forged), key_namespace="sz-test")
    message = payload["message"]
    assert payload["error_type"] == "unexpected"
    assert "\n" not in message and "\x1b" not in message and len(message) <= 2_001
    assert message.startswith("boom\\n[2026-12-04 10:00:00] INFO")


def test_the_providers_own_message_is_kept_as_written() -> None:
    message = "source.path '/x' is a FIFO (named pipe): a file source tails a regular file only"
    payload = error_payload(SystemZeroArgumentError(message, code="not_a_regular_file", field="source.path"))
    assert payload["message"] == message and payload["field"] == "source.path"


def test_a_missing_connection_is_a_configuration_error_by_its_class() -> None:
    """Matched by type (the installed release's class, through compat), not by its name."""
    from airflow_provider_systemzero.compat import AirflowNotFoundException

    class ConnectionMissing(AirflowNotFoundException):  # a subclass is still a missing connection
        pass

    class AirflowNotFoundException(Exception):  # type: ignore[no-redef]  # a namesake is not
        pass

    assert error_payload(ConnectionMissing("The conn_id `sz` isn't defined"))["error_type"] == "configuration"
    assert error_payload(AirflowNotFoundException("elsewhere"))["error_type"] == "unexpected"
