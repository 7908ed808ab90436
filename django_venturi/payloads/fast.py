"""The codec's fast path: msgspec, where it is exactly as strict as the slow path.

`codec.encode` and `codec.decode` ask this module first; the slow path is the
hand-written one in `codec`, which gives every verdict this module declines
(`UNDECIDED`) and every error. Shared pieces come from `fields` (a class's field
hints, the timedelta JSON form) and `text` (storable text); this module imports
nothing else from django_venturi, and never `codec`.

msgspec checks and converts a payload in C, in one pass, against types built once
per payload class ("mirrors" of its fields). It is trusted only where it is as
strict as the slow path and writes the same JSON; everything else is said here,
node by node:

- msgspec accepts more than the slow path in places (a dict or any object with
  the right attributes for a dataclass, an enum's value for the enum, a tuple or
  a set for a list, a number for a Decimal): `accepts` checks those places on the
  input itself.
- msgspec writes some types its own way (a UTC datetime ends in "Z", a timedelta
  is an ISO duration) and reads datetimes with more than six fractional digits
  by rounding: those travel as plain objects or strings through msgspec and are
  written and read with the very functions the slow path uses (`finish`).
- Checks only the slow path knows (storable text, 4300-digit integers) are made
  stricter instead: integers beyond 64 bits, NaN and infinity fail the mirror
  types, and JSON text with a NUL or a surrogate fails the final check.

Whenever the fast path fails or doubts, the slow path runs from the start and
gives the verdict: its result, or its error with the field's path. A type the
fast path cannot mirror exactly (Any, Literal, unions of several types,
recursive dataclasses, unusual enums) always takes the slow path.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import functools
import itertools
import sys
import types
import typing
import uuid
from collections.abc import Callable, Iterator
from typing import Annotated, Any

import msgspec

from django_venturi.payloads import text
from django_venturi.payloads.fields import field_hints, timedelta_from_json, timedelta_to_json

_INT64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
_FINITE = Annotated[float, msgspec.Meta(ge=-sys.float_info.max, le=sys.float_info.max)]
_OBJECTS_ONLY = (dt.datetime, dt.date, dt.time, dt.timedelta, decimal.Decimal, uuid.UUID)
"""Types an encoded value must already be (msgspec would otherwise parse strings)."""
_WRITTEN_BY_US = (dt.datetime, dt.date, dt.time, dt.timedelta)
"""Types left as objects by `to_builtins`, written by `_Node.finish` as the slow path does."""


class _Unsupported(Exception):
    """A type the fast path does not mirror exactly: the slow path handles it."""


class _ConstructorFailed(Exception):
    """A dataclass's own `__init__` raised while decoding: re-raised as it is."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


@dataclasses.dataclass(frozen=True)
class _Node:
    """How one type hint is encoded and decoded on the fast path."""

    encode_type: Any
    """The msgspec type an encoded value converts to (from_attributes, objects only)."""
    decode_type: Any
    """The msgspec type stored JSON converts to before `build`."""
    accepts: Callable[[Any], bool] | None = None
    """Checks of the value to encode that msgspec would let through; None if none."""
    finish: Callable[[Any], Any] | None = None
    """Turns `to_builtins`' output into the slow path's JSON; None if already equal."""
    fits: Callable[[Any], bool] | None = None
    """Checks of the stored JSON that msgspec would let through; None if none."""
    build: Callable[[Any], Any] | None = None
    """Turns msgspec's decoded value into the slow path's value; None if already equal."""


def encode(value: Any, hint: Any) -> Any:
    """`value` encoded as `hint` if the fast path vouches for it, else `UNDECIDED`."""
    node = _node(hint)
    if node is None:
        return UNDECIDED
    try:
        converted = msgspec.convert(
            value, node.encode_type, strict=True, from_attributes=True, builtin_types=_OBJECTS_ONLY
        )
        if node.accepts is not None and not node.accepts(value):
            return UNDECIDED
        encoded = msgspec.to_builtins(converted, builtin_types=_WRITTEN_BY_US)
        if node.finish is not None:
            encoded = node.finish(encoded)
        # NUL is written as an escape; a surrogate cannot be written at all.
        if b"\\u0000" in msgspec.json.encode(encoded):
            return UNDECIDED
    except Exception:  # any failure: the slow path decides and explains
        return UNDECIDED
    return encoded


