"""How large an encoded payload is, and the error for one over its limit.

The limit (`VENTURI["MAX_PAYLOAD_BYTES"]`) is read by the callers, which pass it
in: a job's payload at enqueue (`enqueue.prepare`, dedup merges, the Tasks
backend), and a carry or result when a worker writes a verdict. Sizes are bytes
of compact JSON in UTF-8: what the value weighs, whatever escaping a driver
uses to send it.
"""

from __future__ import annotations

import json

import msgspec

from django_venturi.payloads.codec import JSON, PayloadError


class PayloadTooLarge(PayloadError):
    """An encoded payload (or carry, or result) larger than the limit it is checked against."""

    def __init__(self, path: str, size: int, limit: int) -> None:
        super().__init__(
            path,
            f"is {size:,} bytes as JSON, over the limit of {limit:,} bytes "
            "(VENTURI['MAX_PAYLOAD_BYTES'])",
        )
        self.size = size
        """The encoded size: bytes of compact JSON in UTF-8 (`encoded_size`)."""
        self.limit = limit
        """The limit it was checked against."""

    def in_batch(self, index: int, count: int) -> PayloadTooLarge:
        """The same error, naming the item of a batch of `count` it is about (0-based `index`);
        itself for a batch of one."""
        if count == 1:
            return self
        return PayloadTooLarge(f"{self.path} (item {index} of {count})", self.size, self.limit)


def encoded_size(value: JSON) -> int:
    """The size of an encoded value as the limit counts it: bytes of compact JSON in UTF-8
    ("é" is two bytes, an emoji four)."""
    try:
        return len(msgspec.json.encode(value))
    except TypeError:  # subclasses of str, int or float (a SafeString in an untyped field)
        return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


def check_size(value: JSON, path: str, limit: int | None) -> int:
    """Return the encoded size of `value`; raise `PayloadTooLarge` naming `path` if it is
    over `limit` bytes (None: no limit). Measuring costs one more encoding, in C."""
    size = encoded_size(value)
    if limit is not None and size > limit:
        raise PayloadTooLarge(path, size, limit)
    return size
