"""An operator that asks System Zero about a state built from task outputs and hands the
answers to downstream tasks through XCom."""

from __future__ import annotations

import base64
import dataclasses
import mimetypes
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.configuration import conf
from airflow.sdk import BaseOperator

from airflow_provider_systemzero.compat import AirflowException, AirflowFailException
from airflow_provider_systemzero.decisions.watch import WatchEvent, answers_payload
from airflow_provider_systemzero.durations import is_seconds
from airflow_provider_systemzero.exceptions import ARGUMENT_ERRORS, SystemZeroArgumentError
from airflow_provider_systemzero.hooks.systemzero import SystemZeroHook, check_connection_before_deferring
from airflow_provider_systemzero.identity import context_namespace, state_hash
from airflow_provider_systemzero.protocol.body import json_size
from airflow_provider_systemzero.protocol.errors import did_you_mean
from airflow_provider_systemzero.protocol.messages import Attachment
from airflow_provider_systemzero.protocol.validation import not_json_message, validate_attachment_name
from airflow_provider_systemzero.questions import build_request_dict, validate_state_for_request
from airflow_provider_systemzero.stream.untrusted import server_token
from airflow_provider_systemzero.tasks.checks import (
    check_conn_id,
    check_flag,
    check_key_salt,
    instruction_templates,
    is_literal,
    option_templates,
    parse_time,
    refuse_empty_state,
    refuse_rendered_none_instructions,
    refuse_rendered_none_options,
    template_of,
)
from airflow_provider_systemzero.tasks.deadlines import deadline_in, defer_timeout, timeout_reason
from airflow_provider_systemzero.tasks.payloads import task_failure
from airflow_provider_systemzero.tasks.review import Gate, PolicyGateMixin
from airflow_provider_systemzero.tasks.usage import UsageBudgetMixin
from airflow_provider_systemzero.triggers.decision import SystemZeroDecideTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["SystemZeroDecideOperator", "file_attachment"]


