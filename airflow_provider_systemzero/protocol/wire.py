"""Wire fields declared once: the machinery behind every message and value type of
:mod:`~airflow_provider_systemzero.protocol.messages`.

A message is a frozen dataclass whose fields carry a :class:`WireField` in their metadata
(:func:`wire` writes it). From that one declaration come

* the canonical encoding (:func:`encode_fields`): keys in declaration order, a field with ``at``
  inside a nested object, one with ``after`` right after the key it names (``start.request``
  holds the state between ``model`` and ``questions``), optional fields left out as declared;
* the strict decoding (:func:`decode_fields`): a missing or wrongly typed field is refused
  naming it, and in a strict object (client messages) a key that no field declares is noted as
  an unknown field (WIRE.md §2: a rejection, not a refusal).

The shape is all that is checked here; rules on values (names, keys, event IDs) belong to the
sessions and the ``validate`` methods.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from airflow_provider_systemzero.protocol.errors import RemoteProtocolError, did_you_mean, refuse
from airflow_provider_systemzero.protocol.untrusted import safe_text

__all__ = [
    "MAX_SAFE_INTEGER",
    "Codec",
    "Reader",
    "RecordMap",
    "RecordTuple",
    "StringTuple",
    "Via",
    "WireField",
    "decode_fields",
    "encode_fields",
    "json_type",
    "load_object",
    "refuse",
    "wire",
]

#: The largest integer a server message may carry (I-JSON, RFC 7493: exact in every JSON parser).
MAX_SAFE_INTEGER = 2**53 - 1

#: What each JSON shape accepts, and the words an error uses for it.
_SHAPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "str": (lambda v: isinstance(v, str), "a string"),
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    "number": (lambda v: isinstance(v, int | float) and not isinstance(v, bool), "a number or null"),
    "bool": (lambda v: isinstance(v, bool), "a boolean"),
    "object": (lambda v: isinstance(v, dict), "an object"),
    "array": (lambda v: isinstance(v, list), "an array"),
    "state": (lambda v: isinstance(v, str | list | dict), "a string, an array or an object"),
    "any": (lambda v: True, "any JSON value"),
}


def json_type(value: Any) -> str:
    """The JSON name of a decoded value's type (``null``, ``boolean``, ``number``, …)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


#: Builds the error for a problem: ``(problem, field, path)``, ``field`` as a refusal names it
#: (the bare key, or the path without the message type), ``path`` the full path.
Fail = Callable[[str, str, str], Exception]


def _refusal(problem: str, field: str, path: str) -> Exception:
    return refuse(problem, field)


@dataclass(eq=False, repr=False, slots=True)
class Reader:
    """Reads one decoded JSON object, refusing anything mistyped.

    :param data: the object.
    :param where: its path in errors (``start.request``).
    :param strict: a key that no field declares is an unknown field (client messages);
        else it is tolerated (server messages: a newer gateway stays readable).
    :param unknown: where :meth:`only` notes unknown keys as ``(path, code)`` instead of
        failing on them; ``None`` fails at once.
    :param fail: builds the error for a problem (default: a refusal).
    """

    data: Mapping[str, Any]
    where: str
    _: dataclasses.KW_ONLY
    strict: bool = False
    unknown: list[tuple[str, str]] | None = None
    fail: Fail = _refusal

    def nested(self, data: Mapping[str, Any], where: str) -> Reader:
        """A reader for an object inside this one, with the same rules."""
        return dataclasses.replace(self, data=data, where=where)

    def read(self, name: str, spec: WireField) -> Any:
        """The value of ``name`` checked against ``spec``'s shape (``None`` when it may be absent)."""
        if name not in self.data:
            if spec.optional:
                return None
            raise self.fail(f"{self.where} is missing required field {name!r}", name, self._at(name))
        value = self.data[name]
        if value is None and (spec.optional or spec.nullable):
            return None
        accepts, words = _SHAPES[spec.kind]
        if not accepts(value):
            raise self.fail(
                f"{self.where}.{name} must be {words}, got {json_type(value)}", name, self._at(name)
            )
        if (spec.minimum is not None and value < spec.minimum) or (
            spec.maximum is not None and value > spec.maximum
        ):
            raise self.fail(f"{self.where}.{name} {spec.out_of_range(value)}", name, self._at(name))
        return value

    def _at(self, name: str) -> str:
        return f"{self.where}.{name}"

    def only(self, allowed: frozenset[str], *, code: str = "unknown_field") -> None:
        """Unknown keys: noted with ``code`` when this reader collects them (client messages:
        WIRE.md §2 lists the refusals exhaustively and an unknown field is not among them),
        else an error."""
        unknown = sorted(set(self.data) - allowed)
        if not unknown:
            return
        if self.unknown is None:
            raise self.fail(
                f"{self.where} has unknown field {unknown[0]!r}{did_you_mean(unknown[0], allowed)}",
                unknown[0],
                self._at(unknown[0]),
            )
        self.unknown.append((f"{self.where}.{unknown[0]}", code))


