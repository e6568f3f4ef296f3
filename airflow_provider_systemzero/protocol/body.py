"""Canonical JSON, byte counts and the synthesized decide body (WIRE.md §3).

* ``state_bytes`` is the UTF-8 length of the state as compact JSON (``separators=(",", ":")``,
  non-ASCII left unescaped): ``"Initial log\\n"`` → 15.
* The *synthesized body* is the ordinary HTTP decide body for the current version: compact JSON
  with keys in the order ``model``, ``state``, ``attachments`` (only when non-empty),
  ``questions``, ``route`` (if sent), ``mode`` (if sent), ``prompt_cache_key`` (always; the
  ``stream_id`` when ``start`` omitted it). The public example gives 158 then 173 bytes.

The same function builds the body on both sides, so a client can predict the gateway's byte
counts exactly and refuse an oversized change before sending it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

__all__ = ["JSONValue", "body_hash", "compact_json", "json_size", "state_bytes", "synthesize_decide_body"]

#: A JSON value: what a state, a trigger's kwargs and an XCom value hold. Where a parameter takes
#: one, it may hold any of these, and its reader checks the shape it needs.
JSONValue: TypeAlias = str | int | float | bool | list["JSONValue"] | dict[str, "JSONValue"] | None


#: ``json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)``, built once
#: (``json.dumps`` with options builds a new encoder on every call).
_ENCODE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


def compact_json(value: Any) -> str:
    """Encode ``value`` as compact JSON with non-ASCII left unescaped (the wire's canonical form)."""
    return _ENCODE(value)


def json_size(value: Any) -> int:
    """UTF-8 byte length of :func:`compact_json` of ``value``."""
    return len(compact_json(value).encode("utf-8"))


def state_bytes(state: Any) -> int:
    """``ack.state_bytes`` for a state."""
    return json_size(state)


def synthesize_decide_body(
    *,
    model: str,
    state: Any,
    questions: Mapping[str, Any],
    attachments: Sequence[Mapping[str, str]] = (),
    route: str | None = None,
    mode: str | None = None,
    prompt_cache_key: str,
) -> str:
    """The HTTP decide body for a state, as compact JSON text.

    :param model: ``request.model``.
    :param state: the current state.
    :param questions: the questions in wire form (name → question object).
    :param attachments: the current inline attachments (omitted from the body when empty).
    :param route: ``request.route`` if it was sent.
    :param mode: ``request.mode`` if it was sent.
    :param prompt_cache_key: the explicit key, or the ``stream_id`` when ``start`` omitted it.
    """
    body: dict[str, Any] = {"model": model, "state": state}
    if attachments:
        body["attachments"] = [{"name": a["name"], "data": a["data"]} for a in attachments]
    body["questions"] = questions
    if route is not None:
        body["route"] = route
    if mode is not None:
        body["mode"] = mode
    body["prompt_cache_key"] = prompt_cache_key
    return compact_json(body)


def body_hash(body: str) -> str:
    """Hex SHA-256 of a body's UTF-8 bytes (the ledger's notion of "byte-identical")."""
    return hashlib.sha256(body.encode("utf-8")).hexdigest()
