"""A job's error type: the `module.Name` that starts its `last_error`.

Verdicts store it beside `last_error` (`completion.py`), so the admin filters
and groups errors by type through an index instead of reading every message.
`error_type_of` derives it from a `last_error` written before the column
existed (the migration `0017_error_type` fills old rows with it, in batches).
"""

from __future__ import annotations

ERROR_TYPE_LIMIT = 300
"""The length of `Job.error_type` and `JournalEntry.error_type`."""


def error_type_of(last_error: str) -> str:
    """The type that starts `last_error` ("pkg.Error: message" -> "pkg.Error"), or "".

    A `last_error` that does not start with a name and ": " (a merge note, text
    written by other means) has no type.
    """
    first_line = last_error.lstrip().partition("\n")[0]
    name, colon, _ = first_line.partition(": ")
    if not colon or not name or any(character.isspace() for character in name):
        return ""
    return name[:ERROR_TYPE_LIMIT]


def short_name(error_type: str) -> str:
    """`pkg.module.Error` -> `Error`: the name a reader knows the error by."""
    return error_type.rpartition(".")[2]
