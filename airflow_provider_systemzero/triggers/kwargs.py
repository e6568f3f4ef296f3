"""A trigger's kwargs, declared once per trigger class (:class:`TriggerKwargs`).

The kwargs are what Airflow stores and what a triggerer rebuilds the trigger from, and for an
asset watcher's trigger they are its identity (``BaseEventTrigger.hash``): plain JSON, no secret,
in a fixed order. ``tests/triggers/test_trigger_kwargs.py`` pins each class's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow.triggers.base import BaseTrigger

__all__ = ["TriggerKwargs"]


@dataclass(frozen=True)
class TriggerKwargs:
    """A trigger's kwargs, declared once: each is the trigger's attribute of the same name, kept by
    its ``__init__`` and given back by ``serialize()`` (:meth:`serialized`).

    :param names: the kwargs, space-separated, in their serialized order (the order is part of an
        asset watcher's identity, ``BaseEventTrigger.hash``; tests/triggers/test_trigger_kwargs.py pins it).
    :param when_set: kwargs left out while empty (``None``, ``[]``, ``False``).
    :param unless: kwargs left out while at the given value (their default).
    """

    names: str
    when_set: frozenset[str] = frozenset()
    unless: Mapping[str, Any] = field(default_factory=dict)

    def serialized(
        self, trigger: BaseTrigger, tail: Mapping[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """The class path and plain-JSON kwargs (no secret) of ``trigger``.

        :param trigger: the trigger.
        :param tail: kwargs that follow the declared ones (the ``decide_when`` filter's).
        """
        kwargs: dict[str, Any] = {}
        for name in self.names.split():
            value = getattr(trigger, name)
            if (name in self.when_set and not value) or (name in self.unless and value == self.unless[name]):
                continue
            kwargs[name] = value
        kwargs.update(tail or {})
        return f"{type(trigger).__module__}.{type(trigger).__qualname__}", kwargs
