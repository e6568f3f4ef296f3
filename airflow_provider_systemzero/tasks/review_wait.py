"""Where a person's review waits on Airflow 3.1 and 3.2, which have no ``awaiting_input`` state:
in Airflow's own ``HITLTrigger`` (as ``HITLOperator`` waits there), served under ``dag.test()`` too.

``airflow dags test`` (``dag.test()``) runs a deferred task's trigger in-process, and on 3.1 and
3.2 the in-process supervisor it runs under answers a task's requests only: ``HITLTrigger``'s
request for the review's state (``GetHITLDetailResponse``) and, when the review times out, its
write of the default answer (``UpdateHITLDetail``) end the run with Airflow's "Unhandled request"
error. :class:`ReviewTrigger` is ``HITLTrigger`` plus one shortcut: while it runs under that
in-process supervisor, those two requests go to the supervisor's own Execution API client (the
calls a triggerer makes for them), and every other request goes on as before. In a triggerer, and
wherever the shortcut's parts are missing, it is ``HITLTrigger`` unchanged.

Under ``dag.test()`` it also checks for the answer every second (``HITLTrigger`` checks every 5 s
by default): a person at the terminal waits for it there, and no triggerer is shared.

Its event also carries what the task resumes with (``resume``: the reviewed gate and the policy's
verdict). A triggerer hands the task both its deferral's kwargs and the event, but ``dag.test()``
resumes a deferred task with the event alone.

The shortcut reads private parts of the Task SDK (the supervisor comms, read through
:func:`~airflow_provider_systemzero.compat.supervisor_comms`, and the in-process comms'
``supervisor.client.hitl``) and swaps ``task_runner.SUPERVISOR_COMMS`` while a review waits;
:func:`in_process_review_comms` is the one place that does, and it is checked against the
installed release: it applies only where ``awaiting_input`` is missing (3.1, 3.2) and only to
``InProcessSupervisorComms``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

from airflow.providers.standard.triggers.hitl import HITLTrigger

__all__ = ["IN_PROCESS_POKE_INTERVAL", "ReviewTrigger", "in_process_review_comms"]

#: Seconds between two checks for the answer under ``dag.test()``.
IN_PROCESS_POKE_INTERVAL = 1.0


class _ReviewComms:
    """The in-process comms, with the review's two requests answered by the Execution API client.

    :param comms: ``dag.test()``'s in-process comms.
    :param hitl: the supervisor's Execution API client for reviews.
    :param requests: the classes of the two requests (``GetHITLDetailResponse``, ``UpdateHITLDetail``).
    """

    def __init__(self, comms: Any, hitl: Any, requests: tuple[type, type]) -> None:
        self._comms = comms
        self._hitl = hitl
        self._get_detail, self._update = requests

    def send(self, msg: Any) -> Any:
        """Answer ``GetHITLDetailResponse`` and ``UpdateHITLDetail``; pass anything else on."""
        if isinstance(msg, self._get_detail):
            return self._hitl.get_detail_response(ti_id=msg.ti_id)
        if isinstance(msg, self._update):
            return self._hitl.update_response(
                ti_id=msg.ti_id, chosen_options=msg.chosen_options, params_input=msg.params_input
            )
        return self._comms.send(msg)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._comms, name)


@contextlib.contextmanager
def in_process_review_comms() -> Iterator[bool]:
    """While it is entered, a review's requests are answered under ``dag.test()``'s in-process
    supervisor of Airflow 3.1 / 3.2; yields whether the shortcut applies (``False``: nothing changed).
    """
    from airflow_provider_systemzero.compat import has_awaiting_input, supervisor_comms

    if has_awaiting_input():  # 3.3+: a review never defers to a trigger
        yield False
        return
    try:
        from airflow.sdk.execution_time import task_runner
        from airflow.sdk.execution_time.comms import GetHITLDetailResponse, UpdateHITLDetail
        from airflow.sdk.execution_time.supervisor import InProcessSupervisorComms
    except ImportError:
        yield False
        return
    comms = supervisor_comms()
    hitl = getattr(getattr(getattr(comms, "supervisor", None), "client", None), "hitl", None)
    if not isinstance(comms, InProcessSupervisorComms) or hitl is None:
        yield False
        return
    wrapper = _ReviewComms(comms, hitl, (GetHITLDetailResponse, UpdateHITLDetail))
    task_runner.SUPERVISOR_COMMS = wrapper
    try:
        yield True
    finally:
        if supervisor_comms() is wrapper:
            task_runner.SUPERVISOR_COMMS = comms


class ReviewTrigger(HITLTrigger):
    """Airflow's ``HITLTrigger``, which also runs under ``dag.test()`` on Airflow 3.1 / 3.2 (see
    the module docstring). It takes ``HITLTrigger``'s arguments and fires its events, each with
    ``resume`` added.

    :param resume: what the task resumes with (plain JSON: the gate and the policy's verdict).
    """

    def __init__(self, *, resume: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.resume = dict(resume or {})

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """``HITLTrigger``'s kwargs and ``resume``, under this class's path."""
        _, kwargs = super().serialize()
        return f"{type(self).__module__}.{type(self).__qualname__}", {**kwargs, "resume": self.resume}

    async def run(self) -> AsyncIterator[Any]:
        """``HITLTrigger.run``, with the in-process shortcut while it runs."""
        from airflow.triggers.base import TriggerEvent

        with in_process_review_comms() as in_process:
            if in_process:
                self.poke_interval = min(self.poke_interval, IN_PROCESS_POKE_INTERVAL)
            async for event in super().run():
                payload = event.payload
                yield TriggerEvent({**payload, "resume": self.resume}) if isinstance(payload, dict) else event
