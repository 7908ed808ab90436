"""Tasks for the payload limit and delays in seconds (tests/test_payload_limit.py,
tests/test_delay_seconds.py)."""

from __future__ import annotations

import dataclasses

import django_venturi as venturi
from tests.testapp.tasks import NO_WAIT


@venturi.task(kind="tests.limit.blob")
@dataclasses.dataclass
class Blob(venturi.Task):
    """A payload of one text field: `{"text":"..."}` is the text's UTF-8 bytes plus 11."""

    text: str = ""

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        return venturi.Outcome.completed()


BLOB_OVERHEAD = len('{"text":""}')
"""The bytes of a `Blob` payload around its text."""


@venturi.task(kind="tests.limit.keyed_blob")
@dataclasses.dataclass
class KeyedBlob(venturi.Task):
    """Deduplicated by `key`; a clash merges by appending the new text to the old."""

    key: str
    text: str = ""

    def dedup_key(self) -> str | None:
        return self.key

    def merge(self, existing: venturi.Existing[KeyedBlob]) -> venturi.Merge:
        merged = dataclasses.replace(existing.payload, text=existing.payload.text + self.text)
        return venturi.Merge.update(merged)

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        return venturi.Outcome.completed()


@venturi.task(kind="tests.limit.checkpoints", carry=str, backoff=NO_WAIT, max_attempts=1)
@dataclasses.dataclass
class Checkpoints(venturi.Task):
    """Pauses once with a carry of `size` characters, then completes."""

    size: int

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        if ctx.carry is None:
            return venturi.Outcome.paused("c" * self.size)
        return venturi.Outcome.completed()


@venturi.task(kind="tests.limit.returns", backoff=NO_WAIT, max_attempts=1)
@dataclasses.dataclass
class Returns(venturi.Task):
    """Completes with a result of `size` characters."""

    size: int

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        return venturi.Outcome.completed(result="r" * self.size)


@venturi.task(kind="tests.limit.waits", backoff=NO_WAIT, max_attempts=5)
@dataclasses.dataclass
class Waits(venturi.Task):
    """Asks to run again after `seconds` (an int or a float): paused or retried."""

    seconds: float
    pause: bool = False

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        if self.pause:
            return venturi.Outcome.paused(None, after=self.seconds)
        return venturi.Outcome.retry(after=self.seconds)
