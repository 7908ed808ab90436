"""Typed JSON payloads: dataclass <-> JSON, checked against the type hints.

Payloads are plain JSON (never pickle). Encoding checks every value against its
declared type, so a payload that does not fit is refused at enqueue time with
the path of the offending field; decoding checks again, so a row that no longer
fits its class (the class changed since enqueue) is a clear, permanent failure.
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
from typing import Annotated, Any, TypeVar

import msgspec

from django_venturi.payloads import text

T = TypeVar("T")

JSON = dict[str, Any] | list[Any] | str | int | float | bool | None


class PayloadError(ValueError):
    """A payload value does not fit its declared type; `path` names the field."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path


MAX_INT_DIGITS = 4300
"""The longest integer a payload may hold: Python's default `int` <-> `str` limit,
past which the json module can neither write nor read it."""
_INT_BOUND = 10**MAX_INT_DIGITS


class UnstorableValue(PayloadError):
    """A value of the right type that the database cannot store (NUL, surrogate, huge int)."""


def encode(instance: object) -> dict[str, Any]:
    """Turn a dataclass instance into a JSON object, checking every field.

    Strings (and dict keys) must be text the database can store: see
    `django_venturi.payloads.text`; a NUL character or a surrogate is refused.
    """
    cls = type(instance)
    if dataclasses.is_dataclass(cls):
        encoded = _fast_encode(instance, cls)
        if encoded is not _UNDECIDED:
            return typing.cast(dict[str, Any], encoded)
    try:
        return _encode_dataclass(instance, cls, cls.__name__)
    except RecursionError:
        raise too_deep(cls.__name__) from None


def int_problem(value: int) -> str | None:
    """Describe why JSON cannot hold the integer `value` here, or None."""
    if value.bit_length() < 14_000 or -_INT_BOUND < value < _INT_BOUND:
        return None
    return f"is an integer of more than {MAX_INT_DIGITS} digits, which JSON cannot hold"


def too_deep(path: str) -> UnstorableValue:
    """The error for a value whose encoding hit Python's recursion limit."""
    return UnstorableValue(path, "is nested too deeply to store as JSON")


def decode(cls: type[T], data: Any) -> T:
    """Rebuild a dataclass instance of `cls` from its JSON form, checking every field."""
    if dataclasses.is_dataclass(cls):
        decoded = _fast_decode(cls, data)
        if decoded is not _UNDECIDED:
            return typing.cast(T, decoded)
    return typing.cast(T, _decode(cls, data, cls.__name__))


def encode_value(value: Any, hint: Any, path: str) -> Any:
    """Encode one value of type `hint` (used for carries and nested fields)."""
    encoded = _fast_encode(value, hint)
    if encoded is not _UNDECIDED:
        return encoded
    try:
        return _encode(value, hint, path)
    except RecursionError:
        raise too_deep(path) from None


def decode_value(hint: Any, data: Any, path: str) -> Any:
    """Decode one value of type `hint` (used for carries and nested fields)."""
    decoded = _fast_decode(hint, data)
    if decoded is not _UNDECIDED:
        return decoded
    return _decode(hint, data, path)


SECRET = "venturi.secret"  # noqa: S105 - a metadata key, not a password
"""Field metadata key: the value is masked in the admin and never shown in errors."""
MASK = "********"


def secret(**field_options: Any) -> Any:
    """Declare a payload field whose value is masked in the admin and in error messages.

    Use it like `dataclasses.field`: `api_key: str = venturi.secret()` or
    `token: str = venturi.secret(default="")`. The value is still stored in the
    row as plain JSON: masking protects screens and logs, not the database.
    """
    metadata = {**field_options.pop("metadata", {}), SECRET: True}
    return dataclasses.field(metadata=metadata, **field_options)


@functools.cache
def _field_hints(cls: type) -> tuple[tuple[str, Any, bool], ...]:
    """(name, resolved type, has default) for each init field of a dataclass."""
    hints = typing.get_type_hints(cls)
    return tuple(
        (
            field.name,
            hints[field.name],
            field.default is not dataclasses.MISSING
            or field.default_factory is not dataclasses.MISSING,
        )
        for field in dataclasses.fields(cls)
        if field.init
    )


