"""Public names kept working after a rename, each warning once per process where it is used
(the [deprecation policy](compatibility.md#versioning-and-deprecation-policy)).

A module that renamed a public name answers its module ``__getattr__`` with a :class:`Renamed`
table; a renamed argument or source field is read under both names, its old one warning through
:func:`warn_once`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["Renamed", "forget_warnings", "warn_once"]

#: What has warned in this process already: one warning per old name.
_WARNED: set[str] = set()


def warn_once(old: str, new: str, *, stacklevel: int = 3) -> None:
    """Warn that ``old`` is deprecated in favour of ``new``, the first time in this process.

    :param old: the deprecated name, as a user writes it.
    :param new: what to write instead.
    :param stacklevel: the frame the warning names (the user's code).
    """
    if old in _WARNED:
        return
    _WARNED.add(old)
    warnings.warn(
        f"{old} is deprecated and will be removed in a later minor release: use {new}",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


class Renamed:
    """A module's renamed public names: ``old name → (new name, getter)``, for its ``__getattr__``.

    :param module: the module's ``__name__``.
    :param names: old name → (new name, a callable returning the object under its new name).
    """

    def __init__(self, module: str, names: Mapping[str, tuple[str, Callable[[], Any]]]) -> None:
        self.module = module
        self.names = dict(names)

    def __call__(self, name: str) -> Any:
        """The object of a renamed ``name`` (warning once), for the module's ``__getattr__``.

        :raises AttributeError: ``name`` was never a name of the module.
        """
        if name not in self.names:
            raise AttributeError(f"module {self.module!r} has no attribute {name!r}")
        new, get = self.names[name]
        warn_once(f"{self.module}.{name}", f"{self.module}.{new}")
        return get()


def forget_warnings() -> None:
    """Warn again for every old name, as a new process would (a test seam)."""
    _WARNED.clear()
