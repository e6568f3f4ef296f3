"""How a state source is described, checked and built.

A source is described by plain JSON (it travels in trigger kwargs) and built inside the
triggerer with :func:`build_source`. Three kinds:

``{"type": "static"}``
    The trigger's initial state never changes (the default).
``{"type": "file", "path": "/data/job.log", "encoding": "utf-8", "notifications": "auto", "poll_interval": 1.0}``
    Tails a local text file: the state is the initial state (a string, usually ``""``) followed by
    the file's content. A change is noticed through the operating system's file notifications
    (one watcher per process, :mod:`~airflow_provider_systemzero.sources.file_watch`) or, on
    network filesystems and where ``watch`` is ``"poll"``, every ``poll_interval`` seconds. New bytes
    are read incrementally off the event loop; a file that is replaced — renamed, deleted and
    recreated, rewritten in place or truncated — is read again from the start (see
    :class:`FileSource`). A missing file counts as empty, with
    one WARNING naming the path and the host; ``"must_exist": True`` fails instead. A state that
    holds none of the file (missing or empty) is not decided: the trigger waits for content,
    unless ``"decide_empty": True``.
``{"type": "callable", "path": "my_pkg.sources.job_state", "kwargs": {...}, "poll_interval": 5.0}``
    A function returning the full desired state (string, array or object). A sync function runs
    on a daemon thread of the provider's (one call at a time, at most ``timeout`` seconds), an ``async
    def`` is awaited; an async *generator* is iterated and each value it yields is the new state
    (push, no polling). Failures are retried ``retries`` times with backoff from ``retry_delay``
    (see :class:`CallableSource`). The module must be importable in the triggerer (not from a Dag
    bundle).

The trigger reconciles the desired state with what the gateway has through the core's minimal
mutation (text suffix → ``append_text``, array suffix → ``append_items``, otherwise ``replace``).

The sources live by kind in :mod:`~airflow_provider_systemzero.sources.base` (the read interface
and the static source), :mod:`~airflow_provider_systemzero.sources.file` and
:mod:`~airflow_provider_systemzero.sources.callable`; this module describes, checks and builds them.
"""

from __future__ import annotations

import codecs
import os
from collections.abc import Mapping
from typing import Any

from airflow_provider_systemzero.deprecations import warn_once
from airflow_provider_systemzero.durations import is_seconds
from airflow_provider_systemzero.exceptions import SystemZeroArgumentError
from airflow_provider_systemzero.protocol.errors import did_you_mean
from airflow_provider_systemzero.sources import file_watch
from airflow_provider_systemzero.sources.base import DEFAULT_POLL_INTERVAL, StateSource, StaticSource
from airflow_provider_systemzero.sources.callable import (
    DEFAULT_CALL_TIMEOUT,
    DEFAULT_RETRIES,
    DEFAULT_RETRY_DELAY,
    CallableSource,
    check_source_path,
    import_callable,
)
from airflow_provider_systemzero.sources.file import FileSource
from airflow_provider_systemzero.tasks.checks import (
    has_template,
    refuse_empty_state,
    refuse_rendered_none,
    template_of,
)

__all__ = [
    "SOURCE_TYPES",
    "build_source",
    "check_changes_possible",
    "is_static",
    "plain_source",
    "refuse_rendered_state",
    "state_templates",
    "validate_source_spec",
]

SOURCE_TYPES = ("static", "file", "callable")


def is_static(spec: Mapping[str, Any] | None) -> bool:
    """Whether a source description gives a state that never changes (none, or ``static``)."""
    return spec is None or (isinstance(spec, Mapping) and spec.get("type") == "static")


#: What :func:`state_templates` finds: the templates of the state and of the source's path.
Templates = tuple[str | None, str | None]


def state_templates(state: Any, spec: Any) -> Templates | None:
    """The templates ``state`` and the source's path are rendered from, as written, kept so that
    what they render is checked with :func:`refuse_rendered_state`.

    :param state: the initial state as written.
    :param spec: the source description as written.
    :return: ``(state's template, source.path's template)``, ``None`` for a literal; ``None`` when
        both are literals (nothing is kept).
    """
    found = template_of(state), template_of(spec.get("path")) if isinstance(spec, Mapping) else None
    return found if any(found) else None