@functools.cache
def _secret_fields(cls: type) -> frozenset[str]:
    return frozenset(field.name for field in dataclasses.fields(cls) if field.metadata.get(SECRET))


def masked(cls: type, data: Any) -> Any:
    """The stored JSON of a `cls` payload with its secret fields (at any depth) masked."""
    if not isinstance(data, dict):
        return data
    secrets = _secret_fields(cls)
    result = {}
    for name, hint, _ in _field_hints(cls):
        if name not in data:
            continue
        value = data[name]
        if name in secrets:
            result[name] = MASK
        else:
            nested = _dataclass_in(hint)
            result[name] = _masked_nested(nested, value) if nested else value
    result.update({key: value for key, value in data.items() if key not in result})
    return result


def holds_secrets(cls: type) -> bool:
    """Whether a `cls` payload has a secret field at any depth (so `masked` hides something)."""
    return _holds_secrets(cls, frozenset())


def _holds_secrets(cls: type, seen: frozenset[type]) -> bool:
    if _secret_fields(cls):
        return True
    seen = seen | {cls}
    return any(
        _holds_secrets(inner, seen)
        for _, hint, _ in _field_hints(cls)
        for inner in _dataclasses_in(hint)
        if inner not in seen
    )


def _dataclasses_in(hint: Any) -> Iterator[type]:
    """Every dataclass a type hint names, however deep (`list[dict[str, Item | None]]`)."""
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        yield hint
    for arg in typing.get_args(hint):
        yield from _dataclasses_in(arg)


def _dataclass_in(hint: Any) -> type | None:
    """The dataclass a field holds, directly, optionally, or as list items."""
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return hint
    for arg in typing.get_args(hint):
        if isinstance(arg, type) and dataclasses.is_dataclass(arg):
            return arg
    return None


def _masked_nested(cls: type, value: Any) -> Any:
    if isinstance(value, list):
        return [masked(cls, item) for item in value]
    return masked(cls, value)


def _hide_secret(cls: type, name: str, error: PayloadError) -> PayloadError:
    if name not in _secret_fields(cls) or isinstance(error, UnstorableValue):
        return error  # an unstorable value's message does not show the value
    return PayloadError(error.path, "does not fit its declared type (secret field: value hidden)")


def _describe(value: Any) -> str:
    return type(value).__name__


def _type_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint)


def _encode_dataclass(value: Any, cls: type, path: str) -> dict[str, Any]:
    if not isinstance(value, cls):
        raise PayloadError(path, f"expected {cls.__name__}, got {_describe(value)}")
    encoded = {}
    for name, hint, _ in _field_hints(cls):
        try:
            encoded[name] = _encode(getattr(value, name), hint, f"{path}.{name}")
        except PayloadError as error:
            raise _hide_secret(cls, name, error) from None
    return encoded


def _encode(value: Any, hint: Any, path: str) -> Any:
    if hint is Any or hint is object:
        return _encode_any(value, path)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return _encode_union(value, typing.get_args(hint), path)
    if hint is None or hint is type(None):
        if value is not None:
            raise PayloadError(path, f"expected None, got {_describe(value)}")
        return None
    if origin is typing.Literal:
        if value not in typing.get_args(hint):
            raise PayloadError(path, f"expected one of {typing.get_args(hint)!r}, got {value!r}")
        return _encode_any(value, path) if isinstance(value, str) else value
    if origin in (list, tuple, dict) or hint in (list, tuple, dict):
        return _encode_container(value, hint, path)
    if isinstance(hint, type):
        if dataclasses.is_dataclass(hint):
            return _encode_dataclass(value, hint, path)
        if issubclass(hint, enum.Enum):
            if not isinstance(value, hint):
                raise PayloadError(path, f"expected {hint.__name__}, got {_describe(value)}")
            return _encode_any(value.value, path)
        encoder = _SCALAR_ENCODERS.get(hint)
        if encoder is not None:
            return encoder(value, path)
    raise PayloadError(path, f"type {_type_name(hint)} is not supported in payloads")


def _encode_union(value: Any, options: tuple[Any, ...], path: str) -> Any:
    if value is None and type(None) in options:
        return None
    concrete = [option for option in options if option is not type(None)]
    if len(concrete) == 1:
        return _encode(value, concrete[0], path)
    # A union of several concrete types is stored with a tag so decoding is exact.
    for index, option in enumerate(concrete):
        try:
            return {"__union__": index, "value": _encode(value, option, path)}
        except UnstorableValue:
            raise  # the right type, but not storable: no other option makes it so
        except PayloadError:
            continue
    names = " | ".join(_type_name(option) for option in options)
    raise PayloadError(path, f"expected {names}, got {_describe(value)}")


