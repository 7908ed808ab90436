"""Tasks whose handlers raise, return and report hostile text (tests/test_text.py).

The payload names a sample, never holds it: a sample PostgreSQL cannot store
could not be enqueued. Each handler then puts the sample where its `how` says.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import django_venturi as venturi
from tests.testapp.tasks import NO_WAIT

SAMPLES = {
    "nul": "before\x00after",
    "surrogate": "undecodable \udc80 byte from surrogateescape",
    "pair": "one emoji as two code points: \ud83d\ude00",
    "megabyte": "long " + "x" * 1_000_000,
    "rtl": "\u202eright-to-left: \u05e2\u05d1\u05e8\u05d9\u05ea \u0645\u0631\u062d\u0628\u0627",
    "emoji": "emoji: \U0001f469\u200d\U0001f469\u200d\U0001f467 \U0001f389",
    "sql": "'); DROP TABLE venturi_job; -- \\ $1 %s %(x)s \\x00",
    "html": "<script>alert('venturi')</script> & \"quoted\" <b>bold</b>",
}
STORABLE = ("megabyte", "rtl", "emoji", "sql", "html")
"""Samples the database stores as they are."""
HOWS = ("raise", "permanent", "fail", "note", "carry", "str_raises", "class_name")


class UnprintableError(Exception):
    """An exception whose `__str__` itself raises."""

    def __str__(self) -> str:
        raise RuntimeError("no text for you")


@venturi.task(kind="tests.text.says", backoff=NO_WAIT, max_attempts=1)
@dataclasses.dataclass
class Says(venturi.Task):
    """Puts `SAMPLES[sample]` where `how` says: an error, a reason, a note or a carry."""

    how: str
    sample: str

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        text = SAMPLES[self.sample]
        if self.how == "raise":
            raise RuntimeError(text)
        if self.how == "permanent":
            raise venturi.TaskError.permanent(text)
        if self.how == "fail":
            return venturi.Outcome.failed(text)
        if self.how == "note":
            ctx.progress(1, 2, note=text)
            return venturi.Outcome.completed()
        if self.how == "carry":
            if ctx.carry is None:
                return venturi.Outcome.paused({"text": text})
            if ctx.carry != {"text": text}:
                raise AssertionError("the carry came back changed")
            return venturi.Outcome.completed()
        if self.how == "str_raises":
            raise UnprintableError(text)
        if self.how == "class_name":
            # A class's module may be any text: here the sample, up to 500 characters.
            strange = type("StrangeError", (Exception,), {"__module__": text[:500]})
            raise strange("raised by a strange class")
        raise ValueError(f"unknown how {self.how!r}")


@venturi.task(kind="tests.text.async_says", backoff=NO_WAIT, max_attempts=1)
@dataclasses.dataclass
class AsyncSays(venturi.Task):
    """`Says` for `async def` handlers: raises the sample, or fails with it."""

    how: str
    sample: str

    async def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        if self.how == "fail":
            return venturi.Outcome.failed(SAMPLES[self.sample])
        raise RuntimeError(SAMPLES[self.sample])


@venturi.task(kind="tests.text.waits_long", backoff=NO_WAIT, max_attempts=10)
@dataclasses.dataclass
class WaitsLong(venturi.Task):
    """Asks to run again after the longest timedelta there is."""

    pause: bool = False

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        if self.pause:
            return venturi.Outcome.paused(None, after=timedelta.max)
        return venturi.Outcome.retry(after=timedelta.max)


@venturi.task(
    kind="tests.text.backs_off",
    backoff=venturi.Fibonacci(base=timedelta(seconds=1), cap=timedelta(hours=1)),
    max_attempts=100_000,
)
@dataclasses.dataclass
class BacksOff(venturi.Task):
    """Fails, to be retried after the task's backoff."""

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        raise RuntimeError("fails again")


@venturi.task(kind="tests.text.echo")
@dataclasses.dataclass
class Echo(venturi.Task):
    """A payload of free-form JSON, for enqueue-time checks."""

    value: Any = None

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        return venturi.Outcome.completed()