class Codec(Protocol):
    """Converts between a field's JSON value (already of the declared shape) and its attribute."""

    def decode(self, value: Any, reader: Reader, key: str) -> Any:
        """The attribute for a JSON value read by ``reader`` under ``key``."""

    def encode(self, value: Any) -> Any:
        """The JSON value of an attribute (never ``None``)."""


@dataclass(frozen=True, slots=True)
class WireField:
    """How one dataclass field is written and read.

    :param kind: its JSON shape: ``str``, ``int``, ``number``, ``bool``, ``object``, ``array``,
        ``state`` (a string, an array or an object) or ``any``.
    :param key: the wire key (default: the attribute's name).
    :param at: the key of the nested object that holds it (``None``: the message object).
    :param after: the key it follows in its object (``None``: declaration order).
    :param optional: it may be missing or null (read as ``absent``).
    :param nullable: it is required, but may be null (read as ``None``).
    :param omit: when encoding leaves it out: ``never``, ``none`` (when ``None``) or ``empty``.
    :param minimum: the smallest number allowed.
    :param maximum: the largest number allowed (a value outside the range is refused, naming the
        field and the range).
    :param why: why the range is what it is, ending the refusal (``a dispatch happens within one
        stream``).
    :param codec: converts a structured value (records, tuples, limits).
    :param convert: applied to the value read (after the codec), e.g. a cap.
    :param absent: the attribute when an optional field is missing or null.
    :param const: a fixed value, always written, never read (the field is not constructed).
    :param has_const: ``const`` is set (``None`` may be a constant too).
    """

    kind: str = "any"
    key: str | None = None
    at: str | None = None
    after: str | None = None
    optional: bool = False
    nullable: bool = False
    omit: str = "never"
    minimum: int | None = None
    maximum: int | None = None
    why: str | None = None
    codec: Codec | None = None
    convert: Callable[[Any], Any] | None = None
    absent: Any = None
    const: Any = None
    has_const: bool = False

    def __post_init__(self) -> None:
        if self.kind not in _SHAPES:
            raise ValueError(f"wire kind {self.kind!r} is not one of {sorted(_SHAPES)}")
        if self.omit not in ("never", "none", "empty"):
            raise ValueError(f"wire omit {self.omit!r} is not one of ['never', 'none', 'empty']")

    def out_of_range(self, value: float) -> str:
        """The refusal of ``value``, outside the field's range: ``must be from 0 to 3600000, got 1e+300``."""
        if self.maximum is None:
            allowed = f"at least {self.minimum}"
        elif self.minimum is None:
            allowed = f"at most {self.maximum}"
        else:
            allowed = f"from {self.minimum} to {self.maximum}"
        return f"must be {allowed}, got {value!r}" + (f": {self.why}" if self.why else "")


def wire(
    kind: str = "any", *, default: Any = dataclasses.MISSING, default_factory: Any = None, **spec: Any
) -> Any:
    """Declare a dataclass field with its wire form (see :class:`WireField` for ``spec``).

    :param kind: the JSON shape.
    :param default: the attribute's default.
    :param default_factory: builds the attribute's default.
    """
    if "const" in spec:
        spec["has_const"] = True
    metadata = {"wire": WireField(kind, **spec)}
    if "const" in spec:
        return dataclasses.field(default=spec["const"], init=False, repr=False, metadata=metadata)
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclass(frozen=True, slots=True)
class _Slot:
    attr: str
    key: str
    spec: WireField


