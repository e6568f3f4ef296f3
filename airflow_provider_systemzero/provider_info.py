"""Provider metadata read by Airflow's provider discovery.

Airflow finds this provider through the ``apache_airflow_provider`` entry point, calls
:func:`get_provider_info` and validates the result against its ``provider_info.schema.json``.
The connection form (field labels, hidden fields and the extra fields stored in
``Connection.extra``) is declared here too, so the UI can render it without importing the hook.

This module must stay import-light: no Airflow, asyncio or websockets imports.
"""

from __future__ import annotations

from typing import Any

PACKAGE_NAME = "airflow-provider-systemzero"
CONN_TYPE = "systemzero"
HOOK_CLASS_NAME = "airflow_provider_systemzero.hooks.systemzero.SystemZeroHook"
INTEGRATION_NAME = "System Zero"
DOCS_URL = "https://github.com/systemzero/airflow-provider-systemzero/tree/main/docs"

# Kept in step with ``[project] version`` in pyproject.toml; Airflow shows the installed
# distribution's version, this list is informational only.
VERSIONS = ["0.1.0"]


#: The port field's label in the connection form: why a person stores a port the origin may hold.
PORT_LABEL = "Port (store it: the Test button needs one)"
#: The port field's placeholder: which port to store.
PORT_PLACEHOLDER = "443 for wss:// and https://, else the origin's port"


def connection_fields() -> tuple[str, ...]:
    """The names of a ``systemzero`` connection's extra fields (its form's ``conn-fields``)."""
    return tuple(get_provider_info()["connection-types"][0]["conn-fields"])


