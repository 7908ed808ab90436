"""What the codec reads off a payload class, shared by its two paths and the admin.

- `field_hints`: each init field of a dataclass with its resolved type, read
  once per class; both paths of the codec (`codec` by hand, `fast` with msgspec)
  walk a payload by it.
- Secret fields: `secret()` declares one; `masked` is a payload's stored JSON
  with them hidden, for screens and logs; `holds_secrets` says whether a class
  has any, at any depth. `codec` also hides a secret field's value in its errors.
- The JSON form of a timedelta (integer microseconds), which both paths write
  and read with these very functions.

The lowest module of the codec: it imports nothing from django_venturi, and
`codec` re-exports what callers use (`secret`, `masked`, `holds_secrets`, `MASK`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import typing
from collections.abc import Iterator
from typing import Any

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
def field_hints(cls: type) -> tuple[tuple[str, Any, bool], ...]:
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
def secret_fields(cls: type) -> frozenset[str]:
    """The names of the fields of `cls` declared with `secret()`."""
    return frozenset(field.name for field in dataclasses.fields(cls) if field.metadata.get(SECRET))


def masked(cls: type, data: Any) -> Any:
    """The stored JSON of a `cls` payload with its secret fields (at any depth) masked."""
    if not isinstance(data, dict):
        return data
    secrets = secret_fields(cls)
    result = {}
    for name, hint, _ in field_hints(cls):
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
    if secret_fields(cls):
        return True
    seen = seen | {cls}
    return any(
        _holds_secrets(inner, seen)
        for _, hint, _ in field_hints(cls)
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


def timedelta_to_json(value: dt.timedelta) -> int:
    """A timedelta as stored: its length in whole microseconds."""
    return (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds


def timedelta_from_json(data: int) -> dt.timedelta:
    """The timedelta `timedelta_to_json` stored as `data`."""
    return dt.timedelta(microseconds=data)
