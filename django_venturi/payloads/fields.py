"""What the codec reads off a payload class, shared by its two paths and the admin.

- `field_hints`: each init field of a dataclass with its resolved type, read
  once per class; both paths of the codec (`codec` by hand, `fast` with msgspec)
  walk a payload by it.
- Secret fields: `secret()` declares one and `secret_fields` names a class's
  own; `masking` hides them in stored JSON for screens, by the declared type.
  `codec` also hides a secret field's value in its errors.
- The JSON form of a timedelta (integer microseconds), which both paths write
  and read with these very functions.

The lowest module of the codec: it imports nothing from django_venturi, and
`codec` re-exports what callers use (`secret`, `MASK`; `masked` and `holds_secrets`
from `masking`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import typing
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


def timedelta_to_json(value: dt.timedelta) -> int:
    """A timedelta as stored: its length in whole microseconds."""
    return (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds


def timedelta_from_json(data: int) -> dt.timedelta:
    """The timedelta `timedelta_to_json` stored as `data`."""
    return dt.timedelta(microseconds=data)
