"""Where and how a stream connects: :class:`StreamSettings` (the API key is never shown or serialised)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_systemzero.decisions.budget import parse_limit
from airflow_provider_systemzero.durations import is_seconds
from airflow_provider_systemzero.protocol.errors import (
    LocalProtocolError,
)
from airflow_provider_systemzero.protocol.upgrade import (
    request_headers,
    stream_url,
)
from airflow_provider_systemzero.stream.exceptions import (
    SystemZeroValidationError,
)

__all__ = ["StreamSettings"]


@functools.cache
def _user_agent() -> str:
    from importlib import metadata

    try:
        version = metadata.version("airflow-provider-systemzero")
    except metadata.PackageNotFoundError:  # pragma: no cover - source tree
        version = "0"
    return f"airflow-provider-systemzero/{version}"


@dataclass(frozen=True, slots=True)
class StreamSettings:
    """Where and how to connect. The API key is never shown (``repr``) nor serialised (pickle).

    :param origin: the API origin (``wss://HOST``, ``https://HOST``, a bare host, or ``ws://`` to loopback).
    :param api_key: the API key, sent only as ``Authorization: Bearer`` on the upgrade.
    :param open_timeout: seconds for TCP + TLS + the opening handshake.
    :param ca_bundle: path of a PEM CA bundle for TLS verification (``None``: system trust store).
    :param proxy: explicit proxy URL (``None``: no proxy; environment proxies are never used).
    :param user_agent: the ``User-Agent`` header.
    :param default_model: the model used when a request names none (the connection's ``model``).
    :param prompt_cache_key_prefix: prefix of derived ``prompt_cache_key`` values.
    :param conn_id: the Airflow connection the settings came from (for messages only).
    :param budget_decisions_per_hour: billed decisions allowed per hour on this connection, in this
        process (``None``: no cap); see :func:`~airflow_provider_systemzero.decisions.budget.connection_window`.
    :param budget_input_tokens_per_hour: input tokens allowed per hour on this connection, in this process.
    """

    origin: str
    api_key: str = field(repr=False)
    open_timeout: float = 10.0
    ca_bundle: str | None = None
    proxy: str | None = None
    user_agent: str = field(default_factory=_user_agent)
    default_model: str | None = None
    prompt_cache_key_prefix: str | None = None
    conn_id: str | None = None
    budget_decisions_per_hour: int | None = None
    budget_input_tokens_per_hour: int | None = None

    def __post_init__(self) -> None:
        where = f"connection {self.conn_id!r}: " if self.conn_id else ""
        for name in ("budget_decisions_per_hour", "budget_input_tokens_per_hour"):
            try:
                object.__setattr__(self, name, parse_limit(getattr(self, name), name))
            except ValueError as exc:
                raise SystemZeroValidationError(
                    f"{where}extra {name!r}: {exc}", code=f"invalid_{name}", field=name
                ) from None
        try:
            stream_url(self.origin)
        except LocalProtocolError as exc:
            raise SystemZeroValidationError(f"{where}{exc.message}", code=exc.code, field=exc.field) from None
        key = self.api_key
        if not isinstance(key, str) or not key.strip():
            raise SystemZeroValidationError(
                f"{where}the API key is empty: set it in the connection's password field",
                code="missing_api_key",
                field="password",
            )
        if any(not (0x21 <= ord(ch) <= 0x7E) for ch in key.strip()):
            raise SystemZeroValidationError(
                f"{where}the API key contains spaces, control or non-ASCII characters: "
                "paste the key exactly as issued",
                code="invalid_api_key",
                field="password",
            )
        if not is_seconds(self.open_timeout, positive=True):
            raise SystemZeroValidationError(
                f"{where}open_timeout must be a positive number of seconds, got {self.open_timeout!r}",
                code="invalid_open_timeout",
                field="open_timeout",
            )

    @property
    def url(self) -> str:
        """The exact stream URL (never carries credentials)."""
        return stream_url(self.origin)

    @property
    def authorization(self) -> str:
        """The ``Authorization`` header value. Never log it."""
        return request_headers(self.api_key)["Authorization"]

    def __reduce__(self) -> Any:
        raise TypeError(
            "StreamSettings holds an API key and cannot be serialised: pass the Airflow connection "
            "ID and resolve the settings where they are used"
        )

    def __str__(self) -> str:
        return repr(self)
