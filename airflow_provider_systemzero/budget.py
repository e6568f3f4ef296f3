"""The old home of a task's spend across its tries, kept while the stream client imports from it.

The Airflow side is :mod:`airflow_provider_systemzero.utils.usage`, the arithmetic
:mod:`airflow_provider_systemzero.decisions.budget`. ``scripts/rename_names.py`` points the last
imports of this path at those modules; then this module can go.
"""

from __future__ import annotations

from airflow_provider_systemzero.decisions.budget import (
    BudgetExceeded,
    DecisionBudget,
    Usage,
    connection_window,
    parse_limit,
)
from airflow_provider_systemzero.utils.usage import TaskUsageLedger, UsageBudgetMixin

__all__ = [
    "BudgetExceeded",
    "DecisionBudget",
    "TaskUsageLedger",
    "Usage",
    "UsageBudgetMixin",
    "connection_window",
    "parse_limit",
]