def refuse_rendered_state(state: Any, spec: Any, templates: Templates | None, *, allow_empty: bool) -> None:
    """Refuse, once rendered, a source path a template rendered as ``'None'`` and a state that
    cannot be meant: a static one that is empty or ``'None'`` (unless ``allow_empty``), or the
    ``'None'`` a source's content would follow. Where the task runs first, or in the triggerer for
    a sensor started there, before anything is sent.

    :param state: the rendered initial state.
    :param spec: the rendered source description.
    :param templates: :func:`state_templates` of them as written.
    :param allow_empty: the task's ``allow_empty`` (a static state only).
    :raises SystemZeroArgumentError: naming the argument, its template and the fix.
    """
    state_template, path_template = templates or (None, None)
    if isinstance(spec, Mapping):
        refuse_rendered_none(spec.get("path"), path_template, field="source.path")
    if is_static(spec):
        refuse_empty_state(state, allow_empty=allow_empty, template=state_template)
    else:  # the source's content follows the state: a missing value would prefix it
        refuse_rendered_none(state, state_template, field="state")


def check_changes_possible(
    spec: Mapping[str, Any] | None, *, consecutive: int = 1, decide_initial: bool = True
) -> None:
    """Refuse, for a state that never changes, what only a change can satisfy: a wait that
    could not end until its deadline (or, for an asset watch, ever).

    :param spec: the source description (``None``: no source).
    :param consecutive: the condition's run of successive decisions (each about another state).
    :param decide_initial: ``False`` decides nothing until the state changes.
    :raises SystemZeroArgumentError: naming the argument and the fix.
    """
    if not is_static(spec):
        return
    never = "no source" if spec is None else "a static source"
    if consecutive != 1:
        raise SystemZeroArgumentError(
            f"consecutive={consecutive} needs successive states, but with {never} the state never "
            "changes: give a source that changes, or drop consecutive",
            code="invalid_hysteresis",
            field="consecutive",
        )
    if decide_initial is False:
        raise SystemZeroArgumentError(
            f"decide_initial=False with {never}: the state never changes, so nothing would ever be "
            "decided; give a source that changes, or drop decide_initial=False",
            code="invalid_decide_initial",
            field="decide_initial",
        )


def plain_source(spec: Any) -> Any:
    """The source description with a path object (``pathlib.Path``, any ``os.PathLike``) given as
    ``source.path`` turned into its text: the description travels in trigger kwargs, plain JSON.

    :param spec: a source description as the author wrote it (anything else is returned as is, for
        :func:`validate_source_spec` to name).
    :return: ``spec``, or a copy whose ``path`` is a string.
    """
    if isinstance(spec, Mapping) and isinstance(spec.get("path"), os.PathLike):
        return {**spec, "path": os.fspath(spec["path"])}
    return spec


