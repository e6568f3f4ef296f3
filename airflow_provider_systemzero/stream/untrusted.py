"""Text a gateway chose, made safe to log, raise and tag.

Whatever a gateway sends — a ``stream_id``, a goodbye reason, an error message, a close reason, an
HTTP body — is untrusted: it may echo the API key back, carry newlines that forge log lines, or be
megabytes long. :func:`server_text` quotes it (control characters escaped), bounds its length and
removes the key; :func:`scrub` only removes the key (also in its JSON-escaped form).
"""

from __future__ import annotations

import json
import re

__all__ = ["MAX_SERVER_TEXT", "REDACTED", "scrub", "server_text", "server_token"]

_TOKEN = re.compile(r"[A-Za-z0-9_.:-]{1,64}")

#: What replaces the key.
REDACTED = "***"
#: Characters of server text kept in a log line or an exception message.
MAX_SERVER_TEXT = 200


def scrub(text: str, secret: str | None) -> str:
    """``text`` with every occurrence of ``secret`` (raw or JSON-escaped) replaced by ``***``.

    :param text: any text.
    :param secret: the API key (``None`` or empty: nothing to remove).
    """
    if not secret:
        return text
    if secret in text:
        text = text.replace(secret, REDACTED)
    if not _plain(secret):  # JSON escapes it differently: the escaped form goes too
        escaped = json.dumps(secret)[1:-1]
        if escaped in text:
            text = text.replace(escaped, REDACTED)
    return text


def _plain(secret: str) -> bool:
    """Whether ``secret`` reads the same JSON-escaped (printable ASCII without ``"`` or ``\\``,
    as every valid API key is): then scrubbing a frame costs one search, not an encoding too."""
    return secret.isascii() and secret.isprintable() and '"' not in secret and "\\" not in secret


def server_text(
    value: object, secret: str | None = None, limit: int = MAX_SERVER_TEXT, *, quote: bool = True
) -> str:
    """Server-chosen text as a quoted, escaped, bounded literal without the key: ``'shutdown'``.

    A newline becomes ``\\n`` (no forged log line), anything past ``limit`` characters is cut
    (``…`` marks the cut), and the key is removed.

    :param value: the server's value (a non-string is shown by its ``repr``).
    :param secret: the API key.
    :param limit: characters kept.
    :param quote: keep the quotes around it (``False`` for a sentence that quotes values itself).
    """
    text = value if isinstance(value, str) else repr(value)
    text = scrub(text, secret)
    cut = len(text) > limit
    shown = repr(text[:limit])
    if not quote:
        shown = shown[1:-1]
    return f"{shown}…" if cut else shown


def server_token(value: object, secret: str | None = None) -> str:
    """A server-chosen identifier (an error code, a ``stream_id``, an event or reply id) for a log
    line: shown as is when it is a plain token (letters, digits, ``_.:-``, at most 64), otherwise
    as :func:`server_text`.

    :param value: the server's value.
    :param secret: the API key.
    """
    if isinstance(value, str) and _TOKEN.fullmatch(value) and not (secret and secret in value):
        return value
    return server_text(value, secret, limit=64)
