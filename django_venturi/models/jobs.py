"""The job table, its append-only journal, and the edges of workflows."""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from django_venturi.payloads import stored
from django_venturi.states import FINISHED_STATES, LIVE_STATES, JournalOutcome, Priority, State


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
            # `venturi.stats()`, the stats page and the table's health count the live
            # jobs by state, kind and queue here: their cost follows the backlog, not
            # the millions of finished rows the index above also holds.
            models.Index(
                fields=["state", "kind", "queue"],
                name="venturi_job_live_idx",
                condition=Q(state__in=LIVE_STATES),
            ),
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


class PeriodicTask(Job):
    """The admin's list of periodic schedules (a proxy: the schedules live in code and settings)."""

    class Meta:
        proxy = True
        verbose_name = "periodic task"