def validate_source_spec(spec: Any, initial_state: Any) -> dict[str, Any]:
    """Check a source description (before deferring, so bad input fails on the worker).

    :param spec: ``None`` or a dict as described in the module docstring.
    :param initial_state: the trigger's initial state.
    :return: the normalised description.
    :raises SystemZeroArgumentError: naming the field.
    """
    if spec is None:
        return {"type": "static"}
    spec = plain_source(spec)
    if not isinstance(spec, Mapping):
        raise SystemZeroArgumentError(
            "source must be an object such as {'type': 'file', 'path': ...}",
            code="invalid_source",
            field="source",
        )
    kind = spec.get("type")
    if kind not in SOURCE_TYPES:
        raise SystemZeroArgumentError(
            f"source.type {kind!r} is not one of {list(SOURCE_TYPES)}{did_you_mean(kind, SOURCE_TYPES)}",
            code="invalid_source",
            field="source.type",
        )
    allowed = {
        "static": {"type"},
        "file": {
            "type",
            "path",
            "encoding",
            "poll_interval",
            "notifications",
            "watch",
            "must_exist",
            "decide_empty",
        },
        "callable": {"type", "path", "kwargs", "poll_interval", "retries", "retry_delay", "timeout"},
    }[kind]
    unknown = sorted(set(spec) - allowed)
    if unknown:
        raise SystemZeroArgumentError(
            f"source has unknown field {unknown[0]!r} for type {kind!r}{did_you_mean(unknown[0], allowed)} "
            f"(allowed: {sorted(allowed)})",
            code="invalid_source",
            field=f"source.{unknown[0]}",
        )
    for name in ("poll_interval", "retry_delay", "timeout"):
        value = spec.get(name, 1.0)
        if not is_seconds(value, positive=True):
            raise SystemZeroArgumentError(
                f"source.{name} {value!r} must be a positive number of seconds",
                code="invalid_source",
                field=f"source.{name}",
            )
    retries = spec.get("retries", DEFAULT_RETRIES)
    if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= 100:
        raise SystemZeroArgumentError(
            f"source.retries {retries!r} must be a whole number from 0 to 100",
            code="invalid_source",
            field="source.retries",
        )
    if "watch" in spec and "notifications" in spec:
        raise SystemZeroArgumentError(
            "source has both 'notifications' and 'watch' (its name before 0.2): give 'notifications' only",
            code="invalid_source",
            field="source.watch",
        )
    field = "watch" if "watch" in spec else "notifications"
    if field == "watch":
        warn_once("source field 'watch'", "'notifications' (the same values)")
    if spec.get(field, "auto") not in file_watch.WATCH_MODES:
        raise SystemZeroArgumentError(
            f"source.{field} {spec.get(field)!r} is not one of {list(file_watch.WATCH_MODES)}"
            f"{did_you_mean(spec.get(field), file_watch.WATCH_MODES)}",
            code="invalid_source",
            field=f"source.{field}",
        )
    if kind in ("file", "callable") and (not isinstance(spec.get("path"), str) or not spec["path"]):
        raise SystemZeroArgumentError(
            f"source.path is required for a {kind} source", code="invalid_source", field="source.path"
        )
    if kind == "file":
        path = spec["path"]
        if not has_template(path) and not os.path.isabs(path):
            raise SystemZeroArgumentError(
                f"source.path {path!r} is relative: the triggerer (the worker, in poke mode) would read it "
                "from its own working directory, not the Dag file's; give an absolute path",
                code="invalid_source",
                field="source.path",
            )
        for name in ("must_exist", "decide_empty"):
            if not isinstance(spec.get(name, False), bool):
                raise SystemZeroArgumentError(
                    f"source.{name} must be true or false, got {spec[name]!r}",
                    code="invalid_source",
                    field=f"source.{name}",
                )
        if not isinstance(initial_state, str):
            raise SystemZeroArgumentError(
                "a file source needs a string initial state (the file content is appended to it)",
                code="invalid_source",
                field="state",
            )
        try:
            codecs.lookup(spec.get("encoding", "utf-8"))
        except (LookupError, TypeError):
            raise SystemZeroArgumentError(
                f"source.encoding {spec.get('encoding')!r} is not a known text encoding",
                code="invalid_source",
                field="source.encoding",
            ) from None
    if kind == "callable" and not has_template(spec["path"]):
        check_source_path(spec["path"])  # imported in the triggerer: only its form is known here
    if kind == "callable" and not isinstance(spec.get("kwargs", {}), Mapping):
        raise SystemZeroArgumentError(
            "source.kwargs must be an object", code="invalid_source", field="source.kwargs"
        )
    return dict(spec)


def build_source(spec: Mapping[str, Any] | None, initial_state: Any) -> StateSource:
    """Build a source from its description (in the triggerer; and on a poking sensor's worker,
    which reads it with :meth:`~airflow_provider_systemzero.sources.base.StateSource.read_now`).

    :param spec: the description (see the module docstring).
    :param initial_state: the trigger's initial state.
    """
    spec = validate_source_spec(spec, initial_state)
    poll = float(spec.get("poll_interval", DEFAULT_POLL_INTERVAL))
    if spec["type"] == "file":
        return FileSource(
            spec["path"],
            prefix=initial_state,
            encoding=spec.get("encoding", "utf-8"),
            poll_interval=poll,
            notifications=spec.get("notifications", spec.get("watch", "auto")),
            must_exist=spec.get("must_exist", False),
            decide_empty=spec.get("decide_empty", False),
        )
    if spec["type"] == "callable":
        return CallableSource(
            import_callable(spec["path"]),
            kwargs=spec.get("kwargs"),
            poll_interval=poll,
            retries=spec.get("retries", DEFAULT_RETRIES),
            retry_delay=float(spec.get("retry_delay", DEFAULT_RETRY_DELAY)),
            timeout=float(spec.get("timeout", DEFAULT_CALL_TIMEOUT)),
        )
    return StaticSource(initial_state)
