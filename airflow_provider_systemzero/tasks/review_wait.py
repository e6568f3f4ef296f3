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
installed release: it applies only to ``InProcessSupervisorComms`` (a sensor's trigger reads its open review
under ``dag.test()`` on 3.3 too).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

from airflow.providers.standard.triggers.hitl import HITLTrigger

__all__ = [
    "IN_PROCESS_POKE_INTERVAL",
    "SYSTEMZERO_ANSWER",
    "OpenReview",
    "ReviewTrigger",
    "closed_by_the_sensor",
    "in_process_review_comms",
]

#: Seconds between two checks for the answer under ``dag.test()``.
IN_PROCESS_POKE_INTERVAL = 1.0
#: The key of ``params_input`` in an answer a sensor wrote itself (a request it closed).
SYSTEMZERO_ANSWER = "systemzero"


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
    supervisor; yields whether the shortcut applies (``False``: nothing changed).
    """
    from airflow_provider_systemzero.compat import supervisor_comms

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


class OpenReview:
    """The review request of a task instance, read and answered from its trigger through the
    triggerer's channel (the calls ``HITLTrigger`` makes): a sensor's trigger watches its source
    while a person is asked, and reads the answer, closes a request whose state was replaced, and
    writes the timeout's default itself.

    :meth:`read` and :meth:`write` are the channel (a test's world overrides them); :meth:`close`
    is the rule on top of it.

    :param ti_id: the task instance's ID (its one request per try).
    """

    def __init__(self, ti_id: str) -> None:
        self.ti_id = ti_id

    async def read(self) -> dict[str, Any] | None:
        """The request's answer, in the form Airflow resumes a task with (``chosen_options``,
        ``params_input``, ``responded_at`` in ISO 8601, ``responded_by_user``, ``timedout``: an
        answer nobody gave is the timeout's default, as ``HITLTrigger`` reads it); ``None`` while
        it has none."""
        from airflow.sdk.execution_time.hitl import get_hitl_detail_content_detail
        from asgiref.sync import sync_to_async

        with in_process_review_comms():
            detail = await sync_to_async(get_hitl_detail_content_detail)(ti_id=self.ti_id)
        if not (detail.response_received and detail.chosen_options):
            return None
        return _answer_of(detail)

    async def write(self, chosen: list[str], params: dict[str, Any]) -> None:
        """Write an answer (Airflow refuses it once the request has one).

        :param chosen: the options (at least one).
        :param params: the answer's ``params_input``.
        """
        from airflow.sdk.execution_time.hitl import update_hitl_detail_response
        from asgiref.sync import sync_to_async

        with in_process_review_comms():
            await sync_to_async(update_hitl_detail_response)(
                ti_id=self.ti_id, chosen_options=chosen, params_input=params
            )

    async def close(self, chosen: list[str], why: dict[str, Any]) -> dict[str, Any] | None:
        """Answer the request on Airflow's side so it no longer shows as required, unless it has an
        answer already: one the sensor wrote stays (nothing is written twice); a person's is
        returned, and is what the request keeps.

        :param chosen: the options written (Airflow needs at least one).
        :param why: written as the answer's ``params_input`` (what closed it).
        :return: the person's answer, when one came first; ``None`` once the request is closed.
        """
        answered = await self.read()
        if answered is None:
            try:
                await self.write(chosen, why)
                return None
            except Exception:
                answered = await self.read()  # a person answered between the read and the write
                if answered is None:
                    raise
        return None if closed_by_the_sensor(answered) else answered


def closed_by_the_sensor(answer: Mapping[str, Any]) -> bool:
    """Whether ``answer`` is one a sensor wrote to close its request (not a person's, nor the
    timeout's default).

    :param answer: a Human-in-the-loop answer (``params_input`` …).
    """
    params = answer.get("params_input")
    return isinstance(params, Mapping) and SYSTEMZERO_ANSWER in params


def _answer_of(detail: Any) -> dict[str, Any]:
    """A Human-in-the-loop detail's answer as plain JSON (one nobody gave is the timeout's)."""
    responded_at = getattr(detail, "responded_at", None)
    user = getattr(detail, "responded_by_user", None)
    return {
        "chosen_options": list(detail.chosen_options or []),
        "params_input": dict(getattr(detail, "params_input", None) or {}),
        "responded_at": responded_at.isoformat() if hasattr(responded_at, "isoformat") else responded_at,
        "responded_by_user": None if user is None else {"id": user.id, "name": user.name},
        "timedout": user is None,
    }
