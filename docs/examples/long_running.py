"""Long-running jobs: a timeout per run, progress, and a cooperative stop (cancel, shutdown)."""

from __future__ import annotations

import dataclasses
import time
from datetime import timedelta
from typing import Any

import django_venturi as venturi
from django_venturi.models import Job


# [import-task]
@dataclasses.dataclass
class Position:
    next_row: int


@venturi.task(
    kind="docs.import_rows",
    timeout=timedelta(minutes=10),  # per run: asked to stop after 10 minutes
    carry=Position,  # the checkpoint a run pauses with
)
@dataclasses.dataclass
class ImportRows(venturi.Task):
    source: str
    rows: int

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        start = ctx.carry.next_row if ctx.carry else 0  # None on the first run
        for row in range(start, self.rows):
            if ctx.should_stop:  # cancelled, timed out, shutting down, or the lease is lost
                # Cancelled: the job ends `cancelled` whatever this returns.
                # Otherwise the next run resumes at this row.
                return venturi.Outcome.paused(Position(next_row=row))
            import_row(self.source, row)
            ctx.progress(row + 1, self.rows, note=self.source)  # cheap: call it every row
        return venturi.Outcome.completed()


# [import-task end]


def import_row(source: str, row: int) -> None:
    """Stands in for the real work on one row."""
    time.sleep(0.005)


# [cancel]
def cancel_imports(source: str) -> venturi.CancelResult:
    """Cancel every live import of one source: waiting ones at once, running ones cooperatively."""
    live = Job.objects.filter(
        kind="docs.import_rows",
        state__in=[venturi.State.READY, venturi.State.RUNNING],
        payload__source=source,
    )
    return venturi.cancel(live)  # a Job, an id, or an iterable of either


# [cancel end]


# [progress]
def import_status(job_id: int) -> dict[str, Any]:
    """What a status page or an API shows of one import."""
    job = Job.objects.get(pk=job_id)
    progress = job.progress or {}  # None until the first run reports
    return {
        "state": job.state,
        "done": progress.get("done", 0),
        "total": progress.get("total"),
        "cancelling": job.cancel_requested_at is not None and job.state == venturi.State.RUNNING,
    }


# [progress end]
