"""What the operators' side remembers beside the jobs: the workers, the periodic ticks and
schedules' state, the flow-control tallies, pauses and rate-limit starts, maintenance runs,
and the history roll-ups."""

from __future__ import annotations

from datetime import timedelta

from django.db import models
from django.db.models.functions import Now


class WorkerProcess(models.Model):
    """One row per worker process, kept fresh by its heartbeat (the admin lists them)."""

    name = models.CharField(max_length=200, primary_key=True)
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    queues = models.JSONField(null=True, blank=True, help_text="The queues it serves; null: all.")
    kinds = models.JSONField(
        null=True, blank=True, help_text="The task kinds it can run; null: not reported."
    )
    concurrency = models.PositiveIntegerField()
    started_at = models.DateTimeField(db_default=Now())
    heartbeat_at = models.DateTimeField(db_default=Now())
    stopped_at = models.DateTimeField(null=True, blank=True)
    running = models.PositiveIntegerField(default=0, help_text="Jobs held at the last heartbeat.")
    processed = models.PositiveBigIntegerField(default=0, help_text="Verdicts written so far.")
    heartbeat_grace = models.DurationField(
        default=timedelta(0),
        help_text="Its leases are not recovered while it beat this recently before they ran "
        "out (two heartbeat intervals).",
    )
    waiting = models.BooleanField(
        default=False,
        db_default=False,
        help_text="It has room and waits for a wake-up: enqueues send one after their commit.",
    )

    class Meta:
        verbose_name = "worker"
        ordering = ["-started_at"]

    def __str__(self) -> str:
        return self.name


class PeriodicTick(models.Model):
    """The latest tick of each periodic schedule that was handled, kept when its job is not.

    Cleanup deletes finished jobs, and with them the uniqueness of a tick's job;
    this row outlives the job, so no worker enqueues the same tick twice.
    """

    kind = models.CharField(max_length=200, primary_key=True)
    tick = models.DateTimeField(help_text="The latest tick enqueued (or skipped) for this kind.")
    job_id = models.BigIntegerField(
        null=True, blank=True, help_text="The job enqueued for the tick (it may be cleaned up)."
    )
    handled_at = models.DateTimeField(db_default=Now())

    class Meta:
        verbose_name = "periodic tick"

    def __str__(self) -> str:
        return f"{self.kind} @ {self.tick.isoformat()}"


class ScheduleState(models.Model):
    """What the database holds of one periodic schedule: whether it runs, and since when it exists.

    Keyed by kind, as schedules are: a row outlives deploys, and a schedule removed
    from code or settings and added back finds its row as it left it.
    """

    kind = models.CharField(max_length=200, primary_key=True)
    enabled = models.BooleanField(
        default=True, help_text="Whether workers enqueue its ticks (a disabled one's are skipped)."
    )
    changed_by = models.CharField(
        max_length=200, blank=True, default="", help_text="Who last disabled or enabled it."
    )
    changed_at = models.DateTimeField(
        null=True, blank=True, help_text="When it was last disabled or enabled."
    )
    first_seen_at = models.DateTimeField(
        help_text="When a worker first saw the schedule: a missed tick before it is not caught up."
    )

    class Meta:
        verbose_name = "schedule state"

    def __str__(self) -> str:
        return f"{self.kind} ({'enabled' if self.enabled else 'disabled'})"


class RunTally(models.Model):
    """Journal figures of one minute, folded in when cleanup deletes their journal entries.

    `venturi.stats()` adds these to what the journal still holds, so throughput
    and failure figures stay true after finished jobs are cleaned up.
    """

    minute = models.DateTimeField(help_text="The minute the runs finished in.")
    completed_jobs = models.PositiveBigIntegerField(default=0)
    failed_jobs = models.PositiveBigIntegerField(
        default=0, help_text="Runs that ended their job failed (a permanent failure or a give-up)."
    )
    retried_runs = models.PositiveBigIntegerField(
        default=0, help_text="Failed runs that were retried (retry, timeout, lease expired)."
    )
    other_runs = models.PositiveBigIntegerField(
        default=0, help_text="Paused, released, cancelled or discarded runs."
    )

    class Meta:
        indexes = [models.Index(fields=["minute"], name="venturi_runtally_minute_idx")]

    def __str__(self) -> str:
        return f"runs of {self.minute.isoformat()}"


