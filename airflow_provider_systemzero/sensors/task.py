"""What the sensor's plain modules read and call of the sensor task.

:mod:`~airflow_provider_systemzero.sensors.inputs`, :mod:`~airflow_provider_systemzero.sensors.poking`
and :mod:`~airflow_provider_systemzero.sensors.outcomes` each take the running
:class:`~airflow_provider_systemzero.sensors.decision.SystemZeroDecisionSensor` and read its
arguments. They name it by this protocol, not by its class: the sensor's module imports theirs, so
naming the class back would tie the four modules in an import loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_systemzero.decisions.budget import DecisionBudget
    from airflow_provider_systemzero.decisions.conditions import DecisionCondition
    from airflow_provider_systemzero.decisions.policy import DecisionPolicy
    from airflow_provider_systemzero.utils.review import TaskLog

__all__ = ["DecisionSensorTask"]


_Result = TypeVar("_Result")


class DecisionSensorTask(Protocol):
    """A :class:`~airflow_provider_systemzero.sensors.decision.SystemZeroDecisionSensor`, as its plain
    modules see it: its arguments (as ``__init__`` stores them), the Airflow operator members they
    read, and the few methods they call."""

    # Airflow's operator
    task_id: str
    dag_id: str
    log: TaskLog
    deferrable: bool
    mode: str
    poke_interval: float
    timeout: float
    soft_fail: bool
    execution_timeout: timedelta | None
    template_fields: Sequence[str]
    start_from_trigger: bool
    start_trigger_args: Any

    # the question and the state
    question: str
    instructions: str | None
    questions: dict[str, Any] | None
    state: Any
    source: dict[str, Any] | None
    allow_empty: bool
    wait_on_static_state: bool

    # the condition
    expect: Any
    min_confidence: float | None
    min_probability: float | None
    policy: DecisionPolicy | None
    consecutive: int
    min_true_for: float

    # the request and the connection
    model: str | None
    route: str | None
    request_mode: str | None
    prompt_cache_key: str | None
    decision_mode: str
    systemzero_conn_id: str
    key_salt: str | None
    key_namespace: str | None
    lease_after: float
    max_staleness: float
    _templates: dict[str, Any]

    def has_dag(self) -> bool:
        """Whether the task belongs to a Dag yet."""
        ...

    def _trigger_kwargs(
        self,
        inputs: tuple[dict[str, Any], DecisionCondition, dict[str, Any] | None],
        namespace: str,
        deadline: float | None,
        budget: dict[str, Any],
        skip: list[str],
    ) -> dict[str, Any]:
        """The trigger's kwargs (the one place the sensor builds its trigger)."""
        ...

    @property
    def this_try(self) -> dict[str, Any] | None:
        """What this try spent so far (carried through a review)."""
        ...

    def resume_try(self, carried: Any) -> None:
        """Take the try's record an earlier part carried here."""
        ...

    def start_trigger_budget(self) -> dict[str, Any]:
        """The task's budget, for a trigger started before any worker runs."""
        ...

    def decide_with_budget(
        self,
        context: Mapping[str, Any],
        call: Callable[[DecisionBudget], _Result],
        body_bytes: int | None = None,
    ) -> _Result:
        """Run a synchronous decide under this try's budget."""
        ...

    def _push_record(self, context: Context, record: dict[str, Any]) -> None:
        """Push the ``decision`` audit record to XCom."""
        ...
