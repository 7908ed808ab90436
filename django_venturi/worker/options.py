"""The bounds of a `Worker`'s options: what `Worker(...)` refuses, naming the argument.

`venturi_worker`'s flags are bounded alike (`management/flags.py`), and the
settings they default to by the system checks (`venturi.E003`, `venturi.E004`);
these catch what code passes to the class directly. Past the bounds a worker
cannot work: too many threads abort the process, and waits or timedeltas that
long overflow.
"""

from __future__ import annotations

from datetime import timedelta

from django_venturi.payloads import text

MAX_NAME_LENGTH = 200
"""The longest worker name (`Job.claimed_by`, `JournalEntry.worker`)."""


def check_name(name: str) -> None:
    """A worker's name goes into every row it writes: refuse one the database cannot store."""
    trouble = text.problem(name)
    if trouble is None and len(name) > MAX_NAME_LENGTH:
        trouble = f"is {len(name)} characters long; the limit is {MAX_NAME_LENGTH}"
    if trouble is not None:
        raise ValueError(f"Worker(name=...) {trouble}: {name[:40]!r}")


def whole_number(name: str, value: int, *, largest: int) -> int:
    """`value` if it is a whole number from 1 to `largest`; else a `ValueError`."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= largest:
        raise ValueError(
            f"Worker({name}=...) must be a whole number from 1 to {largest}, got {value!r}"
        )
    return value


def seconds(
    name: str, value: timedelta | float, *, longest: timedelta, zero: bool = False
) -> float:
    """A duration as seconds; a `ValueError` for NaN, infinity, a negative (or 0, unless
    `zero`) or anything longer than `longest`."""
    number = value.total_seconds() if isinstance(value, timedelta) else value
    valid = (
        isinstance(number, int | float)
        and not isinstance(number, bool)
        and (number >= 0 if zero else number > 0)
        and number <= longest.total_seconds()
    )
    if not valid:
        least = "0" if zero else "more than 0"
        raise ValueError(
            f"Worker({name}=...) must be {least} seconds and at most {longest}, got {value!r}"
        )
    return float(number)
