"""``SystemZeroHook``: the Airflow face of the System Zero stream client.

The connection (``conn_type = "systemzero"``):

* **host** — the API origin: ``https://HOST`` or ``wss://HOST`` (a bare host means ``wss://``;
  ``ws://`` only to a loopback host, such as the local emulator);
* **password** — the API key (masked in logs; never in a repr, an exception or a serialized object);
* **extra** — ``model`` (default model), ``prompt_cache_key_prefix``, ``open_timeout`` (seconds),
  ``ca_bundle`` (a PEM path), ``client_cert`` / ``client_key`` (PEM paths: mutual TLS), ``proxy``
  (an explicit proxy URL; environment proxies are never used),
  ``budget_decisions_per_hour`` / ``budget_input_tokens_per_hour`` (caps per connection and hour,
  checked before each dispatch and counted **per process**: see :mod:`~airflow_provider_systemzero.tasks.usage`).

Every stream the hook opens reports metrics and (opt-in) spans through
:class:`~airflow_provider_systemzero.tasks.observability.AirflowStreamObserver`.

Reconnect backoff (full jitter) is read from Airflow's configuration, section ``[systemzero]``:
``reconnect_backoff_base`` (seconds, default 0.5) and ``reconnect_backoff_cap`` (seconds, default
30), e.g. ``AIRFLOW__SYSTEMZERO__RECONNECT_BACKOFF_BASE=1``. A ``backoff`` passed to the hook wins.

Async code (triggers, ``aexecute``) reaches the connection only through
``await BaseHook.aget_connection(...)`` and ``await conn.aextra_dejson()``; the sync
``get_connection`` is used only by the sync helpers meant for workers (:meth:`decide`,
:meth:`get_settings`, :meth:`test_connection`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import difflib
import json
import logging
import os
from collections.abc import Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar, Unpack
from urllib.parse import SplitResult, urlsplit

from airflow.sdk import BaseHook

from airflow_provider_systemzero.compat import AirflowFailException, supervisor_comms
from airflow_provider_systemzero.decisions.budget import DecisionBudget
from airflow_provider_systemzero.durations import is_seconds, parse_seconds
from airflow_provider_systemzero.exceptions import ARGUMENT_ERRORS
from airflow_provider_systemzero.protocol.messages import Attachment, StreamRequest
from airflow_provider_systemzero.protocol.reply import DecisionResult
from airflow_provider_systemzero.stream import DecisionStream, StreamSettings, probe
from airflow_provider_systemzero.stream.capacity import Backoff, StreamCapacity
from airflow_provider_systemzero.stream.diagnosis import (
    describe_connection_error,
    is_network_error,
    without_proxy_credentials,
)
from airflow_provider_systemzero.stream.exceptions import SystemZeroError, SystemZeroValidationError
from airflow_provider_systemzero.stream.observer import StreamObserver
from airflow_provider_systemzero.stream.tls import load_tls
from airflow_provider_systemzero.stream.untrusted import scrub, server_text, server_token
from airflow_provider_systemzero.tasks.observability import AirflowStreamObserver

if TYPE_CHECKING:
    from airflow.sdk import Connection

__all__ = [
    "ANSWER_LIMIT",
    "DEFAULT_DECIDE_TIMEOUT",
    "DecideOptions",
    "StreamOptions",
    "SystemZeroHook",
    "answer_text",
    "backoff_config",
    "check_connection_before_deferring",
    "no_port_note",
    "reconnect_backoff",
    "stored_port",
]

#: Seconds :meth:`SystemZeroHook.decide` waits by default, opening included: a gateway that never
#: answers cannot hold a worker slot for ever.
DEFAULT_DECIDE_TIMEOUT = 600.0

log = logging.getLogger(__name__)

_T = TypeVar("_T")


class DecideOptions(TypedDict, total=False):
    """The options of :meth:`SystemZeroHook.decide` (each one also a :meth:`SystemZeroHook.stream` option).

    ``attachments``: inline attachments; ``idempotency_key``: the state's key (default: derived from
    the state); ``key_namespace``: namespace of derived per-state keys (e.g. a task instance's);
    ``identity``: the caller's identity for the stream (e.g. DAG and task IDs), hashed into the
    derived ``prompt_cache_key`` so every process replays byte-identically; ``budget``: spend caps
    checked before every dispatch, and where the usage is counted.
    """

    attachments: Sequence[Attachment]
    idempotency_key: str | None
    key_namespace: str | None
    identity: str | None
    budget: DecisionBudget | None


class StreamOptions(DecideOptions, total=False):
    """The options of :meth:`SystemZeroHook.stream`: :class:`DecisionStream`'s keyword arguments.

    ``decision_mode``: ``on_change`` (default) or ``on_request``; ``state``: the initial state
    (string, array or object); ``min_interval_ms``: minimum milliseconds between dispatch starts;
    ``open_deadline``: seconds allowed for opening (``None``: retry until cancelled);
    ``decide_retries``: retries of a retryable on_request decision failure (default 3);
    ``reached``: an earlier stream of the caller reached this gateway (a loopback gateway that
    refuses now is restarting: the stream keeps reconnecting instead of giving up).
    """

    decision_mode: str
    state: Any
    min_interval_ms: int | None
    open_deadline: float | None
    decide_retries: int
    reached: bool


def run_sync(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run a coroutine to completion from sync code.

    Uses ``asyncio.run`` when no loop runs in this thread, else a helper thread with its own loop
    (the calling thread blocks meanwhile: this is for sync callers only). The coroutine's own
    exception propagates as it is, with no chain from the loop check.

    :param coro: the coroutine to run.
    """
    try:
        asyncio.get_running_loop()
        loop_running = True
    except RuntimeError:
        loop_running = False
    if not loop_running:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="systemzero-sync") as pool:
        return pool.submit(asyncio.run, coro).result()


