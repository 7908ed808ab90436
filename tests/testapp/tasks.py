"""Tasks the test suite enqueues; each handler leaves a Record."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import decimal
import enum
import os
import time
import uuid
from datetime import timedelta

import django_venturi as venturi
from tests.testapp.models import Record

NO_WAIT = venturi.Fibonacci(base=timedelta(0), cap=timedelta(0))


def record(ctx: venturi.Context, kind: str, value: object = None) -> None:
    Record.objects.using(ctx.database).create(
        job_id=ctx.job_id, kind=kind, attempt=ctx.attempt, value=value
    )


@venturi.task(kind="tests.noop")
@dataclasses.dataclass
class Noop(venturi.Task):
    n: int = 0

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        record(ctx, "noop", self.n)
        return venturi.Outcome.completed()


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclasses.dataclass
class Address:
    street: str
    zip_code: int | None = None


@venturi.task(kind="tests.all_types")
@dataclasses.dataclass
class AllTypes(venturi.Task):
    text: str
    number: int
    ratio: float
    flag: bool
    nothing: None
    items: list[int]
    mapping: dict[str, float]
    pair: tuple[str, int]
    when: dt.datetime
    day: dt.date
    clock: dt.time
    span: dt.timedelta
    amount: decimal.Decimal
    ident: uuid.UUID
    colour: Colour
    address: Address
    maybe: str | None = None
    addresses: list[Address] = dataclasses.field(default_factory=list)

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        # Store what the handler received, re-encoded, plus a few type checks.
        record(
            ctx,
            "all_types",
            {
                "repr": repr(self),
                "types_ok": isinstance(self.when, dt.datetime)
                and isinstance(self.amount, decimal.Decimal)
                and isinstance(self.pair, tuple)
                and isinstance(self.address, Address)
                and isinstance(self.colour, Colour),
            },
        )
        return venturi.Outcome.completed()


@dataclasses.dataclass
class Progress:
    done: int


@venturi.task(kind="tests.pausing", carry=Progress)
@dataclasses.dataclass
class Pausing(venturi.Task):
    steps: int

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        done = ctx.carry.done if ctx.carry else 0
        record(ctx, "pausing", done)
        if done + 1 < self.steps:
            return venturi.Outcome.paused(Progress(done + 1))
        return venturi.Outcome.completed()


@venturi.task(kind="tests.flaky", backoff=NO_WAIT, max_attempts=10)
@dataclasses.dataclass
class Flaky(venturi.Task):
    failures: int

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        record(ctx, "flaky")
        if ctx.attempt <= self.failures:
            raise RuntimeError(f"flaky failure {ctx.attempt}")
        return venturi.Outcome.completed()


@venturi.task(kind="tests.exits", backoff=NO_WAIT, max_attempts=2)
@dataclasses.dataclass
class Exits(venturi.Task):
    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        record(ctx, "exits")
        raise SystemExit(3)


@venturi.task(kind="tests.asks_retry", backoff=NO_WAIT)
@dataclasses.dataclass
class AsksRetry(venturi.Task):
    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        record(ctx, "asks_retry")
        if ctx.attempt == 1:
            return venturi.Outcome.retry(after=timedelta(0))
        return venturi.Outcome.completed()


@venturi.task(kind="tests.permanent")
@dataclasses.dataclass
class Permanent(venturi.Task):
    use_outcome: bool = False

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        record(ctx, "permanent")
        if self.use_outcome:
            return venturi.Outcome.failed("the outcome says no")
        raise venturi.TaskError.permanent("the address does not exist")


@venturi.task(kind="tests.always_fails", backoff=NO_WAIT, max_attempts=3)
@dataclasses.dataclass
class AlwaysFails(venturi.Task):
    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        record(ctx, "always_fails")
        raise ValueError("never works")


@venturi.task(kind="tests.gives_up_late", backoff=NO_WAIT, give_up_after=timedelta(seconds=1))
@dataclasses.dataclass
class GivesUpLate(venturi.Task):
    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        record(ctx, "gives_up_late")
        time.sleep(0.3)
        raise ValueError("still failing")


@venturi.task(kind="tests.returns_none")
@dataclasses.dataclass
class ReturnsNone(venturi.Task):
    def handle(self, ctx: venturi.Context) -> None:  # type: ignore[override]
        record(ctx, "returns_none")


@venturi.task(kind="tests.async")
@dataclasses.dataclass
class AsyncTask(venturi.Task):
    n: int

    async def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        await asyncio.sleep(0.01)
        from asgiref.sync import sync_to_async

        await sync_to_async(record)(ctx, "async", self.n)
        return venturi.Outcome.completed()


@venturi.task(kind="tests.sleeper", lease=timedelta(seconds=3))
@dataclasses.dataclass
class Sleeper(venturi.Task):
    seconds: float
    cooperative: bool = True

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        record(ctx, "sleeper", os.getpid())
        deadline = time.monotonic() + self.seconds
        while time.monotonic() < deadline:
            if self.cooperative and ctx.should_stop:
                return venturi.Outcome.paused(None)
            time.sleep(0.02)
        return venturi.Outcome.completed()


@venturi.task(kind="tests.async_blocking")
@dataclasses.dataclass
class AsyncBlocking(venturi.Task):
    """An async handler blocked in `sync_to_async` code that ignores `should_stop`."""

    seconds: float

    async def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        from asgiref.sync import sync_to_async

        await sync_to_async(record)(ctx, "async_blocking", os.getpid())
        await sync_to_async(time.sleep)(self.seconds)
        return venturi.Outcome.completed()


# ---------------------------------------------------------------- crash and fault tests


def append_line(path: str, line: str) -> None:
    """One `write()` to a file opened with O_APPEND: lines from many processes never mix."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def wait_for_file(path: str | os.PathLike[str], seconds: float = 60) -> None:
    """Hold a handler until `path` exists (a test's gate), `seconds` at most."""
    deadline = time.monotonic() + seconds
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)


