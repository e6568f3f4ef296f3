"""Operators that act on a System Zero decision: take a branch, or let the rest of the Dag run.

* :class:`SystemZeroBranchOperator` — a choice question whose options are downstream tasks; the
  chosen branch runs, the others are skipped (Airflow's own branching, mapped tasks included).
* :class:`SystemZeroShortCircuitOperator` — a yes/no gate: downstream tasks run only when the
  decision says so.

Both take a :class:`~airflow_provider_systemzero.decisions.policy.DecisionPolicy` (act, ask a person,
fall back), push the ``decision`` audit record, and — like
:class:`~airflow_provider_systemzero.operators.decide.SystemZeroDecideOperator`, which they
extend — decide each state once: a retry replays the same answer unbilled.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowException

from airflow_provider_systemzero.compat import BranchMixIn, SkipMixin
from airflow_provider_systemzero.decisions.policy import DecisionPolicy
from airflow_provider_systemzero.exceptions import SystemZeroArgumentError
from airflow_provider_systemzero.operators.decide import SystemZeroDecideOperator
from airflow_provider_systemzero.protocol.errors import did_you_mean
from airflow_provider_systemzero.tasks.checks import (
    check_flag,
    is_literal,
    parse_time,
    refuse_rendered_none,
    template_of,
)
from airflow_provider_systemzero.tasks.review import Gate

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_systemzero.decisions.watch import WatchEvent

__all__ = ["BranchOption", "SystemZeroBranchOperator", "SystemZeroShortCircuitOperator"]

#: Longest base question name of a multi-select branch (room for ``__<index>``).
_MAX_BASE_NAME = 58


@dataclass(frozen=True)
class BranchOption:
    """One option of a :class:`SystemZeroBranchOperator`.

    :param tasks: the task IDs (or task group IDs) that run when the option is chosen
        (default: the task whose ID is the option's name).
    :param description: what the option means, shown to the model (and to a reviewer).
    :param act_above: this option's own act bar (replaces the policy's).
    :param review_above: this option's own review bar.
    """

    tasks: str | Sequence[str] | None = None
    description: str | None = None
    act_above: float | None = None
    review_above: float | None = None

    def task_ids(self, option: str) -> list[str]:
        """The tasks that run for ``option``."""
        if self.tasks is None:
            return [option]
        return [self.tasks] if isinstance(self.tasks, str) else list(self.tasks)


def _as_option(value: Any, option: str) -> BranchOption:
    if isinstance(value, BranchOption):
        return value
    if isinstance(value, str) or (isinstance(value, Sequence) and not isinstance(value, Mapping)):
        return BranchOption(tasks=value)
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - {"tasks", "description", "act_above", "review_above"})
        if unknown:
            keys = ("tasks", "description", "act_above", "review_above")
            raise ValueError(
                f"branches[{option!r}] has unknown key {unknown[0]!r}{did_you_mean(unknown[0], keys)} "
                f"(keys: {', '.join(keys)})"
            )
        return BranchOption(**value)
    if value is None:
        return BranchOption()
    raise ValueError(
        f"branches[{option!r}] must be task IDs, a BranchOption or a dict, got {type(value).__name__}"
    )


class _GateOperator(SystemZeroDecideOperator):
    """A decide operator whose answer decides which downstream tasks run (it skips the others)."""

    inherits_from_skipmixin = True
    _can_skip_downstream = True
    ui_color = "#e8f0ff"


class SystemZeroBranchOperator(_GateOperator, BranchMixIn):
    """Asks System Zero which branch to take, and takes it.

    The options are the downstream task IDs (sorted, so every worker asks the same question), or
    ``branches``: option names mapped to task IDs / task group IDs, with descriptions and their
    own bars. With ``multiple=True`` several branches may run: each option is asked as its own
    yes/no question (System Zero choice questions pick one option), so every option has its own
    probability and confidence, and the least certain answer decides what the policy does.

    ::

        SystemZeroBranchOperator(
            task_id="route",
            instructions="Which team should handle this ticket?",
            state="{{ ti.xcom_pull(task_ids='fetch_ticket') }}",
            branches={"billing": BranchOption(description="payments, invoices"),
                      "support": BranchOption(description="everything else", act_above=0.6)},
            policy=DecisionPolicy(act_above=0.8, review_above=0.5, below="default", default="support"),
        ) >> [billing, support]

    The ``decision`` record's ``effect`` names the chosen options and the tasks that run; the other
    direct downstream tasks are skipped (tasks downstream of a chosen branch still run, as with
    ``@task.branch``).

    :param instructions: what to decide (templated).
    :param question: the question's name (default ``"branch"``; with ``multiple=True`` the options
        are asked as ``branch__0``, ``branch__1``, …): the name emulator rules match.
    :param branches: option names (a list), or option → task ID(s) / :class:`BranchOption` / dict
        (default: the downstream task IDs, sorted).
    :param descriptions: option → description (added to the instructions).
    :param multiple: allow several branches.
    :param policy: the :class:`~airflow_provider_systemzero.decisions.policy.DecisionPolicy`; its ``default``
        is an option (a list of options with ``multiple=True``).

    Every other parameter is :class:`SystemZeroDecideOperator`'s (``state``, ``upstream_task_ids``,
    ``model``, ``systemzero_conn_id``, ``deferrable``, the review settings, …).
    """

    template_fields: Sequence[str] = (*SystemZeroDecideOperator.template_fields, "branch_instructions")

    def __init__(
        self,
        *,
        instructions: str,
        question: str = "branch",
        branches: Sequence[str] | Mapping[str, Any] | None = None,
        descriptions: Mapping[str, str] | None = None,
        multiple: bool = False,
        policy: Any = None,
        **kwargs: Any,
    ) -> None:
        if "questions" in kwargs or "policy_question" in kwargs:
            raise TypeError("SystemZeroBranchOperator builds its own question: use instructions and branches")
        super().__init__(questions={}, policy=policy, policy_question=question, **kwargs)
        with parse_time(self.task_id):  # a bad option is an import error naming the task
            self.branch_instructions = instructions
            self._branch_template = template_of(instructions)  # what a text rendered as 'None' came from
            self.question = question
            check_flag("multiple", multiple, "several branches may be chosen")
            self.multiple = multiple
            self.descriptions = dict(descriptions or {})
            if multiple and len(question) > _MAX_BASE_NAME:
                raise ValueError(
                    f"{self.task_id}: question names a multi-select branch in at most {_MAX_BASE_NAME} characters"
                )
            self.branches: dict[str, BranchOption] | None = None
            if branches is not None:
                if isinstance(branches, str):
                    branches = [branches]
                if isinstance(branches, Mapping):
                    self.branches = {str(k): _as_option(v, str(k)) for k, v in branches.items()}
                else:
                    self.branches = {str(b): BranchOption() for b in branches}
                if not self.branches:
                    raise ValueError(f"{self.task_id}: branches is empty")
                # as dicts: the policy checks them, naming the option whose bar is wrong
                bars = {
                    name: {"act_above": option.act_above, "review_above": option.review_above}
                    for name, option in self.branches.items()
                    if option.act_above is not None or option.review_above is not None
                }
                if bars:
                    base = self.policy or DecisionPolicy()
                    self.policy = replace(base, options={**base.options, **bars})
        self._check_branch_literals()

    def _check_literals(self) -> None:
        """Called by the base class before the branches are set: see :meth:`_check_branch_literals`."""

    def _check_branch_literals(self) -> None:
        """Parse time: the question built from literal branches and instructions (the downstream
        tasks are known only once the DAG is built: checked when the task runs)."""
        if self.branches is None or not all(
            is_literal(getattr(self, name, None))
            for name in ("branch_instructions", "question", "model", "prompt_cache_key")
        ):
            return
        with parse_time(self.task_id):
            self._request_for(self._questions_for(self.branches))

    # ------------------------------------------------------------------ options and questions

    def _options(self) -> dict[str, BranchOption]:
        """Option name → option, in the order they are asked."""
        if self.branches is not None:
            return self.branches
        downstream = sorted(self.downstream_task_ids)
        if not downstream:
            raise SystemZeroArgumentError(
                "the branch has no downstream tasks to choose from", code="invalid_branches", field="branches"
            )
        return {task_id: BranchOption() for task_id in downstream}

    def _check_targets(self, options: Mapping[str, BranchOption]) -> None:
        dag = self.dag if self.has_dag() else None
        groups = dag.task_group_dict if dag is not None else {}
        downstream = set(self.downstream_task_ids)
        for name, option in options.items():
            for target in option.task_ids(name):
                if target not in downstream and target not in groups:
                    raise SystemZeroArgumentError(
                        f"branches[{name!r}] names {target!r}, which is not a task directly "
                        f"downstream (downstream: {sorted(downstream)}){did_you_mean(target, downstream)}",
                        code="invalid_branches",
                        field=f"branches.{name}",
                    )

    def _description(self, name: str, option: BranchOption) -> str | None:
        return self.descriptions.get(name) or option.description

    def _request_questions(self, context: Context) -> dict[str, Any]:
        options = self._options()
        self._check_targets(options)
        return self._questions_for(options)

    def _questions_for(self, options: Mapping[str, BranchOption]) -> dict[str, Any]:
        text = self.branch_instructions
        refuse_rendered_none(text, self._branch_template, field="instructions", code="invalid_question")
        if not isinstance(text, str) or not text.strip():
            raise SystemZeroArgumentError(
                "instructions must say what to decide, e.g. 'Which team should handle this ticket?'",
                code="invalid_question",
                field="instructions",
            )
        unknown = sorted(set(self.descriptions) - set(options))
        if unknown:
            raise SystemZeroArgumentError(
                f"descriptions names no branch: {unknown[0]!r} (branches: {list(options)})"
                f"{did_you_mean(unknown[0], options)}: fix the name, or drop its description",
                code="invalid_branches",
                field=f"descriptions.{unknown[0]}",
            )
        if not self.multiple:
            described = [
                f"- {name}: {desc}"
                for name, option in options.items()
                if (desc := self._description(name, option))
            ]
            if described:
                text = f"{text}\n\nOptions:\n" + "\n".join(described)
            return {self.question: {"type": "choice", "instructions": text, "options": list(options)}}
        questions = {}
        for index, (name, option) in enumerate(options.items()):
            desc = self._description(name, option)
            questions[f"{self.question}__{index}"] = {
                "type": "boolean",
                "instructions": f"{text}\n\nShould the option {name!r} be chosen?"
                + (f" ({desc})" if desc else ""),
            }
        return questions

    def _gated_question(self, request: Mapping[str, Any]) -> str:
        return self.question

    def _check_policy(self, request: Mapping[str, Any]) -> None:
        if self.policy is None:
            return
        try:
            self.policy.check(kind="choice", options=list(self._options()), multiple=self.multiple)
        except ValueError as exc:
            raise SystemZeroArgumentError(str(exc), code="invalid_policy", field="policy") from None

    def _make_gate(self, request: Mapping[str, Any], event: WatchEvent) -> Gate:
        if not self.multiple:
            return super()._make_gate(request, event)
        options = list(self._options())
        answers = event.answers
        option_answers = {}
        for index, name in enumerate(options):
            key = f"{self.question}__{index}"
            if key not in answers:
                raise AirflowException(f"{self.task_id}: the reply has no answer for option {name!r} ({key})")
            option_answers[name] = answers[key]
        spec = {"instructions": self.branch_instructions, "options": options}
        return Gate.of_event(self.question, spec, event, option_answers=option_answers)

    # ------------------------------------------------------------------ taking the branch

    def _apply(self, context: Context, gate: Gate, record: dict[str, Any]) -> Any:
        chosen = record["decision"]
        chosen = [chosen] if isinstance(chosen, str) else list(chosen or [])
        options = self._options()
        task_ids: list[str] = []
        for name in chosen:
            for target in options[name].task_ids(name):
                if target not in task_ids:
                    task_ids.append(target)
        record["effect"] = {"branches": chosen, "follow": task_ids}
        self._push_record(context, record)
        self.log.info("taking branch(es) %s → tasks %s (%s)", chosen, task_ids, record["decided_by"])
        return self.do_branch(context, task_ids)


class SystemZeroShortCircuitOperator(_GateOperator, SkipMixin):
    """A yes/no gate: downstream tasks run only when System Zero (under the policy) says so.

    The question is a boolean; when the answer that takes effect equals ``proceed_when``
    (``True`` by default) the Dag continues, otherwise downstream tasks are skipped exactly as
    Airflow's ``ShortCircuitOperator`` skips them: every downstream task with
    ``ignore_downstream_trigger_rules=True`` (the default), only the direct ones (letting trigger
    rules decide the rest) with ``False``. Teardown tasks are never skipped.

    ::

        SystemZeroShortCircuitOperator(
            task_id="only_if_fresh",
            instructions="Is the data fresh enough to publish?",
            upstream_task_ids=[measure.output],
            policy=DecisionPolicy(act_above=0.8, review_above=0.5, below="default", default=False),
        ) >> publish

    The return value is the answer that took effect; ``decision``'s ``effect`` says whether the Dag
    proceeds and which tasks were skipped.

    :param instructions: the yes/no question (templated).
    :param question: the question's name (default ``"proceed"``): the name emulator rules match.
    :param proceed_when: the answer that lets downstream tasks run (``False`` makes a "skip if" gate).
    :param ignore_downstream_trigger_rules: skip every downstream task (``True``), or only the direct ones.
    :param policy: the :class:`~airflow_provider_systemzero.decisions.policy.DecisionPolicy`.

    Every other parameter is :class:`SystemZeroDecideOperator`'s.
    """

    template_fields: Sequence[str] = SystemZeroDecideOperator.template_fields

    def __init__(
        self,
        *,
        instructions: str,
        question: str = "proceed",
        proceed_when: bool = True,
        ignore_downstream_trigger_rules: bool = True,
        policy: Any = None,
        **kwargs: Any,
    ) -> None:
        if "questions" in kwargs or "policy_question" in kwargs:
            raise TypeError("SystemZeroShortCircuitOperator builds its own question: use instructions")
        with parse_time(kwargs.get("task_id")):  # a truthy "no" would open the gate
            check_flag("proceed_when", proceed_when, "downstream tasks run on a yes (False: on a no)")
            check_flag(
                "ignore_downstream_trigger_rules",
                ignore_downstream_trigger_rules,
                "a closed gate skips every downstream task (False: only the direct ones)",
            )
        super().__init__(
            questions={question: {"type": "boolean", "instructions": instructions}},
            policy=policy,
            policy_question=question,
            **kwargs,
        )
        self.question = question
        # the question's text is the author's instructions: name that argument
        self._instruction_templates = {
            name: ("instructions", template) for name, (_, template) in self._instruction_templates.items()
        }
        self.proceed_when = proceed_when
        self.ignore_downstream_trigger_rules = ignore_downstream_trigger_rules

    def _tasks_to_skip(self, context: Context) -> Iterable[Any]:
        task = context["task"]
        if self.ignore_downstream_trigger_rules:
            tasks = task.get_flat_relatives(upstream=False)
        else:
            tasks = task.get_direct_relatives(upstream=False)
        return [t for t in tasks if not t.is_teardown]

    def _apply(self, context: Context, gate: Gate, record: dict[str, Any]) -> Any:
        decision = record["decision"]
        proceed = decision is self.proceed_when
        to_skip = [] if proceed else list(self._tasks_to_skip(context))
        record["effect"] = {"proceed": proceed, "skipped": sorted(t.task_id for t in to_skip)}
        self._push_record(context, record)
        if proceed:
            self.log.info(
                "%s = %s (%s): proceeding with downstream tasks",
                gate.question,
                decision,
                record["decided_by"],
            )
        elif to_skip:
            self.log.info(
                "%s = %s (%s): skipping downstream tasks %s",
                gate.question,
                decision,
                record["decided_by"],
                record["effect"]["skipped"],
            )
            self.skip(ti=context["ti"], tasks=to_skip)
        return decision