def _seconds(extra: Mapping[str, Any], field: str, conn_id: str, *, default: float) -> float:
    """The extra ``field``, a positive number of seconds (``default`` when unset)."""
    value = extra.get(field)
    number = parse_seconds(value, default)
    if number is None or not is_seconds(number, positive=True):
        raise SystemZeroValidationError(
            f"connection {conn_id!r}: extra {field!r} must be a positive number of seconds, got {value!r}",
            code=f"invalid_{field}",
            field=field,
        )
    return number


def _text(extra: Mapping[str, Any], field: str, conn_id: str) -> str | None:
    """The extra ``field``, a string (``None`` when unset or blank)."""
    value = extra.get(field)
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, str):
        raise SystemZeroValidationError(
            f"connection {conn_id!r}: extra {field!r} must be a string, got {type(value).__name__}",
            code=f"invalid_{field}",
            field=field,
        )
    return value.strip()


def _supervisor_comms_lack_async_send() -> bool:
    """Whether the task's supervisor comms exist but cannot be awaited (``dag.test()``'s in-process ones)."""
    comms = supervisor_comms()
    return comms is not None and not hasattr(comms, "asend")


def _outside_a_task() -> bool:
    """Whether this process reads connections as Airflow 3's fallback does: no task's (or trigger's)
    supervisor comms and no server context, so environment variables and secrets backends only,
    never the metadata DB (``airflow.sdk.execution_time.supervisor.ensure_secrets_backend_loaded``)."""
    if supervisor_comms() is not None:
        return False
    return os.environ.get("_AIRFLOW_PROCESS_CONTEXT") not in ("server", "client")


def reconnect_backoff() -> Backoff:
    """The reconnect backoff configured in ``[systemzero]`` (``reconnect_backoff_base``,
    ``reconnect_backoff_cap``; seconds), a fresh one per stream so each draws its own jitter.

    Reading the configuration touches no database or network, so it is safe on the triggerer's loop.

    :raises SystemZeroValidationError: a value is not a non-negative number.
    """
    base, cap = backoff_config()
    return Backoff(base=base, cap=cap)


