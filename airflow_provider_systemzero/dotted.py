"""Functions named by dotted path: a state source's ``source.path`` and ``decide_when``'s
``callable``, both plain JSON in a trigger's kwargs and imported where they run.

One rule for both: ``package.module.function`` (or ``package.module:function``; an attribute
path such as ``package.module.Class.method`` too), imported with :func:`pkgutil.resolve_name`.
:func:`check_dotted` checks the form when the Dag is parsed; :func:`import_dotted` imports it when
the trigger starts (or a poke reads the source) and names the field, the path and the fix.
"""

from __future__ import annotations

import pkgutil
from collections.abc import Callable
from typing import Any

from airflow_provider_systemzero.exceptions import SystemZeroArgumentError

__all__ = ["check_dotted", "import_dotted"]


def check_dotted(path: Any, *, field: str, code: str, takes: str) -> str:
    """``path`` when it has the form of a dotted path to a function.

    :param path: the path given.
    :param field: the argument named in the message (``source.path`` …).
    :param code: the error code.
    :param takes: what the function is called with and returns, for the message.
    :raises SystemZeroArgumentError: naming the field, the path and the form to use.
    """
    module, colon, rest = path.partition(":") if isinstance(path, str) else ("", "", "")
    parts = [*module.split("."), *(rest.split(".") if colon else ())]
    if len(parts) < 2 or not all(part.isidentifier() for part in parts) or ":" in rest:
        raise SystemZeroArgumentError(
            f"{field} {path!r} is not a dotted path 'package.module.function': pass the path of a "
            f"function {takes}, with its module, importable where the triggerer runs",
            code=code,
            field=field,
        )
    return path


def import_dotted(path: str, *, field: str, code: str, takes: str) -> Callable[..., Any]:
    """Import the function ``path`` names (:func:`check_dotted` first).

    :raises SystemZeroArgumentError: the path cannot be imported here, or is not callable.
    """
    check_dotted(path, field=field, code=code, takes=takes)
    try:
        target = pkgutil.resolve_name(path)
    except (ImportError, AttributeError, ValueError) as exc:
        raise SystemZeroArgumentError(
            f"{field} {path!r} cannot be imported in the triggerer (or, for a poking sensor, on the "
            f"worker): {exc}. The module must be installed where the task's trigger runs, not only in "
            "a Dag bundle",
            code=code,
            field=field,
        ) from None
    if not callable(target):
        raise SystemZeroArgumentError(
            f"{field} {path!r} is not callable: name a function {takes}", code=code, field=field
        )
    return target
