"""A :class:`DecisionStream` owns its parts: each a class with its own state, each attribute said
where it is declared, the parts reaching each other only through what they make public, and every
signal they wake each other with in the one table of ``stream/life.py``."""

from __future__ import annotations

import ast
import asyncio
import re
from pathlib import Path

from airflow_provider_systemzero import stream as stream_package
from airflow_provider_systemzero.stream import Backoff, DecisionStream
from airflow_provider_systemzero.stream import life as life_module
from tests.stream.support import EmulatorFactory
from tests.stream.test_stream import make_stream

STREAM_DIR = Path(stream_package.__file__).parent
#: The modules of the stream's parts, and the stream that owns them.
PART_MODULES = ("decision_stream", "life", "delivery", "core_events", "serving", "run_loop", "accounting")
#: What a wake-up signal is held in (a task is work, not a signal).
SIGNAL_TYPES = ("asyncio.Event", "asyncio.Future", "asyncio.Handle", "asyncio.TimerHandle")


def _tree(module: str) -> ast.Module:
    return ast.parse((STREAM_DIR / f"{module}.py").read_text(encoding="utf-8"))


def _table() -> dict[str, set[str]]:
    """The signals of ``stream.life``'s table: part → attributes."""
    rows = re.findall(r"^\| `(\w+)\.(\w+)` \|", life_module.__doc__ or "", flags=re.MULTILINE)
    assert len(rows) >= 5, "the table reads nothing"
    table: dict[str, set[str]] = {}
    for part, attribute in rows:
        table.setdefault(part, set()).add(attribute)
    return table


def _inits() -> list[tuple[str, str, ast.FunctionDef]]:
    found = []
    for module in PART_MODULES:
        for node in ast.walk(_tree(module)):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                        found.append((module, node.name, item))
    assert len(found) >= 7, "the walk reads nothing"
    return found


def test_the_stream_is_composed_not_inherited() -> None:
    assert DecisionStream.__mro__ == (DecisionStream, object)


def test_every_signal_a_part_declares_is_in_the_table() -> None:
    table = _table()
    declared: dict[str, set[str]] = {}
    for _module, part, init in _inits():
        for node in ast.walk(init):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Attribute)
                and isinstance(node.target.value, ast.Name)
                and node.target.value.id == "self"
                and any(kind in ast.unparse(node.annotation) for kind in SIGNAL_TYPES)
            ):
                declared.setdefault(part, set()).add(node.target.attr)
    assert declared, "the walk found no signal"
    missing = {part: names - table.get(part, set()) for part, names in declared.items()}
    assert not any(missing.values()), f"signals missing from stream/life.py's table: {missing}"


async def test_every_signal_in_the_table_exists_on_an_open_stream(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    emu = await make_emulator()
    async with make_stream(emu, fast_backoff, identity="stream-parts") as stream:
        await stream.decide(timeout=10)
        socket = stream._connection.socket
        assert socket is not None
        parts = {
            "StreamLife": stream._life,
            "ConnectionServer": stream._connection,
            "DecisionDelivery": stream._delivery,
            "CoreEvents": stream._events,
            "GatewaySocket": socket,
        }
        for part, attributes in _table().items():
            assert part in parts, f"the table names a part the stream does not have: {part}"
            for attribute in attributes:
                assert hasattr(parts[part], attribute), f"{part}.{attribute}"
        assert isinstance(socket.lost, asyncio.Future)


def test_every_attribute_is_said_where_it_is_declared() -> None:
    """h11's way: each attribute a part sets up has a comment (``#:``) above it, or stores a
    parameter its class's docstring describes."""
    undocumented = []
    for module, part, init in _inits():
        lines = (STREAM_DIR / f"{module}.py").read_text(encoding="utf-8").splitlines()
        params = {arg.arg for arg in (*init.args.args, *init.args.kwonlyargs)}
        for node in init.body:
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign)
                else []
            )
            for target in targets:
                if not (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)):
                    continue
                value = node.value
                stores_parameter = isinstance(value, ast.Name) and value.id in params
                above = lines[node.lineno - 2].strip()
                if not stores_parameter and not above.startswith("#"):
                    undocumented.append(f"{part}.{target.attr} ({module}.py:{node.lineno})")
    assert not undocumented, undocumented


def test_the_parts_reach_no_private_state_of_another() -> None:
    """A part reads another through its public attributes and methods; ``_name`` is its own."""
    reaching = []
    for module in PART_MODULES:
        for node in ast.walk(_tree(module)):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
                # the stream's own methods, through the weak reference its parts call it by
                and not (
                    module == "decision_stream" and isinstance(node.value, ast.Name) and node.value.id == "me"
                )
            ):
                reaching.append(f"{module}.py:{node.lineno}: {ast.unparse(node)}")
    assert not reaching, reaching
