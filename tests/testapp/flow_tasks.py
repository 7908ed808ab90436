"""Tasks of the flow-control tests (rate limits, pauses), found through VENTURI["TASK_MODULES"]."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from datetime import timedelta

import django_venturi as venturi
from tests.testapp.tasks import NO_WAIT, record, wait_for_file


def stamp(ctx: venturi.Context, kind: str, **extra: object) -> None:
    """Record the handler's own start time (one machine: the workers' clocks agree)."""
    record(ctx, kind, {"start": time.time(), **extra})


@venturi.task(
    kind="tests.rated",
    rate_limit=venturi.RateLimit(5, per=timedelta(milliseconds=400)),
    backoff=NO_WAIT,
)
@dataclasses.dataclass
class Rated(venturi.Task):
    n: int = 0
    fail_first: bool = False

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        stamp(ctx, "rated", n=self.n)
        if self.fail_first and ctx.attempt == 1:
            return venturi.Outcome.retry()
        return venturi.Outcome.completed()


@venturi.task(
    kind="tests.rated_per_account",
    rate_limit=venturi.RateLimit(3, per=timedelta(seconds=1), key="account"),
)
@dataclasses.dataclass
class RatedPerAccount(venturi.Task):
    account: str
    n: int = 0

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        stamp(ctx, "rated_per_account", account=self.account, n=self.n)
        return venturi.Outcome.completed()


@venturi.task(
    kind="tests.rated_per_second", rate_limit=venturi.RateLimit(30, per=timedelta(seconds=1))
)
@dataclasses.dataclass
class RatedPerSecond(venturi.Task):
    """The real-process check: 30 starts a second across every worker."""

    n: int = 0

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        stamp(ctx, "rated_per_second", n=self.n)
        return venturi.Outcome.completed()


@venturi.task(kind="tests.rated_fifty", rate_limit=venturi.RateLimit(50, per=timedelta(seconds=1)))
@dataclasses.dataclass
class RatedFifty(venturi.Task):
    """The issue's own check: 1,000 jobs at 50 a second on eight workers (thorough).

    Its start goes to the file VENTURI_TEST_STAMPS names, one JSON line each, not
    to the database: 64 handler threads each holding a connection, beside the
    workers' own 32 and the test's, passed the server's 100 (`max_connections`),
    and the refused handlers' failed starts took places in the limit."""

    n: int = 0

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        line = json.dumps({"n": self.n, "start": time.time()}) + "\n"
        fd = os.open(os.environ["VENTURI_TEST_STAMPS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, line.encode())  # one write: lines of several processes never mix
        finally:
            os.close(fd)
        return venturi.Outcome.completed()


@venturi.task(kind="tests.held")
@dataclasses.dataclass
class Held(venturi.Task):
    """Runs for `seconds`, or until the file `gate` exists (60 s at most): keeps a handler
    slot busy while a pause happens."""

    n: int = 0
    seconds: float = 0.0
    gate: str = ""

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        stamp(ctx, "held", n=self.n)
        if self.gate:
            wait_for_file(self.gate)
        else:
            time.sleep(self.seconds)
        return venturi.Outcome.completed()


@venturi.task(
    kind="tests.rated_capped",
    concurrency=2,
    rate_limit=venturi.RateLimit(5, per=timedelta(seconds=30)),
)
@dataclasses.dataclass
class RatedCapped(venturi.Task):
    """A concurrency cap and a rate limit on one kind: both hold."""

    n: int = 0

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        return venturi.Outcome.completed()
