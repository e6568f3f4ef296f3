"""Errors of the Airflow layer that are not protocol errors.

:class:`~airflow_provider_systemzero.protocol.errors.LocalProtocolError` carries the *wire* codes
of the stream protocol (``invalid_question_name``, ``invalid_state`` …): our side would send
something the protocol forbids. A mistake in a DAG's arguments that the wire never sees (a
threshold out of range, an unknown policy key, a source spec of the wrong shape) is a
:class:`SystemZeroArgumentError` instead, with a code of its own.

Both are ``ValueError`` subclasses; :data:`ARGUMENT_ERRORS` names the pair for the places that turn
either into a failed task.
"""

from __future__ import annotations

from airflow_provider_systemzero.protocol.errors import LocalProtocolError, ProtocolError

__all__ = ["ARGUMENT_ERRORS", "SystemZeroArgumentError", "SystemZeroError"]


class SystemZeroError(Exception):
    """Base class of every error raised by the System Zero stream client (and of the budget's refusal).

    It is re-exported by :mod:`~airflow_provider_systemzero.stream.exceptions`, the client's error
    tree; it is defined here, below both the stream and the pure decision package, so that
    :class:`~airflow_provider_systemzero.decisions.budget.BudgetExceeded` can join the tree without
    the decision package importing the stream (which imports it).
    """


class SystemZeroArgumentError(ValueError):
    """A DAG argument (or a value that fills one when the task runs) breaks a rule of this provider.

    :param message: what is wrong, naming the field, the problem and the fix.
    :param code: a machine-readable code (``invalid_threshold``, ``invalid_source`` …); never a wire code.
    :param field: dotted path of the offending argument, or ``None``.
    """

    def __init__(self, message: str, *, code: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message, self.code, self.field = message, code, field

    # The same fields and the same repr as a protocol error, without being one: a DAG-argument
    # error never carries a wire code, so it is no ProtocolError (nor caught as one).
    __repr__ = ProtocolError.__repr__


#: The errors that mean "the task's input is wrong" (never retried): a DAG-argument mistake, or a
#: value that would break a rule of the wire protocol.
ARGUMENT_ERRORS: tuple[type[ValueError], ...] = (SystemZeroArgumentError, LocalProtocolError)
