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
:class:`~airflow_provider_systemzero.decisions.watch.VerdictRules`. When the wait ends, the poke gets
the same :class:`~airflow_provider_systemzero.decisions.watch.WatchEvent` the trigger would have fired.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Collection, Iterator
from typing import TYPE_CHECKING, Any

from airflow_provider_systemzero.compat import (
    AirflowFailException,
    AirflowSensorTimeout,
    AirflowSkipException,
    AirflowTaskTimeout,
)
from airflow_provider_systemzero.decisions.source_watch import Decide, Fire, Open, Release, SourceWatch
from airflow_provider_systemzero.decisions.watch import VerdictRules, WatchEvent
from airflow_provider_systemzero.exceptions import ARGUMENT_ERRORS
from airflow_provider_systemzero.identity import state_hash
from airflow_provider_systemzero.sources.spec import build_source

if TYPE_CHECKING:
    from logging import Logger, LoggerAdapter

    from airflow_provider_systemzero.protocol.body import JSONValue
    from airflow_provider_systemzero.protocol.reply import DecisionResult
    from airflow_provider_systemzero.sensors.inputs import SensorInputs
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
        self._rules: VerdictRules | None = None
        self._watch: SourceWatch | None = None
        #: the source, built at the first poke and read at each (a file keeps its read position)
        self._source: StateSource | None = None
        #: when the first poke started (``time.monotonic()``): the sensor's timeout counts from it
        self._started: float | None = None

    @property
    def started(self) -> bool:
        """Whether a poke started in this process."""
        return self._started is not None

    def time_left(self, timeout: float) -> float:
        """Seconds left of the sensor's ``timeout``, counted from the first poke in this process
        (in ``reschedule`` mode each poke is a process of its own: at most the whole timeout).

        :param timeout: the sensor's ``timeout`` in seconds.
        """
        now = time.monotonic()
        started = now if self._started is None else self._started
        return max(0.0, float(timeout) - (now - started))

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

    def poke(
        self,
        inputs: SensorInputs,
        *,
        state: JSONValue,
        end_when_unmet: bool,
        max_staleness: float,
        namespace: str,
        decide: Callable[[JSONValue], DecisionResult],
        task_id: str,
        log: Logger | LoggerAdapter[Logger],
    ) -> WatchEvent | None:
        """Read the source, decide when the watch wants a decision, and say whether the wait ends.

        :param inputs: the sensor's request, condition and source.
        :param state: the sensor's ``state`` (a source's initial state).
        :param end_when_unmet: a decision that does not meet the condition ends the wait (a static state).
        :param max_staleness: the sensor's ``max_staleness``.
        :param namespace: the task's key namespace (the event's).
        :param decide: one on_request decide about a state, under the task's spending cap.
        :param task_id: the sensor's task ID (its errors start with it).
        :param log: the task's log.
        :return: the event that ends the wait (or asks a person), else ``None``.
        :raises AirflowFailException: the source cannot be read as a state.
        """
        if self._started is None:  # the sensor's timeout counts from the first poke, decided or not
            self._started = time.monotonic()
        if self._watch is None:
            from airflow_provider_systemzero.triggers.watching import new_timeline

            self._rules = VerdictRules(
                inputs.condition,
                skip_states=self.skip_states,
                end_when_unmet=end_when_unmet,
                timeline=new_timeline(),
            )
            # a poke decides on request; its "stream" is the poke's own decide, given back at once
            self._watch = SourceWatch(
                self._rules,
                decision_mode="on_request",
                lease_after=0.0,
                max_staleness=max_staleness,
                timeline=self._rules.timeline,
                question=inputs.condition.question,
            )
        watch, rules = self._watch, self._rules
        assert rules is not None
        read = self._read(inputs.source, state, task_id)
        if self._source is not None and self._source.withheld(read):  # a file without content
            self.last_reason = f"the last poke: {self._source.waiting_on()}"
            log.info("%s; the next poke reads it again", self.last_reason)
            return None
        while actions := watch.actions(time.monotonic()):
            for action in actions:
                if isinstance(action, Open):
                    watch.opened(time.monotonic())
                elif isinstance(action, Release):
                    watch.released(time.monotonic())
                elif isinstance(action, Decide):
                    try:
                        decision = decide(watch.sent)
                    except BaseException:
                        watch.lost(time.monotonic())  # the next poke (or try) decides afresh
                        raise
                    # judged against the newest read, as a polled source's in the triggerer: a
                    # change during the decide is read, and decided, at the next poke
                    watch.decided(decision, time.monotonic(), covers=True, state_hash=state_hash(watch.sent))
                    self.last_reason = rules.last_reason
                elif isinstance(action, Fire):
                    return rules.sensor_event(action.verdict, key_namespace=namespace, deadline=None)
        return None

    def _read(self, source: dict[str, Any] | None, state: JSONValue, task_id: str) -> JSONValue:
        """Read the source (built at the first poke) and hand the read to the watch.

        :raises AirflowFailException: the source cannot be read as a state.
        """
        assert self._watch is not None
        try:
            if self._source is None:
                self._source = build_source(source, state)
            read = self._source.read_now()
            withheld = self._source.withheld(read)
        except ARGUMENT_ERRORS as exc:
            raise AirflowFailException(f"{task_id}: {exc}") from None
        self._watch.read(read, time.monotonic(), withheld=withheld)
        return read
