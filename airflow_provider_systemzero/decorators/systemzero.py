"""``@task.systemzero``: the decorated function returns the state; the task asks the questions
about it and returns the answers.

::

    from airflow.sdk import task

    @task.systemzero(questions={"urgent": "Does this ticket report an outage?"},
                     policy=DecisionPolicy(act_above=0.8, review_above=0.5, below="default", default=False))
    def triage(ticket: dict) -> dict:
        return {"subject": ticket["subject"], "body": ticket["body"]}   # the state

    triage(ticket)   # -> {"urgent": True}; the "decision" XCom holds the audit record

Every keyword of :class:`~airflow_provider_systemzero.operators.decide.SystemZeroDecideOperator`
works except ``state`` and ``upstream_task_ids`` (the function's return value is the state).
The function runs once per attempt, on the worker, before the task defers; the answer is
decided once per state (a retry that returns the same state replays it unbilled).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk.bases.decorator import DecoratedOperator, task_decorator_factory
from airflow.sdk.definitions.context import context_merge

from airflow_provider_systemzero.compat import AirflowFailException, KeywordParameters
from airflow_provider_systemzero.operators.decide import SystemZeroDecideOperator

if TYPE_CHECKING:
    from airflow.sdk import Context
    from airflow.sdk.bases.decorator import TaskDecorator

__all__ = ["StateFunctionMixin", "systemzero_task"]


class StateFunctionMixin:
    """Runs the decorated function to get the state, then lets the operator decide."""

    #: the function returns the state when the task runs: no ``state`` is given at parse time
    state_from_callable = True
    python_callable: Callable[..., Any]
    op_args: Sequence[Any]
    op_kwargs: dict[str, Any]
    task_id: str
    state: Any

    def execute(self, context: Context) -> Any:
        """Run the function for the state, then decide as the System Zero operator does."""
        self.state = self._state_from_function(context)
        # the System Zero operator's execute (after DecoratedOperator's, which would run the function)
        return super(DecoratedOperator, self).execute(context)  # type: ignore[misc]

    def _check_state_kwargs(self, kwargs: dict[str, Any]) -> None:
        for name in ("state", "upstream_task_ids"):
            if name in kwargs:
                raise TypeError(
                    f"{type(self).custom_operator_name}: the decorated function returns the state; "  # type: ignore[attr-defined]
                    f"do not pass {name}"
                )

    def _state_from_function(self, context: Context) -> Any:
        context_merge(context, self.op_kwargs)
        kwargs = KeywordParameters.determine(self.python_callable, self.op_args, context).unpacking()
        state = self.python_callable(*self.op_args, **kwargs)
        if state is None:
            raise AirflowFailException(
                f"{self.task_id}: the decorated function returned None; return the state "
                "to decide about (a string, a list or a dict)"
            )
        return state


class _SystemZeroDecoratedOperator(StateFunctionMixin, DecoratedOperator, SystemZeroDecideOperator):
    """``@task.systemzero``: the function's return value is the state."""

    template_fields: Sequence[str] = (
        *DecoratedOperator.template_fields,
        *(f for f in SystemZeroDecideOperator.template_fields if f not in ("state", "replay_task_ids")),
    )
    template_fields_renderers = {"op_args": "py", "op_kwargs": "py", "questions": "json"}
    custom_operator_name = "@task.systemzero"

    def __init__(self, *, python_callable: Callable[..., Any], **kwargs: Any) -> None:
        self._check_state_kwargs(kwargs)
        super().__init__(python_callable=python_callable, **kwargs)


def systemzero_task(
    python_callable: Callable[..., Any] | None = None, multiple_outputs: bool | None = None, **kwargs: Any
) -> TaskDecorator:
    """Wrap a function that returns a state into a System Zero decision task (``@task.systemzero``).

    :param python_callable: the function (returns the state).
    :param multiple_outputs: push each question's answer as its own XCom key too.
    :param kwargs: :class:`~airflow_provider_systemzero.operators.decide.SystemZeroDecideOperator`'s
        keywords (``questions``, ``policy``, ``model``, …).
    """
    return task_decorator_factory(
        python_callable=python_callable,
        multiple_outputs=multiple_outputs,
        decorated_operator_class=_SystemZeroDecoratedOperator,
        **kwargs,
    )
