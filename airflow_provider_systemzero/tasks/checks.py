"""Checks a task runs on a DAG author's arguments before anything costs time or money.

* At parse time (in ``__init__``), every argument that is a plain literal — no Jinja template,
  no ``XComArg`` — is checked, so a DAG that can never work shows as an import error in the UI
  instead of failing when it runs. Templated values are checked again when the task runs.
* Before deferring, the worker checks what the triggerer will need, without the network
  (:meth:`~airflow_provider_systemzero.hooks.systemzero.SystemZeroHook.check_connection`).
* An empty state (``""``, ``[]``, ``{}``) is refused unless ``allow_empty=True``: a decision
  about nothing is billed like any other.
"""

from __future__ import annotations

import datetime
import decimal
import inspect
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import TracebackType
from typing import Any

from airflow_provider_systemzero.durations import is_seconds
from airflow_provider_systemzero.exceptions import SystemZeroArgumentError
from airflow_provider_systemzero.protocol.errors import LocalProtocolError

__all__ = [
    "check_conn_id",
    "check_flag",
    "check_key_salt",
    "check_lease_after",
    "has_template",
    "instruction_templates",
    "is_literal",
    "option_templates",
    "parse_time",
    "refuse_empty_state",
    "refuse_rendered_none",
    "refuse_rendered_none_instructions",
    "refuse_rendered_none_options",
    "template_of",
]

_JINJA_MARKERS = ("{{", "{%", "{#")
#: Plain values a Dag file fixes that are not JSON (a state of them is refused when it is parsed).
_PLAIN_NOT_JSON = (
    bytes,
    bytearray,
    complex,
    datetime.date,
    datetime.time,
    datetime.timedelta,
    decimal.Decimal,
)


def has_template(text: str) -> bool:
    """Whether ``text`` holds a Jinja template (``{{``, ``{%`` or ``{#``), rendered when the task runs.

    :param text: an argument, or the ``repr`` of a structured one.
    """
    return any(marker in text for marker in _JINJA_MARKERS)


def is_literal(value: Any) -> bool:
    """Whether ``value`` is plain JSON-like data with no template: what a DAG file fixes for good.

    :param value: an operator argument.
    """
    if value is None or isinstance(value, (bool, int, float, *_PLAIN_NOT_JSON)):
        return True  # fixed for good: what is not JSON among them is refused as such
    if isinstance(value, str):
        return not has_template(value)
    if isinstance(value, list | tuple | set | frozenset):
        return all(is_literal(item) for item in value)
    if isinstance(value, Mapping):
        return all(isinstance(key, str) and is_literal(item) for key, item in value.items())
    return False  # an XComArg, a template object or anything resolved when the task runs


def _library_directories() -> tuple[str, ...]:
    """Where the code that is not the Dag author's lives: this package, Airflow, Python's own library."""
    import importlib.util
    import sysconfig

    places = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]  # the package
    spec = importlib.util.find_spec("airflow")
    places += list(spec.submodule_search_locations or ()) if spec is not None else []
    places += [sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]]
    return tuple(os.path.join(os.path.abspath(place), "") for place in places)


def _authors_line() -> TracebackType | None:
    """A traceback entry of the nearest caller that is the Dag author's code (the Dag file's line
    that built the task), or ``None`` when no caller is (a task running: Airflow calls it)."""
    libraries = _library_directories()
    frame = inspect.currentframe()
    try:
        while frame is not None:
            filename = os.path.abspath(frame.f_code.co_filename)
            if not filename.startswith(libraries) and not filename.startswith("<"):
                return TracebackType(None, frame, frame.f_lasti, frame.f_lineno)
            frame = frame.f_back
        return None
    finally:
        del frame


