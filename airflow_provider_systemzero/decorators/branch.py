"""``@task.systemzero_branch``: the decorated function returns the state; System Zero picks the
downstream branch.

::

    @task.systemzero_branch(instructions="Which team should handle this ticket?",
                            descriptions={"billing": "payments, invoices", "support": "anything else"},
                            policy=DecisionPolicy(act_above=0.8, review_above=0.5))
    def route(ticket: dict) -> dict:
        return ticket                       # the state

    route(ticket) >> [billing(), support()]

The options are the downstream task IDs (sorted) unless ``branches`` names them; every keyword of
:class:`~airflow_provider_systemzero.operators.branch.SystemZeroBranchOperator` works except
``state`` and ``upstream_task_ids``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk.bases.decorator import DecoratedOperator, task_decorator_factory

from airflow_provider_systemzero.decorators.systemzero import StateFunctionMixin
from airflow_provider_systemzero.operators.branch import SystemZeroBranchOperator

if TYPE_CHECKING:
    from airflow.sdk.bases.decorator import TaskDecorator

__all__ = ["systemzero_branch_task"]


class _SystemZeroBranchDecoratedOperator(StateFunctionMixin, DecoratedOperator, SystemZeroBranchOperator):
    """``@task.systemzero_branch``: the function's return value is the state."""

    template_fields: Sequence[str] = (
        *DecoratedOperator.template_fields,
        *(f for f in SystemZeroBranchOperator.template_fields if f not in ("state", "replay_task_ids")),
    )
    template_fields_renderers = {"op_args": "py", "op_kwargs": "py"}
    custom_operator_name = "@task.systemzero_branch"

    def __init__(self, *, python_callable: Callable[..., Any], **kwargs: Any) -> None:
        self._check_state_kwargs(kwargs)
        super().__init__(python_callable=python_callable, **kwargs)


def systemzero_branch_task(
    python_callable: Callable[..., Any] | None = None, multiple_outputs: bool | None = None, **kwargs: Any
) -> TaskDecorator:
    """Wrap a function that returns a state into a System Zero branch (``@task.systemzero_branch``).

    :param python_callable: the function (returns the state).
    :param multiple_outputs: unused by branching; accepted for symmetry with ``@task``.
    :param kwargs: :class:`~airflow_provider_systemzero.operators.branch.SystemZeroBranchOperator`'s
        keywords (``instructions``, ``branches``, ``descriptions``, ``multiple``, ``policy``, …).
    """
    return task_decorator_factory(
        python_callable=python_callable,
        multiple_outputs=multiple_outputs,
        decorated_operator_class=_SystemZeroBranchDecoratedOperator,
        **kwargs,
    )