def decode(hint: Any, data: Any) -> Any:
    """`data` decoded as `hint` if the fast path vouches for it, else `UNDECIDED`."""
    node = _node(hint)
    if node is None:
        return UNDECIDED
    try:
        converted = msgspec.convert(data, node.decode_type, strict=True)
        if node.fits is not None and not node.fits(data):
            return UNDECIDED
        return converted if node.build is None else node.build(converted)
    except _ConstructorFailed as failed:
        raise failed.error from None
    except Exception:  # any failure: the slow path decides and explains
        return UNDECIDED


UNDECIDED: Any = object()
"""What `encode` and `decode` return when the slow path must decide (and explain)."""


def _node(hint: Any) -> _Node | None:
    """The fast path's plan for `hint`, built once; None if the slow path must handle it."""
    try:
        return _cached_node(hint)
    except TypeError:  # an unhashable hint
        return None


@functools.cache
def _cached_node(hint: Any) -> _Node | None:
    try:
        return _build_node(hint, ())
    except Exception:  # _Unsupported, or a hint msgspec refuses
        return None


def _build_node(hint: Any, outer: tuple[type, ...]) -> _Node:
    if hint in (str, bool):
        return _Node(hint, hint)
    if hint is int:
        return _Node(_INT64, int)
    if hint is float:  # msgspec would also take a Decimal, both ways
        return _Node(_FINITE, float, accepts=_is_number, fits=_is_number)
    if hint is None or hint is type(None):
        return _Node(None, None)
    if hint in _ISO_TEXT:
        return _Node(hint, str, finish=_ISO_TEXT[hint], build=hint.fromisoformat)
    if hint is dt.timedelta:
        return _Node(hint, int, finish=timedelta_to_json, build=timedelta_from_json)
    if hint in (decimal.Decimal, uuid.UUID):
        # Read from a string only: msgspec would also take numbers and objects.
        return _Node(hint, hint, fits=_is_str)
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return _optional_node(args, outer)
    if origin is list and len(args) == 1:
        return _list_node(_build_node(args[0], outer))
    if origin is tuple and args and args != ((),):
        if len(args) == 2 and args[1] is Ellipsis:
            return _tuple_node([_build_node(args[0], outer)], variadic=True)
        return _tuple_node([_build_node(arg, outer) for arg in args], variadic=False)
    if origin is dict and len(args) == 2 and args[0] is str:
        return _dict_node(_build_node(args[1], outer))
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _enum_node(hint)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _dataclass_node(hint, outer)
    raise _Unsupported(hint)  # Any, Literal, bare containers, unsupported types


_ISO_TEXT: dict[Any, Callable[[Any], str]] = {
    dt.datetime: dt.datetime.isoformat,
    dt.date: dt.date.isoformat,
    dt.time: dt.time.isoformat,
}


def _is_str(data: Any) -> bool:
    return isinstance(data, str)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float)


def _optional_node(args: tuple[Any, ...], outer: tuple[type, ...]) -> _Node:
    concrete = [arg for arg in args if arg is not type(None)]
    if len(concrete) != 1:
        raise _Unsupported(args)  # stored with a tag by the slow path
    inner = _build_node(concrete[0], outer)
    accepts, finish, fits, build = inner.accepts, inner.finish, inner.fits, inner.build
    return _Node(
        inner.encode_type | None,
        inner.decode_type | None,
        accepts=None if accepts is None else lambda value: value is None or accepts(value),
        finish=None if finish is None else lambda value: None if value is None else finish(value),
        fits=None if fits is None else lambda data: data is None or fits(data),
        build=None if build is None else lambda value: None if value is None else build(value),
    )


def _list_node(item: _Node) -> _Node:
    accepts, finish, fits, build = item.accepts, item.finish, item.fits, item.build
    return _Node(
        list[item.encode_type],  # type: ignore[name-defined]
        list[item.decode_type],  # type: ignore[name-defined]
        accepts=lambda value: (
            isinstance(value, list) and (accepts is None or all(map(accepts, value)))
        ),
        finish=None if finish is None else lambda value: [finish(each) for each in value],
        fits=lambda data: isinstance(data, list) and (fits is None or all(map(fits, data))),
        build=None if build is None else lambda value: [build(each) for each in value],
    )


