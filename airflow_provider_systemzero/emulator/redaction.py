"""What the emulator may print of a secret: a stable tag (:func:`mask_secret`), a header value with
its credential masked, and a logger adapter that keeps API keys and the admin token out of
websockets' request logs."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["SECRET_HEADERS", "RedactingLogger", "mask_secret", "masked_header"]

#: Request headers whose value is a credential (lower case).
SECRET_HEADERS = frozenset({"authorization", "x-emulator-token", "cookie", "proxy-authorization"})


def mask_secret(value: str) -> str:
    """A printable stand-in for a secret: never the secret, but stable (a short SHA-256 tag)."""
    return "sha256:" + hashlib.sha256(value.encode("utf-8")).hexdigest()[:8]


def masked_header(name: str, value: str) -> str:
    """A header value safe to record or log: secret headers keep only their scheme (``Bearer ***``).

    :param name: the header name (any case).
    :param value: the header value.
    """
    if name.lower() not in SECRET_HEADERS:
        return value
    scheme, sep, _secret = value.partition(" ")
    return f"{scheme} ***" if sep and name.lower() != "cookie" else "***"


class RedactingLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """websockets logs every request header at DEBUG (``< Authorization: Bearer …``): secret headers
    are masked, and no configured API key or admin token appears in any record.

    :param logger: the logger to write to.
    :param secrets: returns the secrets to mask, read at every record (keys may be added later).
    """

    def __init__(self, logger: logging.Logger, secrets: Callable[[], Iterable[str]]) -> None:
        super().__init__(logger, {})
        self._secrets = secrets

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        if not self.isEnabledFor(level):
            return
        if len(args) == 2 and isinstance(args[0], str) and isinstance(args[1], str):
            args = (args[0], masked_header(args[0], args[1]))
        super().log(level, self._redact(msg), *(self._redact(a) for a in args), **kwargs)

    def _redact(self, value: object) -> object:
        if isinstance(value, str):
            for secret in self._secrets():
                if secret and secret in value:
                    value = value.replace(secret, mask_secret(secret))
        return value
