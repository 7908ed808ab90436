"""`venturi.stats()`: one live snapshot of the queue, cheap enough to take every few seconds.

Live jobs (ready, running) are counted through the partial indexes that cover
only them, and throughput comes from the journal's index on `finished_at` plus
the run tallies that cleanup leaves of deleted journals (`tallies.py`), so the
cost follows the live backlog and the last hour, not the table's size.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Min

from django_venturi.conf import venturi_settings
from django_venturi.observe import cap_stats, fair_stats, rate_limit_stats
from django_venturi.observe.cap_stats import CapUse
from django_venturi.observe.fair_stats import FairUse
from django_venturi.observe.rate_limit_stats import RateLimitUse
from django_venturi.states import State
from django_venturi.store import registration, tallies
from django_venturi.store.clock import database_time
from django_venturi.store.orphan_kinds import OrphanKind, find_orphan_kinds
from django_venturi.store.pauses import Paused, paused

WINDOW = tallies.WINDOW


@dataclasses.dataclass(frozen=True, slots=True)
class Minute:
    """Jobs that finished, and other runs, in one minute."""

    start: datetime
    completed: int
    """Jobs completed."""
    failed: int
    """Jobs failed: a permanent failure, or a failed run that gave up (not the retried runs)."""
    other: int
    """Paused, released, cancelled or discarded runs."""
    retried: int = 0
    """Failed runs after which the job was retried (retry, timeout, lease expired)."""


@dataclasses.dataclass(frozen=True, slots=True)
class RunningProgress:
    """A running job's latest `ctx.progress()`."""

    job_id: int
    kind: str
    queue: str
    done: float
    total: float | None
    note: str
    at: str
    """When the handler reported it (ISO 8601, the worker's clock)."""

    @property
    def fraction(self) -> float | None:
        """done / total, when the total is known and positive."""
        return self.done / self.total if self.total else None


PROGRESS_LIMIT = 100
"""The most running jobs with progress a snapshot lists."""


@dataclasses.dataclass(frozen=True, slots=True)
class LiveWorker:
    """A worker process that has not said it stopped, as its registry row shows it."""

    name: str
    host: str
    pid: int
    queues: list[str] | None
    """The queues it serves; None: all."""
    concurrency: int
    started_at: datetime
    heartbeat_at: datetime
    running: int
    """Jobs it held at its last heartbeat."""
    processed: int
    stale: bool
    """Its heartbeat is older than a few heartbeat intervals: killed, frozen or cut off."""

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["started_at"] = self.started_at.isoformat()
        data["heartbeat_at"] = self.heartbeat_at.isoformat()
        return data