def backoff_config() -> tuple[float, float]:
    """``[systemzero] reconnect_backoff_base`` and ``reconnect_backoff_cap`` (seconds), checked.

    :raises SystemZeroValidationError: a value is not a non-negative number.
    """
    from airflow.configuration import conf

    values = {}
    for name, default in (("reconnect_backoff_base", 0.5), ("reconnect_backoff_cap", 30.0)):
        raw = conf.get("systemzero", name, fallback=None)
        value = parse_seconds(raw, default)
        if value is None or not is_seconds(value):
            raise SystemZeroValidationError(
                f"[systemzero] {name} must be a non-negative number of seconds, got {raw!r}",
                code=f"invalid_{name}",
                field=name,
            )
        values[name] = value
    return values["reconnect_backoff_base"], values["reconnect_backoff_cap"]


def _check_extra_names(extra: Mapping[str, Any], conn_id: str) -> None:
    """Refuse an extra that is a misspelt field (a cap typed wrong would mean no cap); say that
    any other unknown extra is ignored."""
    from airflow_provider_systemzero.provider_info import connection_fields

    fields = connection_fields()
    for name in extra:
        if name in fields:
            continue
        close = difflib.get_close_matches(str(name), fields, n=1, cutoff=0.8)
        if close:
            raise SystemZeroValidationError(
                f"connection {conn_id!r}: extra {name!r} is not a field of a systemzero connection; "
                f"did you mean {close[0]!r}? Rename it in the connection's extra (the fields are "
                f"{', '.join(fields)})",
                code="unknown_extra",
                field=str(name),
            )
        log.warning(
            "connection %r: extra %r is not a field of a systemzero connection and is ignored (the fields are %s)",
            conn_id,
            name,
            ", ".join(fields),
        )


def _secrets(settings: StreamSettings) -> list[str]:
    """What Airflow's log masking must hide of the settings: the key, the proxy URL and its password."""
    secrets = [settings.api_key]
    if settings.proxy:
        secrets.append(settings.proxy)
        parts = settings.proxy_parts
        if parts is not None and parts.password:
            secrets.append(parts.password)
    return secrets


def _parse_extra(raw: str | None, conn_id: str) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        extra = json.loads(raw)
    except ValueError:
        raise SystemZeroValidationError(
            f"connection {conn_id!r}: extra is not valid JSON", code="invalid_extra", field="extra"
        ) from None
    if not isinstance(extra, dict):
        raise SystemZeroValidationError(
            f"connection {conn_id!r}: extra must be a JSON object", code="invalid_extra", field="extra"
        )
    return extra


