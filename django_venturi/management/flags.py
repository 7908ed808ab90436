"""The argparse `type=` parsers venturi's commands share, each with its bounds.

A value out of bounds, NaN, infinite or not a number is refused by argparse
before the command runs, and the message names the flag: `argument
--concurrency: must be at most 1000, got 100000` (exit 2 on the command line, a
`CommandError` under `call_command`). The bounds are those of the settings the
flags override (`conf.py`), so a flag accepts what its setting accepts.
"""

from __future__ import annotations

import argparse
import math
import reprlib
from collections.abc import Callable

from django.db import connections

from django_venturi.conf import (
    MAX_BATCH_SIZE,
    MAX_CONCURRENCY,
    MAX_POLL_INTERVAL,
    MAX_SHUTDOWN_TIMEOUT,
)

MAX_WATCH_SECONDS = 86_400.0
"""The longest pause of `venturi_stats --watch`: a day."""
MAX_STALE_AFTER_SECONDS = 7 * 86_400.0
"""The largest `venturi_stats --stale-after`: a week."""
MAX_CLEANUP_BATCH_SIZE = 100_000
"""The most jobs `venturi_cleanup` deletes per transaction (`--batch-size`)."""
MAX_PORT = 65_535
"""The largest TCP port (`venturi_worker --health-port`)."""


def whole_number(*, low: int, high: int) -> Callable[[str], int]:
    """A parser of whole numbers from `low` to `high`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            digits = text.strip().lstrip("+-")
            if digits.isdecimal():  # more digits than int() reads
                raise argparse.ArgumentTypeError(
                    f"must be at most {high}, got a number of {len(digits)} digits"
                ) from None
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        if value > high:
            raise argparse.ArgumentTypeError(f"must be at most {high}, got {value}")
        return value

    return parse


def seconds(*, high: float, zero: bool = False) -> Callable[[str], float]:
    """A parser of a finite number of seconds, more than 0 (or 0 too, with `zero`), at most
    `high`."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if math.isnan(value) or math.isinf(value):
            raise argparse.ArgumentTypeError(f"must be a finite number of seconds, got {text}")
        if value < 0 or (value == 0 and not zero):
            least = "0 or more" if zero else "more than 0"
            raise argparse.ArgumentTypeError(f"must be {least} seconds, got {text}")
        if value > high:
            raise argparse.ArgumentTypeError(f"must be at most {high:g} seconds, got {text}")
        return value

    return parse


concurrency = whole_number(low=1, high=MAX_CONCURRENCY)
"""Handler slots: `--concurrency`, and each N of `--kind-concurrency`."""
batch_size = whole_number(low=1, high=MAX_BATCH_SIZE)
"""`venturi_worker --batch-size`: the most jobs one claim takes."""
poll_interval = seconds(high=MAX_POLL_INTERVAL.total_seconds())
"""`--poll-interval`."""
shutdown_timeout = seconds(high=MAX_SHUTDOWN_TIMEOUT.total_seconds(), zero=True)
"""`--shutdown-timeout`: 0 hands running jobs back at once."""
watch_interval = seconds(high=MAX_WATCH_SECONDS)
"""`venturi_stats --watch`."""
stale_after = seconds(high=MAX_STALE_AFTER_SECONDS)
"""`venturi_stats --stale-after`."""
cleanup_batch_size = whole_number(low=1, high=MAX_CLEANUP_BATCH_SIZE)
"""`venturi_cleanup --batch-size`."""
health_port = whole_number(low=0, high=MAX_PORT)
"""`venturi_worker --health-port`: 0 serves no health endpoint."""


def host(text: str) -> str:
    """`--health-host`: an address or host name to listen on (is it there: binding says)."""
    name = text.strip()
    if not name or any(character.isspace() for character in name):
        raise argparse.ArgumentTypeError(f"{reprlib.repr(text)} is not an address or host name")
    return name[1:-1] if name.startswith("[") and name.endswith("]") else name


def database_alias(text: str) -> str:
    """`--database`: an alias in `DATABASES` (another would end in a traceback)."""
    aliases = list(connections)
    if text not in aliases:
        raise argparse.ArgumentTypeError(
            f"{reprlib.repr(text)} is not an alias in DATABASES ({', '.join(aliases)})"
        )
    return text


def add_database(parser: argparse.ArgumentParser, *, default_note: str = "") -> None:
    """The `--database` option every venturi command takes, checked by `database_alias`."""
    parser.add_argument(
        "--database",
        type=database_alias,
        default=None,
        help=f"Database alias holding the jobs{default_note}.",
    )
