"""Every key the client derives, in one place (WIRE.md §3, §8).

* :func:`derive_prompt_cache_key` — a stream's ``prompt_cache_key`` from the connection's prefix
  and the caller's identity, so a different process replays byte-identically;
* :func:`default_key_namespace` — the namespace of per-state idempotency keys, from the cache key;
* :func:`derive_state_key` — a state's idempotency key from that namespace and its decide body:
  the same state always gets the same key, a different state a different one (no 422).
"""

from __future__ import annotations

import hashlib

from airflow_provider_systemzero.protocol.errors import LocalProtocolError
from airflow_provider_systemzero.protocol.validation import validate_prompt_cache_key

__all__ = [
    "DEFAULT_PROMPT_CACHE_KEY_PREFIX",
    "default_key_namespace",
    "derive_prompt_cache_key",
    "derive_state_key",
    "state_key",
]

#: Prefix of derived ``prompt_cache_key`` values when the connection sets none.
DEFAULT_PROMPT_CACHE_KEY_PREFIX = "airflow-systemzero"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def derive_prompt_cache_key(prefix: str | None, identity: str) -> str:
    """A deterministic ``prompt_cache_key``: ``<prefix>-<first 32 hex of sha256(identity)>``.

    The same prefix and identity give the same key in every process, so a replay from another
    worker or triggerer stays byte-identical (WIRE.md §8). The stream client re-exports it as
    :func:`airflow_provider_systemzero.stream.derive_prompt_cache_key`.

    :param prefix: the connection's ``prompt_cache_key_prefix`` (``None`` or blank: the default).
    :param identity: the caller's identity for the stream (e.g. DAG, task and a stream name).
    :raises LocalProtocolError: the prefix makes an invalid key (``field`` is
        ``prompt_cache_key_prefix``).
    """
    prefix = (
        DEFAULT_PROMPT_CACHE_KEY_PREFIX if prefix is None or not str(prefix).strip() else str(prefix).strip()
    )
    key = f"{prefix}-{_digest(identity)[:32]}"
    try:
        validate_prompt_cache_key(key)
    except LocalProtocolError as exc:
        raise LocalProtocolError(
            f"prompt_cache_key_prefix {prefix[:40]!r} does not make a valid prompt_cache_key ({exc.message}): "
            "use at most 200 printable ASCII characters",
            code=exc.code,
            field="prompt_cache_key_prefix",
        ) from None
    return key


def default_key_namespace(prompt_cache_key: str) -> str:
    """The namespace of a stream's per-state keys when the caller names none."""
    return f"szk-{_digest(prompt_cache_key)[:32]}"


def derive_state_key(namespace: str, body: str) -> str:
    """The per-state idempotency key for a decide body: ``<namespace>:<sha256 of the body>``.

    :param namespace: a stable prefix (printable ASCII, at most 190 characters).
    :param body: the synthesized decide body.
    """
    return state_key(namespace, _digest(body))


def state_key(namespace: str, body_sha256: str) -> str:
    """The per-state key from the hex SHA-256 of the decide body, however it was computed (the
    desired state carries the hash forward across appends)."""
    return f"{namespace}:{body_sha256}"
