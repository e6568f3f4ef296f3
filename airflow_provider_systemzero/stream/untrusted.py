"""Text a gateway chose, in a log line or an exception, without the key.

Whatever a gateway sends — a ``stream_id``, a goodbye reason, an error message, a close reason, an
HTTP body — is untrusted: it may echo the API key back, carry newlines that forge log lines, or be
megabytes long. :func:`server_text` removes the key and passes the rest through
:func:`~airflow_provider_systemzero.protocol.untrusted.safe_text`, the one function every gateway
string passes through (escaped, bounded), quoted for a sentence; :func:`server_token` shows a plain
identifier as it is; :func:`scrub` only removes the key (in any JSON spelling too), from a frame
before it is read.
"""

from __future__ import annotations

import functools
import re

from airflow_provider_systemzero.protocol.untrusted import MAX_TEXT, safe_text

__all__ = ["REDACTED", "scrub", "server_text", "server_token"]

_TOKEN = re.compile(r"[A-Za-z0-9_.:-]{1,64}")

#: What replaces the key.
REDACTED = "***"


def scrub(text: str, secret: str | None) -> str:
    """``text`` with every occurrence of ``secret`` replaced by ``***``: raw, and in any JSON
    spelling (each character as itself, as ``\\uXXXX`` in either case, or as its short escape), so
    a key a gateway echoes back escaped does not survive a ``json.loads`` of the text.

    :param text: any text (a frame, an HTTP body, a reason).
    :param secret: the API key (``None`` or empty: nothing to remove).
    """
    if not secret:
        return text
    if secret in text:
        text = text.replace(secret, REDACTED)
    if "\\" in text:  # only an escape can spell the key otherwise: one search, then a regex
        text = _spellings(secret).sub(REDACTED, text)
    return text


#: JSON's two-character escapes, by the character they stand for.
_SHORT_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "/": "\\/",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
}


@functools.lru_cache(maxsize=4)
def _spellings(secret: str) -> re.Pattern[str]:
    """A pattern matching ``secret`` in every way JSON can write it."""
    parts = []
    for char in secret:
        options = []
        if char.isprintable() and char not in '"\\':
            options.append(re.escape(char))
        if char in _SHORT_ESCAPES:
            options.append(re.escape(_SHORT_ESCAPES[char]))
        units = char.encode("utf-16-be")  # a character past U+FFFF is a surrogate pair
        options.append(
            "".join(
                r"\\u" + "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else c for c in f"{unit:04x}")
                for unit in (int.from_bytes(units[i : i + 2], "big") for i in range(0, len(units), 2))
            )
        )
        parts.append(f"(?:{'|'.join(options)})")
    return re.compile("".join(parts))


def server_text(
    value: object, secret: str | None = None, limit: int = MAX_TEXT, *, quote: bool = True
) -> str:
    """Server-chosen text for a log line or an exception message: ``'shutdown'``.

    The key is removed, then the rest passes through
    :func:`~airflow_provider_systemzero.protocol.untrusted.safe_text`: a newline becomes ``\\n``
    (no forged log line), an escape ``\\x1b``, and anything past ``limit`` characters is cut
    (``…`` marks the cut).

    :param value: the server's value (a non-string is shown by its ``repr``).
    :param secret: the API key.
    :param limit: characters kept.
    :param quote: put quotes around it (``False`` for a sentence that quotes values itself).
    """
    text = value if isinstance(value, str) else repr(value)
    shown = safe_text(scrub(text, secret), limit)
    return f"'{shown}'" if quote else shown


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
