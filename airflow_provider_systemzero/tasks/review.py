"""Acting on a decision under a :class:`~airflow_provider_systemzero.decisions.policy.DecisionPolicy`,
with a person asked through Airflow's own human-in-the-loop machinery.

:class:`PolicyGateMixin` is shared by every System Zero operator and the sensor. Given a
decision (a :class:`Gate`), it asks the policy what to do and then:

* ``act`` — takes the model's answer (``decided_by: model``);
* ``default`` — takes the policy's default answer (``decided_by: policy``);
* ``fail`` / ``skip`` — records why and fails or skips the task (``decided_by: policy``);
* ``review`` — writes a Human-in-the-loop request (``upsert_hitl_detail``, the same call
  :class:`~airflow.providers.standard.operators.hitl.HITLOperator` makes) and parks the task in
  Airflow 3.3's ``awaiting_input`` state (``TaskAwaitingInput``): no worker slot, no triggerer.
  On Airflow 3.1 and 3.2, which have no such state, the task defers to Airflow's ``HITLTrigger``
  instead (as ``HITLOperator`` does there): the wait holds a triggerer slot, not a worker.
  The request shows the question, a summary of the state, the model's answer with its
  probability and confidence, the ranked alternatives, the bars and why a person is asked.
  A deferrable sensor defers to its own trigger instead and goes on watching its source while
  the person decides (:mod:`~airflow_provider_systemzero.triggers.review`): a review is about
  the one state its request shows, and Airflow keeps one request per task try.
  The Required Actions page (or ``PATCH .../hitlDetails``) resumes the task in
  :meth:`PolicyGateMixin.execute_review_complete`: the person's answer becomes the decision
  (``decided_by: human``). When ``review_timeout`` passes, the scheduler's timeout sweep answers
  with the policy's default (``decided_by: timeout_default``), or — with no default — the task
  does what ``below`` says.

Every path pushes the ``decision`` XCom (:func:`~airflow_provider_systemzero.decisions.policy.decision_record`),
``pending_review`` while a person is asked (``decided_by: null``: nothing is decided yet), ``final`` after.

Retries: the model's answer replays unbilled (same state, same keys). A person's answer is kept
in the task's state store (``context["task_state_store"]``, which outlives retries), keyed by the
question and the state's hash, so a retry about the same state takes it again instead of asking
twice.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_provider_systemzero.compat import AirflowFailException, AirflowSkipException
from airflow_provider_systemzero.decisions.policy import (
    DecisionPolicy,
    PolicyOutcome,
    answer_numbers,
    decision_record,
    ranked_answers,
    state_preview,
)
from airflow_provider_systemzero.durations import readable
from airflow_provider_systemzero.exceptions import SystemZeroArgumentError
from airflow_provider_systemzero.protocol.untrusted import safe_text
from airflow_provider_systemzero.timestamps import utc_iso

if TYPE_CHECKING:
    from logging import Logger

    from airflow.sdk import Context

    from airflow_provider_systemzero.decisions.watch import WatchEvent

__all__ = [
    "DECISION_XCOM_KEY",
    "Gate",
    "PolicyGateMixin",
    "answer_record",
    "review_body",
    "review_endpoint",
    "state_preview",
]

#: The XCom key of the audit record.
DECISION_XCOM_KEY = "decision"
#: Labels of a boolean question's answers in the review form.
BOOLEAN_LABELS = {True: "Yes", False: "No"}


@dataclass
class Gate:
    """One decision to act on: the question, the model's answer(s) and where they come from.

    Plain data (it travels through ``awaiting_input`` as JSON).

    :param question: the gated question's name.
    :param kind: ``boolean`` or ``choice``.
    :param instructions: the question's instructions (shown to a reviewer).
    :param options: a choice question's options, or a multi-select branch's options.
    :param multiple: the answer is a set of options, one boolean answer per option.
    :param answer: the model's answer in dict form (single answers).
    :param option_answers: option → its boolean answer in dict form (multi-select).
    :param model: the model that answered.
    :param reply_id: the reply's ID.
    :param request_id: the decide call's request ID.
    :param state_version: the state version the decision covers.
    :param state_hash: SHA-256 of the state.
    :param state_bytes: the state's size in bytes.
    :param preview: a short view of the state for a reviewer.
    :param extra: the task's own data carried through a review (JSON).
    :param decided_at: when System Zero decided (UTC ISO 8601).
    """

    question: str
    kind: str
    instructions: str | None = None
    options: list[str] | None = None
    multiple: bool = False
    answer: dict[str, Any] | None = None
    option_answers: dict[str, dict[str, Any]] | None = None
    model: str | None = None
    reply_id: str | None = None
    request_id: str | None = None
    state_version: int | None = None
    state_hash: str | None = None
    state_bytes: int | None = None
    preview: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    decided_at: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Gate:
        """Read :meth:`to_dict` output."""
        return cls(**dict(data))

    @classmethod
    def of_event(
        cls,
        question: str,
        spec: Mapping[str, Any],
        event: WatchEvent,
        *,
        answer: Mapping[str, Any] | None = None,
        option_answers: Mapping[str, Mapping[str, Any]] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Gate:
        """The gate of ``question`` for a decision read back from its event: the one way the
        operators and the sensor build a gate.

        :param question: the gated question.
        :param spec: the question's request form (``type``, ``instructions``, ``options``).
        :param event: the decision's event.
        :param answer: the question's answer in dict form (single answers).
        :param option_answers: option → its answer (a multi-select branch: the gate is a choice).
        :param extra: the task's own data carried through a review.
        """
        info = event.state_info
        return cls(
            question=question,
            kind="choice" if option_answers is not None else spec.get("type", "boolean"),
            instructions=spec.get("instructions"),
            options=list(spec["options"]) if spec.get("options") else None,
            multiple=option_answers is not None,
            answer=dict(answer) if answer is not None else None,
            option_answers=None
            if option_answers is None
            else {k: dict(v) for k, v in option_answers.items()},
            model=event.model,
            reply_id=event.reply_id,
            request_id=event.request_id,
            state_version=event.state_version,
            state_hash=event.state_hash,
            state_bytes=info.get("state_bytes"),
            preview=info.get("preview"),
            extra=dict(extra or {}),
            decided_at=event.decided_at,
        )

    @property
    def proposed(self) -> Any:
        """The model's answer: a decision, or the options answered ``true`` (multi-select)."""
        if self.multiple:
            return [
                name for name, answer in (self.option_answers or {}).items() if answer.get("decision") is True
            ]
        return (self.answer or {}).get("decision")

    # ------------------------------------------------------------------ review form labels

    def labels(self) -> list[str]:
        """The review form's options."""
        if self.kind == "boolean" and not self.multiple:
            return [BOOLEAN_LABELS[True], BOOLEAN_LABELS[False]]
        return list(self.options or [])

    def to_labels(self, answer: Any) -> list[str]:
        """An answer as review form options."""
        if self.multiple:
            return [answer] if isinstance(answer, str) else list(answer)
        if isinstance(answer, bool):
            return [BOOLEAN_LABELS[answer]]
        return [answer]

    def from_labels(self, chosen: Sequence[str]) -> Any:
        """The answer a reviewer chose.

        :raises ValueError: the choice is not one of the form's options.
        """
        unknown = [c for c in chosen if c not in self.labels()]
        if unknown:
            raise ValueError(f"the review answered {unknown[0]!r}, which is not one of {self.labels()}")
        if self.multiple:
            return [option for option in self.options or [] if option in chosen]
        if len(chosen) != 1:
            raise ValueError(f"the review must choose exactly one answer, got {list(chosen)}")
        if self.kind == "boolean":
            return chosen[0] == BOOLEAN_LABELS[True]
        return chosen[0]


