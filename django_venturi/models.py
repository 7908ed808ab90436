"""The job table and its append-only journal."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from django_venturi.payloads import stored
from django_venturi.states import FINISHED_STATES, JournalOutcome, Priority, State


class StoredJSONField(models.JSONField):
    """A `JSONField` whose loads never raise: a value Python cannot read is `Unreadable`.

    With psycopg 3 Django loads jsonb as text and reads it with `json.loads`,
    which raises on valid JSON it cannot read (an integer of 5,000 digits, arrays
    nested 11,000 deep: written by SQL). One such row would break every query
    that loads it: lease recovery, the admin's list. See `payloads/stored.py`.

    The migrations see a plain `JSONField` (`deconstruct`): the column is the same.
    """

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        try:
            return super().from_db_value(value, expression, connection)
        except stored.READ_ERRORS as error:
            return stored.unreadable(error)

    def deconstruct(self) -> Any:
        name, _, args, kwargs = super().deconstruct()
        return name, "django.db.models.JSONField", args, kwargs


class Job(models.Model):
    """One row per job: what to run, where it is in its life, and who holds it."""

    kind = models.CharField(max_length=200, help_text="The registered task kind.")
    queue = models.CharField(max_length=100, default="default")
    priority = models.PositiveSmallIntegerField(choices=Priority.choices, default=Priority.NORMAL)
    rank = models.SmallIntegerField(
        db_default=0,
        help_text="Order within the priority tier, lower first (a Django Tasks priority, negated).",
    )
    state = models.CharField(max_length=16, choices=State.choices, default=State.READY)
    payload = StoredJSONField(help_text="The task's dataclass fields as typed JSON.")
    carry = StoredJSONField(null=True, blank=True, help_text="The checkpoint of a paused job.")
    # NULL, not "", means "no dedup key": the dedup unique index only covers keyed jobs.
    dedup_key = models.CharField(  # noqa: DJ001
        max_length=200, null=True, blank=True, help_text="What the task's dedup_key() returned."
    )
    merged_count = models.PositiveIntegerField(
        db_default=0, help_text="Enqueues merged into this job by deduplication."
    )
    last_merged_at = models.DateTimeField(
        null=True, blank=True, help_text="When an enqueue was last merged into this job."
    )
    attempt = models.PositiveIntegerField(default=0, help_text="Runs started so far.")
    failures = models.PositiveIntegerField(
        default=0, help_text="Failed runs so far (counted against max_attempts)."
    )
    run_at = models.DateTimeField(db_default=Now(), help_text="Not claimed before this time.")
    enqueued_at = models.DateTimeField(db_default=Now())
    started_at = models.DateTimeField(null=True, blank=True, help_text="Start of the latest run.")
    finished_at = models.DateTimeField(null=True, blank=True)
    claim_token = models.UUIDField(null=True, blank=True, help_text="Fences writes to a claim.")
    claimed_by = models.CharField(max_length=200, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    error_type = models.CharField(
        max_length=300,
        blank=True,
        db_default="",
        help_text="The exception type of last_error (`module.Name`), for the admin's filter.",
    )
    result = StoredJSONField(
        null=True, blank=True, help_text="What the handler returned (Django Tasks jobs)."
    )
    cancel_requested_at = models.DateTimeField(
        null=True, blank=True, help_text="When a cancel of this running job was asked."
    )
    progress = StoredJSONField(
        null=True, blank=True, help_text="The latest ctx.progress(): done, total, note, at."
    )
    periodic_tick = models.DateTimeField(
        null=True, blank=True, help_text="The cron tick this periodic job was enqueued for."
    )
    waiting_for = models.PositiveIntegerField(
        db_default=0, help_text="Dependencies not finished yet (a waiting job)."
    )
    fair_key = models.TextField(  # noqa: DJ001
        null=True,
        blank=True,
        help_text="The value of the task's fair_by field: the kind's jobs take turns by it.",
    )
    dependents = models.PositiveIntegerField(
        db_default=0,
        help_text="Jobs enqueued after this one while it was unfinished (its verdict "
        "resolves them).",
    )
    trace_context = StoredJSONField(
        null=True,
        blank=True,
        help_text="The W3C trace context (traceparent, tracestate) of the span that "
        "enqueued the job, with METRICS on: each run's span links to it.",
    )

    class Meta:
        indexes = [
            # The claim walks this index in order: ready jobs of one queue by
            # priority tier and rank within it, then due time, then enqueue order.
            models.Index(
                fields=["queue", "priority", "rank", "run_at", "id"],
                name="venturi_job_claim_rank_idx",
                condition=Q(state=State.READY),
            ),
            # The claim finds the keys of a fair kind's due jobs here, one probe each,
            # and each key's first jobs (`claim_statement.py`).
            models.Index(
                fields=["queue", "priority", "rank", "kind", "fair_key", "run_at", "id"],
                name="venturi_job_fair_idx",
                condition=Q(state=State.READY, fair_key__isnull=False),
            ),
            # The rescuer finds expired leases without looking at other rows.
            models.Index(
                fields=["lease_expires_at"],
                name="venturi_job_lease_idx",
                condition=Q(state=State.RUNNING),
            ),
            # Concurrency caps count the running jobs of a kind at each claim.
            models.Index(
                fields=["kind"],
                name="venturi_job_running_kind_idx",
                condition=Q(state=State.RUNNING),
            ),
            models.Index(fields=["kind", "state"], name="venturi_job_kind_state_idx"),
            # The admin's error type filter and error groups: the jobs whose error is
            # current (failed, or ready again after a failed run), newest first per type.
            models.Index(
                fields=["error_type", "id"],
                name="venturi_job_error_type_idx",
                condition=~Q(error_type="")
                & (Q(state=State.FAILED) | Q(state=State.READY, failures__gt=0)),
            ),
            # A new job with a dedup key finds the running jobs of its key here.
            models.Index(
                fields=["kind", "dedup_key"],
                name="venturi_job_dedup_running_idx",
                condition=Q(state=State.RUNNING, dedup_key__isnull=False),
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=~Q(state__in=FINISHED_STATES) | Q(finished_at__isnull=False),
                name="venturi_job_finished_has_finished_at",
            ),
            models.CheckConstraint(
                condition=~Q(state=State.RUNNING)
                | Q(claim_token__isnull=False, lease_expires_at__isnull=False),
                name="venturi_job_running_has_lease",
            ),
            models.CheckConstraint(
                condition=Q(failures__lte=models.F("attempt")),
                name="venturi_job_failures_within_attempts",
            ),
            # Deduplication: one ready job per kind and key. Running jobs are not
            # covered, which leaves room for one follow-up behind a running job
            # (Merge.enqueue); a finished job leaves the index and frees its key.
            models.UniqueConstraint(
                fields=["kind", "dedup_key"],
                name="venturi_job_dedup_ready_uniq",
                condition=Q(state=State.READY, dedup_key__isnull=False),
            ),
            models.CheckConstraint(
                condition=~Q(dedup_key=""), name="venturi_job_dedup_key_not_empty"
            ),
            models.CheckConstraint(
                condition=~Q(state=State.WAITING) | Q(waiting_for__gt=0),
                name="venturi_job_waiting_has_dependencies",
            ),
            # Periodic jobs: one job per kind and cron tick, however many workers
            # reach the tick at once.
            models.UniqueConstraint(
                fields=["kind", "periodic_tick"],
                name="venturi_job_periodic_tick_uniq",
                condition=Q(periodic_tick__isnull=False),
            ),
        ]
        permissions = [
            ("retry_job", "Can retry jobs now (admin action)"),
            ("cancel_job", "Can cancel jobs (admin action)"),
            ("cleanup_jobs", "Can clean up finished jobs (admin page)"),
            ("pause_queues", "Can pause and resume queues and kinds (admin stats page)"),
            (
                "manage_schedules",
                "Can run, disable and enable periodic schedules (admin periodic page)",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} #{self.pk} ({self.state})"

    def masked_payload(self) -> Any:
        """The stored payload with the task's secret fields masked (for screens and logs).

        Masked by the declared types, at any depth (`payloads.masking`). A kind this
        process has not registered shows its top-level keys only: which of its
        values are secret is not known here.
        """
        from django_venturi.payloads import masking
        from django_venturi.registry import registry

        types = registry.declared_types(self.kind)  # a Django Tasks job's: plain, as stored
        if types is None:
            return masking.hidden(self.payload)
        return masking.masked_value(types[0], self.payload)

    def decoded_payload(self) -> Any:
        """Return the payload as an instance of its task class."""
        from django_venturi.registry import registry

        return registry.get(self.kind).decode(self.payload)


class JournalEntry(models.Model):
    """One row per execution of a job, written once and never changed."""

    job = models.ForeignKey(
        Job,
        on_delete=models.CASCADE,
        related_name="journal",
        # No constraint in the database: checking it cost a lookup and a row lock of
        # the job per entry, a third of the cost of writing a batch of verdicts.
        # Entries go with their job through Django (`on_delete`), cleanup and the
        # admin, which lock the jobs first; the verdict write inserts an entry only
        # while its job exists.
        db_constraint=False,
    )
    attempt = models.PositiveIntegerField()
    worker = models.CharField(max_length=200, blank=True, default="")
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(db_default=Now())
    outcome = models.CharField(max_length=16, choices=JournalOutcome.choices)
    error_type = models.CharField(max_length=300, blank=True, default="")
    error_message = models.TextField(blank=True, default="")
    traceback = models.TextField(blank=True, default="")

    class Meta:
        verbose_name_plural = "journal entries"
        ordering = ["job_id", "id"]
        indexes = [models.Index(fields=["finished_at"], name="venturi_journal_finished_idx")]

    def __str__(self) -> str:
        return f"job #{self.job_id} attempt {self.attempt}: {self.outcome}"


class Dependency(models.Model):
    """One edge of a workflow: `dependent` waits for `dependency` to finish."""

    dependent = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="dependency_links")
    dependency = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="dependent_links")
    run_after_failure = models.BooleanField(
        default=False, help_text="Run the dependent even if this dependency fails or is cancelled."
    )
    resolved = models.BooleanField(
        default=False, help_text="The dependency finished and the dependent has counted it."
    )

    class Meta:
        verbose_name_plural = "dependencies"
        constraints = [
            models.UniqueConstraint(
                fields=["dependency", "dependent"], name="venturi_dependency_uniq"
            ),
        ]
        # A verdict finds the unresolved edges of the jobs it finishes here.
        indexes = [
            models.Index(
                fields=["dependency"],
                name="venturi_dependency_open_idx",
                condition=Q(resolved=False),
            )
        ]

    def __str__(self) -> str:
        return f"job #{self.dependent_id} after job #{self.dependency_id}"


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


class PeriodicTask(Job):
    """The admin's list of periodic schedules (a proxy: the schedules live in code and settings)."""

    class Meta:
        proxy = True
        verbose_name = "periodic task"


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
