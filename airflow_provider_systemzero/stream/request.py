"""The request a stream sends: :func:`build_request`, with its derived ``prompt_cache_key``.

:func:`derive_prompt_cache_key` is the core's (:mod:`airflow_provider_systemzero.protocol.keys`),
re-exported here; :func:`build_request` turns its error into a :class:`SystemZeroValidationError`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from airflow_provider_systemzero.protocol.errors import (
    LocalProtocolError,
)
from airflow_provider_systemzero.protocol.keys import DEFAULT_PROMPT_CACHE_KEY_PREFIX, derive_prompt_cache_key
from airflow_provider_systemzero.protocol.messages import (
    StreamRequest,
)
from airflow_provider_systemzero.stream.exceptions import (
    SystemZeroValidationError,
)
from airflow_provider_systemzero.stream.settings import StreamSettings

__all__ = ["DEFAULT_PROMPT_CACHE_KEY_PREFIX", "build_request", "derive_prompt_cache_key"]

_REQUEST_FIELDS = frozenset({"model", "questions", "route", "mode", "prompt_cache_key"})


def build_request(
    request: StreamRequest | Mapping[str, Any],
    settings: StreamSettings | None = None,
    *,
    identity: str | None = None,
) -> StreamRequest:
    """The :class:`StreamRequest` to stream, with an explicit stable ``prompt_cache_key``.

    :param request: a :class:`StreamRequest`, or a dict with ``questions`` and optionally
        ``model`` (default: the connection's ``model``), ``route``, ``mode``, ``prompt_cache_key``.
    :param settings: the connection settings (default model, cache key prefix).
    :param identity: the caller's identity for the stream; the derived ``prompt_cache_key`` hashes
        it (default: the model and questions).
    :raises SystemZeroValidationError: naming the invalid field.
    """
    try:
        if isinstance(request, StreamRequest):
            built = request
            built.validate()
        elif isinstance(request, Mapping):
            unknown = sorted(set(request) - _REQUEST_FIELDS)
            if unknown:
                hint = (
                    " (pass the state with state=, not in the request)"
                    if unknown[0] in ("state", "attachments")
                    else ""
                )
                raise LocalProtocolError(
                    f"request has unknown field {unknown[0]!r}{hint}: a request holds "
                    f"{sorted(_REQUEST_FIELDS)}",
                    code="invalid_request",
                    field=unknown[0],
                )
            model = request.get("model") or (settings.default_model if settings else None)
            if model is None:
                where = (
                    f"connection {settings.conn_id!r}" if settings and settings.conn_id else "the connection"
                )
                raise LocalProtocolError(
                    f"no model: pass model= to the task (a hook call: request['model']) "
                    f"or set the 'model' extra of {where}",
                    code="invalid_model",
                    field="model",
                )
            built = StreamRequest.build(
                model=model,
                questions=request.get("questions"),  # type: ignore[arg-type]
                route=request.get("route"),
                mode=request.get("mode"),
                prompt_cache_key=request.get("prompt_cache_key"),
            )
        else:
            raise LocalProtocolError(
                f"request must be a StreamRequest or a dict, got {type(request).__name__}",
                code="invalid_request",
                field="request",
            )
        if built.prompt_cache_key is None:
            if identity is None:
                identity = json.dumps(
                    {
                        "model": built.model,
                        "questions": built.questions_wire(),
                        "route": built.route,
                        "mode": built.mode,
                    },
                    sort_keys=True,
                    separators=(",", ":"),
                )
            prefix = settings.prompt_cache_key_prefix if settings else None
            built = dataclasses.replace(built, prompt_cache_key=derive_prompt_cache_key(prefix, identity))
    except LocalProtocolError as exc:
        raise SystemZeroValidationError.from_local(exc) from None
    return built