def _tuple_node(items: list[_Node], *, variadic: bool) -> _Node:
    if variadic:
        item = items[0]
        encode_type: Any = tuple[item.encode_type, ...]  # type: ignore[name-defined]
        decode_type: Any = tuple[item.decode_type, ...]  # type: ignore[name-defined]
    else:
        encode_type = tuple[tuple(each.encode_type for each in items)]  # type: ignore[misc]
        decode_type = tuple[tuple(each.decode_type for each in items)]  # type: ignore[misc]

    def per_item(value: Any) -> Iterator[tuple[_Node, Any]]:
        return zip(itertools.repeat(items[0]) if variadic else items, value, strict=False)

    def accepts(value: Any) -> bool:
        # msgspec has checked the length; it also takes lists and sets, the slow path not.
        return isinstance(value, tuple) and all(
            node.accepts(each) for node, each in per_item(value) if node.accepts is not None
        )

    def finish(value: Any) -> list[Any]:  # JSON has no tuples: an array, as the slow path
        return [
            each if node.finish is None else node.finish(each) for node, each in per_item(value)
        ]

    def fits(data: Any) -> bool:  # stored as an array: the slow path refuses a tuple
        return isinstance(data, list) and all(
            node.fits(each) for node, each in per_item(data) if node.fits is not None
        )

    def build(value: Any) -> tuple[Any, ...]:
        return tuple(
            each if node.build is None else node.build(each) for node, each in per_item(value)
        )

    needs_build = any(node.build is not None for node in items)
    return _Node(encode_type, decode_type, accepts, finish, fits, build if needs_build else None)


def _dict_node(item: _Node) -> _Node:
    accepts, finish, fits, build = item.accepts, item.finish, item.fits, item.build
    return _Node(
        dict[str, item.encode_type],  # type: ignore[name-defined]
        dict[str, item.decode_type],  # type: ignore[name-defined]
        accepts=lambda value: (
            isinstance(value, dict) and (accepts is None or all(map(accepts, value.values())))
        ),
        finish=None
        if finish is None
        else lambda value: {key: finish(each) for key, each in value.items()},
        fits=lambda data: (
            isinstance(data, dict) and (fits is None or all(map(fits, data.values())))
        ),
        build=None
        if build is None
        else lambda value: {key: build(each) for key, each in value.items()},
    )


_ENUM_MISSING = getattr(enum.Enum._missing_, "__func__", None)


def _enum_node(hint: type[enum.Enum]) -> _Node:
    """Plain enums of storable str values, or of 64-bit int values, as msgspec reads them."""
    values = [member.value for member in hint]
    plain = (
        not issubclass(hint, enum.Flag)
        and getattr(hint._missing_, "__func__", None) is _ENUM_MISSING
        and values
    )
    strings = all(type(value) is str and text.problem(value) is None for value in values)
    integers = all(type(value) is int and -(2**63) <= value < 2**63 for value in values)
    if not plain or not (strings or integers):
        raise _Unsupported(hint)
    return _Node(hint, hint, accepts=lambda value: isinstance(value, hint))


def _dataclass_node(cls: type, outer: tuple[type, ...]) -> _Node:
    if cls in outer:
        raise _Unsupported(cls)  # a recursive type: msgspec would need forward references
    outer = (*outer, cls)
    fields = [
        (name, _build_node(hint, outer), has_default)
        for name, hint, has_default in field_hints(cls)
    ]
    name = f"_Fast{cls.__name__}"
    encode_type = msgspec.defstruct(name, [(field, node.encode_type) for field, node, _ in fields])
    decode_type = msgspec.defstruct(
        name,
        [
            (field, node.decode_type, msgspec.UNSET) if has_default else (field, node.decode_type)
            for field, node, has_default in fields
        ],
        forbid_unknown_fields=True,
    )
    to_accept = [(field, node.accepts) for field, node, _ in fields if node.accepts is not None]
    to_finish = [(field, node.finish) for field, node, _ in fields if node.finish is not None]
    to_fit = [(field, node.fits) for field, node, _ in fields if node.fits is not None]
    builders = [(field, node.build) for field, node, _ in fields]

    def accepts(value: Any) -> bool:
        return isinstance(value, cls) and all(
            check(getattr(value, field)) for field, check in to_accept
        )

    def finish(value: dict[str, Any]) -> dict[str, Any]:
        for field, convert in to_finish:
            value[field] = convert(value[field])
        return value

    def fits(data: Any) -> bool:
        return isinstance(data, dict) and all(
            check(data[field]) for field, check in to_fit if field in data
        )

    def build(value: Any) -> Any:
        values = {}
        for field, convert in builders:
            each = getattr(value, field)
            if each is not msgspec.UNSET:
                values[field] = each if convert is None else convert(each)
        try:
            return cls(**values)
        except Exception as error:
            raise _ConstructorFailed(error) from error

    return _Node(encode_type, decode_type, accepts, finish if to_finish else None, fits, build)