def _number(value: Any) -> str:
    return "missing" if value is None else f"{value:g}"


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(str(v) for v in value) + "]" if value else "nothing"
    return str(value)


#: Runs of backticks, to find a code span's fence.
_BACKTICKS = re.compile(r"`+")
#: Characters Markdown acts on within a line (code, emphasis, links, images, HTML, entities,
#: strikethrough, table cells): escaped in text shown as plain text.
_MARKDOWN = re.compile(r"([\\`*_\[\]<>!&~|])")


def _code(value: Any, *, in_table: bool = False) -> str:
    """``value`` as a Markdown code span that nothing inside it can close or leave.

    The text passes through ``safe_text`` first (no line break can end the paragraph, nothing is
    longer than a line), then the fence is one backtick longer than the longest run inside it
    (CommonMark), and a space pads text that starts or ends with a backtick or a space. Inside a
    code span Markdown, HTML and entities are literal: a link, an image or a tag in a value shows
    as its own text.

    :param value: what to show (a decision, an option, a model's or reply's ID).
    :param in_table: the span sits in a table cell, where ``|`` must be escaped even in code (GFM).
    """
    text = safe_text(_shown(value))
    fence = "`" * (max(map(len, _BACKTICKS.findall(text)), default=0) + 1)
    pad = " " if not text or text[0] in "` " or text[-1] in "` " else ""
    span = f"{fence}{pad}{text}{pad}{fence}"
    return span.replace("|", "\\|") if in_table else span