class SystemZeroHook(BaseHook):
    """Streams state to the System Zero decision API and reads its decisions.

    :param systemzero_conn_id: the Airflow connection ID (``conn_type`` ``systemzero``).
    :param backoff: reconnect backoff for the streams this hook opens (default: :func:`reconnect_backoff`,
        0.5 s base and 30 s cap unless ``[systemzero]`` says otherwise).
    :param capacity: the stream cap (default: the process-wide one, shared by every hook).
    """

    conn_name_attr = "systemzero_conn_id"
    default_conn_name = "systemzero_default"
    conn_type = "systemzero"
    hook_name = "System Zero"

    def __init__(
        self,
        systemzero_conn_id: str = default_conn_name,
        *,
        backoff: Backoff | None = None,
        capacity: StreamCapacity | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.systemzero_conn_id = systemzero_conn_id
        self.backoff = backoff
        self.capacity = capacity

    def __repr__(self) -> str:
        return f"{type(self).__name__}(systemzero_conn_id={self.systemzero_conn_id!r})"

    # Airflow 3.1 reads the connection form from these two; 3.2+ reads the provider info's
    # conn-fields / ui-field-behaviour instead and never calls them. Both derive from that info.
    @classmethod
    def get_connection_form_widgets(cls) -> dict[str, Any]:
        """The form's extra fields for Airflow 3.1 (from the provider info's ``conn-fields``)."""
        from airflow_provider_systemzero.compat import legacy_form_widgets

        return legacy_form_widgets()

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """Hidden and relabelled fields for Airflow 3.1 (from the provider info's ``ui-field-behaviour``)."""
        from airflow_provider_systemzero.compat import legacy_ui_field_behaviour

        return legacy_ui_field_behaviour()

    # ------------------------------------------------------------------ settings

    @classmethod
    def settings_from_connection(cls, conn: Connection, extra: Mapping[str, Any]) -> StreamSettings:
        """Build :class:`StreamSettings` from a connection and its parsed extras.

        :param conn: the Airflow connection.
        :param extra: ``await conn.aextra_dejson()`` (async) or ``conn.extra_dejson`` (sync).
        :raises SystemZeroValidationError: naming the connection and the field to fix.
        """
        conn_id = conn.conn_id or cls.default_conn_name
        host = (conn.host or "").strip()
        if not host:
            raise SystemZeroValidationError(
                f"connection {conn_id!r} has no host: set it to the API origin, e.g. wss://api.example.com",
                code="invalid_origin",
                field="host",
            )
        if conn.port:
            parts, port = _origin(host)
            if port is None and not parts.path.strip("/") and parts.hostname:
                host = f"{host.rstrip('/')}:{conn.port}"
            elif port is not None and port != conn.port:
                # which of the two would the person mean? neither is taken: both are shown
                raise SystemZeroValidationError(
                    f"connection {conn_id!r}: its port {conn.port} differs from the port of its API "
                    f"origin {host!r} ({port}): store {port} as the port, or take the port out of the origin",
                    code="invalid_port",
                    field="port",
                )
        _check_extra_names(extra, conn_id)
        key = conn.password
        if not key or not str(key).strip():
            raise SystemZeroValidationError(
                f"connection {conn_id!r} has no API key: set it in the connection's password field",
                code="missing_api_key",
                field="password",
            )
        return StreamSettings(
            origin=host,
            api_key=str(key).strip(),
            open_timeout=_seconds(extra, "open_timeout", conn_id, default=10.0),
            ca_bundle=_text(extra, "ca_bundle", conn_id),
            proxy=_text(extra, "proxy", conn_id),
            client_cert=_text(extra, "client_cert", conn_id),
            client_key=_text(extra, "client_key", conn_id),
            default_model=_text(extra, "model", conn_id),
            prompt_cache_key_prefix=_text(extra, "prompt_cache_key_prefix", conn_id),
            conn_id=conn_id,
            budget_decisions_per_hour=extra.get("budget_decisions_per_hour"),
            budget_input_tokens_per_hour=extra.get("budget_input_tokens_per_hour"),
        )

    async def aget_settings(self) -> StreamSettings:
        """The connection's settings, read asynchronously (safe in a trigger's ``run()``).

        Uses ``await aget_connection`` and ``await conn.aextra_dejson()`` only, and registers the
        key with Airflow's log masking (``amask_secret``).

        :raises SystemZeroValidationError: the connection is missing, not of type ``systemzero``,
            incomplete or invalid.
        """
        conn = self._checked(await self._aget_connection())
        aextra_dejson = getattr(conn, "aextra_dejson", None)
        if aextra_dejson is not None:
            extra = await aextra_dejson()
        else:
            # a server-side secrets backend (the metastore) hands back the ORM model, which has no
            # async variant: parse the JSON here rather than touch the sync property
            extra = _parse_extra(conn.extra, conn.conn_id or self.systemzero_conn_id)
        settings = self.settings_from_connection(conn, extra)
        from airflow_provider_systemzero.compat import amask_secret

        for secret in _secrets(settings):
            await amask_secret(secret)
        return settings

    async def _aget_connection(self) -> Any:
        from airflow_provider_systemzero.compat import AirflowNotFoundException

        try:
            return await self.aget_connection(self.systemzero_conn_id)
        except AirflowNotFoundException:
            if not _supervisor_comms_lack_async_send():
                raise self._missing() from None
        # ``dag.test()`` runs triggers with in-process supervisor comms that (in Airflow 3.3.2) have
        # no async send, so the async lookup cannot reach the metadata DB there. Look it up on a
        # worker thread instead — never on the event loop.
        log.debug("async connection lookup unavailable (in-process comms); using a worker thread")
        return await asyncio.to_thread(self._get_connection)

    def _get_connection(self) -> Any:
        """The connection, read synchronously; a missing one is a :class:`SystemZeroValidationError`."""
        from airflow_provider_systemzero.compat import AirflowNotFoundException

        try:
            return self.get_connection(self.systemzero_conn_id)
        except AirflowNotFoundException:
            raise self._missing() from None

    def _missing(self) -> SystemZeroValidationError:
        """The error for a connection no backend this process reads has: where it looks, and the fix."""
        conn_id = self.systemzero_conn_id
        env = f"AIRFLOW_CONN_{conn_id.upper()}"
        if _outside_a_task():
            # a script, a notebook: the metadata DB's connections are out of reach, not absent
            message = (
                f"connection {conn_id!r} is not defined where this process looks: outside a task, Airflow 3 "
                "reads connections from AIRFLOW_CONN_* environment variables and a configured secrets "
                "backend only, not from the metadata DB (one created in the UI or with `airflow connections "
                f"add` is not seen here): set {env} or define it in the secrets backend, or run this in a task"
            )
        else:
            message = (
                f"connection {conn_id!r} is not defined: create it (conn_type 'systemzero', host = the API "
                f"origin, password = the API key) or set {env}, or pass the right systemzero_conn_id"
            )
        return SystemZeroValidationError(message, code="missing_connection", field="systemzero_conn_id")

    def _checked(self, conn: Any) -> Any:
        """``conn``, when it is a System Zero connection (another type's fields mean other things)."""
        if (conn.conn_type or "") != self.conn_type:
            raise SystemZeroValidationError(
                f"connection {self.systemzero_conn_id!r} has conn_type {conn.conn_type!r}, not 'systemzero': "
                "pass the ID of a System Zero connection, or change its type",
                code="invalid_connection",
                field="conn_type",
            )
        return conn

    def get_settings(self) -> StreamSettings:
        """The connection's settings, read synchronously (workers; never from async code).

        :raises SystemZeroValidationError: the connection is missing, not of type ``systemzero``,
            incomplete or invalid.
        """
        conn = self._checked(self._get_connection())
        settings = self.settings_from_connection(conn, conn.extra_dejson)
        from airflow.sdk.log import mask_secret

        for secret in _secrets(settings):
            mask_secret(secret)
        return settings

    def get_conn(self) -> StreamSettings:
        """The connection's settings (sync; see :meth:`get_settings`)."""
        return self.get_settings()

    # ------------------------------------------------------------------ streams

    def stream(
        self,
        request: StreamRequest | Mapping[str, Any],
        *,
        settings: StreamSettings | None = None,
        observer: StreamObserver | None = None,
        **options: Unpack[StreamOptions],
    ) -> DecisionStream:
        """A stream to use with ``async with``; the connection is read asynchronously on entering.

        :param request: a :class:`StreamRequest`, or a dict with ``questions`` and optionally ``model``
            (default: the connection's ``model`` extra), ``route``, ``mode``, ``prompt_cache_key``
            (default: derived from the connection's ``prompt_cache_key_prefix`` and ``identity``).
        :param settings: already resolved settings (skips the connection lookup).
        :param observer: what hears the stream (default: metrics and opt-in spans through Airflow).
        :param options: the stream's options (:class:`StreamOptions`: ``decision_mode``, ``state``,
            ``attachments``, ``min_interval_ms``, ``idempotency_key``, ``key_namespace``, ``identity``,
            ``open_deadline``, ``decide_retries``, ``budget``), passed to :class:`DecisionStream`;
            the connection's per-hour caps are added to the ``budget``.
        """
        return DecisionStream(
            settings or self.aget_settings,
            request,
            backoff=self.backoff or reconnect_backoff(),
            capacity=self.capacity,
            observer=observer or AirflowStreamObserver(options.get("decision_mode", "on_change")),
            **options,
        )

    def decide(
        self,
        request: StreamRequest | Mapping[str, Any],
        state: Any = "",
        *,
        timeout: float | None = DEFAULT_DECIDE_TIMEOUT,
        **options: Unpack[DecideOptions],
    ) -> DecisionResult:
        """Run one on_request decision to completion (sync; for non-deferrable operators).

        :param request: see :meth:`stream`.
        :param state: the state to decide.
        :param timeout: seconds for the whole call, opening included (default
            :data:`DEFAULT_DECIDE_TIMEOUT`, 10 minutes; ``None``: no limit).
        :param options: ``attachments``, ``idempotency_key``, ``key_namespace``, ``identity`` and
            ``budget`` (see :class:`DecideOptions`); the budget is asked before the decide is sent,
            and its ``usage`` counts the decision.
        :raises SystemZeroError: every failure (``DeadlineExceeded`` when ``timeout`` passes;
            :class:`~airflow_provider_systemzero.decisions.budget.BudgetExceeded` when the budget refused).
        """
        settings = self.get_settings()

        async def run() -> DecisionResult:
            loop = asyncio.get_running_loop()
            deadline = None if timeout is None else loop.time() + timeout
            async with self.stream(
                request,
                decision_mode="on_request",
                state=state,
                open_deadline=timeout,
                settings=settings,
                **options,
            ) as stream:
                try:
                    remaining = None if deadline is None else max(0.0, deadline - loop.time())
                    return await stream.decide(timeout=remaining)
                finally:
                    if deadline is not None:  # the close handshake too ends by the deadline
                        await stream.aclose(grace=max(0.0, deadline - loop.time()))

        return run_sync(run())

    def check_connection(self, model: str | None = None) -> StreamSettings:
        """Check, without the network, what a trigger will need (a worker calls it before deferring).

        The connection exists and is of type ``systemzero``, its origin, key and proxy are valid,
        its TLS files (``ca_bundle``, ``client_cert``, ``client_key``) are readable PEM, and a model
        is known (``model``, or the connection's ``model`` extra).

        :param model: the task's ``model=`` (``None``: the connection must name one).
        :raises SystemZeroValidationError: naming the connection, the field and the fix.
        """
        settings = self.get_settings()
        load_tls(settings)  # a TLS file that cannot be used fails here, not in the triggerer
        if not (model or settings.default_model):
            raise SystemZeroValidationError(
                f"no model: pass model= to the task or set the 'model' extra of connection "
                f"{self.systemzero_conn_id!r}",
                code="invalid_model",
                field="model",
            )
        return settings

    def test_connection(self) -> tuple[bool, str]:
        """Open a stream, read ``hello`` and close with 1000 (the UI's Test button, and
        ``airflow connections test``): no decision is asked, nothing is billed.

        The message names the connection the person tested (the UI's Test button hands the hook
        a copy under a temporary ID: :func:`~airflow_provider_systemzero.compat.tested_connection_id`).
        A connection that stores no port is named as the cause of the bare "Bad Request" Airflow
        3.3.2's Test button answers for it (apache/airflow#73298, before the provider is asked):
        a warning in the log, and a note after a success.
        """
        ok, message = self._test_stream()
        from airflow_provider_systemzero.compat import tested_connection_id

        tested = tested_connection_id(self.systemzero_conn_id)
        if tested is not None:
            message = message.replace(repr(self.systemzero_conn_id), repr(tested))
        note = self._no_port_note(tested or self.systemzero_conn_id)
        if note is not None:
            log.warning("%s", note)
            if ok:
                message = f"{message}; {note}"
        return ok, message

    def _no_port_note(self, name: str) -> str | None:
        """Why the Test button may refuse this connection when it stores no port, and the fix
        (``None``: it stores one, or it cannot be read: the test says why)."""
        try:
            conn = self._get_connection()
        except Exception:
            return None
        if conn.port:
            return None
        return no_port_note(name, conn.host)

    def _test_stream(self) -> tuple[bool, str]:
        """:meth:`test_connection`'s stream: ``hello`` read and the stream closed, or why not.
        Every answer passes through the one gate for a person's eyes (:func:`answer_text`): the key
        removed, the gateway's text escaped and bounded."""
        settings: StreamSettings | None = None
        try:
            settings = self.get_settings()
            hello = run_sync(probe(settings))
        except Exception as exc:
            if settings is not None and not isinstance(exc, SystemZeroError) and is_network_error(exc):
                return False, answer_text(
                    describe_connection_error(
                        exc, settings.url, open_timeout=settings.open_timeout, proxy=settings.proxy
                    ),
                    settings,
                )
            return False, answer_text(
                without_proxy_credentials(
                    f"{type(exc).__name__}: {exc}", settings.proxy if settings is not None else None
                ),
                settings,
            )
        model = (
            f"default model {settings.default_model!r}"
            if settings.default_model
            else "no default model: every task must pass model=, or set the 'model' extra"
        )
        stream = server_token(hello.stream_id, settings.api_key.strip())
        return True, answer_text(
            f"connected to {settings.url}: {hello.protocol}, stream {stream}; "
            f"max_streams_per_process={hello.limits.max_streams_per_process}; {model}",
            settings,
        )


#: The most characters of an answer :meth:`SystemZeroHook.test_connection` gives.
ANSWER_LIMIT = 1_000


def answer_text(text: str, settings: StreamSettings | None) -> str:
    """An answer the hook gives a person (the Test button, ``airflow connections test``), through the
    one gate for a gateway's text (:func:`~airflow_provider_systemzero.stream.untrusted.server_text`):
    the API key removed, what is not printable escaped, at most :data:`ANSWER_LIMIT` characters.
    Airflow's CLI prints the answer as ``rich`` markup, so what would read as a markup tag there
    (``[/bold]``, ``[link=…]``) is escaped too: a gateway can neither hide a link in it nor break it.

    :param text: the answer.
    :param settings: the connection's settings, whose key is removed (``None``: not read yet).
    """
    from rich.markup import escape

    secret = settings.api_key.strip() if settings is not None else None
    return server_text(escape(scrub(text, secret)), secret, limit=ANSWER_LIMIT, quote=False)


def stored_port(host: str | None) -> int:
    """The port to store on a connection whose API origin is ``host``: the origin's own port, else
    443 (``wss://``, ``https://`` and a bare host) or 80 (``ws://``, ``http://``).

    :param host: the connection's host (its API origin).
    """
    parts, port = _origin((host or "").strip())
    if port:
        return port
    return 80 if parts.scheme in ("ws", "http") else 443


def _origin(host: str) -> tuple[SplitResult, int | None]:
    """An API origin's parts (a bare host is read as ``wss://``) and its port (``None``: none, or
    not a number)."""
    parts = urlsplit(host if "://" in host else f"wss://{host}")
    try:
        return parts, parts.port
    except ValueError:
        return parts, None


def no_port_note(conn_id: str, host: str | None) -> str:
    """What a connection that stores no port says about the Test button: the cause and the fix.

    :param conn_id: the connection's ID.
    :param host: its host (its API origin), for the port to store.
    """
    port = stored_port(host)
    return (
        f"connection {conn_id!r} stores no port: Airflow 3.3.2's Test button refuses such a connection "
        "with a bare 'Bad Request' before the provider is asked (apache/airflow#73298); store the "
        f"gateway's port, {port}, in the form's Port field or with `airflow connections add ... "
        f"--conn-port {port}` (tasks do not need it)"
    )


def check_connection_before_deferring(task_id: str, conn_id: str, model: Any) -> None:
    """Fail the task on the worker when the connection cannot serve the trigger (no network used).

    :param task_id: the task (for the message).
    :param conn_id: the System Zero connection ID.
    :param model: the task's ``model=`` (``None``: the connection's ``model`` extra).
    :raises AirflowFailException: the connection is missing, of another type, invalid, or names no model.
    """
    try:
        SystemZeroHook(systemzero_conn_id=conn_id).check_connection(model)
    except ARGUMENT_ERRORS as exc:
        raise AirflowFailException(f"{task_id}: {exc}") from None