@contextmanager
def parse_time(task_id: str | None) -> Iterator[None]:
    """Turn a rule broken by a literal argument into the ``ValueError`` that fails the DAG's import,
    its message starting with the task ID (``<task_id>: …``) once, however the checks nest.

    Any ``ValueError`` raised inside gets the prefix (this package's checks, a policy's, Airflow's
    own where it raises one); an argument error keeps its class, code and field. Its traceback ends
    at the Dag author's line that built the task: Airflow shows the last lines of an import
    error's traceback (``[core] dagbag_import_error_traceback_depth``, 2 by default), which would
    otherwise be this package's.
    """
    try:
        yield
    except ValueError as exc:
        prefix = f"{task_id}: "
        if str(exc).startswith(prefix):
            raise
        message = f"{prefix}{exc}"
        if isinstance(exc, SystemZeroArgumentError):
            error: ValueError = SystemZeroArgumentError(message, code=exc.code, field=exc.field)
        elif isinstance(exc, LocalProtocolError):
            error = LocalProtocolError(message, code=exc.code, field=exc.field)
        else:
            error = ValueError(message)
        raise error.with_traceback(_authors_line()) from None


def check_flag(name: str, value: Any, meaning: str) -> None:
    """A flag is ``True`` or ``False``: a string such as ``"no"`` would count as ``True``.

    :param meaning: what ``True`` means, for the message.
    :raises SystemZeroArgumentError: naming the flag and what ``True`` means.
    """
    if not isinstance(value, bool):
        raise SystemZeroArgumentError(
            f"{name} must be True or False, got {type(value).__name__} {value!r}: True means {meaning}",
            code="invalid_flag",
            field=name,
        )


def check_key_salt(value: Any) -> None:
    """``key_salt`` is a string or ``None``.

    :raises SystemZeroArgumentError: naming the argument.
    """
    if value is not None and not isinstance(value, str):
        raise SystemZeroArgumentError(
            f"key_salt must be a string or None, got {type(value).__name__} {value!r}: "
            f"pass e.g. key_salt={str(value)!r}",
            code="invalid_key_salt",
            field="key_salt",
        )


def check_conn_id(value: Any) -> None:
    """``systemzero_conn_id`` names a connection: a non-empty string.

    :raises SystemZeroArgumentError: naming the argument.
    """
    if not isinstance(value, str) or not value.strip():
        raise SystemZeroArgumentError(
            f"systemzero_conn_id must be the ID of a System Zero connection (a non-empty string), "
            f"got {value!r}: pass e.g. systemzero_conn_id='systemzero_default'",
            code="invalid_connection",
            field="systemzero_conn_id",
        )


def check_lease_after(value: Any) -> None:
    """``lease_after`` is a number of seconds, 0 or more.

    :raises SystemZeroArgumentError: naming the argument and what it means.
    """
    if not is_seconds(value):
        raise SystemZeroArgumentError(
            f"lease_after must be a number of seconds (0 or more), got {type(value).__name__} "
            f"{value!r}: how long a stream may stay quiet before the trigger gives it back "
            "(lease=False keeps it)",
            code="invalid_lease",
            field="lease_after",
        )


def template_of(value: Any) -> str | None:
    """``value`` when it is a Jinja template (what :func:`refuse_empty_state` quotes once it is
    rendered), else ``None``."""
    return value if isinstance(value, str) and has_template(value) else None


def refuse_rendered_none(
    value: Any, template: str | None, *, field: str, meant: str = "", code: str = "empty_state"
) -> None:
    """Refuse a template that rendered a missing value as the text ``"None"``
    (``{{ dag_run.conf.get('x') }}``, an XCom that was not pushed).

    :param value: the rendered value.
    :param template: the template it was rendered from (``None``: it was not).
    :param field: the argument named in the message.
    :param meant: how to say that ``'None'`` is meant, when it can be (``""``: it cannot).
    :param code: the error's code.
    :raises SystemZeroArgumentError: naming the field, the template and the fix.
    """
    if template is None or not isinstance(value, str) or value.strip() != "None":
        return
    also = f", or {meant} if 'None' is meant" if meant else ""
    raise SystemZeroArgumentError(
        f"{field} rendered to 'None' from the template {template!r}: the value it reads is missing "
        "(a dag_run.conf key, a param, an XCom that was not pushed); check it, give it a default "
        f"(e.g. dag_run.conf.get('key', 'text')){also}",
        code=code,
        field=field,
    )


