"""Micro-benchmark of the payload codec: µs per encode and decode of one payload.

    python benchmarks/codec.py [--number 20000] [--repeat 7]

The payload has eight fields (a datetime, a Decimal, a UUID, an enum, a list of
str, a nested dataclass, an int and a str). Rows: the hand-written path alone
(what `codec.encode`/`codec.decode` did before msgspec), the codec as it is
(msgspec's fast path, which hands over to the hand-written one on any doubt), and
msgspec alone on the same dataclass (`to_builtins`, `convert`) for reference,
which neither checks as strictly nor writes the same JSON. Each figure is the
best of `--repeat` rounds of `--number` calls. No database needed.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import decimal
import enum
import sys
import timeit
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from django_venturi.payloads import codec  # after the repository is on sys.path


class Status(enum.Enum):
    NEW = "new"
    PAID = "paid"


@dataclasses.dataclass
class Address:
    street: str
    zip_code: int | None = None


@dataclasses.dataclass
class Order:
    order_id: int
    customer: str
    placed_at: dt.datetime
    total: decimal.Decimal
    reference: uuid.UUID
    status: Status
    tags: list[str]
    address: Address


ORDER = Order(
    order_id=42,
    customer="Ann Smith",
    placed_at=dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC),
    total=decimal.Decimal("1234.50"),
    reference=uuid.UUID("12345678-1234-5678-1234-567812345678"),
    status=Status.PAID,
    tags=["gift", "express", "fragile"],
    address=Address("1 Main Street", 12345),
)


def microseconds(call: Callable[[], Any], number: int, repeat: int) -> float:
    return min(timeit.repeat(call, number=number, repeat=repeat)) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--number", type=int, default=20_000, help="calls per round")
    parser.add_argument("--repeat", type=int, default=7, help="rounds; the best one counts")
    options = parser.parse_args()

    stored = codec.encode(ORDER)
    assert stored == codec._encode_dataclass(ORDER, Order, "Order"), "the stored JSON changed"
    assert codec.decode(Order, stored) == codec._decode(Order, stored, "Order") == ORDER
    plain = msgspec.to_builtins(ORDER)

    rows = [
        (
            "hand-written (before)",
            lambda: codec._encode_dataclass(ORDER, Order, "Order"),
            lambda: codec._decode(Order, stored, "Order"),
        ),
        (
            "codec with msgspec (now)",
            lambda: codec.encode(ORDER),
            lambda: codec.decode(Order, stored),
        ),
        (
            "msgspec alone (reference)",
            lambda: msgspec.to_builtins(ORDER),
            lambda: msgspec.convert(plain, Order),
        ),
    ]
    print(f"Eight-field payload, best of {options.repeat} x {options.number:,} calls")
    print()
    print(f"| {'path':<26} | {'encode µs':>9} | {'decode µs':>9} |")
    print(f"|{'-' * 28}|{'-' * 10}:|{'-' * 10}:|")
    for name, encode, decode in rows:
        encoding = microseconds(encode, options.number, options.repeat)
        decoding = microseconds(decode, options.number, options.repeat)
        print(f"| {name:<26} | {encoding:>9.2f} | {decoding:>9.2f} |")


if __name__ == "__main__":
    main()
