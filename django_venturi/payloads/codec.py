"""Typed JSON payloads: dataclass <-> JSON, checked against the type hints.

Payloads are plain JSON (never pickle). Encoding checks every value against its
declared type, so a payload that does not fit is refused at enqueue time with
the path of the offending field; decoding checks again, so a row that no longer
fits its class (the class changed since enqueue) is a clear, permanent failure.

This module holds the entry points (`encode`, `decode`, `encode_value`,
`decode_value`), the errors (`PayloadError`, `UnstorableValue`: journal entries
name them by this module's path) and the slow path: the hand-written encoder and
decoder, which handle every type and give every error, with the field's path.
Each entry point asks the fast path first (`fast`: msgspec, for the types it
mirrors exactly) and runs the slow path when it declines. What a payload class
declares (field hints, secret fields) is read in `fields`, their masking for
screens is `masking`'s, both re-exported here; storable text is `text`'s.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import types
import typing
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from django_venturi.payloads import text
from django_venturi.payloads.fast import UNDECIDED
from django_venturi.payloads.fast import decode as fast_decode
from django_venturi.payloads.fast import encode as fast_encode
from django_venturi.payloads.fields import (
    MASK,
    SECRET,
    field_hints,
    secret,
    secret_fields,
    timedelta_from_json,
    timedelta_to_json,
)
from django_venturi.payloads.masking import holds_secrets, masked

__all__ = [
    "JSON",
    "MASK",
    "MAX_INT_DIGITS",
    "SECRET",
    "PayloadError",
    "UnstorableValue",
    "decode",
    "decode_value",
    "encode",
    "encode_value",
    "holds_secrets",
    "int_problem",
    "masked",
    "secret",
    "too_deep",
]

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
        encoded = fast_encode(instance, cls)
        if encoded is not UNDECIDED:
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
        decoded = fast_decode(cls, data)
        if decoded is not UNDECIDED:
            return typing.cast(T, decoded)
    return typing.cast(T, _decode(cls, data, cls.__name__))


def encode_value(value: Any, hint: Any, path: str) -> Any:
    """Encode one value of type `hint` (used for carries and nested fields)."""
    encoded = fast_encode(value, hint)
    if encoded is not UNDECIDED:
        return encoded
    try:
        return _encode(value, hint, path)
    except RecursionError:
        raise too_deep(path) from None


def decode_value(hint: Any, data: Any, path: str) -> Any:
    """Decode one value of type `hint` (used for carries and nested fields)."""
    decoded = fast_decode(hint, data)
    if decoded is not UNDECIDED:
        return decoded
    return _decode(hint, data, path)


# ---------------------------------------------------------------- the slow path


def _hide_secret(cls: type, name: str, error: PayloadError) -> PayloadError:
    if name not in secret_fields(cls) or isinstance(error, UnstorableValue):
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
    for name, hint, _ in field_hints(cls):
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


_SCALAR_ENCODERS: dict[type, Callable[[Any, str], Any]] = {
    str: _encode_str_field,
    int: _checked(int, int, _encode_int),
    bool: _checked(bool, bool),
    float: _encode_float,
    dt.datetime: _checked(dt.datetime, dt.datetime.isoformat),
    dt.date: _checked(dt.date, dt.date.isoformat),
    dt.time: _checked(dt.time, dt.time.isoformat),
    dt.timedelta: _checked(dt.timedelta, timedelta_to_json),
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
    fields = field_hints(cls)
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


_SCALAR_DECODERS: dict[type, Callable[[Any, str], Any]] = {
    str: _parsed(str, str),
    int: _parsed(int, int, json_type=int),
    bool: _parsed(bool, bool, json_type=bool),
    float: _parsed(float, float, json_type=(int, float)),
    dt.datetime: _parsed(dt.datetime, dt.datetime.fromisoformat),
    dt.date: _parsed(dt.date, dt.date.fromisoformat),
    dt.time: _parsed(dt.time, dt.time.fromisoformat),
    dt.timedelta: _parsed(dt.timedelta, timedelta_from_json, json_type=int),
    decimal.Decimal: _parsed(decimal.Decimal, decimal.Decimal),
    uuid.UUID: _parsed(uuid.UUID, uuid.UUID),
}