def instruction_templates(questions: Any, instructions: Any = None) -> dict[str, tuple[str, str]]:
    """The templates the questions' texts are rendered from, kept when the task is built so that a
    text rendered as ``'None'`` is refused with its template when the task runs
    (:func:`refuse_rendered_none_instructions`).

    :param questions: the task's ``questions`` as written (``{name: text | question dict}``).
    :param instructions: the task's ``{name: text}`` overrides, as written.
    :return: ``{question name: (the argument it was written in, its template)}``, for the
        templated texts only.
    """
    found: dict[str, tuple[str, str]] = {}
    for name, value in questions.items() if isinstance(questions, Mapping) else ():
        text, field = value, f"questions.{name}"
        if isinstance(value, Mapping):
            text, field = value.get("instructions"), f"questions.{name}.instructions"
        if (template := template_of(text)) is not None:
            found[name] = (field, template)
    for name, text in instructions.items() if isinstance(instructions, Mapping) else ():
        found.pop(name, None)  # the override is the text asked
        if (template := template_of(text)) is not None:
            found[name] = (f"instructions.{name}", template)
    return found


def refuse_rendered_none_instructions(
    questions: Mapping[str, Any], templates: Mapping[str, tuple[str, str]]
) -> None:
    """Refuse a question whose text rendered as ``'None'`` (:func:`refuse_rendered_none`): asked,
    it would be billed and answered about nothing.

    :param questions: the wire-form questions, rendered.
    :param templates: :func:`instruction_templates` of the questions as written.
    :raises SystemZeroArgumentError: naming the argument, the template and the fix.
    """
    for name, (field, template) in templates.items():
        question = questions.get(name)
        if isinstance(question, Mapping):
            refuse_rendered_none(question.get("instructions"), template, field=field, code="invalid_question")


def option_templates(questions: Any) -> dict[tuple[str, int], tuple[str, str]]:
    """The templates a choice question's options are rendered from, kept when the task is built so
    that an option rendered as ``'None'`` is refused with its template when the task runs
    (:func:`refuse_rendered_none_options`).

    :param questions: the task's ``questions`` as written (``{name: text | question dict}``).
    :return: ``{(question name, index in its options): (the argument, its template)}``, for the
        templated options only.
    """
    found: dict[tuple[str, int], tuple[str, str]] = {}
    for name, value in questions.items() if isinstance(questions, Mapping) else ():
        options = value.get("options") if isinstance(value, Mapping) else None
        for index, option in enumerate(options) if isinstance(options, list | tuple) else ():
            if (template := template_of(option)) is not None:
                found[name, index] = (f"questions.{name}.options[{index}]", template)
    return found


def refuse_rendered_none_options(
    questions: Mapping[str, Any], templates: Mapping[tuple[str, int], tuple[str, str]]
) -> None:
    """Refuse a choice question's option rendered as ``'None'`` (:func:`refuse_rendered_none`):
    asked, the model could pick it, and the answer would name no real choice.

    :param questions: the wire-form questions, rendered.
    :param templates: :func:`option_templates` of the questions as written.
    :raises SystemZeroArgumentError: naming the option, the template and the fix.
    """
    for (name, index), (field, template) in templates.items():
        question = questions.get(name)
        options = question.get("options") if isinstance(question, Mapping) else None
        if isinstance(options, list | tuple) and index < len(options):
            refuse_rendered_none(options[index], template, field=field, code="invalid_question")


def refuse_empty_state(
    state: Any, *, allow_empty: bool, field: str = "state", template: str | None = None
) -> None:
    """Refuse an empty state (``""``, ``[]``, ``{}``) unless the author allowed it, and a template
    that rendered a missing value as the text ``"None"`` (``{{ dag_run.conf.get('x') }}``).

    :param state: the state.
    :param allow_empty: the task's ``allow_empty``.
    :param field: the argument named in the message.
    :param template: the template ``state`` was rendered from (``None``: it was not).
    :raises SystemZeroArgumentError: the state is empty, or a missing value rendered.
    """
    if allow_empty:
        return
    refuse_rendered_none(state, template, field=field, meant="pass allow_empty=True")
    if not isinstance(state, str | list | tuple | Mapping) or len(state):
        return
    raise SystemZeroArgumentError(
        f"{field} is empty ({state!r}): nothing would be decided but the decision is billed; "
        f"check the value (or the template) that should fill it, or pass allow_empty=True "
        f"if an empty state is meant",
        code="empty_state",
        field=field,
    )