def _encode_container(value: Any, hint: Any, path: str) -> Any:
    origin = typing.get_origin(hint) or hint
    args = typing.get_args(hint)
    if origin is dict:
        if not isinstance(value, dict):
            raise PayloadError(path, f"expected dict, got {_describe(value)}")
        key_hint, value_hint = args or (str, Any)
        if key_hint is not str:
            raise PayloadError(path, "dict keys must be str in payloads")
        _check_keys(value, path)
        return {key: _encode(item, value_hint, f"{path}[{key!r}]") for key, item in value.items()}
    if origin is list:
        if not isinstance(value, list):
            raise PayloadError(path, f"expected list, got {_describe(value)}")
        (item_hint,) = args or (Any,)
        return [_encode(item, item_hint, f"{path}[{i}]") for i, item in enumerate(value)]
    if not isinstance(value, tuple):
        raise PayloadError(path, f"expected tuple, got {_describe(value)}")
    return [
        _encode(item, hint, f"{path}[{i}]") for i, (item, hint) in _tuple_items(value, args, path)
    ]


def _tuple_items(value: Any, args: tuple[Any, ...], path: str) -> list[tuple[int, tuple[Any, Any]]]:
    if not args or (len(args) == 2 and args[1] is Ellipsis):
        item_hint = args[0] if args else Any
        return list(enumerate((item, item_hint) for item in value))
    if len(value) != len(args):
        raise PayloadError(path, f"expected {len(args)} items, got {len(value)}")
    return list(enumerate(zip(value, args, strict=True)))


def _encode_any(value: Any, path: str) -> Any:
    """Untyped values (Any, bare list/dict items) must already be plain JSON."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return _encode_str(value, path)
    if isinstance(value, int):
        return _encode_int(value, path)
    if isinstance(value, float):
        return _encode_float(value, path)
    if isinstance(value, list | tuple):
        return [_encode_any(item, f"{path}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, dict):
        _check_keys(value, path)
        return {key: _encode_any(item, f"{path}[{key!r}]") for key, item in value.items()}
    raise PayloadError(path, f"{_describe(value)} is not JSON; give the field a precise type")


def _check_keys(value: dict[Any, Any], path: str) -> None:
    for key in value:
        if not isinstance(key, str):
            raise PayloadError(f"{path}[{key!r}]", "dict keys must be str")
        problem = text.problem(key)
        if problem:
            raise UnstorableValue(f"{path}[{key!r}]", f"the key {problem}")


def _encode_str(value: str, path: str) -> str:
    problem = text.problem(value)
    if problem:
        raise UnstorableValue(path, problem)
    return value


def _encode_str_field(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise PayloadError(path, f"expected str, got {_describe(value)}")
    # The usual case in two fast checks; otherwise the full one (and str subclasses become str).
    if value.isascii() and "\x00" not in value and type(value) is str:
        return value
    return _encode_str(str(value), path)


def _encode_int(value: int, path: str) -> int:
    problem = int_problem(value)
    if problem:
        raise UnstorableValue(path, problem)
    return value


def _encode_float(value: Any, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PayloadError(path, f"expected float, got {_describe(value)}")
    result = float(value)
    if result != result or result in (float("inf"), float("-inf")):
        raise PayloadError(path, "NaN and infinity are not valid JSON")
    return result


def _checked(
    kind: type,
    convert: Callable[[Any], Any],
    storable: Callable[[Any, str], Any] | None = None,
) -> Callable[[Any, str], Any]:
    """An encoder of `kind`: type check, `convert`, then `storable`'s check if given."""

    def encode_scalar(value: Any, path: str) -> Any:
        # bool is an int subclass, and datetime a date subclass: neither may pass for the other.
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise PayloadError(path, f"expected {kind.__name__}, got {_describe(value)}")
        if kind is dt.date and isinstance(value, dt.datetime):
            raise PayloadError(path, "expected date, got datetime")
        converted = convert(value)
        return converted if storable is None else storable(converted, path)

    return encode_scalar


