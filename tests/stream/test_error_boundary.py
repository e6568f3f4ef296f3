"""The stream's one boundary for a dependency's exceptions (``stream/diagnosis.py``): a failure
below HTTP is recognised by its type, never by its class's name."""

from __future__ import annotations

import ast
from pathlib import Path

from websockets.exceptions import InvalidMessage, InvalidProxy

from airflow_provider_systemzero import stream as stream_package
from airflow_provider_systemzero.stream.diagnosis import (
    NetworkFailures,
    describe_connection_error,
    is_network_error,
)

URL = "ws://127.0.0.1:8765/v1/system-zero/stream"
STREAM_DIR = Path(stream_package.__file__).parent


class _NotAWebSocketServer(InvalidMessage):
    """What a newer websockets might raise for a peer that does not speak HTTP: a subclass."""


class gaierror(Exception):  # named like socket.gaierror on purpose, and nothing like it
    """An error of some other library that happens to share socket.gaierror's name."""


def test_a_subclass_of_a_dependency_error_is_described_as_its_base() -> None:
    error = _NotAWebSocketServer("did not receive a valid HTTP response")
    assert is_network_error(error)
    text = describe_connection_error(error, URL)
    assert "did not answer as a WebSocket server" in text, text
    assert "did not answer as a WebSocket server" in (NetworkFailures(URL).describe(error) or "")


def test_a_class_that_only_shares_a_name_is_not_taken_for_it() -> None:
    text = describe_connection_error(gaierror("no such thing"), URL)
    assert "cannot resolve host" not in text, text
    assert text.startswith(f"connecting to {URL} failed: gaierror: no such thing")


def test_a_proxy_refusal_is_a_network_failure_described_with_its_fix() -> None:
    error = InvalidProxy("http://proxy.corp:3128", "connection refused")
    assert is_network_error(error)
    assert NetworkFailures(URL).describe(error) == describe_connection_error(error, URL)
    assert not is_network_error(ValueError("a bug"))


def _stream_modules() -> list[Path]:
    modules = sorted(STREAM_DIR.glob("*.py"))
    assert len(modules) > 5, "the walk reads nothing"
    return modules


def test_no_stream_module_matches_an_exception_by_its_class_name() -> None:
    """``type(exc).__name__ == "..."`` breaks silently when a dependency renames or subclasses a
    class: the stream matches by type."""
    offenders = []
    for path in _stream_modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            names = any(isinstance(side, ast.Attribute) and side.attr == "__name__" for side in sides)
            literal = any(isinstance(side, ast.Constant) and isinstance(side.value, str) for side in sides)
            if names and literal:
                offenders.append(f"{path.name}:{node.lineno}")
    assert not offenders, offenders
