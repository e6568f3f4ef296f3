"""The protocols that keep the import graph acyclic where a module must name the class that imports it.

``emulator/host.py`` (``EmulatorHost``, ``FrameReceiver``) stands for the emulator and a stream in
the emulator's parts. Each protocol must list what those modules use of the other side, and the real
class must have every member the protocol lists.
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import ModuleType

import pytest

from airflow_provider_systemzero.emulator import connection, control, websocket
from airflow_provider_systemzero.emulator.connection import StreamLoop
from airflow_provider_systemzero.emulator.host import EmulatorHost, FrameReceiver
from airflow_provider_systemzero.emulator.server import Emulator


def members(protocol: type) -> set[str]:
    """The attributes and methods a protocol class declares."""
    declared = {name for name in vars(protocol) if not name.startswith("__")} - {
        "_is_protocol",
        "_is_runtime_protocol",
    }
    return set(protocol.__annotations__) | {name for name in declared if not name.startswith("_abc_")}


def used_through(modules: tuple[ModuleType, ...], *chains: str) -> set[str]:
    """Every ``<chain>.<name>`` the modules' sources use, for each dotted ``chain`` (``sensor``,
    ``self.emulator``)."""
    used: set[str] = set()
    for module in modules:
        for node in ast.walk(ast.parse(Path(str(module.__file__)).read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and ast.unparse(node.value) in chains:
                used.add(node.attr)
    return used


def test_the_emulator_protocols_name_what_its_parts_use() -> None:
    used = used_through((connection, control, websocket), "emulator", "self.emulator")
    assert {"limits", "faults", "_spawn"} <= used, "the walk reads nothing"
    assert used <= members(EmulatorHost), sorted(used - members(EmulatorHost))
    fed = used_through((websocket,), "self.stream", "stream")
    assert {"receive_text", "start_reader"} <= fed, "the walk reads nothing"
    assert fed <= members(FrameReceiver), sorted(fed - members(FrameReceiver))


@pytest.mark.parametrize(("protocol", "cls"), [(EmulatorHost, Emulator), (FrameReceiver, StreamLoop)])
def test_the_emulator_classes_have_every_member_of_their_protocol(protocol: type, cls: type) -> None:
    if cls is Emulator:
        instance: object = Emulator(api_keys=["demo"])
    else:
        instance = cls  # the stream's members are methods: its class has them
    assert not [name for name in members(protocol) if not hasattr(instance, name)]