class MaintenanceRun(models.Model):
    """The latest run of each maintenance task (`venturi_maintenance`, `VENTURI["MAINTENANCE"]`).

    Workers read it to run a task once per interval between them all.
    """

    task = models.CharField(max_length=50, primary_key=True)
    started_at = models.DateTimeField(help_text="When the latest run began.")
    finished_at = models.DateTimeField(
        null=True, blank=True, help_text="When it ended; empty while it runs or if it failed."
    )
    report = models.TextField(blank=True, default="", help_text="What it did, or its error.")

    class Meta:
        verbose_name = "maintenance run"

    def __str__(self) -> str:
        return f"{self.task} @ {self.started_at.isoformat()}"


class Pause(models.Model):
    """A queue or a kind that workers do not claim from (see `pauses.py`).

    A row, not worker state: a pause outlives worker restarts and deploys, and
    every worker on every host sees it at its next claim.
    """

    QUEUE = "queue"
    KIND = "kind"

    scope = models.CharField(
        max_length=8, choices=[(QUEUE, "queue"), (KIND, "kind")], help_text="What is paused."
    )
    name = models.CharField(max_length=200, help_text="The queue's or the kind's name.")
    paused_by = models.CharField(
        max_length=200, help_text='Who paused it: an admin user\'s name, or "api".'
    )
    paused_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["scope", "name"]
        constraints = [
            models.UniqueConstraint(fields=["scope", "name"], name="venturi_pause_scope_name_uniq")
        ]

    def __str__(self) -> str:
        return f"{self.scope} {self.name} (paused by {self.paused_by})"


class RateStart(models.Model):
    """One start of a rate-limited kind, written by the claim that started it.

    The claim counts these rows within the limit's window; rows older than every
    window are deleted by later claims. When the job's handler starts, its worker
    moves `started_at` to that moment.
    """

    id = models.BigAutoField(primary_key=True)
    kind = models.CharField(max_length=200)
    key = models.TextField(
        blank=True, default="", help_text="The limited payload field's value; empty: the kind's."
    )
    started_at = models.DateTimeField(
        help_text="The claim's time, then the handler's start (see `rate_starts.py`)."
    )
    job_id = models.BigIntegerField(help_text="The job that started.")

    class Meta:
        indexes = [
            models.Index(fields=["kind", "key", "started_at"], name="venturi_ratestart_window_idx"),
            models.Index(fields=["job_id"], name="venturi_ratestart_job_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.kind}[{self.key}] @ {self.started_at.isoformat()}"


HISTOGRAM_BUCKETS = 24
"""Buckets of a roll-up's wait and run time histograms: bucket 0 holds times under
1 ms, bucket i (1 to 22) those from 2^(i-1) to 2^i ms, bucket 23 anything longer
(`store/history.py`)."""
WAIT_COLUMNS = tuple(f"wait_{index:02d}" for index in range(HISTOGRAM_BUCKETS))
RUN_COLUMNS = tuple(f"run_{index:02d}" for index in range(HISTOGRAM_BUCKETS))


class HistoryRollup(models.Model):
    """Figures of one minute or one hour for one queue and kind (`store/history.py`).

    Workers write one minute row each per queue and kind they ran; one worker a
    minute samples the queue depth into rows without a worker, and derives the
    hour rows from the minute rows. The row without queue nor kind marks a
    sampled minute (`samples`: how many minutes were sampled into the row).
    """

    class Span(models.TextChoices):
        MINUTE = "minute"
        HOUR = "hour"

    id = models.BigAutoField(primary_key=True)
    span = models.CharField(max_length=6, choices=Span.choices)
    start = models.DateTimeField()
    queue = models.CharField(max_length=100, blank=True, default="")
    kind = models.CharField(max_length=200, blank=True, default="")
    worker = models.CharField(
        max_length=200, blank=True, default="", help_text="The writing worker; empty: derived."
    )
    # Integers, not bigints: PostgreSQL sums an integer column into a bigint (fast) and a
    # bigint one into a numeric (several times slower on the 30-day range's 50 columns).
    completed = models.IntegerField(default=0)
    failed = models.IntegerField(default=0, help_text="Jobs failed for good or gave up.")
    retried = models.IntegerField(default=0, help_text="Failed runs retried.")
    ready = models.IntegerField(default=0, help_text="Ready jobs, summed over the samples.")
    waiting = models.IntegerField(default=0, help_text="Waiting jobs, summed over the samples.")
    samples = models.IntegerField(default=0, help_text="Depth samples (on the marker row).")

    class Meta:
        verbose_name = "history roll-up"
        constraints = [
            models.UniqueConstraint(
                fields=["span", "start", "queue", "kind", "worker"],
                name="venturi_history_rollup_key",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.span} {self.start.isoformat()} {self.queue} {self.kind} {self.worker}"


for _column in (*WAIT_COLUMNS, *RUN_COLUMNS):
    HistoryRollup.add_to_class(_column, models.IntegerField(default=0))