def file_attachment(name: str, path: str | Path, mime_type: str | None = None) -> dict[str, str]:
    """An inline attachment ``{"name", "data"}`` from a local file (a base64 data URL).

    :param name: the attachment name (letters, digits, ``_``, ``-``; starts with a letter).
    :param path: the file.
    :param mime_type: the MIME type (guessed from the file name when ``None``).
    """
    validate_attachment_name(name, field="attachment name")
    path = Path(path)
    mime = mime_type or mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    return {"name": name, "data": f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"}


def _items(upstream_task_ids: Any) -> list[Any]:
    """``upstream_task_ids`` as a list: one task ID or one XComArg stands for itself alone (a string
    is never split into its characters)."""
    if isinstance(upstream_task_ids, str) or getattr(upstream_task_ids, "operator", None) is not None:
        return [upstream_task_ids]
    if isinstance(upstream_task_ids, list | tuple):
        return list(upstream_task_ids)
    raise SystemZeroArgumentError(
        f"upstream_task_ids must be a task ID, a list of task IDs or .output XComArgs, got "
        f"{type(upstream_task_ids).__name__} {upstream_task_ids!r}: pass e.g. upstream_task_ids=['extract']",
        code="invalid_upstream",
        field="upstream_task_ids",
    )


def _as_attachment(value: Any, index: int) -> Attachment:
    if isinstance(value, Attachment):
        return value
    if isinstance(value, Mapping) and set(value) == {"name", "data"}:
        return Attachment(name=value["name"], data=value["data"])
    if isinstance(value, Mapping) and set(value) <= {"name", "bytes", "mime_type"} and "bytes" in value:
        raw = value["bytes"]
        if not isinstance(raw, bytes | bytearray):
            raise SystemZeroArgumentError(
                f"attachments[{index}].bytes must be bytes",
                code="invalid_attachment",
                field=f"attachments[{index}].bytes",
            )
        mime = value.get("mime_type") or "application/octet-stream"
        return Attachment(
            name=value.get("name"), data=f"data:{mime};base64,{base64.b64encode(raw).decode('ascii')}"
        )
    raise SystemZeroArgumentError(
        f"attachments[{index}] must be {{name, data}} (a data URL), {{name, bytes, mime_type}} "
        "or file_attachment(...)",
        code="invalid_attachment",
        field=f"attachments[{index}]",
    )


class SystemZeroDecideOperator(UsageBudgetMixin, PolicyGateMixin, BaseOperator):
    """Streams a state to System Zero, asks its questions once, and pushes the answers to XCom.

    The state is either ``state`` or the outputs of upstream tasks, **replayed as state**: an
    array with one item per output, in the given order, each ``{"task_id": …, "output": …}``.
    One decision per state: an on_request stream sends ``start`` with the full state, then
    ``decide``. Keys are derived from the task instance and the state's hash, with a stable
    ``prompt_cache_key``, so a retry, a clear, a triggerer restart or an HA double run replays
    byte-identically and is billed once.

    XCom: the return value is ``{question: decision}``; ``answers`` holds every answer in full
    (probability, confidence, alternatives), ``reply`` the whole reply and ``decision_id`` its ID;
    ``decision`` is the audit record of the gated question (see
    :func:`~airflow_provider_systemzero.decisions.policy.decision_record`); ``decisions`` the
    decision's history row per question, what the UI's "Decision timeline" shows.

    With a ``policy`` (:class:`~airflow_provider_systemzero.decisions.policy.DecisionPolicy`), the answer to
    ``policy_question`` is acted on, sent to a person (Airflow's Human-in-the-loop
    ``awaiting_input``), replaced by the policy's default, or fails/skips the task; the return
    value carries the answer that took effect.

    :param questions: ``{name: instructions}`` (boolean) or full question objects (boolean/choice).
    :param state: the state (string, array or object), if not built from upstream outputs.
    :param upstream_task_ids: tasks (IDs or their ``.output`` XComArgs, or one of either) whose return
        values are replayed as state, in order; XComArgs also set the dependency. When the task
        runs, each must be a task of the Dag that runs before this one and have returned a value
        (``None`` is refused: nothing to decide about, but billed).
    :param instructions: ``{name: text}`` overriding questions' instructions.
    :param attachments: inline attachments: ``{"name", "data"}`` data URLs, ``{"name", "bytes",
        "mime_type"}``, or :func:`file_attachment`.
    :param model: the model (default: the connection's ``model`` extra).
    :param route: ``direct`` or ``committee``.
    :param mode: ``fast`` or ``deliberate`` (not with ``committee``).
    :param prompt_cache_key: a stable cache key (default: derived from the task instance).
    :param systemzero_conn_id: the System Zero connection.
    :param deferrable: run the stream in the triggerer.
    :param decision_timeout: seconds allowed for the decision.
    :param key_salt: mixed into the key namespace (e.g. to force a fresh decision).
    :param max_decisions: billed decisions allowed for this task across all its tries, checked
        before each dispatch (``None``: no cap); see :mod:`~airflow_provider_systemzero.tasks.usage`.
    :param max_input_tokens: input tokens allowed for this task across all its tries (``None``: no cap).
    :param policy: a :class:`~airflow_provider_systemzero.decisions.policy.DecisionPolicy` (or its dict form)
        for ``policy_question``; ``None`` uses the model's answers as they are.
    :param policy_question: the question the policy gates (default: the only question).
    :param review_assigned_users: who may answer a review (``{"id", "name"}`` or a list of them).
    :param review_notifiers: notifiers called when a review is requested (like ``HITLOperator``'s).
    :param review_subject: the review request's subject (default: names the question).
    :param allow_empty: accept an empty state (``""``, ``[]``, ``{}``); refused by default, before
        any connection, since a decision about nothing is billed like any other.

    Literal (non-templated) arguments are checked when the DAG is parsed, so an operator that can
    never work is an import error; templated ones when the task runs.
    """

    #: the state comes from elsewhere when the task runs (a decorated function's return value), so
    #: neither ``state`` nor ``upstream_task_ids`` is needed when the Dag is parsed
    state_from_callable: bool = False

    template_fields: Sequence[str] = (
        "questions",
        "state",
        "instructions",
        "model",
        "prompt_cache_key",
        "replay_task_ids",
    )
    ui_color = "#e8f0ff"

    def __init__(
        self,
        *,
        questions: Mapping[str, Any],
        state: Any = None,
        upstream_task_ids: Sequence[Any] | None = None,
        instructions: Mapping[str, str] | None = None,
        attachments: Sequence[Any] | None = None,
        model: str | None = None,
        route: str | None = None,
        mode: str | None = None,
        prompt_cache_key: str | None = None,
        systemzero_conn_id: str = "systemzero_default",
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=True),
        decision_timeout: float = 600.0,
        key_salt: str | None = None,
        max_decisions: int | None = None,
        max_input_tokens: int | None = None,
        policy: Any = None,
        policy_question: str | None = None,
        review_assigned_users: Any = None,
        review_notifiers: Any = None,
        review_subject: str | None = None,
        allow_empty: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(max_decisions=max_decisions, max_input_tokens=max_input_tokens, **kwargs)
        self.allow_empty = allow_empty
        with parse_time(self.task_id):
            check_flag("deferrable", deferrable, "wait for the decision in the triggerer")
            check_flag("allow_empty", allow_empty, "decide about an empty state")
            check_key_salt(key_salt)
            check_conn_id(systemzero_conn_id)
            self._init_review(policy, review_assigned_users, review_notifiers, review_subject)
        self.policy_question = policy_question
        if (
            self.policy is not None
            and policy_question is None
            and isinstance(questions, Mapping)
            and len(questions) > 1
        ):
            raise ValueError(
                f"{self.task_id}: name the question the policy gates: policy_question=... "
                f"(one of {sorted(questions)})"
            )
        self.questions = questions
        self.state = state
        self._state_template = template_of(state)  # what a rendered 'None' came from
        #: task IDs whose outputs are replayed (``upstream_task_ids`` is BaseOperator's own attribute)
        self.replay_task_ids: list[str] | None = None
        if upstream_task_ids is not None:
            with parse_time(self.task_id):
                items = _items(upstream_task_ids)
            self.replay_task_ids = [self._replayed(item, index) for index, item in enumerate(items)]
        self.instructions = instructions
        #: what a question's text rendered as 'None' came from
        self._instruction_templates = instruction_templates(questions, instructions)
        self._option_templates = option_templates(questions)  # and a choice's option
        self.attachments = list(attachments or [])
        self.model = model
        self.route = route
        self.mode = mode
        self.prompt_cache_key = prompt_cache_key
        self.systemzero_conn_id = systemzero_conn_id
        self.deferrable = deferrable
        self.decision_timeout = decision_timeout
        self.key_salt = key_salt
        self._check_state_arguments()
        self._check_literals()

    def _replayed(self, item: Any, index: int) -> str:
        """The task ID of one entry of ``upstream_task_ids``; an XComArg also sets the dependency."""
        producer = getattr(item, "operator", None)  # an XComArg: replay its task's output
        if producer is not None:
            self.set_upstream(producer)
            return producer.task_id
        if not isinstance(item, str) or not item:
            raise ValueError(
                f"{self.task_id}: upstream_task_ids[{index}] is {item!r}: name each task by its task ID "
                "(a string) or pass its .output"
            )
        return item

    def _check_state_arguments(self) -> None:
        """Parse time: ``state`` or ``upstream_task_ids``, not both and not neither (unless the
        state is a decorated function's return value); what they hold is checked in :meth:`_check_literals`."""
        with parse_time(self.task_id):
            if self.replay_task_ids is not None:
                self._check_replay_arguments()
            elif not self.state_from_callable:
                self._check_state_given()

    def _check_literals(self) -> None:
        """Parse time: check every argument that no template or XComArg can still change."""
        timeout = self.decision_timeout
        if not is_seconds(timeout, positive=True):
            raise ValueError(
                f"{self.task_id}: decision_timeout {timeout!r} must be a positive number of seconds"
            )
        if not all(
            is_literal(getattr(self, name, None))
            for name in ("questions", "instructions", "model", "prompt_cache_key")
        ):
            return
        with parse_time(self.task_id):
            request = self._request(None)  # type: ignore[arg-type] # the questions read no context here
            attachments_literal = all(
                isinstance(a, Mapping) and is_literal(dict(a)) for a in self.attachments
            )
            if self.replay_task_ids is None and self.state is not None and is_literal(self.state):
                refuse_empty_state(self.state, allow_empty=self.allow_empty)
                if attachments_literal:
                    attachments = [_as_attachment(a, i) for i, a in enumerate(self.attachments)]
                    validate_state_for_request(
                        request, self.state, attachments, templated="state" in self.template_fields
                    )

    # ------------------------------------------------------------------ inputs

    def _state(self, context: Context) -> Any:
        if self.replay_task_ids is None:
            self._check_state_given()
            return self.state
        self._check_replay_arguments()
        self._check_replayed_tasks()
        items = []
        ti = context["ti"]
        for task_id in self.replay_task_ids:
            output = self._mapped_outputs(ti, task_id)
            if output is None:
                output = ti.xcom_pull(task_ids=task_id, key="return_value")
            if output is None:
                raise SystemZeroArgumentError(
                    f"upstream task {task_id!r} left no output to replay (it returned None, or pushes "
                    "no return value): return the value to decide about from it, or leave it out of "
                    "upstream_task_ids",
                    code="invalid_state",
                    field=f"upstream_task_ids[{task_id}]",
                )
            try:
                json_size(output)
            except (TypeError, ValueError, RecursionError) as exc:
                what = f"the output of upstream task {task_id!r}, replayed as state"
                raise SystemZeroArgumentError(
                    not_json_message(output, what, exc, root="output"),
                    code="invalid_state",
                    field=f"upstream_task_ids[{task_id}]",
                ) from None
            items.append({"task_id": task_id, "output": output})
        return items

    def _mapped_outputs(self, ti: Any, task_id: str) -> list[Any] | None:
        """A mapped upstream task's outputs, one per map index in order (``None``: the task is not
        mapped, or this Airflow cannot count its instances).

        Pulled without map indexes, the outputs of a mapped task leave out every instance that
        returned ``None`` (it pushed nothing), so the state would silently lack them: each index
        is pulled, and a missing one is refused as an unmapped task's ``None`` is.
        """
        task = self.dag.task_dict.get(task_id) if self.has_dag() else None
        count_of = getattr(ti, "get_ti_count", None)
        if not getattr(task, "is_mapped", False) or count_of is None:
            return None
        try:
            count = count_of(dag_id=ti.dag_id, task_ids=[task_id], run_ids=[ti.run_id])
        except Exception as exc:  # an Airflow whose task runner cannot count: as it returns them
            self.log.warning(
                "cannot count the instances of mapped task %r (%s): its outputs are replayed as Airflow "
                "returns them, without the instances that returned None",
                task_id,
                exc,
            )
            return None
        outputs = list(ti.xcom_pull(task_ids=task_id, key="return_value", map_indexes=list(range(count))))
        missing = [index for index, output in enumerate(outputs) if output is None]
        if missing:
            raise SystemZeroArgumentError(
                f"upstream task {task_id!r} is mapped, and its instance(s) at map index {missing} left "
                f"no output to replay (of {count}; each returned None): return a value from every "
                "instance (e.g. a status), or leave the task out of upstream_task_ids",
                code="invalid_state",
                field=f"upstream_task_ids[{task_id}]",
            )
        return outputs

    def _check_state_given(self) -> None:
        """Without ``upstream_task_ids``, ``state`` is given (``None`` is nothing: no template or
        XComArg can fill it when the task runs)."""
        if self.state is None:
            raise SystemZeroArgumentError(
                "state is required unless upstream_task_ids is given: pass state=... (a string, an "
                "array or an object, a template, or an upstream task's .output), or "
                "upstream_task_ids=[...] to decide about upstream tasks' outputs",
                code="invalid_state",
                field="state",
            )

    def _check_replay_arguments(self) -> None:
        """``upstream_task_ids`` names at least one task, and ``state`` is not given beside it."""
        if self.state is not None:
            raise SystemZeroArgumentError(
                "give either state or upstream_task_ids, not both", code="invalid_state", field="state"
            )
        if not self.replay_task_ids:
            raise SystemZeroArgumentError(
                "upstream_task_ids is empty: name at least one task",
                code="invalid_state",
                field="upstream_task_ids",
            )

    def _check_replayed_tasks(self) -> None:
        """Each task replayed is a task of this Dag that runs before this one (its output exists).

        Checked when the task runs, before anything is sent: the Dag's other tasks may be defined
        after this one in the file.
        """
        if not self.has_dag():
            return
        dag = self.dag
        upstream = self.get_flat_relative_ids(upstream=True)
        for task_id in self.replay_task_ids or ():
            if task_id not in dag.task_dict:
                raise SystemZeroArgumentError(
                    f"upstream_task_ids names {task_id!r}, which is not a task of Dag {dag.dag_id!r}"
                    f"{did_you_mean(task_id, dag.task_dict)}: check the spelling (its tasks: "
                    f"{sorted(dag.task_dict)[:20]})",
                    code="invalid_state",
                    field="upstream_task_ids",
                )
            if task_id not in upstream:
                raise SystemZeroArgumentError(
                    f"upstream task {task_id!r} does not run before {self.task_id!r}, so its output "
                    f"may not exist yet: set {task_id} >> {self.task_id}, or pass its .output "
                    "instead of its task ID",
                    code="invalid_state",
                    field="upstream_task_ids",
                )

    def _state_name(self) -> str:
        """The state's origin, for messages."""
        if self.replay_task_ids:
            return f"the state built from the outputs of upstream tasks {self.replay_task_ids}"
        return "state"

    def _request_questions(self, context: Context) -> Any:
        """The questions to ask (subclasses build their own)."""
        return self.questions

    def _gated_question(self, request: Mapping[str, Any]) -> str:
        """The question the policy gates and the ``decision`` record describes."""
        questions = request["questions"]
        if self.policy_question is not None:
            if self.policy_question not in questions:
                raise SystemZeroArgumentError(
                    f"policy_question {self.policy_question!r} is not among the questions "
                    f"({sorted(questions)}){did_you_mean(self.policy_question, questions)}",
                    code="unknown_question",
                    field="policy_question",
                )
            return self.policy_question
        return next(iter(questions))

    def _check_policy(self, request: Mapping[str, Any]) -> None:
        """Check the policy against the gated question before anything is asked."""
        if self.policy is None:
            return
        spec = request["questions"][self._gated_question(request)]
        try:
            self.policy.check(kind=spec.get("type", "boolean"), options=spec.get("options"))
        except ValueError as exc:
            raise SystemZeroArgumentError(str(exc), code="invalid_policy", field="policy") from None

    def _request(self, context: Context) -> dict[str, Any]:
        """The request (questions, model, route, mode, cache key), checked with the policy.

        :raises SystemZeroArgumentError: naming the field.
        """
        return self._request_for(self._request_questions(context))

    def _request_for(self, questions: Any) -> dict[str, Any]:
        """The request asking ``questions``, checked with the policy (also at parse time)."""
        request = build_request_dict(
            questions=questions,
            instructions=self.instructions,
            model=self.model,
            route=self.route,
            mode=self.mode,
            prompt_cache_key=self.prompt_cache_key,
        )
        self._check_policy(request)
        return request

    def _prepare(self, context: Context) -> tuple[dict[str, Any], Any, list[Attachment], str, int]:
        """The request, the state, its attachments, the key namespace and the decide body's size
        (checked: a mistake fails the task before anything is sent)."""
        try:
            request = self._request(context)
            refuse_rendered_none_instructions(request["questions"], self._instruction_templates)
            refuse_rendered_none_options(request["questions"], self._option_templates)
            state = self._state(context)
            # when it runs: a template may fill it
            refuse_empty_state(state, allow_empty=self.allow_empty, template=self._state_template)
            attachments = [_as_attachment(a, i) for i, a in enumerate(self.attachments)]
            body_bytes = validate_state_for_request(
                request,
                state,
                attachments,
                field=self._state_name(),
                too_large="return less from those tasks (a summary, the last part)"
                if self.replay_task_ids
                else None,  # the default fix: send less
                # the state argument itself (a decorated task's state is its function's return value)
                templated=not self.replay_task_ids and "state" in self.template_fields,
            )
        except ARGUMENT_ERRORS as exc:
            raise AirflowFailException(f"{self.task_id}: {exc}") from None
        namespace = context_namespace(context, salt=self.key_salt)
        return request, state, attachments, namespace, body_bytes

    # ------------------------------------------------------------------ running

    def execute(self, context: Context) -> dict[str, Any]:
        """Decide (deferring to the triggerer when deferrable)."""
        request, state, attachments, namespace, body_bytes = self._prepare(context)
        check_connection_before_deferring(self.task_id, self.systemzero_conn_id, request.get("model"))
        self.log.info(
            "asking %d question(s) about a state of %d bytes (sha256 %s)",
            len(request["questions"]),
            json_size(state),
            state_hash(state)[:12],
        )
        if self.deferrable:
            deadline = deadline_in(self, self.decision_timeout)  # execution_timeout, if shorter
            trigger = SystemZeroDecideTrigger(
                systemzero_conn_id=self.systemzero_conn_id,
                request=request,
                state=state,
                key_namespace=namespace,
                attachments=[a.to_dict() for a in attachments],
                deadline=deadline,
                budget=self.trigger_budget(context, body_bytes),
            )
            self.defer(
                trigger=trigger,
                method_name="execute_complete",
                timeout=defer_timeout(deadline),
            )
        decision = self.decide_with_budget(
            context,
            lambda budget: SystemZeroHook(systemzero_conn_id=self.systemzero_conn_id).decide(
                request,
                state=state,
                attachments=attachments,
                key_namespace=namespace,
                identity=namespace,
                timeout=self.decision_timeout,
                budget=budget,
            ),
            body_bytes,
        )
        from airflow_provider_systemzero.tasks.observability import capture_content_enabled

        payload = answers_payload(
            decision, state, key_namespace=namespace, capture_content=capture_content_enabled()
        )
        return self._publish(context, WatchEvent.from_payload(payload))

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> Any:
        """Resume with the trigger's decision; idempotent (the same event gives the same XCom).

        :param event: the trigger's payload.
        """
        event = self.resumed_event(context, event, {context_namespace(context, salt=self.key_salt)})
        if event.status == "timeout":  # whose deadline it was, how long decisions took, what to raise
            reason = timeout_reason(
                self,
                "decision_timeout",
                self.decision_timeout,
                event.extra,
                needs="how long a decision takes",
            )
            event = dataclasses.replace(event, extra={**event.extra, "message": reason})
        if event.status != "success":
            raise task_failure(self.task_id, event)
        return self._publish(context, event)

    def _publish(self, context: Context, event: WatchEvent) -> Any:
        answers = event.answers
        ti = context["ti"]
        self.push_history(context, event, condition=self._policy_drawn(answers))
        ti.xcom_push(key="answers", value=answers)
        ti.xcom_push(key="reply", value=event.reply)
        ti.xcom_push(key="decision_id", value=event.reply_id)
        decisions = {name: answer.get("decision") for name, answer in answers.items()}
        self.log.info(
            "System Zero answered %s (reply %s, state version %s)",
            decisions,
            server_token(event.reply_id),
            event.state_version,
        )
        try:
            request = self._request(context)
        except ARGUMENT_ERRORS as exc:
            raise AirflowFailException(f"{self.task_id}: {exc}") from None
        return self._gate(context, self._make_gate(request, event))

    def _policy_drawn(self, answers: Mapping[str, Any]) -> dict[str, Any] | None:
        """The policy the decision history is drawn against: its bars across the gated question's
        chart (``None`` without a policy)."""
        if self.policy is None:
            return None
        question = self.policy_question or (next(iter(answers)) if len(answers) == 1 else None)
        return None if question is None else {"question": question, "policy": self.policy.to_dict()}

    def _make_gate(self, request: Mapping[str, Any], event: WatchEvent) -> Gate:
        """The gated question's decision, for the policy and the ``decision`` record."""
        question = self._gated_question(request)
        answers = event.answers
        if question not in answers:
            raise AirflowException(
                f"{self.task_id}: the reply has no answer for {question!r} (answers: {sorted(answers)})"
            )
        decisions = {name: answer.get("decision") for name, answer in answers.items()}
        spec = request["questions"][question]
        return Gate.of_event(question, spec, event, answer=answers[question], extra={"decisions": decisions})

    def _apply(self, context: Context, gate: Gate, record: dict[str, Any]) -> dict[str, Any]:
        """Return ``{question: decision}`` with the gated question's answer that took effect."""
        decisions = dict(gate.extra.get("decisions") or {})
        decisions[gate.question] = record["decision"]
        record["effect"] = {"return_value": decisions}
        self._push_record(context, record)
        return decisions