def _timedelta_to_json(value: dt.timedelta) -> int:
    return (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds


_SCALAR_ENCODERS: dict[type, Callable[[Any, str], Any]] = {
    str: _encode_str_field,
    int: _checked(int, int, _encode_int),
    bool: _checked(bool, bool),
    float: _encode_float,
    dt.datetime: _checked(dt.datetime, dt.datetime.isoformat),
    dt.date: _checked(dt.date, dt.date.isoformat),
    dt.time: _checked(dt.time, dt.time.isoformat),
    dt.timedelta: _checked(dt.timedelta, _timedelta_to_json),
    decimal.Decimal: _checked(decimal.Decimal, str),
    uuid.UUID: _checked(uuid.UUID, str),
}


# ---------------------------------------------------------------- decoding


def _decode(hint: Any, data: Any, path: str) -> Any:
    if hint is Any or hint is object:
        return data
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return _decode_union(typing.get_args(hint), data, path)
    if hint is None or hint is type(None):
        if data is not None:
            raise PayloadError(path, f"expected null, got {_describe(data)}")
        return None
    if origin is typing.Literal:
        if data not in typing.get_args(hint):
            raise PayloadError(path, f"expected one of {typing.get_args(hint)!r}, got {data!r}")
        return data
    if origin in (list, tuple, dict) or hint in (list, tuple, dict):
        return _decode_container(hint, data, path)
    if isinstance(hint, type):
        if dataclasses.is_dataclass(hint):
            return _decode_dataclass(hint, data, path)
        if issubclass(hint, enum.Enum):
            try:
                return hint(data)
            except ValueError:
                raise PayloadError(path, f"{data!r} is not a {hint.__name__}") from None
        decoder = _SCALAR_DECODERS.get(hint)
        if decoder is not None:
            return decoder(data, path)
    raise PayloadError(path, f"type {_type_name(hint)} is not supported in payloads")


def _decode_dataclass(cls: type, data: Any, path: str) -> Any:
    if not isinstance(data, dict):
        raise PayloadError(path, f"expected an object, got {_describe(data)}")
    fields = _field_hints(cls)
    known = {name for name, _, _ in fields}
    unknown = sorted(set(data) - known)
    if unknown:
        raise PayloadError(f"{path}.{unknown[0]}", f"unknown field (fields: {sorted(known)})")
    values = {}
    for name, hint, has_default in fields:
        if name in data:
            try:
                values[name] = _decode(hint, data[name], f"{path}.{name}")
            except PayloadError as error:
                raise _hide_secret(cls, name, error) from None
        elif not has_default:
            raise PayloadError(f"{path}.{name}", "missing")
    return cls(**values)


def _decode_union(options: tuple[Any, ...], data: Any, path: str) -> Any:
    if data is None and type(None) in options:
        return None
    concrete = [option for option in options if option is not type(None)]
    if len(concrete) == 1:
        return _decode(concrete[0], data, path)
    if not isinstance(data, dict) or set(data) != {"__union__", "value"}:
        raise PayloadError(path, "expected a tagged union value")
    index = data["__union__"]
    if not isinstance(index, int) or not 0 <= index < len(concrete):
        raise PayloadError(path, f"union tag {index!r} is out of range")
    return _decode(concrete[index], data["value"], path)


def _decode_container(hint: Any, data: Any, path: str) -> Any:
    origin = typing.get_origin(hint) or hint
    args = typing.get_args(hint)
    if origin is dict:
        if not isinstance(data, dict):
            raise PayloadError(path, f"expected an object, got {_describe(data)}")
        value_hint = args[1] if args else Any
        return {key: _decode(value_hint, item, f"{path}[{key!r}]") for key, item in data.items()}
    if not isinstance(data, list):
        raise PayloadError(path, f"expected an array, got {_describe(data)}")
    if origin is list:
        item_hint = args[0] if args else Any
        return [_decode(item_hint, item, f"{path}[{i}]") for i, item in enumerate(data)]
    return tuple(
        _decode(hint, item, f"{path}[{i}]") for i, (item, hint) in _tuple_items(data, args, path)
    )


def _parsed(
    kind: type, parse: Callable[[Any], Any], *, json_type: type | tuple[type, ...] = str
) -> Callable[[Any, str], Any]:
    def decode_scalar(data: Any, path: str) -> Any:
        if not isinstance(data, json_type) or (isinstance(data, bool) and kind is not bool):
            raise PayloadError(path, f"expected {kind.__name__}, got {_describe(data)}")
        try:
            return parse(data)
        except (ValueError, ArithmeticError):
            raise PayloadError(path, f"{data!r} is not a valid {kind.__name__}") from None

    return decode_scalar


def _timedelta_from_json(data: int) -> dt.timedelta:
    return dt.timedelta(microseconds=data)


_SCALAR_DECODERS: dict[type, Callable[[Any, str], Any]] = {
    str: _parsed(str, str),
    int: _parsed(int, int, json_type=int),
    bool: _parsed(bool, bool, json_type=bool),
    float: _parsed(float, float, json_type=(int, float)),
    dt.datetime: _parsed(dt.datetime, dt.datetime.fromisoformat),
    dt.date: _parsed(dt.date, dt.date.fromisoformat),
    dt.time: _parsed(dt.time, dt.time.fromisoformat),
    dt.timedelta: _parsed(dt.timedelta, _timedelta_from_json, json_type=int),
    decimal.Decimal: _parsed(decimal.Decimal, decimal.Decimal),
    uuid.UUID: _parsed(uuid.UUID, uuid.UUID),
}


# ---------------------------------------------------------------- the fast path
#
# msgspec checks and converts a payload in C, in one pass, against types built once
# per payload class ("mirrors" of its fields). It is trusted only where it is as
# strict as the code above and writes the same JSON; everything else is said here,
# node by node:
#
# - msgspec accepts more than the slow path in places (a dict or any object with
#   the right attributes for a dataclass, an enum's value for the enum, a tuple or
#   a set for a list, a number for a Decimal): `accepts` checks those places on the
#   input itself.
# - msgspec writes some types its own way (a UTC datetime ends in "Z", a timedelta
#   is an ISO duration) and reads datetimes with more than six fractional digits
#   by rounding: those travel as plain objects or strings through msgspec and are
#   written and read with the very functions the slow path uses (`finish`).
# - Checks only the slow path knows (storable text, 4300-digit integers) are made
#   stricter instead: integers beyond 64 bits, NaN and infinity fail the mirror
#   types, and JSON text with a NUL or a surrogate fails the final check.
#
# Whenever the fast path fails or doubts, the slow path runs from the start and
# gives the verdict: its result, or its error with the field's path. A type the
# fast path cannot mirror exactly (Any, Literal, unions of several types,
# recursive dataclasses, unusual enums) always takes the slow path.

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


def _fast_encode(value: Any, hint: Any) -> Any:
    """`value` encoded as `hint` if the fast path vouches for it, else `_UNDECIDED`."""
    node = _node(hint)
    if node is None:
        return _UNDECIDED
    try:
        converted = msgspec.convert(
            value, node.encode_type, strict=True, from_attributes=True, builtin_types=_OBJECTS_ONLY
        )
        if node.accepts is not None and not node.accepts(value):
            return _UNDECIDED
        encoded = msgspec.to_builtins(converted, builtin_types=_WRITTEN_BY_US)
        if node.finish is not None:
            encoded = node.finish(encoded)
        # NUL is written as an escape; a surrogate cannot be written at all.
        if b"\\u0000" in msgspec.json.encode(encoded):
            return _UNDECIDED
    except Exception:  # any failure: the slow path decides and explains
        return _UNDECIDED
    return encoded


def _fast_decode(hint: Any, data: Any) -> Any:
    """`data` decoded as `hint` if the fast path vouches for it, else `_UNDECIDED`."""
    node = _node(hint)
    if node is None:
        return _UNDECIDED
    try:
        converted = msgspec.convert(data, node.decode_type, strict=True)
        if node.fits is not None and not node.fits(data):
            return _UNDECIDED
        return converted if node.build is None else node.build(converted)
    except _ConstructorFailed as failed:
        raise failed.error from None
    except Exception:  # any failure: the slow path decides and explains
        return _UNDECIDED


_UNDECIDED: Any = object()


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
        return _Node(hint, int, finish=_timedelta_to_json, build=_timedelta_from_json)
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
        for name, hint, has_default in _field_hints(cls)
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
