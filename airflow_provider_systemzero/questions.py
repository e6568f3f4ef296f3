"""Turning what a DAG author writes into a valid request, before anything is sent.

Authors may write questions in full wire form or in shorthand::

    {"ready": "Is the job ready?"}                                   # a boolean question
    {"ready": {"type": "boolean", "instructions": "Is the job ready?"}}
    {"tier": {"type": "choice", "instructions": "Which tier?", "options": ["gold", "silver"]}}

``instructions`` (``{name: text}``) overrides a question's instructions. Every rule of the
protocol is checked here with the core's validators, so a bad DAG fails on the worker with the
field named and no connection opened.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_provider_systemzero.exceptions import SystemZeroArgumentError
from airflow_provider_systemzero.protocol.body import json_size
from airflow_provider_systemzero.protocol.errors import did_you_mean
from airflow_provider_systemzero.protocol.limits import Limits
from airflow_provider_systemzero.protocol.messages import Attachment, StreamRequest, validate_attachment_tuple
from airflow_provider_systemzero.protocol.validation import not_json_message, validate_state

__all__ = ["build_request_dict", "normalise_questions", "validate_state_for_request"]

#: Stands in for the connection's model when checking a request before the connection is read.
_MODEL_PLACEHOLDER = "model-from-connection"
#: Stands in for the cache key when predicting body sizes.
_CACHE_KEY_PLACEHOLDER = "k" * 64


def normalise_questions(
    questions: Any, instructions: Mapping[str, str] | None = None
) -> dict[str, dict[str, Any]]:
    """Wire-form questions from full or shorthand form.

    :param questions: ``{name: text | question dict}``.
    :param instructions: optional ``{name: text}`` overriding instructions.
    :raises SystemZeroArgumentError: a question's form is wrong (naming the field).
    :raises LocalProtocolError: a question breaks a rule of the wire, e.g. its name (naming the
        field); both are ``ValueError`` and :data:`~airflow_provider_systemzero.exceptions.ARGUMENT_ERRORS`.
    """
    if not isinstance(questions, Mapping) or not questions:
        # a template renders to text unless the Dag renders templates as native objects
        rendered = (
            f"; got the string {questions[:60]!r}: a template renders to a string unless the Dag "
            "sets render_template_as_native_obj=True"
            if isinstance(questions, str) and questions.lstrip().startswith("{")
            else ""
        )
        raise SystemZeroArgumentError(
            "questions must be a non-empty mapping of question names to questions, e.g. "
            f"{{'ready': 'Is the job ready?'}}{rendered}",
            code="invalid_questions",
            field="questions",
        )
    if instructions is not None and not isinstance(instructions, Mapping):
        raise SystemZeroArgumentError(
            f"instructions must map question names to their text, got {type(instructions).__name__} "
            f"{instructions!r}: put the text in questions (questions={{'ready': 'Is the job ready?'}}), "
            "or pass instructions={'ready': '...'} to replace a question's text",
            code="invalid_questions",
            field="instructions",
        )
    result: dict[str, dict[str, Any]] = {}
    for name, value in questions.items():
        if isinstance(value, str):
            question: dict[str, Any] = {"type": "boolean", "instructions": value}
        elif isinstance(value, Mapping):
            question = dict(value)
            question.setdefault("type", "choice" if "options" in question else "boolean")
        else:
            raise SystemZeroArgumentError(
                f"questions.{name} must be instructions text or a question object",
                code="invalid_question",
                field=f"questions.{name}",
            )
        if "options" in question and isinstance(question["options"], tuple):
            question["options"] = list(question["options"])
        result[str(name) if not isinstance(name, str) else name] = question
    for name, text in (instructions or {}).items():
        if name not in result:
            raise SystemZeroArgumentError(
                f"instructions.{name} names no question (questions: {sorted(result)}){did_you_mean(name, result)}",
                code="unknown_question",
                field=f"instructions.{name}",
            )
        result[name]["instructions"] = text
    # the core's rules: names, shapes
    StreamRequest.build(model=_MODEL_PLACEHOLDER, questions=result)
    return result


def build_request_dict(
    *,
    questions: Any,
    instructions: Mapping[str, str] | None = None,
    model: str | None = None,
    route: str | None = None,
    mode: str | None = None,
    prompt_cache_key: str | None = None,
) -> dict[str, Any]:
    """The plain-JSON request a trigger carries (``model`` ``None`` means the connection's default).

    :raises SystemZeroArgumentError: naming the first invalid field (``LocalProtocolError`` for a
        wire rule, as :func:`normalise_questions`).
    """
    wire = normalise_questions(questions, instructions)
    StreamRequest.build(
        model=model or _MODEL_PLACEHOLDER,
        questions=wire,
        route=route,
        mode=mode,
        prompt_cache_key=prompt_cache_key,
    )
    request: dict[str, Any] = {"questions": wire}
    for key, value in (
        ("model", model),
        ("route", route),
        ("mode", mode),
        ("prompt_cache_key", prompt_cache_key),
    ):
        if value is not None:
            request[key] = value
    return request


def validate_state_for_request(
    request: Mapping[str, Any],
    state: Any,
    attachments: list[Attachment] | tuple[Attachment, ...] = (),
    *,
    limits: Limits | None = None,
    field: str = "state",
    too_large: str | None = None,
    templated: bool = False,
) -> int:
    """Check a state (and attachments) against the request: JSON, kind, and the decide-body limit.

    :param field: what the state is called in the messages (the argument that holds it).
    :param templated: the state comes from a templated argument (a template is one fix for a value
        JSON cannot carry).
    :param too_large: the fix a body over the limit is told (where the state came from decides it;
        by default: send less).

    :return: the decide body's size in bytes (what a budget's token estimate reads).
    :raises SystemZeroArgumentError: naming the field (``LocalProtocolError`` for a wire rule of
        the state or attachments).
    """
    validate_state(state, field=field)
    try:
        json_size(state)
    except (TypeError, ValueError, RecursionError) as exc:
        raise SystemZeroArgumentError(
            not_json_message(state, field, exc, templated=templated), code="invalid_state", field=field
        ) from None
    validate_attachment_tuple(tuple(attachments), field="attachments")
    limits = limits or Limits()
    built = StreamRequest.build(
        model=request.get("model") or _MODEL_PLACEHOLDER,
        questions=request["questions"],
        route=request.get("route"),
        mode=request.get("mode"),
        prompt_cache_key=request.get("prompt_cache_key") or _CACHE_KEY_PLACEHOLDER,
    )
    size = len(built.decide_body(state, tuple(attachments)).encode("utf-8"))
    if size > limits.max_decide_body_bytes:
        if too_large is None:
            too_large = "send less (a summary, the last part of a log)"
            too_large += " or smaller attachments" if attachments else ""
        raise SystemZeroArgumentError(
            f"{field} makes the decide body {size} bytes: the body may not exceed "
            f"max_decide_body_bytes ({limits.max_decide_body_bytes}): {too_large}",
            code="decide_body_too_large",
            field=field,
        )
    return size