def _plain(text: str) -> str:
    """``text`` shown as plain text in a Markdown line: through ``safe_text``, and every character
    Markdown would act on backslash-escaped."""
    return _MARKDOWN.sub(r"\\\1", safe_text(text, 1000))


def review_endpoint(ti: Any, task_id: str) -> str:
    """The REST path that answers the review of ``ti`` (its run ID URL-encoded, as a client sends it).

    :param ti: the task instance (its ``dag_id``, ``run_id`` and ``map_index``).
    :param task_id: the task's ID.
    """
    from urllib.parse import quote

    dag_id = quote(str(getattr(ti, "dag_id", "?")), safe="")
    run_id = quote(str(getattr(ti, "run_id", "?")), safe="")
    map_index = getattr(ti, "map_index", -1)
    return f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{quote(task_id, safe='')}/{map_index}/hitlDetails"


def review_body(
    gate: Gate, outcome: PolicyOutcome, policy: DecisionPolicy | None, *, watching: bool = False
) -> str:
    """The review request's Markdown body: question, state summary, answer, numbers, alternatives.

    :param watching: the task goes on watching its source while the person decides (a deferrable
        sensor): the body says that the answer counts only for the state it shows.

    Every value in it — above all the gateway's (model, reply ID, the alternatives' answers) — is
    a code span (:func:`_code`) no value can close, so no text a gateway chose becomes a link, an
    image, HTML or a line of its own in what a person answers; the reason is plain text.
    """
    lines = [f"**Question** {_code(gate.question)} ({'multi-select' if gate.multiple else gate.kind})"]
    if gate.instructions:
        lines += ["", gate.instructions]
    lines += ["", f"**Model's answer:** {_code(gate.proposed)}"]
    if gate.multiple:
        lines += ["", "| option | model says | probability | confidence |", "|---|---|---|---|"]
        for name, answer in (gate.option_answers or {}).items():
            decision, probability, confidence, _ = answer_numbers(answer)
            lines.append(
                f"| {_code(name, in_table=True)} | {'run' if decision is True else 'skip'} | "
                f"{_number(probability)} | {_number(confidence)} |"
            )
    else:
        answer = gate.answer or {}
        lines.append(
            f"probability {_number(answer.get('probability'))}, confidence "
            f"{_number(answer.get('confidence'))}"
        )
        lines += ["", "**Ranked answers**"]
        for rank, item in enumerate(ranked_answers(answer), start=1):
            numbers = ", ".join(
                f"{key} {item[key]:g}" for key in ("probability", "confidence") if item.get(key) is not None
            )
            lines.append(
                f"{rank}. {_code(item['decision'])}"
                + (f" — {numbers}" if numbers else "")
                + (" (proposed)" if rank == 1 else "")
            )
    lines += ["", f"**Why you are asked:** {_plain(outcome.reason)}."]
    if gate.model or gate.reply_id:
        lines.append(f"Model {_code(gate.model)}, reply {_code(gate.reply_id)}.")
    size = f", {gate.state_bytes} bytes" if gate.state_bytes is not None else ""
    digest = f", sha256 {gate.state_hash[:12]}…" if gate.state_hash else ""
    lines += [
        "",
        f"**State** (version {gate.state_version}{size}{digest}):",
        "",
        "```text",
        (gate.preview or "").replace("```", "'''"),
        "```",
    ]
    if watching:
        lines += [
            "",
            f"**While you decide** the sensor goes on watching its source. Your answer counts only "
            f"for the state above (version {gate.state_version}) while the source still holds it. "
            "If a newer state is decided first, this request is closed for you; an answer given "
            "after the state moved on is recorded and decides nothing. The task's Decision timeline "
            "shows every state and each review.",
        ]
    if policy is not None and policy.review_timeout is not None:
        fallback = (
            f"the default answer {_code(policy.default)} applies"
            if policy.default is not None
            else f"the task does what the policy says below its bars ({policy.below})"
        )
        lines += ["", f"If nobody answers within {readable(policy.review_timeout)}, {fallback}."]
    return "\n".join(lines)


