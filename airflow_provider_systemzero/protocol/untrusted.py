"""The one function a gateway's text passes through before anything shows or stores it.

Every string a gateway chooses — reply and request IDs, model and ``served_by`` names, error types,
codes and messages, goodbye and close reasons, an answer's alternatives and calibration label — is
untrusted. It may carry a newline and a fake ``INFO - Marking task as SUCCESS`` that reads as a line
of the task log, a terminal escape, a bidirectional control that reorders what a person reads, a
lone surrogate that no UTF-8 store accepts, or twenty thousand characters.

:func:`safe_text` is the one function each such string passes through before it reaches a log
line, an exception, a trigger event, XCom or a review body: every character that is not printable
(``str.isprintable``: control characters, CR and LF, escapes, format and bidirectional controls,
line and paragraph separators, surrogates) is written as its Python escape (``\\n``, ``\\x1b``,
``\\u202e``), and the result is at most ``limit`` characters, a cut marked with ``…``. Printable
text within the limit comes back unchanged, so a well-behaved gateway's values arrive as it sent
them, and text passed through twice comes out as it did the first time.

A reply passes through it string by string, keys included, when the client reads it
(``protocol/reply.py``). Markdown is the review body's own concern (code spans that no value can
close, in ``tasks/review.py``); removing the API key is the stream's, which knows the key
(``stream/untrusted.py``).
"""

from __future__ import annotations

__all__ = ["MAX_TEXT", "safe_text"]

#: Characters of a gateway's string kept by default: far more than any ID, name or code the
#: service sends, and short enough for one log line.
MAX_TEXT = 200

#: The short escapes of the control characters a log or a terminal acts on most.
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(char: str) -> str:
    """One character that is not printable, as its Python escape."""
    short = _SHORT.get(char)
    if short is not None:
        return short
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def safe_text(text: str, limit: int = MAX_TEXT) -> str:
    """``text`` from a gateway, safe to log, raise, store and show: characters that are not
    printable escaped, at most ``limit`` characters (``…`` ends a cut one).

    Printable text of at most ``limit`` characters is returned as it is; the result is always
    printable and never longer than ``limit``, so ``safe_text(safe_text(t)) == safe_text(t)``.

    :param text: the gateway's string.
    :param limit: the most characters kept, the ``…`` of a cut included (at least 1).
    """
    if len(text) <= limit and text.isprintable():
        return text
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    pieces: list[str] = []
    size = 0
    for char in text:
        piece = char if char.isprintable() else _escaped(char)
        pieces.append(piece)
        size += len(piece)
        if size > limit:
            break
    else:
        return "".join(pieces)
    while size > limit - 1:  # whole escapes only: room for the mark of the cut
        size -= len(pieces.pop())
    return "".join(pieces) + "…"
