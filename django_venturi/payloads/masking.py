"""What screens may show of stored JSON: `secret()` fields masked by their declared type.

- `masked_value(hint, data)`: the stored JSON of a value of type `hint` with every
  value a `secret()` field holds replaced by `MASK`, wherever the type lets one
  sit: a dataclass held directly, optionally or inside another, list items
  (nested too), tuple items (fixed or variadic), dict values, each member of a
  union (stored tagged). `masked(cls, data)` is the same for a payload class.
- Mask rather than leak: where a type could hold a secret but the stored JSON
  does not fit it (an old row, a field renamed or removed since, a union tag out
  of range) or a class's field types cannot be resolved, the value there is
  masked whole. A type that cannot hold a secret is shown as stored, untouched.
- `holds_secrets(hint)`: whether a type can hold a secret at any depth (the
  admin keeps such payloads out of its search).
- `secret_texts(hint, data)`: the texts of what `masked_value` hid (strings,
  numbers, keys), with the forms they take when quoted (`repr`, JSON, URL), and
  `stored_secret_texts` for a job's payload and carry together; and
  `redact` / `redact_text`, which hide them in untyped JSON (a job's result, an
  untyped carry) and in free text (an error message, a traceback) that a
  handler may have copied them into.

Imports `fields` and `stored` only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import types
import typing
import urllib.parse
from collections.abc import Iterable
from typing import Any

from django_venturi.payloads.fields import MASK, field_hints, secret_fields
from django_venturi.payloads.stored import Unreadable

MIN_REDACTED_LENGTH = 4
"""Secret texts shorter than this are masked where they stand (a field, a whole JSON
value equal to one) but not searched for inside longer text: "1" or "abc" would
mask every line number and word that holds them."""

_NONE = type(None)
_UNIONS = (typing.Union, types.UnionType)


def masked(cls: type, data: Any) -> Any:
    """The stored JSON of a `cls` payload with its secret fields (at any depth) masked."""
    return masked_value(cls, data)


def masked_value(hint: Any, data: Any) -> Any:
    """The stored JSON `data` of type `hint` with every secret it holds masked."""
    return _walk(hint, data, None)


def secret_texts(hint: Any, data: Any) -> frozenset[str]:
    """The texts `masked_value(hint, data)` hides, in the forms they take when quoted."""
    found: set[str] = set()
    _walk(hint, data, found)
    return frozenset(found)


def leaf_texts(data: Any) -> frozenset[str]:
    """The texts of every value and key in `data`, for JSON whose type is unknown."""
    found: set[str] = set()
    _collect(data, found)
    return frozenset(found)


def stored_secret_texts(types: tuple[Any, Any] | None, payload: Any, carry: Any) -> frozenset[str]:
    """The texts a job's secret fields hold, by the declared (payload, carry) `types`;
    for types not known (None), every text of both, since any of them may be secret."""
    if types is None:
        return leaf_texts(payload) | leaf_texts(carry)
    payload_type, carry_type = types
    return secret_texts(payload_type, payload) | secret_texts(carry_type, carry)


def hidden(data: Any) -> Any:
    """`data` with every value masked and only its top-level keys left: for stored JSON
    whose type is not known here (a kind this process has not registered)."""
    if isinstance(data, dict):
        return dict.fromkeys(data, MASK)
    if data is None or isinstance(data, Unreadable):
        return data
    return MASK


def holds_secrets(hint: Any) -> bool:
    """Whether a value of type `hint` can hold a `secret()` field at any depth.

    A dataclass whose field types cannot be resolved counts as holding one.
    """
    try:
        return _holds_cached(hint)
    except TypeError:  # an unhashable hint
        return _holds(hint, frozenset())


def redact(data: Any, texts: Iterable[str]) -> Any:
    """Untyped JSON with `texts` hidden: a value equal to one is masked, and within
    strings and keys each occurrence of one (`MIN_REDACTED_LENGTH` or longer)."""
    ordered = _ordered(texts)
    if not ordered or data is None or isinstance(data, Unreadable):
        return data
    whole = frozenset(ordered)
    try:
        return _redact(data, whole, ordered)
    except RecursionError:
        return MASK


def redact_text(text: str, texts: Iterable[str]) -> str:
    """`text` with each occurrence of one of `texts` (`MIN_REDACTED_LENGTH` or longer)
    replaced by `MASK`; a text that is one of them whole is masked whatever its length."""
    ordered = _ordered(texts)
    return _redact_str(text, frozenset(ordered), ordered) if ordered else text


# ---------------------------------------------------------------- the walk by type


def _walk(hint: Any, data: Any, found: set[str] | None) -> Any:
    """`data` masked by `hint`; what it masks goes into `found` (if given) as texts."""
    if isinstance(data, Unreadable) or not holds_secrets(hint):
        return data
    try:
        return _mask(hint, data, found)
    except RecursionError:  # data nested deeper than Python can walk: hide it all
        return _masked_whole(data, found)


def _mask(hint: Any, data: Any, found: set[str] | None) -> Any:
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _mask_dataclass(hint, data, found)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in _UNIONS:
        return _mask_union(args, data, found)
    if origin is list and len(args) == 1 and isinstance(data, list):
        return [_walk(args[0], item, found) for item in data]
    if origin is tuple and isinstance(data, list):
        if len(args) == 2 and args[1] is Ellipsis:
            return [_walk(args[0], item, found) for item in data]
        if len(args) == len(data):
            return [_walk(arg, item, found) for arg, item in zip(args, data, strict=True)]
    if origin is dict and len(args) == 2 and isinstance(data, dict):
        return {key: _walk(args[1], item, found) for key, item in data.items()}
    # The JSON does not fit its type, or the type is a shape this walk does not know:
    # it could hold a secret (`holds_secrets`), so nothing of it is shown.
    return _masked_whole(data, found)


def _mask_dataclass(cls: type, data: Any, found: set[str] | None) -> Any:
    if not isinstance(data, dict):
        return _masked_whole(data, found)
    try:
        hints = {name: hint for name, hint, _ in field_hints(cls)}
    except Exception:  # a type that no longer resolves (NameError, ...): mask every field
        hints = {}
    secrets = secret_fields(cls)
    shown = {}
    for key, value in data.items():
        if key in secrets or key not in hints:  # a secret, or a field of unknown type
            shown[key] = _masked_whole(value, found)
        else:
            shown[key] = _walk(hints[key], value, found)
    return shown


def _mask_union(options: tuple[Any, ...], data: Any, found: set[str] | None) -> Any:
    if data is None and _NONE in options:
        return None
    concrete = [option for option in options if option is not _NONE]
    if len(concrete) == 1:
        return _walk(concrete[0], data, found)
    # Several concrete types: stored tagged by the codec, {"__union__": i, "value": ...}.
    if isinstance(data, dict) and set(data) == {"__union__", "value"}:
        index = data["__union__"]
        if isinstance(index, int) and not isinstance(index, bool) and 0 <= index < len(concrete):
            return {"__union__": index, "value": _walk(concrete[index], data["value"], found)}
    return _masked_whole(data, found)


def _masked_whole(data: Any, found: set[str] | None) -> Any:
    if found is not None:
        _collect(data, found)
    return MASK


def _collect(data: Any, found: set[str]) -> None:
    """Add the texts of every value and key in `data` (no recursion: any depth)."""
    stack = [data]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list | tuple):
            stack.extend(value)
        else:
            found.update(_quoted_forms(value))


def _quoted_forms(value: Any) -> set[str]:
    """A secret value's text, and the forms it takes quoted in a message or a URL."""
    if isinstance(value, bool) or value is None:
        return set()  # one bit: masked where it stands, never looked for in text
    if isinstance(value, int):
        if value.bit_length() > 10_000:  # past str()'s digit limit; no message holds it
            return set()
        return {str(value)}
    if isinstance(value, float):
        return {repr(value), json.dumps(value)}
    if not isinstance(value, str) or not value:
        return set()
    forms = {
        value,
        repr(value)[1:-1],
        json.dumps(value)[1:-1],
        json.dumps(value, ensure_ascii=False)[1:-1],
    }
    with contextlib.suppress(UnicodeEncodeError):  # a lone surrogate (never stored)
        forms.update({urllib.parse.quote(value, safe=""), urllib.parse.quote_plus(value)})
    return {form for form in forms if form}