def get_provider_info() -> dict[str, Any]:
    """Return the provider-info dict for Airflow's provider discovery."""
    return {
        "package-name": PACKAGE_NAME,
        "name": INTEGRATION_NAME,
        "description": (
            "System Zero streaming decision API: a hook for the WebSocket stream protocol, "
            "a deferrable trigger, sensor and operator."
        ),
        "versions": list(VERSIONS),
        "integrations": [
            {
                "integration-name": INTEGRATION_NAME,
                "external-doc-url": DOCS_URL,
                "tags": ["ai"],
            }
        ],
        "connection-types": [
            {
                "connection-type": CONN_TYPE,
                "hook-class-name": HOOK_CLASS_NAME,
                "hook-name": INTEGRATION_NAME,
                # The port is shown although the origin may name one: Airflow 3.3.2's Test button
                # refuses a connection that stores no port (apache/airflow#73298), and a person
                # using the UI alone must be able to store it. The label says why.
                "ui-field-behaviour": {
                    "hidden-fields": ["login", "schema"],
                    "relabeling": {
                        "host": "API origin",
                        "password": "API key",
                        "port": PORT_LABEL,
                    },
                    "placeholders": {
                        "host": "wss://api.example.com or https://api.example.com",
                        "port": PORT_PLACEHOLDER,
                    },
                },
                "conn-fields": {
                    "model": {
                        "label": "Default model",
                        "description": "Model ID used when a task does not name one.",
                        "schema": {"type": ["string", "null"]},
                    },
                    "prompt_cache_key_prefix": {
                        "label": "Prompt cache key prefix",
                        "description": (
                            "Prefix for prompt cache keys derived by the client when a task "
                            "does not pass an explicit prompt_cache_key."
                        ),
                        "schema": {"type": ["string", "null"]},
                    },
                    "open_timeout": {
                        "label": "Open timeout (s)",
                        "description": "Seconds allowed for the TCP, TLS and WebSocket opening handshake.",
                        "schema": {"type": ["number", "null"], "exclusiveMinimum": 0, "default": 10},
                    },
                    "ca_bundle": {
                        "label": "CA bundle",
                        "description": (
                            "Path to a PEM file of CA certificates used to verify the gateway's "
                            "TLS certificate (and an https:// proxy's) instead of the system trust store."
                        ),
                        "schema": {"type": ["string", "null"]},
                    },
                    "client_cert": {
                        "label": "Client certificate",
                        "description": (
                            "Path to a PEM client certificate presented to the gateway (mutual TLS); "
                            "it may hold the private key too."
                        ),
                        "schema": {"type": ["string", "null"]},
                    },
                    "client_key": {
                        "label": "Client key",
                        "description": (
                            "Path to the client certificate's unencrypted PEM private key, when it "
                            "is not in the certificate's file."
                        ),
                        "schema": {"type": ["string", "null"]},
                    },
                    "proxy": {
                        "label": "Proxy URL",
                        "description": (
                            "Explicit proxy URL (http://, https://, or socks5:// with python-socks "
                            "installed). Proxies from environment variables are not used unless set here."
                        ),
                        "schema": {"type": ["string", "null"]},
                    },
                    "budget_decisions_per_hour": {
                        "label": "Decisions per hour (cap)",
                        "description": (
                            "Billed decisions allowed per hour on this connection in each process "
                            "(worker or triggerer); 0 allows none. Empty: no cap."
                        ),
                        "schema": {"type": ["integer", "null"], "minimum": 0},
                    },
                    "budget_input_tokens_per_hour": {
                        "label": "Input tokens per hour (cap)",
                        "description": (
                            "Input tokens allowed per hour on this connection in each process "
                            "(worker or triggerer); 0 allows none. Empty: no cap."
                        ),
                        "schema": {"type": ["integer", "null"], "minimum": 0},
                    },
                },
            }
        ],
        "config": {
            "systemzero": {
                "description": "Client settings of the System Zero stream provider.",
                "options": {
                    "reconnect_backoff_base": {
                        "description": (
                            "Seconds: the first reconnect waits a random time up to this long (full "
                            "jitter), doubling per failed attempt up to reconnect_backoff_cap; counted "
                            "from the end of any delay the gateway asked for."
                        ),
                        "version_added": "0.1.0",
                        "type": "float",
                        "example": "1.0",
                        "default": "0.5",
                    },
                    "reconnect_backoff_cap": {
                        "description": "Seconds: the largest jitter window of the reconnect backoff.",
                        "version_added": "0.1.0",
                        "type": "float",
                        "example": "60",
                        "default": "30",
                    },
                    "otel_spans": {
                        "description": (
                            "Emit OpenTelemetry spans (one per stream connection and one per decision) "
                            "through the tracer provider Airflow sets up. Unset: follow [traces] otel_on."
                        ),
                        "version_added": "0.1.0",
                        "type": "boolean",
                        "example": "True",
                        "default": None,
                    },
                    "capture_content": {
                        "description": (
                            "Put the streamed state and the questions' instructions in spans. Off by "
                            "default: spans carry ids, versions, covered events, answers and usage only."
                        ),
                        "version_added": "0.1.0",
                        "type": "boolean",
                        "example": "True",
                        "default": "False",
                    },
                },
            }
        },
        "hooks": [
            {
                "integration-name": INTEGRATION_NAME,
                "python-modules": ["airflow_provider_systemzero.hooks.systemzero"],
            }
        ],
        "operators": [
            {
                "integration-name": INTEGRATION_NAME,
                "python-modules": [
                    "airflow_provider_systemzero.operators.decide",
                    "airflow_provider_systemzero.operators.branch",
                ],
            }
        ],
        "sensors": [
            {
                "integration-name": INTEGRATION_NAME,
                "python-modules": ["airflow_provider_systemzero.sensors.decision"],
            }
        ],
        "triggers": [
            {
                "integration-name": INTEGRATION_NAME,
                "python-modules": ["airflow_provider_systemzero.triggers.decision"],
            }
        ],
        # ``@task.systemzero`` and ``@task.systemzero_branch``. Airflow's runtime reads "class-name"
        # (the same key the standard provider uses), although the runtime schema lists "path".
        "task-decorators": [
            {
                "name": "systemzero",
                "class-name": "airflow_provider_systemzero.decorators.systemzero.systemzero_task",
            },
            {
                "name": "systemzero_branch",
                "class-name": "airflow_provider_systemzero.decorators.branch.systemzero_branch_task",
            },
        ],
    }
