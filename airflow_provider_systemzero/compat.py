"""What the installed Airflow offers, and the documented fallback where it offers less.

The provider supports Airflow 3.1, 3.2 and 3.3. Five features depend on the minor release:

================================  =======  ===========================================================
feature                           Airflow  on older releases
================================  =======  ===========================================================
declarative connection form       3.2      the hook's ``get_connection_form_widgets`` /
(``conn-fields`` in provider info)         ``get_ui_field_behaviour`` describe the same form
a person's review in              3.3      the review waits through the triggerer (Airflow's
``awaiting_input``                         ``HITLTrigger``), as ``HITLOperator`` does on that release
task state store (budgets and     3.3      budgets count one try, with a notice in the task log; a
reviews across tries)                      retry asks its reviewer again
trigger templates rendered in     3.3      ``start_from_trigger=True`` defers from a worker instead,
the triggerer                              with a warning when the Dag is parsed
shared streams of asset watchers  3.3      each asset watcher's trigger holds its own stream
================================  =======  ===========================================================

Names that moved between releases (``AirflowFailException`` and its siblings, ``BranchMixIn``,
``SkipMixin``, ``KeywordParameters``, ``conf``, ``stats``) are imported from here: each resolves,
on first use, to the Task SDK's name where the release has it and to the older home otherwise.

Every check here reads the installed distribution's metadata or tries one import; none imports
Airflow at module load, so this module is safe to import from anywhere.
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the 3.3 homes; at run time ``__getattr__`` below picks the installed release's
    from airflow.sdk import BranchMixIn, SkipMixin
    from airflow.sdk.bases.decorator import KeywordParameters
    from airflow.sdk.configuration import conf
    from airflow.sdk.exceptions import (
        AirflowException,
        AirflowFailException,
        AirflowNotFoundException,
        AirflowSensorTimeout,
        AirflowSkipException,
        AirflowTaskTimeout,
    )
    from airflow.sdk.observability import stats

__all__ = [
    "AIRFLOW_AWAITING_INPUT",
    "AIRFLOW_CONN_FIELDS",
    "AIRFLOW_TASK_STATE_STORE",
    "AirflowException",
    "AirflowFailException",
    "AirflowNotFoundException",
    "AirflowSensorTimeout",
    "AirflowSkipException",
    "AirflowTaskTimeout",
    "BranchMixIn",
    "KeywordParameters",
    "SkipMixin",
    "airflow_version",
    "amask_secret",
    "conf",
    "has_awaiting_input",
    "has_conn_fields",
    "has_shared_streams",
    "has_task_state_store",
    "has_trigger_templates",
    "legacy_form_widgets",
    "legacy_ui_field_behaviour",
    "stats",
    "tested_connection_id",
]

_SDK_EXCEPTIONS = ("airflow.sdk.exceptions", "airflow.exceptions")
#: name → the modules that hold it, newest home first (the attribute has the same name unless
#: paired; paired with ``None``, the home is a module of its own, which its package may not have
#: imported yet).
_MOVED: dict[str, tuple[str | tuple[str, str | None], ...]] = {
    "AirflowException": _SDK_EXCEPTIONS,
    "AirflowFailException": _SDK_EXCEPTIONS,
    "AirflowNotFoundException": _SDK_EXCEPTIONS,
    "AirflowSensorTimeout": _SDK_EXCEPTIONS,
    "AirflowSkipException": _SDK_EXCEPTIONS,
    "AirflowTaskTimeout": _SDK_EXCEPTIONS,
    "BranchMixIn": ("airflow.sdk", "airflow.providers.standard.operators.branch"),
    "SkipMixin": ("airflow.sdk", "airflow.providers.standard.utils.skipmixin"),
    "KeywordParameters": ("airflow.sdk.bases.decorator", "airflow.utils.operator_helpers"),
    "conf": ("airflow.sdk.configuration", "airflow.configuration"),
    # ``airflow.stats`` warns that it is deprecated when imported, in every task's log: last resort
    "stats": (("airflow.sdk.observability.stats", None), ("airflow.stats", "Stats")),
}


def __getattr__(name: str) -> Any:
    homes = _MOVED.get(name)
    if homes is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    for home in homes:
        module_name, attribute = home if isinstance(home, tuple) else (home, name)
        try:
            module = importlib.import_module(module_name)
            value = module if attribute is None else getattr(module, attribute)
        except (ImportError, AttributeError):
            continue
        globals()[name] = value
        return value
    raise ImportError(f"{name} is in none of {homes}: is Airflow 3.1 or newer installed?")


async def amask_secret(secret: Any) -> None:
    """Register ``secret`` with Airflow's log masking from async code.

    Airflow 3.2+ has ``amask_secret``; on 3.1 the sync ``mask_secret``, which that release
    documents as safe in async contexts, does the same.

    :param secret: the value to mask.
    """
    try:
        from airflow.sdk.log import amask_secret as mask
    except ImportError:
        from airflow.sdk.log import mask_secret

        mask_secret(secret)
        return
    await mask(secret)


def supervisor_comms() -> Any:
    """The running task's (or trigger runner's) channel to its supervisor, ``None`` outside one.

    The Task SDK keeps it as ``airflow.sdk.execution_time.task_runner.SUPERVISOR_COMMS``, which
    no public API exposes; this is the one place the provider reads it. Under ``dag.test()`` it
    is the in-process supervisor's comms, which cannot be awaited (no ``asend``).
    """
    try:
        from airflow.sdk.execution_time import task_runner
    except ImportError:  # pragma: no cover - always present in Airflow 3
        return None
    return getattr(task_runner, "SUPERVISOR_COMMS", None)


#: Where Airflow's API server tests a connection for the UI's Test button (3.1 to 3.3): the route
#: function and its two locals the provider reads.
_TEST_ROUTE = ("airflow.api_fastapi.core_api.routes.public.connections", "test_connection")
_TEST_ROUTE_LOCALS = ("transient_conn_id", "test_body")


def tested_connection_id(conn_id: str) -> str | None:
    """The connection ID a person tested with the UI's Test button, when ``conn_id`` is the
    temporary one Airflow's API server gave the copy it hands the hook; ``None`` otherwise.

    Airflow 3.1–3.3 test a connection for the UI by storing a copy of it under a random ID (an
    ``AIRFLOW_CONN_<random>`` variable) and building the hook on that ID, so a message naming the
    hook's connection names an ID the person never saw. No public API tells the real one: the API
    route's own frame holds it (``test_body.connection_id``, beside ``transient_conn_id``). This
    is the one place the provider reads it, and only when that frame is the caller's and its
    ``transient_conn_id`` is ``conn_id``; on any other Airflow, or called any other way (the CLI,
    a worker's test, a task), it answers ``None`` and messages name ``conn_id``.

    :param conn_id: the ID the hook was built on.
    """
    import inspect

    module, function = _TEST_ROUTE
    frame = inspect.currentframe()
    try:
        while frame is not None:
            code = frame.f_code
            if code.co_name == function and frame.f_globals.get("__name__") == module:
                transient, body = (frame.f_locals.get(name) for name in _TEST_ROUTE_LOCALS)
                tested = getattr(body, "connection_id", None)
                if transient == conn_id and isinstance(tested, str) and tested:
                    return tested
                return None
            frame = frame.f_back
        return None
    finally:
        del frame  # a frame holds its callers: never keep one past the call


#: The first Airflow release whose providers manager reads ``conn-fields`` from provider info.
AIRFLOW_CONN_FIELDS = (3, 2)
#: The first Airflow release with the ``awaiting_input`` task state (``TaskAwaitingInput``).
AIRFLOW_AWAITING_INPUT = (3, 3)
#: The first Airflow release that hands tasks a state store (``context["task_state_store"]``).
AIRFLOW_TASK_STATE_STORE = (3, 3)


@functools.cache
def airflow_version() -> tuple[int, int, int]:
    """The installed Airflow's ``(major, minor, patch)``, read from its distribution metadata.

    ``apache-airflow-core`` carries the version the code runs (the ``apache-airflow`` meta
    package may be absent in slim images); ``(0, 0, 0)`` when neither is installed.
    """
    from importlib import metadata

    for dist in ("apache-airflow-core", "apache-airflow"):
        try:
            text = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        numbers = [int(match[0]) if (match := re.match(r"\d+", part)) else 0 for part in text.split(".")[:3]]
        numbers += [0] * (3 - len(numbers))
        return numbers[0], numbers[1], numbers[2]
    return 0, 0, 0


def has_conn_fields() -> bool:
    """Whether the providers manager reads the connection form from provider info (Airflow 3.2+)."""
    return airflow_version()[:2] >= AIRFLOW_CONN_FIELDS


@functools.cache
def has_awaiting_input() -> bool:
    """Whether a task can park itself in ``awaiting_input`` (Airflow 3.3+)."""
    try:
        from airflow.sdk.exceptions import TaskAwaitingInput  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def has_trigger_templates() -> bool:
    """Whether the triggerer renders a trigger's template fields (Airflow 3.3+), which
    ``start_from_trigger`` needs for its templated key namespace."""
    try:
        from airflow.triggers.base import BaseTrigger
    except ImportError:
        return False
    return hasattr(BaseTrigger, "render_template_fields")


@functools.cache
def has_shared_streams() -> bool:
    """Whether the triggerer lets event triggers share one stream (Airflow 3.3+:
    ``BaseEventTrigger.shared_stream_key``, ``open_shared_stream`` and ``filter_shared_stream``,
    driven by ``airflow.triggers.shared_stream``); older releases always call ``run()``."""
    try:
        from airflow.triggers.base import BaseEventTrigger
        from airflow.triggers.shared_stream import SharedStreamManager  # noqa: F401
    except ImportError:
        return False
    return all(
        hasattr(BaseEventTrigger, name)
        for name in ("shared_stream_key", "open_shared_stream", "filter_shared_stream")
    )


def has_task_state_store(context: Any) -> bool:
    """Whether this task run was handed a state store that outlives its tries.

    :param context: the task context.
    """
    getter = getattr(context, "get", None)
    return callable(getter) and getter("task_state_store") is not None


def legacy_ui_field_behaviour() -> dict[str, Any]:
    """The connection form's field behaviour in the hook-method shape of Airflow 3.1.

    Read from the provider info's ``ui-field-behaviour``, so the two never disagree.
    """
    from airflow_provider_systemzero.provider_info import get_provider_info

    behaviour = get_provider_info()["connection-types"][0]["ui-field-behaviour"]
    return {
        "hidden_fields": list(behaviour.get("hidden-fields", [])),
        "relabeling": dict(behaviour.get("relabeling", {})),
        "placeholders": dict(behaviour.get("placeholders", {})),
    }


def legacy_form_widgets() -> dict[str, Any]:
    """The connection form's extra fields as the WTForms widgets Airflow 3.1 asks hooks for.

    Built from the provider info's ``conn-fields`` (label, description, type, default), so the
    form is the same on every release. Airflow 3.1 evaluates these with stand-ins for WTForms
    when Flask-AppBuilder is not installed; where even that fails, the form has no extra fields
    (the connection still works with the fields typed into ``extra``).
    """
    from airflow_provider_systemzero.provider_info import get_provider_info

    try:
        from flask_appbuilder.fieldwidgets import BS3TextFieldWidget
        from flask_babel import lazy_gettext
        from wtforms import IntegerField, StringField
        from wtforms.validators import NumberRange, Optional
    except ImportError:
        return {}
    widgets: dict[str, Any] = {}
    for name, field in get_provider_info()["connection-types"][0]["conn-fields"].items():
        schema = field.get("schema", {})
        kinds = schema.get("type")
        kinds = set(kinds) if isinstance(kinds, list) else {kinds}
        options: dict[str, Any] = {
            "description": field.get("description", ""),
            "widget": BS3TextFieldWidget(),
        }
        if "default" in schema:
            options["default"] = schema["default"]
        if "integer" in kinds or "number" in kinds:
            # Airflow 3.1's UI builds its form from stand-ins for StringField, IntegerField,
            # PasswordField and BooleanField only, and reads no bound: a number is whole seconds
            # there (a fraction can still be typed into the extra JSON).
            validators: list[Any] = [Optional()]
            if "minimum" in schema:
                validators.append(NumberRange(min=schema["minimum"]))
            widgets[name] = IntegerField(lazy_gettext(field["label"]), validators=validators, **options)
        else:
            widgets[name] = StringField(lazy_gettext(field["label"]), validators=[Optional()], **options)
    return widgets