@functools.cache
def _holds_cached(hint: Any) -> bool:
    return _holds(hint, frozenset())


def _holds(hint: Any, seen: frozenset[type]) -> bool:
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if hint in seen:
            return False  # a recursive type: its fields are being looked at already
        if secret_fields(hint):
            return True
        try:
            hints = field_hints(hint)
        except Exception:  # field types that cannot be resolved: assume the worst
            return True
        return any(_holds(inner, seen | {hint}) for _, inner, _ in hints)
    return any(_holds(arg, seen) for arg in typing.get_args(hint) if arg is not Ellipsis)


# ---------------------------------------------------------------- redaction by value


def _ordered(texts: Iterable[str]) -> tuple[str, ...]:
    """Longest first, so a secret that holds another is hidden whole."""
    return tuple(sorted({text for text in texts if text}, key=lambda text: (-len(text), text)))


def _redact(data: Any, whole: frozenset[str], ordered: tuple[str, ...]) -> Any:
    if isinstance(data, str):
        return _redact_str(data, whole, ordered)
    if isinstance(data, bool) or data is None:
        return data
    if isinstance(data, int | float):
        return MASK if _quoted_forms(data) & whole else data
    if isinstance(data, list):
        return [_redact(item, whole, ordered) for item in data]
    if isinstance(data, dict):
        return {
            _redact_str(str(key), whole, ordered): _redact(value, whole, ordered)
            for key, value in data.items()
        }
    return data


def _redact_str(text: str, whole: frozenset[str], ordered: tuple[str, ...]) -> str:
    if text in whole:
        return MASK
    for secret in ordered:
        if len(secret) < MIN_REDACTED_LENGTH:
            break  # longest first: the rest are shorter still
        if secret in text:
            text = text.replace(secret, MASK)
    return text