def answer_record(answer: Mapping[str, Any]) -> dict[str, Any]:
    """What the ``decision`` record keeps of a review's answer: the options chosen, who answered
    and when (ISO 8601 text), and whether it is the timeout's default.

    :param answer: the Human-in-the-loop answer a task resumes with (``chosen_options``,
        ``responded_by_user``, ``responded_at`` — a ``datetime`` in a 3.1 / 3.2 trigger's event —
        and ``timedout``).
    """
    responded_by = answer.get("responded_by_user")
    responded_at = answer.get("responded_at")
    return {
        "chosen_options": list(answer.get("chosen_options") or []),
        "responded_by": dict(responded_by) if responded_by else None,
        "responded_at": responded_at.isoformat() if hasattr(responded_at, "isoformat") else responded_at,
        "timedout": bool(answer.get("timedout")),
    }


class PolicyGateMixin:
    """Acts on a :class:`Gate` under the task's policy (see the module docstring).

    The class using it sets ``policy``, ``review_assigned_users``, ``review_notifiers`` and
    ``review_subject`` (see :meth:`_init_review`) and implements :meth:`_apply`.
    """

    policy: DecisionPolicy | None
    review_assigned_users: list[dict[str, str]] | None
    review_notifiers: list[Any]
    review_subject: str | None
    task_id: str
    log: Logger

    def _init_review(
        self,
        policy: Any,
        review_assigned_users: Any = None,
        review_notifiers: Any = None,
        review_subject: str | None = None,
    ) -> None:
        """Read the policy and the review settings, checked: ``review_assigned_users`` as a list of
        ``{"id", "name"}`` (``None``: anyone), ``review_notifiers`` as a list of callables.

        :raises ValueError: a bad policy or setting, naming it.
        """
        users = (
            [review_assigned_users] if isinstance(review_assigned_users, Mapping) else review_assigned_users
        )
        if users is not None and (
            not isinstance(users, list | tuple)
            or not all(
                isinstance(user, Mapping) and all(isinstance(user.get(key), str) for key in ("id", "name"))
                for user in users
            )
        ):
            raise SystemZeroArgumentError(
                f"review_assigned_users must be a user {{'id': …, 'name': …}} (two strings) or a list of "
                f"them, got {review_assigned_users!r}",
                code="invalid_review",
                field="review_assigned_users",
            )
        notifiers = review_notifiers
        if not isinstance(notifiers, list | tuple):
            notifiers = [] if notifiers is None else [notifiers]
        if not all(callable(notifier) for notifier in notifiers):
            raise SystemZeroArgumentError(
                f"review_notifiers must be a notifier (called with the task's context) or a list of them, "
                f"got {review_notifiers!r}",
                code="invalid_review",
                field="review_notifiers",
            )
        if review_subject is not None and not isinstance(review_subject, str):
            raise SystemZeroArgumentError(
                f"review_subject must be a string or None, got {type(review_subject).__name__} {review_subject!r}",
                code="invalid_review",
                field="review_subject",
            )
        self.review_assigned_users = [dict(user) for user in users] if users else None
        self.review_notifiers, self.review_subject = list(notifiers), review_subject
        self.policy = DecisionPolicy.coerce(policy)

    # ------------------------------------------------------------------ what the task does

    def _apply(self, context: Context, gate: Gate, record: dict[str, Any]) -> Any:
        """Take the decision in ``record["decision"]``: push ``record`` (after setting its
        ``effect``) and return the task's result. Implemented by each task."""
        raise NotImplementedError

    def _wait_again(self, context: Context, gate: Gate, record: dict[str, Any]) -> Any:
        """Push ``record`` (nothing fired) and keep waiting for a new state: the ``wait`` fallback,
        which only a task that waits (the sensor) implements."""
        raise AirflowFailException(f"{self.task_id}: this task cannot wait for a new state")

    def _review_timed_out(
        self, gate: Gate, outcome: PolicyOutcome, reason: str, review: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        """The record of a review nobody answered: the policy's ``below`` takes effect (``fail``
        without a policy), decided by the policy.

        :param outcome: the outcome that asked for the review (its bars and measure are kept).
        :param reason: why, for the record.
        :param review: what the review said (or the stored one).
        """
        below = self.policy.below if self.policy is not None else "fail"
        fallback = PolicyOutcome(
            below, reason, "review_timeout", outcome.measured, outcome.act_above, outcome.review_above
        )
        return self._record(gate, fallback, decision=None, decided_by="policy", reason=reason, review=review)

    def _fallback(self, context: Context, gate: Gate, record: dict[str, Any]) -> Any:
        """Below the bars: ``fail``/``skip`` push ``record`` and stop; ``wait`` keeps waiting."""
        if record["action"] == "wait":
            return self._wait_again(context, gate, record)
        self._push_record(context, record)
        message = (
            f"{self.task_id}: System Zero's answer to {gate.question!r} was not used: {record['reason']}"
        )
        if record["action"] == "skip":
            raise AirflowSkipException(message)
        raise AirflowFailException(message)

    # ------------------------------------------------------------------ the gate

    def _evaluate(self, gate: Gate) -> PolicyOutcome:
        if self.policy is None:
            return PolicyOutcome("act", "no policy: the model's answer is used as is", "no_bar")
        if gate.multiple:
            return self.policy.evaluate_options(gate.option_answers or {})
        return self.policy.evaluate(gate.answer or {})

    def _record(
        self,
        gate: Gate,
        outcome: PolicyOutcome,
        *,
        decision: Any,
        decided_by: str | None,
        reason: str,
        status: str = "final",
        review: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        record = decision_record(
            question=gate.question,
            answer=None if gate.multiple else gate.answer,
            decision=decision,
            action=outcome.action,
            decided_by=decided_by,
            reason=reason,
            policy=self.policy,
            outcome=outcome,
            model=gate.model,
            reply_id=gate.reply_id,
            state_version=gate.state_version,
            state_hash=gate.state_hash,
            status=status,
            review=review,
            options=gate.option_answers if gate.multiple else None,
            decided_at=gate.decided_at,
            answered_at=utc_iso((review or {}).get("responded_at")) if decided_by == "human" else None,
        )
        if gate.extra.get("streak"):  # the sensor's run of decisions (hysteresis)
            record["streak"] = gate.extra["streak"]
        if gate.extra.get("review"):  # the sensor's review request of this try, and how it ended
            record["review_request"] = {
                key: value for key, value in gate.extra["review"].items() if key not in ("ti_id", "answer")
            }
        return record

    def _push_record(self, context: Context, record: dict[str, Any]) -> None:
        context["ti"].xcom_push(key=DECISION_XCOM_KEY, value=record)

    def _gate(self, context: Context, gate: Gate, outcome: PolicyOutcome | None = None) -> Any:
        """Decide what to do with ``gate`` and do it (may park the task for a review).

        :param outcome: the policy's verdict when it was reached already (the sensor's watch);
            ``None`` evaluates the policy on the gate's answer.
        """
        outcome = outcome or self._evaluate(gate)
        self.log.info(
            "policy for %s = %s: %s (%s)",
            gate.question,
            _shown(gate.proposed),
            outcome.action,
            outcome.reason,
        )
        if outcome.action == "review":
            stored = self._stored_review(context, gate)
            if stored is not None:
                self.log.info(
                    "taking the earlier review of this state (%s, %s)",
                    stored.get("decided_by"),
                    _shown(stored.get("decision")),
                )
                if stored.get("decision") is None:  # the review timed out, with no default
                    record = self._review_timed_out(gate, outcome, stored["reason"], stored.get("review"))
                    return self._fallback(context, gate, record)
                record = self._record(
                    gate,
                    outcome,
                    decision=stored["decision"],
                    decided_by=stored["decided_by"],
                    reason=stored["reason"],
                    review=stored.get("review"),
                )
                return self._apply(context, gate, record)
            spent = gate.extra.get("review")
            if spent:
                return self._not_asked(context, gate, outcome, spent)
            self._request_review(context, gate, outcome)
        if outcome.action == "act":
            record = self._record(
                gate, outcome, decision=gate.proposed, decided_by="model", reason=outcome.reason
            )
            return self._apply(context, gate, record)
        if outcome.action == "default":
            assert self.policy is not None
            record = self._record(
                gate,
                outcome,
                decision=self._default(gate),
                decided_by="policy",
                reason=f"{outcome.reason}: the policy's default applies",
            )
            return self._apply(context, gate, record)
        record = self._record(gate, outcome, decision=None, decided_by="policy", reason=outcome.reason)
        return self._fallback(context, gate, record)

    def _not_asked(
        self, context: Context, gate: Gate, outcome: PolicyOutcome, spent: Mapping[str, Any]
    ) -> Any:
        """A state that needs a person after this try's review request was used: Airflow keeps one
        request per task try and never changes its text, so no request can show this state. The
        sensor says so and waits for a state the model decides on its own (or its timeout)."""
        reason = (
            f"{outcome.reason}; a person would be asked, but this try's review request showed state "
            f"version {spent.get('state_version')} and Airflow keeps one request per task try, its "
            "text fixed: the sensor waits for a state the model decides on its own (clear the task "
            "to ask a person about the newest state)"
        )
        self.log.info("%s", reason)
        record = self._record(gate, outcome, decision=None, decided_by=None, reason=reason)
        return self._wait_again(context, gate, record)

    def _watches_while_asked(self) -> bool:
        """Whether this task goes on watching its source while a person decides: then, the request
        written, :meth:`_watch_while_asked` defers to its own trigger (a deferrable sensor)."""
        return False

    def _watch_while_asked(
        self, context: Context, gate: Gate, outcome: PolicyOutcome, defaults: list[str] | None
    ) -> None:
        """Go on watching while the person decides (only when :meth:`_watches_while_asked`)."""
        raise NotImplementedError

    def _default(self, gate: Gate) -> Any:
        default = self.policy.default if self.policy is not None else None
        if gate.multiple and isinstance(default, str):
            return [default]
        return list(default) if isinstance(default, tuple) else default

    # ------------------------------------------------------------------ review

    def _review_key(self, gate: Gate) -> str:
        return f"systemzero.review.{gate.question}.{gate.state_hash or 'nostate'}"

    def _stored_review(self, context: Context, gate: Gate) -> dict[str, Any] | None:
        store = context.get("task_state_store") if isinstance(context, Mapping) else None
        if store is None or not gate.state_hash:
            return None
        value = store.get(self._review_key(gate))
        return value if isinstance(value, dict) and "decided_by" in value else None

    def _store_review(self, context: Context, gate: Gate, record: Mapping[str, Any]) -> None:
        store = context.get("task_state_store") if isinstance(context, Mapping) else None
        if store is None or not gate.state_hash:
            return
        store.set(
            self._review_key(gate),
            {key: record.get(key) for key in ("decision", "decided_by", "reason", "review")},
        )

    def _request_review(self, context: Context, gate: Gate, outcome: PolicyOutcome) -> None:
        """Write the review request, push the pending record and park the task (raises)."""
        from airflow.sdk.execution_time.hitl import upsert_hitl_detail

        from airflow_provider_systemzero.compat import has_awaiting_input

        policy = self.policy
        defaults = None
        if policy is not None and policy.default is not None:
            defaults = gate.to_labels(self._default(gate))
        subject = self.review_subject or f"System Zero is unsure: {gate.question}"
        watching = self._watches_while_asked()
        upsert_hitl_detail(
            ti_id=context["task_instance"].id,
            options=gate.labels(),
            subject=subject,
            body=review_body(gate, outcome, policy, watching=watching),
            defaults=defaults,
            multiple=gate.multiple,
            params={},
            assigned_users=self.review_assigned_users,
        )
        # nothing is decided yet: the person's answer (or the timeout) decides
        self._push_record(
            context,
            self._record(
                gate, outcome, decision=None, decided_by=None, reason=outcome.reason, status="pending_review"
            ),
        )
        self.log.info(
            "asking a person about %s (%s); the task waits %s: answer on Airflow's Required Actions "
            "page, or with PATCH %s (the steps: the provider's docs, Policies, Human review)",
            gate.question,
            outcome.reason,
            "deferred, watching its source meanwhile"
            if watching
            else "in awaiting_input"
            if has_awaiting_input()
            else "deferred, while Airflow's HITLTrigger checks for an answer",
            review_endpoint(context.get("ti"), getattr(self, "task_id", "?")),
        )
        for notifier in self.review_notifiers:
            notifier(context)
        if watching:
            self._watch_while_asked(context, gate, outcome, defaults)
        resume = {"gate": gate.to_dict(), "outcome": outcome.to_dict()}
        timeout = policy.review_timedelta if policy is not None else None
        if has_awaiting_input():
            from airflow.sdk.exceptions import TaskAwaitingInput

            raise TaskAwaitingInput(method_name="execute_review_complete", kwargs=resume, timeout=timeout)
        # Airflow 3.1 / 3.2: no awaiting_input state; wait in the triggerer, as HITLOperator does there.
        from airflow.sdk.timezone import utcnow

        from airflow_provider_systemzero.tasks.review_wait import ReviewTrigger

        self.defer(
            trigger=ReviewTrigger(
                ti_id=context["task_instance"].id,
                options=gate.labels(),
                defaults=defaults,
                params={},
                multiple=gate.multiple,
                timeout_datetime=utcnow() + timeout if timeout is not None else None,
                resume=resume,
            ),
            method_name="execute_review_complete",
            kwargs=resume,
        )

    def execute_review_complete(
        self,
        context: Context,
        event: dict[str, Any] | None = None,
        gate: dict[str, Any] | None = None,
        outcome: dict[str, Any] | None = None,
    ) -> Any:
        """Resume after a person answered (or the review timed out) and take that answer.

        :param event: the Human-in-the-loop response (``chosen_options``, ``responded_by_user``,
            ``responded_at``, ``timedout``) or a timeout error.
        :param gate: the :class:`Gate` that was reviewed.
        :param outcome: the policy's verdict that asked for the review.
        """
        if gate is None and isinstance(event, Mapping) and isinstance(event.get("resume"), Mapping):
            # dag.test() resumes a deferred task with the trigger's event alone (Airflow 3.1 / 3.2)
            gate, outcome = event["resume"].get("gate"), event["resume"].get("outcome")
        if gate is None or outcome is None or not isinstance(event, Mapping):
            raise AirflowFailException(
                f"{self.task_id}: resumed from a review without its decision ({event!r})"
            )
        the_gate = Gate.from_dict(gate)
        record = self._answer_kept(context, the_gate, PolicyOutcome(**outcome), event)
        if "error" in event:  # timed out, and the policy has no default
            return self._fallback(context, the_gate, record)
        self.log.info(
            "review of %s: %s (%s)", the_gate.question, _shown(record["decision"]), record["decided_by"]
        )
        return self._apply(context, the_gate, record)

    def _answer_kept(
        self, context: Context, gate: Gate, outcome: PolicyOutcome, event: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The record of a person's answer to the review of ``gate`` (or of its timeout), kept in
        the task's state store: a retry about the same state takes it instead of asking again.

        :param outcome: the policy's verdict that asked for the review.
        :param event: the Human-in-the-loop response, or a timeout error (``error``).
        :raises AirflowFailException: the answer names no option of the question.
        """
        if "error" in event:
            record = self._review_timed_out(
                gate,
                outcome,
                f"nobody answered the review in time ({event.get('error')}) and the policy has no default",
                {"timedout": True, "chosen_options": [], "responded_by": None, "responded_at": None},
            )
        else:
            try:
                decision = gate.from_labels(list(event.get("chosen_options") or []))
            except ValueError as exc:
                raise AirflowFailException(f"{self.task_id}: {exc}") from None
            review = answer_record(event)
            if review["timedout"]:
                reason = (
                    f"{outcome.reason}; nobody answered the review in time, so the policy's default applies"
                )
                decided_by = "timeout_default"
            else:
                responded_by = review["responded_by"]
                who = responded_by.get("name") if isinstance(responded_by, Mapping) else None
                reason = f"{outcome.reason}; {who or 'a person'} answered {_shown(decision)}"
                decided_by = "human"
            record = self._record(
                gate, outcome, decision=decision, decided_by=decided_by, reason=reason, review=review
            )
        self._store_review(context, gate, record)
        return record
