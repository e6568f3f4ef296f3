"""Straight-line encoders and decoders compiled from the wire declarations of
:mod:`~airflow_provider_systemzero.protocol.wire`.

The declaration of a message (its dataclass fields and their
:class:`~airflow_provider_systemzero.protocol.wire.WireField`) stays the one source of truth;
:func:`~airflow_provider_systemzero.protocol.wire.encode_fields` and
:func:`~airflow_provider_systemzero.protocol.wire.decode_fields` interpret it field by field, which
costs a loop, a reader and a shape lookup per field of every frame. For a declaration whose
fields all sit in the message object itself, this module writes that interpretation out once, as
Python source, and compiles it (as :mod:`dataclasses` writes ``__init__``):

* the **encoder** sets each key in declaration order, leaving out what the declaration omits;
* the **decoder** is a *fast path* that only accepts what the interpreter accepts: exact JSON
  types (a decoded frame holds nothing else), no unknown key in a strict object, nothing a codec
  other than a string array would have to read. On anything else it returns ``None`` and the
  interpreter runs, so every refusal and rejection keeps its exact message and code.

``tests/protocol/test_wire_compile.py`` checks both against the interpreter on generated messages
and on mistyped, missing and unknown fields.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["compile_decoder", "compile_encoder"]

#: What the decoder returns when the interpreter has to read the object.
SLOW: Any = None

#: Missing key (distinct from JSON ``null``).
_MISSING = object()

#: The test of a value of each JSON shape, on its exact type (``v`` the value, ``t`` its type).
_SHAPE_TESTS = {
    "str": "t is str",
    "int": "t is int",
    "number": "(t is int or t is float)",
    "bool": "(v is True or v is False)",
    "object": "t is dict",
    "array": "t is list",
    "state": "(t is str or t is list or t is dict)",
    "any": "v is not MISSING",
}


def _define(name: str, lines: list[str], namespace: dict[str, Any]) -> Callable[..., Any]:
    exec("\n".join(lines), namespace)  # the source is generated here, from declarations only
    return namespace[name]


def compile_encoder(
    cls: type, slots: Sequence[Any]
) -> Callable[[Any, dict[str, Any]], dict[str, Any]] | None:
    """An encoder ``(obj, data) -> data`` for ``cls``, or ``None`` if a field nests (``at``/``after``).

    :param cls: the declared dataclass.
    :param slots: its ``(attr, key, spec)`` slots in declaration order.
    """
    namespace: dict[str, Any] = {}
    body = [f"def encode_{cls.__name__}(obj, data):"]
    for index, slot in enumerate(slots):
        spec = slot.spec
        if spec.at is not None or spec.after is not None:
            return None
        value = f"v{index}"
        body.append(f"    {value} = obj.{slot.attr}")
        indent = "    "
        if spec.omit == "none":
            body.append(f"    if {value} is not None:")
            indent = "        "
        elif spec.omit == "empty":
            body.append(f"    if {value}:")
            indent = "        "
        if spec.codec is not None:
            namespace[f"CODEC{index}"] = spec.codec
            if spec.omit == "never":
                body.append(f"    if {value} is not None:")
                body.append(f"        {value} = CODEC{index}.encode({value})")
            else:
                body.append(f"{indent}{value} = CODEC{index}.encode({value})")
        body.append(f"{indent}data[{slot.key!r}] = {value}")
    body.append("    return data")
    return _define(f"encode_{cls.__name__}", body, namespace)


def compile_decoder(
    cls: type,
    slots: Sequence[Any],
    *,
    allowed: frozenset[str] | None,
    string_array: type,
) -> Callable[[dict[str, Any]], dict[str, Any] | None] | None:
    """A fast decoder ``data -> kwargs or None`` for ``cls``, or ``None`` if it cannot have one.

    :param cls: the declared dataclass.
    :param slots: its ``(attr, key, spec)`` slots in declaration order.
    :param allowed: the keys a strict object may hold (``None``: not strict, any key is tolerated).
    :param string_array: the codec class of an array of strings (read here; any other codec is left
        to the interpreter, and so is a class with a nested field or one sharing its object).
    """
    namespace: dict[str, Any] = {"MISSING": _MISSING, "ALLOWED": allowed}
    body = [f"def decode_{cls.__name__}(data):"]
    if allowed is not None:
        body += ["    if not data.keys() <= ALLOWED:", "        return None"]
    names: list[str] = []
    for index, slot in enumerate(slots):
        spec = slot.spec
        if spec.has_const:
            continue
        if spec.at is not None:
            return None
        codec = spec.codec
        array_of_strings = codec is not None and type(codec) is string_array
        if codec is not None and not array_of_strings and not spec.optional:
            return None  # a required structured value: the interpreter reads it
        value = f"v{index}"
        names.append(f"{slot.attr}={value}")
        namespace[f"ABSENT{index}"] = spec.absent
        body.append(f"    v = data.get({slot.key!r}, MISSING)")
        if spec.optional:
            body += ["    if v is MISSING or v is None:", f"        {value} = ABSENT{index}", "    else:"]
        elif spec.nullable or spec.kind == "any":
            body += ["    if v is None:", f"        {value} = ABSENT{index}", "    else:"]
        else:
            body.append("    if True:")
        body += [
            "        t = type(v)",
            f"        if not {_SHAPE_TESTS[spec.kind]}:",
            "            return None",
        ]
        if spec.minimum is not None:
            body += [f"        if v < {spec.minimum!r}:", "            return None"]
        if array_of_strings:
            body += [
                "        for item in v:",
                "            if type(item) is not str:",
                "                return None",
            ]
            body.append("        v = tuple(v)")
        elif codec is not None:
            body.append("        return None")  # present: the interpreter reads it
        body.append(f"        {value} = v")
        if spec.convert is not None:
            namespace[f"CONVERT{index}"] = spec.convert
            body.append(f"    {value} = CONVERT{index}({value})")
    body.append(f"    return dict({', '.join(names)})")
    return _define(f"decode_{cls.__name__}", body, namespace)