@dataclasses.dataclass(frozen=True, slots=True)
class Stats:
    """A snapshot of the queue at `taken_at` (database time)."""

    taken_at: datetime
    live: dict[tuple[str, str, str], int]
    """(state, kind, queue) -> jobs, for `waiting`, `ready` and `running`."""
    due: dict[str, int]
    """queue -> ready jobs whose `run_at` has come."""
    oldest_due_age: dict[str, timedelta]
    """queue -> how long its oldest due job has waited (the queue's latency)."""
    minutes: list[Minute]
    """The last hour, one entry per minute, oldest first."""
    progress: list[RunningProgress] = dataclasses.field(default_factory=list)
    """Running jobs that reported progress (at most `PROGRESS_LIMIT`, oldest job first)."""
    workers: list[LiveWorker] = dataclasses.field(default_factory=list)
    """Worker processes not stopped, newest first; stale ones included and marked."""
    orphan_kinds: list[OrphanKind] = dataclasses.field(default_factory=list)
    """Due jobs that no live worker can run, by kind and queue (see `store/orphan_kinds.py`)."""
    rate_limits: list[RateLimitUse] = dataclasses.field(default_factory=list)
    """Each rate-limited kind this process knows: its use now and its due jobs."""
    caps: list[CapUse] = dataclasses.field(default_factory=list)
    """Each kind with a concurrency cap this process knows: its places held and due jobs."""
    fair: list[FairUse] = dataclasses.field(default_factory=list)
    """Each fair kind this process knows: its keys with due jobs and the busiest ones."""
    pauses: list[Paused] = dataclasses.field(default_factory=list)
    """Paused queues and kinds, with who paused them and when."""

    @property
    def stale_workers(self) -> list[LiveWorker]:
        return [worker for worker in self.workers if worker.stale]

    @property
    def ready(self) -> int:
        """Ready jobs, due or not."""
        return sum(n for (state, _, _), n in self.live.items() if state == State.READY)

    @property
    def waiting(self) -> int:
        """Jobs waiting for their dependencies (not counted as ready)."""
        return sum(n for (state, _, _), n in self.live.items() if state == State.WAITING)

    @property
    def running(self) -> int:
        """Running jobs."""
        return sum(n for (state, _, _), n in self.live.items() if state == State.RUNNING)

    @property
    def completed_last_hour(self) -> int:
        """Jobs completed in the last hour."""
        return sum(minute.completed for minute in self.minutes)

    @property
    def failed_last_hour(self) -> int:
        """Jobs failed in the last hour: failed for good or gave up (retried runs are apart)."""
        return sum(minute.failed for minute in self.minutes)

    @property
    def retried_last_hour(self) -> int:
        """Failed runs in the last hour after which their job was retried."""
        return sum(minute.retried for minute in self.minutes)

    @property
    def other_last_hour(self) -> int:
        """Paused, released, cancelled or discarded runs in the last hour."""
        return sum(minute.other for minute in self.minutes)

    @property
    def failure_rate(self) -> float:
        """Failed jobs over completed and failed jobs in the last hour (0 when none)."""
        total = self.completed_last_hour + self.failed_last_hour
        return self.failed_last_hour / total if total else 0.0

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data (for `venturi_stats --json`)."""
        return {
            "taken_at": self.taken_at.isoformat(),
            "ready": self.ready,
            "waiting": self.waiting,
            "running": self.running,
            "live": [
                {"state": state, "kind": kind, "queue": queue, "jobs": n}
                for (state, kind, queue), n in sorted(self.live.items())
            ],
            "due": self.due,
            "oldest_due_age_seconds": {
                queue: age.total_seconds() for queue, age in self.oldest_due_age.items()
            },
            "completed_last_hour": self.completed_last_hour,
            "failed_last_hour": self.failed_last_hour,
            "retried_last_hour": self.retried_last_hour,
            "other_last_hour": self.other_last_hour,
            "failure_rate": self.failure_rate,
            "minutes": [
                {
                    "start": minute.start.isoformat(),
                    "completed": minute.completed,
                    "failed": minute.failed,
                    "retried": minute.retried,
                    "other": minute.other,
                }
                for minute in self.minutes
            ],
            "progress": [dataclasses.asdict(item) for item in self.progress],
            "workers": [worker.as_dict() for worker in self.workers],
            "orphan_kinds": [orphan.as_dict() for orphan in self.orphan_kinds],
            "rate_limits": [use.as_dict() for use in self.rate_limits],
            "caps": [use.as_dict() for use in self.caps],
            "fair": [use.as_dict() for use in self.fair],
            "pauses": [pause.as_dict() for pause in self.pauses],
        }


def stats(*, using: str | None = None, stale_after: timedelta | None = None) -> Stats:
    """Take a snapshot: live counts, due backlog and latency per queue, and the last hour's
    finished jobs and other runs (with what cleanup folded into run tallies).

    Workers whose heartbeat is older than `stale_after` (default: three heartbeat
    intervals) are marked stale.
    """
    from django_venturi.models import (  # at call time: importing the package must not load models
        Job,
    )

    alias = using or venturi_settings.DATABASE
    now = database_time(alias, statement=True)
    jobs = Job.objects.using(alias)
    live = {
        (row["state"], row["kind"], row["queue"]): row["jobs"]
        for row in jobs.filter(state__in=[State.WAITING, State.READY, State.RUNNING])
        .values("state", "kind", "queue")
        .annotate(jobs=Count("id"))
        .order_by()
    }
    due_rows = (
        jobs.filter(state=State.READY, run_at__lte=now)
        .values("queue")
        .annotate(jobs=Count("id"), oldest=Min("run_at"))
        .order_by()
    )
    return Stats(
        taken_at=now,
        live=live,
        due={row["queue"]: row["jobs"] for row in due_rows},
        oldest_due_age={row["queue"]: max(now - row["oldest"], timedelta(0)) for row in due_rows},
        minutes=_minutes(alias, now),
        progress=_progress(alias),
        workers=_workers(alias, now, stale_after),
        orphan_kinds=find_orphan_kinds(alias, now=now, stale_after=stale_after),
        rate_limits=rate_limit_stats.usage(alias, now),
        caps=cap_stats.usage(alias, now),
        fair=fair_stats.usage(alias, now),
        pauses=paused(using=alias),
    )


def _progress(alias: str) -> list[RunningProgress]:
    from django_venturi.models import Job  # at call time, as above

    rows = (
        Job.objects.using(alias)
        .filter(state=State.RUNNING, progress__isnull=False)
        .order_by("id")
        .values_list("id", "kind", "queue", "progress")[:PROGRESS_LIMIT]
    )
    return [
        RunningProgress(
            job_id=job_id,
            kind=kind,
            queue=queue,
            done=value.get("done", 0),
            total=value.get("total"),
            note=value.get("note", ""),
            at=value.get("at", ""),
        )
        for job_id, kind, queue, value in rows
        if isinstance(value, dict)
    ]


def _workers(alias: str, now: datetime, stale_after: timedelta | None) -> list[LiveWorker]:
    from django_venturi.models import WorkerProcess

    return [
        LiveWorker(
            name=row.name,
            host=row.host,
            pid=row.pid,
            queues=row.queues,
            concurrency=row.concurrency,
            started_at=row.started_at,
            heartbeat_at=row.heartbeat_at,
            running=row.running,
            processed=row.processed,
            stale=registration.is_stale(row.heartbeat_at, now, after=stale_after),
        )
        for row in WorkerProcess.objects.using(alias).filter(stopped_at__isnull=True)
    ]


def _minutes(alias: str, now: datetime) -> list[Minute]:
    start = tallies.window_start(now)
    found = tallies.by_minute(alias, start, start + WINDOW)
    minutes = []
    for index in range(int(WINDOW / timedelta(minutes=1))):
        moment = start + timedelta(minutes=index)
        counts = found.get(moment, tallies.Counts())
        minutes.append(
            Minute(
                start=moment,
                completed=counts.completed_jobs,
                failed=counts.failed_jobs,
                other=counts.other_runs,
                retried=counts.retried_runs,
            )
        )
    return minutes