@dataclass(frozen=True, slots=True)
class _Plan:
    slots: tuple[_Slot, ...]
    #: the keys of each object, by ``at`` (``None``: the top object)
    keys: dict[str | None, frozenset[str]]


_PLANS: dict[type, _Plan] = {}


def _plan(cls: type) -> _Plan:
    plan = _PLANS.get(cls)
    if plan is None:
        slots = tuple(
            _Slot(f.name, f.metadata["wire"].key or f.name, f.metadata["wire"])
            for f in dataclasses.fields(cls)
            if "wire" in f.metadata
        )
        keys: dict[str | None, set[str]] = {}
        for slot in slots:
            keys.setdefault(slot.spec.at, set()).add(slot.key)
            if isinstance(slot.spec.codec, Record):
                # a record field whose key holds other fields too: its fields share that object
                keys.setdefault(slot.key, set()).update(_plan(slot.spec.codec.cls).keys[None])
        plan = _PLANS[cls] = _Plan(slots, {at: frozenset(names) for at, names in keys.items()})
    return plan


def _place(data: dict[str, Any], key: str, value: Any, after: str | None) -> dict[str, Any]:
    if after is None or after not in data:
        data[key] = value
        return data
    items = list(data.items())
    index = next(i for i, (k, _) in enumerate(items) if k == after) + 1
    items.insert(index, (key, value))
    return dict(items)


def encode_fields(obj: Any, data: dict[str, Any] | None = None) -> dict[str, Any]:
    """The wire object of a declared dataclass, keys in canonical order.

    :param obj: the message or value.
    :param data: keys that come first (a message's ``type``).
    """
    data = {} if data is None else data
    for slot in _plan(type(obj)).slots:
        spec = slot.spec
        value = getattr(obj, slot.attr)
        if (spec.omit == "none" and value is None) or (spec.omit == "empty" and not value):
            continue
        if value is not None and spec.codec is not None:
            value = spec.codec.encode(value)
        if spec.at is None:
            data = _place(data, slot.key, value, spec.after)
        else:
            data[spec.at] = _place(data.get(spec.at, {}), slot.key, value, spec.after)
    return data


def decode_fields(
    cls: type,
    reader: Reader,
    *,
    code: str = "unknown_field",
    also: frozenset[str] = frozenset(),
    check_keys: bool = True,
) -> dict[str, Any]:
    """The constructor arguments of a declared dataclass, read from ``reader``.

    :param cls: the dataclass.
    :param reader: the object's reader (a strict one checks the keys first).
    :param code: the code an unknown key is noted with.
    :param also: keys allowed besides the declared ones (a message's ``type``).
    :param check_keys: ``False`` when the caller checked the object's keys already.
    """
    plan = _plan(cls)
    strict = reader.strict
    if strict and check_keys:
        reader.only(plan.keys[None] | also, code=code)
    inner: dict[str, Reader] = {}

    def reader_at(key: str) -> Reader:
        if key not in inner:
            value = reader.read(key, _OBJECT)
            inner[key] = reader.nested(value, f"{reader.where}.{key}")
            if strict:
                inner[key].only(plan.keys[key])
        return inner[key]

    values: dict[str, Any] = {}
    for slot in plan.slots:
        spec = slot.spec
        if spec.has_const:
            continue
        if isinstance(spec.codec, Record) and slot.key in plan.keys:
            # the record shares its object with fields declared ``at`` its key (``start.request``)
            record = decode_fields(spec.codec.cls, reader_at(slot.key), check_keys=False)
            values[slot.attr] = spec.codec.cls(**record)
            continue
        source = reader if spec.at is None else reader_at(spec.at)
        value = source.read(slot.key, spec)
        if value is None:
            value = spec.absent
        elif spec.codec is not None:
            value = spec.codec.decode(value, source, slot.key)
        values[slot.attr] = value if spec.convert is None else spec.convert(value)
    return values