def append_run(ctx: venturi.Context, path: str) -> None:
    """The side effect of a run: `job attempt pid` appended to `path` as one whole line."""
    append_line(path, f"{ctx.job_id} {ctx.attempt} {os.getpid()}\n")


@venturi.task(kind="tests.chaos", lease=timedelta(seconds=2), backoff=NO_WAIT, max_attempts=100)
@dataclasses.dataclass
class Chaos(venturi.Task):
    """Appends `job attempt pid` to `path` (the side effect of each run), then sleeps."""

    path: str
    sleep: float = 0.005

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        append_run(ctx, self.path)
        time.sleep(self.sleep)
        return venturi.Outcome.completed()


@venturi.task(
    kind="tests.kills_its_worker", lease=timedelta(seconds=2), backoff=NO_WAIT, max_attempts=3
)
@dataclasses.dataclass
class KillsItsWorker(venturi.Task):
    """A poison job: every run SIGKILLs the worker process that runs it."""

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        import signal

        record(ctx, "kills_its_worker", os.getpid())
        os.kill(os.getpid(), signal.SIGKILL)
        return venturi.Outcome.completed()  # never reached


@venturi.task(kind="tests.slow_first", lease=timedelta(seconds=2), backoff=NO_WAIT)
@dataclasses.dataclass
class SlowFirst(venturi.Task):
    """Runs `first` seconds on its first attempt (long past its lease), `then` afterwards."""

    first: float
    then: float = 0.1

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        record(ctx, "slow_first", os.getpid())
        time.sleep(self.first if ctx.attempt == 1 else self.then)
        return venturi.Outcome.completed()


@venturi.task(kind="tests.steady", lease=timedelta(seconds=5), backoff=NO_WAIT, max_attempts=50)
@dataclasses.dataclass
class Steady(venturi.Task):
    """A short job that writes a Record (its side effect) through the handler's connection."""

    n: int
    sleep: float = 0.01

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        record(ctx, "steady", self.n)
        time.sleep(self.sleep)
        return venturi.Outcome.completed()


@venturi.task(
    kind="tests.outlasts_outage", lease=timedelta(seconds=10), backoff=NO_WAIT, max_attempts=50
)
@dataclasses.dataclass
class OutlastsOutage(venturi.Task):
    """`Chaos` with a 10 s lease: a claim outlives a few seconds without the database."""

    path: str
    sleep: float = 0.01

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        append_run(ctx, self.path)
        time.sleep(self.sleep)
        return venturi.Outcome.completed()


@venturi.task(kind="tests.backend_pid")
@dataclasses.dataclass
class BackendPid(venturi.Task):
    """Records the PostgreSQL backend its handler thread's connection talks to."""

    n: int = 0

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        from django.db import connections

        with connections[ctx.database].cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            (pid,) = cursor.fetchone()
        record(ctx, "backend_pid", pid)
        return venturi.Outcome.completed()


@venturi.task(kind="tests.leaky_login", max_attempts=1)
@dataclasses.dataclass
class LeakyLogin(venturi.Task):
    """Fails with an error that quotes its secret field, as an HTTP client's often does."""

    user: str
    token: str = venturi.secret()

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        raise PermissionError(f"401 for https://api.example/login?token={self.token}")
