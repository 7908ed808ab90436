"""Tasks of the tests that restart PostgreSQL or kill workers (private clusters only).

Each run appends `job attempt pid` to a file first (one O_APPEND write, whole
lines even from many processes), so a test counts every run that started,
whatever became of it: the side effect the journal must account for.
"""

from __future__ import annotations

import dataclasses
import os
import time
from datetime import timedelta

import django_venturi as venturi
from tests.testapp.models import Record
from tests.testapp.tasks import NO_WAIT, append_line

MODULE = __name__
"""For the workers' TASK_MODULES (tests/cluster_workers.py)."""


def journal(ctx: venturi.Context, path: str) -> None:
    append_line(path, f"{ctx.job_id} {ctx.attempt} {os.getpid()}\n")


@venturi.task(kind="soak.journalled", lease=timedelta(seconds=3), backoff=NO_WAIT, max_attempts=50)
@dataclasses.dataclass
class Journalled(venturi.Task):
    """Records its run, uses the database as handlers do (a Record), sleeps, completes.

    With the database away the insert raises: the run ends as a retry.
    """

    path: str
    sleep: float = 0.01

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        journal(ctx, self.path)
        Record.objects.using(ctx.database).create(
            job_id=ctx.job_id, kind="journalled", attempt=ctx.attempt
        )
        time.sleep(self.sleep)
        return venturi.Outcome.completed()