_OBJECT = WireField("object")


# --------------------------------------------------------------------------------------------
# codecs
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Record:
    """A nested object that is itself a declared dataclass.

    :param cls: the dataclass.
    """

    cls: type

    def decode(self, value: Any, reader: Reader, key: str) -> Any:
        nested = reader.nested(value, f"{reader.where}.{key}")
        return self.cls(**decode_fields(self.cls, nested))

    def encode(self, value: Any) -> Any:
        return encode_fields(value)


@dataclass(frozen=True, slots=True)
class RecordTuple:
    """An array of objects of a declared dataclass, as a tuple.

    :param cls: the dataclass.
    :param code: the code an unknown key inside an element is noted with.
    """

    cls: type
    code: str = "unknown_field"

    def decode(self, value: Any, reader: Reader, key: str) -> Any:
        path = f"{reader.where}.{key}"
        result = []
        for index, item in enumerate(value):
            if not isinstance(item, dict):
                raise reader.fail(
                    f"{path}[{index}] must be an object", f"{path}[{index}]", f"{path}[{index}]"
                )
            nested = reader.nested(item, f"{path}[{index}]")
            result.append(self.cls(**decode_fields(self.cls, nested, code=self.code)))
        return tuple(result)

    def encode(self, value: Any) -> Any:
        return [encode_fields(item) for item in value]


@dataclass(frozen=True, slots=True)
class RecordMap:
    """An object of name → object of a declared dataclass, as ``(name, value)`` pairs in order.

    :param cls: the dataclass.
    """

    cls: type

    def decode(self, value: Any, reader: Reader, key: str) -> Any:
        path = f"{reader.where}.{key}"
        pairs = []
        for name, item in value.items():
            if not isinstance(item, dict):
                raise reader.fail(
                    f"{path}.{name} must be an object", f"{_relative(path)}.{name}", f"{path}.{name}"
                )
            pairs.append((name, Record(self.cls).decode(item, reader.nested(value, path), name)))
        return tuple(pairs)

    def encode(self, value: Any) -> Any:
        return {name: encode_fields(item) for name, item in value}


class StringTuple:
    """An array of strings, as a tuple."""

    def decode(self, value: Any, reader: Reader, key: str) -> Any:
        path = f"{reader.where}.{key}"
        for index, item in enumerate(value):
            if not isinstance(item, str):
                raise reader.fail(f"{path}[{index}] must be a string", _relative(path), f"{path}[{index}]")
        return tuple(value)

    def encode(self, value: Any) -> Any:
        return list(value)


@dataclass(frozen=True, slots=True)
class Via:
    """A value type with its own strict reader (limits, error envelope, retry hint).

    :param read: ``(value, field)`` → the attribute, ``field`` the path without the message type.
    :param write: the attribute → its JSON value.
    """

    read: Callable[[Any, str], Any]
    write: Callable[[Any], Any]

    def decode(self, value: Any, reader: Reader, key: str) -> Any:
        return self.read(value, _relative(f"{reader.where}.{key}"))

    def encode(self, value: Any) -> Any:
        return self.write(value)


def _relative(path: str) -> str:
    """A path without the message type in front (``start.request.x`` → ``request.x``)."""
    return path.partition(".")[2]


# --------------------------------------------------------------------------------------------
# the frame
# --------------------------------------------------------------------------------------------


class _Unreadable(str):
    """A number literal no peer may send (see :func:`_unreadable`), kept as its text to find its field."""


def _unreadable(text: str, *, integers: bool) -> str | None:
    """Why a number literal cannot be read, or ``None`` when it can: an integer beyond ±(2**53 - 1)
    (with ``integers``), a float that overflows to infinity, or ``NaN`` / ``Infinity``."""
    if text in ("NaN", "Infinity", "-Infinity"):
        return f"{text}, which is not JSON: numbers are finite"
    if any(c in text for c in ".eE"):
        if math.isfinite(float(text)):
            return None
        return f"the number {text[:24]!r}, which overflows to infinity: JSON numbers are finite"
    if not integers or -MAX_SAFE_INTEGER <= int(text) <= MAX_SAFE_INTEGER:
        return None
    return (
        f"the integer {text[:24]}{'…' if len(text) > 24 else ''} ({len(text)} digits), outside "
        "±(2**53 - 1): a number every JSON parser reads exactly"
    )


