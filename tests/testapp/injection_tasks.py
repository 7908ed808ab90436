"""The task of tests/test_error_injection.py: its runs leave a line in a file, not a row.

The file, not the database, records each run, so a database error injected into
the worker's statements never touches the record of what ran. Workers load this
module through `VENTURI["TASK_MODULES"]`, which that test passes them.
"""

from __future__ import annotations

import dataclasses
import time
from datetime import timedelta

import django_venturi as venturi
from tests.testapp.tasks import NO_WAIT, append_run


@venturi.task(kind="tests.injected", lease=timedelta(seconds=2), backoff=NO_WAIT, max_attempts=50)
@dataclasses.dataclass
class Injected(venturi.Task):
    """Appends `job attempt pid` to `path`, then sleeps `sleep` seconds and completes."""

    path: str
    sleep: float = 0.05

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        append_run(ctx, self.path)
        time.sleep(self.sleep)
        return venturi.Outcome.completed()
