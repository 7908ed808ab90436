"""Stored JSON read back, even when Python cannot read it.

PostgreSQL's jsonb holds values Python's JSON readers refuse: an integer of more
than 4300 digits (`sys.get_int_max_str_digits()`) or arrays nested thousands
deep (RecursionError). The codec never writes one, but SQL, a data fix, a
migration or another program can. Reading such a value must not raise where the
reader is not the one who can deal with it: a claim takes a whole batch, lease
recovery a whole round, the admin's list a whole page. So the value reads as
`Unreadable`, which says why, and only the job's own run fails on it
(`UNREADABLE_PREFIX`), for good: the row cannot get better by itself.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import msgspec

from django_venturi.payloads.text import text_of

UNREADABLE_PREFIX = "stored payload unreadable: "
"""How the journal's message of a job failed on an unreadable stored value starts."""

READ_ERRORS = (ValueError, RecursionError)
"""What Python's JSON readers raise on valid JSON they cannot read."""


@dataclasses.dataclass(frozen=True, slots=True)
class Unreadable:
    """A stored JSON value that Python cannot read back, in place of the value.

    Never stored: the Job fields refuse to save it (it is no JSON), so a row
    loaded with one keeps what the database holds.
    """

    reason: str
    """Why it cannot be read, e.g. `ValueError: Exceeds the limit (4300 digits) ...`."""

    def __str__(self) -> str:
        return f"unreadable stored JSON ({self.reason})"


def unreadable(error: BaseException) -> Unreadable:
    """The `Unreadable` of an error a JSON reader (or a decoder walking the value) raised."""
    if isinstance(error, RecursionError):
        return Unreadable(f"nested too deep for Python (RecursionError: {text_of(error)})")
    return Unreadable(f"{type(error).__name__}: {text_of(error)}")


def read(text: str | bytes) -> Any:
    """The JSON value of `text`, or `Unreadable` when Python cannot read it.

    msgspec first (a tenth of `json.loads`' time), `json` for what msgspec
    refuses but `json` reads (1e400 becomes inf; integers past 64 bits).
    """
    try:
        return _decode(text)
    except msgspec.MsgspecError:
        pass
    except RecursionError as error:
        return unreadable(error)
    try:
        return json.loads(text)
    except READ_ERRORS as error:
        return unreadable(error)


_decode = msgspec.json.Decoder().decode
