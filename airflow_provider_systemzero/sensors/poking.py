"""The sensor's poke path: the same watch as the deferrable trigger's, one poke at a time.

A poke reads the source — the same source object a trigger would build, kept across the pokes,
so a file reads the same bytes and the "no content" rule and its messages are the trigger's —
and hands the read to the sensor's
:class:`~airflow_provider_systemzero.decisions.source_watch.SourceWatch`, kept across the pokes,
which says whether a decision is wanted (a state it has no current decision about), asks System
Zero about it (one on_request decide, under the task's spending cap) and judges the decision as a
trigger does with a polled source: against the newest read (a change during the decide is read,
and decided, at the next poke), and the rules of the wait — the condition, its policy, the states a person already said
"no" about, the run of decisions (hysteresis) — are the trigger's
:class:`~airflow_provider_systemzero.decisions.watch.DecisionWatch`. When the wait ends, the poke gets
the same :class:`~airflow_provider_systemzero.decisions.watch.WatchEvent` the trigger would have fired.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Collection, Iterator
from typing import TYPE_CHECKING, Any

from airflow_provider_systemzero.compat import (
    AirflowFailException,
    AirflowSensorTimeout,
    AirflowSkipException,
    AirflowTaskTimeout,
)
from airflow_provider_systemzero.decisions.source_watch import Decide, Fire, Open, Release, SourceWatch
from airflow_provider_systemzero.decisions.watch import DecisionWatch, WatchEvent
from airflow_provider_systemzero.exceptions import ARGUMENT_ERRORS
from airflow_provider_systemzero.hooks.systemzero import DEFAULT_DECIDE_TIMEOUT, SystemZeroHook
from airflow_provider_systemzero.identity import context_namespace, state_hash
from airflow_provider_systemzero.questions import validate_state_for_request
from airflow_provider_systemzero.sensors.inputs import Inputs, ends_when_unmet, source_name
from airflow_provider_systemzero.sensors.outcomes import static_unmet
from airflow_provider_systemzero.sources.spec import build_source
from airflow_provider_systemzero.stream.exceptions import DeadlineExceeded

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_systemzero.protocol.body import JSONValue
    from airflow_provider_systemzero.protocol.reply import DecisionResult
    from airflow_provider_systemzero.sensors.task import DecisionSensorTask
    from airflow_provider_systemzero.sources.base import StateSource

__all__ = ["PokeWatch"]


class PokeWatch:
    """A poking sensor's watch, kept across its pokes (in one worker process).

    :param skip_states: hashes of states a person already said "no" about.
    """

    def __init__(self, skip_states: Collection[str] = ()) -> None:
        self.skip_states = list(skip_states)
        #: why the last poke did not end the wait (quoted when the sensor times out), ``None`` before one
        self.last_reason: str | None = None
        self._rules: DecisionWatch | None = None
        self._watch: SourceWatch | None = None
        #: the source, built at the first poke and read at each (a file keeps its read position)
        self._source: StateSource | None = None
        self._slot_noted = False
        #: when the first poke started (``time.monotonic()``): the sensor's timeout counts from it
        self._started: float | None = None

    def time_left(self, sensor: DecisionSensorTask) -> float:
        """Seconds left of the sensor's ``timeout``, counted from the first poke in this process
        (in ``reschedule`` mode each poke is a process of its own: at most the whole timeout)."""
        now = time.monotonic()
        started = now if self._started is None else self._started
        return max(0.0, float(sensor.timeout) - (now - started))

    @contextlib.contextmanager
    def explaining_timeout(self) -> Iterator[None]:
        """Around the poking: Airflow's timeout gets why the last poke did not end the wait.

        With ``soft_fail`` Airflow skips instead, saying only "Skipping due to soft_fail" for a
        poke's failure or its own timeout text: the skip says the same as the failure would have.
        """
        try:
            yield
        except AirflowSensorTimeout as timeout:
            raise AirflowSensorTimeout(self._why(timeout)) from None
        except AirflowSkipException as skip:
            cause = skip.__cause__
            if isinstance(cause, AirflowSensorTimeout | AirflowTaskTimeout | AirflowFailException):
                raise AirflowSkipException(f"{self._why(cause)} (skipped: soft_fail)") from cause
            if not str(skip).startswith("Sensor has timed out"):
                raise  # a skip of the sensor's own (a static state unmet), already explained
            raise AirflowSkipException(self._why(skip)) from None

    def _why(self, ended: BaseException) -> str:
        """``ended``'s message, with why the last poke did not end the wait after a timeout: the
        last decision, and the hold rule (``consecutive``, ``min_true_for``) when it met the
        condition but the rule kept it from ending the wait."""
        if self.last_reason is None or isinstance(ended, AirflowFailException):
            return str(ended)
        rules = self._rules
        held = (
            None
            if rules is None
            else rules.held_back(time.monotonic(), more_time="raise the sensor's timeout")
        )
        return "; ".join(filter(None, [str(ended), self.last_reason, held]))

    def poke(self, sensor: DecisionSensorTask, context: Context, inputs: Inputs) -> WatchEvent | None:
        """Read the source, decide when the watch wants a decision, and say whether the wait ends.

        :param sensor: the poking sensor (its source, connection, budget and log).
        :param inputs: the sensor's request, condition and source.
        :return: the event that ends the wait (or asks a person), else ``None``.
        :raises AirflowFailException: the source's state cannot be sent, or a static state's decision
            did not meet the condition (``AirflowSkipException`` with ``soft_fail``).
        """
        request, condition, source = inputs
        if self._started is None:  # the sensor's timeout counts from the first poke, decided or not
            self._started = time.monotonic()
        if sensor.mode == "poke" and not self._slot_noted:
            self._slot_noted = True
            sensor.log.warning(
                "poke mode: this sensor holds a worker slot for its whole wait (timeout %s s); pass "
                "deferrable=True (or set [operators] default_deferrable = True) to wait in the "
                "triggerer instead",
                sensor.timeout,
            )
        if self._watch is None:
            from airflow_provider_systemzero.triggers.watching import new_timeline

            self._rules = DecisionWatch(
                condition,
                skip_states=self.skip_states,
                end_when_unmet=ends_when_unmet(sensor, source),
                timeline=new_timeline(),
            )
            # a poke decides on request; its "stream" is the poke's own decide, given back at once
            self._watch = SourceWatch(
                self._rules,
                decision_mode="on_request",
                lease_after=0.0,
                max_staleness=sensor.max_staleness,
                timeline=self._rules.timeline,
                question=condition.question,
            )
        watch = self._watch
        state = self._read(sensor, source)
        if self._source is not None and self._source.withheld(state):  # a file without content
            self.last_reason = f"the last poke: {self._source.waiting_on()}"
            sensor.log.info("%s; the next poke reads it again", self.last_reason)
            return None
        namespace = context_namespace(context, salt=sensor.key_salt)
        while actions := watch.actions(time.monotonic()):
            for action in actions:
                if isinstance(action, Open):
                    watch.opened(time.monotonic())
                elif isinstance(action, Release):
                    watch.released(time.monotonic())
                elif isinstance(action, Decide):
                    try:
                        decision = self._decide(sensor, context, request, watch.sent, namespace)
                    except BaseException:
                        watch.lost(time.monotonic())  # the next poke (or try) decides afresh
                        raise
                    # judged against the newest read, as a polled source's in the triggerer: a
                    # change during the decide is read, and decided, at the next poke
                    watch.decided(decision, time.monotonic(), covers=True, state_hash=state_hash(watch.sent))
                    assert self._rules is not None
                    self.last_reason = self._rules.last_reason
                elif isinstance(action, Fire):
                    assert self._rules is not None
                    event = self._rules.sensor_event(action.verdict, key_namespace=namespace, deadline=None)
                    if event.status == "unmet":
                        static_unmet(sensor, str(event.reason))
                    return event
        return None

    def _read(self, sensor: DecisionSensorTask, source: dict[str, Any] | None) -> JSONValue:
        """Read the source (built at the first poke) and hand the read to the watch.

        :raises AirflowFailException: the source cannot be read as a state.
        """
        assert self._watch is not None
        try:
            if self._source is None:
                self._source = build_source(source, sensor.state)
            state = self._source.read_now()
            withheld = self._source.withheld(state)
        except ARGUMENT_ERRORS as exc:
            raise AirflowFailException(f"{sensor.task_id}: {exc}") from None
        self._watch.read(state, time.monotonic(), withheld=withheld)
        return state

    def _decide(
        self,
        sensor: DecisionSensorTask,
        context: Context,
        request: dict[str, Any],
        state: JSONValue,
        namespace: str,
    ) -> DecisionResult:
        """One on_request decision about ``state``, under the task's spending cap, ended by the
        sensor's timeout at the latest.

        :raises AirflowFailException: the state cannot be sent.
        :raises AirflowSensorTimeout: the sensor's timeout passed during the decision.
        """
        try:
            body_bytes = validate_state_for_request(request, state, field=source_name(sensor.source))
        except ARGUMENT_ERRORS as exc:
            raise AirflowFailException(f"{sensor.task_id}: {exc}") from None
        hook = SystemZeroHook(systemzero_conn_id=sensor.systemzero_conn_id)
        # a poke's decide ends by the sensor's timeout (Airflow checks it only between pokes)
        time_left = self.time_left(sensor)
        limit = min(DEFAULT_DECIDE_TIMEOUT, time_left)
        try:
            return sensor.decide_with_budget(
                context,
                lambda budget: hook.decide(
                    request,
                    state=state,
                    key_namespace=namespace,
                    identity=namespace,
                    budget=budget,
                    timeout=limit,
                ),
                body_bytes,
            )
        except DeadlineExceeded as exc:
            if limit < time_left:
                raise  # the decide's own limit, not the sensor's timeout: Airflow's retries apply
            raise AirflowSensorTimeout(
                f"{sensor.task_id}: the sensor's timeout ({sensor.timeout} s) passed during a poke's "
                f"decision ({exc})"
            ) from None