def _safe_int(text: str) -> int:
    value = int(text)
    if not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
        raise refuse(f"the frame holds {_unreadable(text, integers=True)}", None)
    return value


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise refuse(f"the frame holds {_unreadable(text, integers=True)}", None)
    return value


def _no_constant(name: str) -> Any:
    raise refuse(f"the frame holds {_unreadable(name, integers=True)}", None)


def _kept(text: str) -> Any:
    return _Unreadable(text) if _unreadable(text, integers=True) is not None else json.loads(text)


#: ``json.loads`` keeping each number literal no peer may send as an :class:`_Unreadable`: read
#: again only to name the field of a frame refused for one.
_MARKING = json.JSONDecoder(parse_int=_kept, parse_float=_kept, parse_constant=_kept).decode


def _unreadable_at(value: Any, path: str, integers: bool) -> tuple[str, str] | None:
    """The path to the first unreadable number in ``value`` and the number's text, depth first."""
    if isinstance(value, _Unreadable):
        return (path, value) if _unreadable(value, integers=integers) is not None else None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        at = f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}"
        found = _unreadable_at(item, at, integers)
        if found is not None:
            return found
    return None


def _named(refusal: RemoteProtocolError, text: str, *, integers: bool) -> RemoteProtocolError:
    """``refusal`` of a frame for a number, naming the number's field when the frame is a message."""
    try:
        data = _MARKING(text)
        found = _unreadable_at(data, "", integers) if isinstance(data, dict) else None
    except (ValueError, RecursionError):
        return refusal
    kind = data.get("type") if isinstance(data, dict) else None
    if found is None or not isinstance(kind, str) or isinstance(kind, _Unreadable):
        return refusal
    # the path may hold any key the peer chose: escaped and bounded like any text of its
    field, number = safe_text(found[0].removeprefix("."), 120), found[1]
    return refuse(f"{safe_text(kind, 64)}.{field} holds {_unreadable(number, integers=integers)}", field)


#: ``json.loads`` checking every integer and float literal as it is read (:func:`_safe_int`,
#: :func:`_finite_float`), built once (``json.loads`` with options builds a new decoder on every call).
_CHECKED = json.JSONDecoder(
    parse_int=_safe_int, parse_float=_finite_float, parse_constant=_no_constant
).decode
#: ``json.loads`` refusing what is not JSON although Python reads it: ``NaN``, the infinities, and
#: a float literal that overflows to one (a client's state may hold any integer).
_FINITE = json.JSONDecoder(parse_float=_finite_float, parse_constant=_no_constant).decode


def load_object(text: str | bytes, *, strict_numbers: bool = False) -> dict[str, Any]:
    """One text frame as a JSON object with a string ``type``.

    :param text: the frame (``bytes`` stands for a binary frame and is always refused).
    :param strict_numbers: refuse integers beyond ±(2**53 - 1) too (non-finite numbers are
        never JSON: always refused).
    :raises RemoteProtocolError: a refusal saying what the frame is instead.
    """
    if isinstance(text, bytes | bytearray | memoryview):
        raise refuse(
            "binary frames are not allowed: every message is one text frame holding a JSON object", None
        )
    try:
        data = _CHECKED(text) if strict_numbers else _FINITE(text)
    except RemoteProtocolError as exc:  # a number no peer may send: name its field
        raise _named(exc, text, integers=strict_numbers) from None
    except (ValueError, RecursionError):
        raise refuse(
            "the frame is not valid JSON: every message is one text frame holding a JSON object", None
        ) from None
    if not isinstance(data, dict):
        raise refuse(f"the frame holds a JSON {json_type(data)}, not an object", None)
    if not isinstance(data.get("type"), str):
        raise refuse("the message has no string 'type'", "type")
    return data
