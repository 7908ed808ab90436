"""The job lifecycle as a state machine: Hypothesis drives the library's functions in any order.

Rules enqueue (plain, delayed, every priority, keyed with each merge decision),
claim, write every verdict (also under old claims, and two for one run in one
batch), heartbeat, let leases run out, recover them, cancel, retry now, let
time pass and clean up, each against the real database. A model says what
each job must look like; after every step the whole job table and journal are
compared with it, and the invariants below are checked on the rows alone:

- no job is lost: every job the model knows is there, unless cleanup deleted
  it when it was finished; a job merged or absorbed is so by a documented rule;
- at most one ready and one running job per kind and dedup key;
- a verdict under an old claim changes no row (it is journalled `discarded`);
- one journal entry per run, numbered as the row's `attempt` counts them;
- failures never pass `max_attempts` (a manual retry starts a fresh set of attempts).

The default profile is small and derandomized (the default suite); set
`VENTURI_LONG_PROPERTIES=1` for a long random run (see CONTRIBUTING.md).
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

import django_venturi as venturi
from django_venturi.models import Job, JournalEntry
from django_venturi.registry import registry
from django_venturi.store import leases, verdicts
from django_venturi.store.claim import ClaimedJob, ClaimRequest, claim
from django_venturi.store.clock import database_time
from django_venturi.store.completion import write_verdicts
from django_venturi.store.retry import retry_now
from django_venturi.store.scheduling import TierClock

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])

LONG = os.environ.get("VENTURI_LONG_PROPERTIES") == "1"
PROFILE = (
    settings(max_examples=400, stateful_step_count=80, deadline=None)
    if LONG
    else settings(max_examples=15, stateful_step_count=35, deadline=None, derandomize=True)
)
BACKOFF = venturi.Fibonacci(base=timedelta(minutes=1), cap=timedelta(hours=1))
"""Retries are never due at once (the shortest delay is 54 s): only `time_passes` makes them."""
LEASE = timedelta(minutes=5)
DELAY = timedelta(hours=1)
AGE = timedelta(days=1)
"""How far `time_passes` moves every due time and finish time back."""
KEYS = ("a", "b")
DECISIONS = ("keep", "replace", "update", "enqueue")
FAILED_RUN_OUTCOMES = ("retry", "failed", "lease_expired", "timeout")


@venturi.task(kind="tests.lifecycle.plain", max_attempts=3, backoff=BACKOFF, carry=int)
@dataclasses.dataclass
class Plain(venturi.Task):
    n: int

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        return venturi.Outcome.completed()


@venturi.task(kind="tests.lifecycle.keyed", max_attempts=2, backoff=BACKOFF, carry=int)
@dataclasses.dataclass
class Keyed(venturi.Task):
    """Deduplicated by `key`; the merge decision of a new job is its own `decision` field."""

    key: str
    decision: str
    value: int

    def dedup_key(self) -> str | None:
        return self.key

    def merge(self, existing: venturi.Existing[Keyed]) -> venturi.Merge:
        if self.decision == "keep":
            return venturi.Merge.keep()
        if self.decision == "replace":
            return venturi.Merge.replace()
        if self.decision == "update":
            merged = dataclasses.replace(
                existing.payload, value=existing.payload.value + self.value
            )
            return venturi.Merge.update(merged)
        return venturi.Merge.enqueue()

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        return venturi.Outcome.completed()


PLAIN, KEYED = "tests.lifecycle.plain", "tests.lifecycle.keyed"
MAX_ATTEMPTS = {PLAIN: 3, KEYED: 2}


@dataclasses.dataclass
class Model:
    """What one job must look like."""

    id: int
    kind: str
    key: str | None
    payload: dict[str, Any]
    priority: int
    due: bool
    state: str = "ready"
    attempt: int = 0
    failures: int = 0
    carry: Any = None
    merged_count: int = 0
    cancel_requested: bool = False
    token: uuid.UUID | None = None
    expired: bool = False
    aged: bool = False
    """Finished before the last `time_passes`: old enough for cleanup."""
    journal: list[tuple[int, str]] = dataclasses.field(default_factory=list)
    """(attempt, outcome) of each journal entry, in order."""

    @property
    def finished(self) -> bool:
        return self.state in ("completed", "failed", "cancelled")

    def holds(self, run: ClaimedJob) -> bool:
        return self.state == "running" and self.token == run.claim_token


class Lifecycle(RuleBasedStateMachine):
    alias = "default"
    runs = Bundle("runs")

    def __init__(self) -> None:
        super().__init__()
        self.jobs: dict[int, Model] = {}
        self.deleted: set[int] = set()
        self.clock = TierClock((6, 3, 1))

    def teardown(self) -> None:
        JournalEntry.objects.using(self.alias).all().delete()
        Job.objects.using(self.alias).all().delete()

    # ------------------------------------------------------------ helpers

    def live(self) -> list[Model]:
        return [job for job in self.jobs.values() if not job.finished]

    def of_key(self, key: str, state: str) -> list[Model]:
        return [
            job
            for job in self.jobs.values()
            if job.kind == KEYED and job.key == key and job.state == state
        ]

    def requeue(self, job: Model, *, due: bool, carry: Any = None, set_carry: bool = False) -> str:
        """A run of `job` ends going back to `ready`: cancelled instead, or absorbing a twin."""
        job.token, job.expired = None, False
        if set_carry:
            job.carry = carry
        if job.cancel_requested:
            job.state = "cancelled"
            return "cancelled"
        twins = self.of_key(job.key, "ready") if job.key is not None else []
        job.state, job.due = "ready", due
        for twin in twins:
            self.absorb(job, twin)
        return ""

    def absorb(self, survivor: Model, twin: Model) -> None:
        """The twin's own `merge()` decides, as if enqueued now against the survivor."""
        decision = twin.payload["decision"]
        if decision == "replace":
            survivor.payload = dict(twin.payload)
        elif decision == "update":
            survivor.payload = {
                **survivor.payload,
                "value": survivor.payload["value"] + twin.payload["value"],
            }
        survivor.merged_count += twin.merged_count + 1
        twin.state = "cancelled"

    def fail(self, job: Model, outcome: str) -> str:
        """A retryable failure of the current run: back to ready after backoff, or gave up."""
        job.failures += 1
        if job.failures >= MAX_ATTEMPTS[job.kind]:
            job.state, job.token, job.expired = "failed", None, False
            return "failed" if outcome == "retry" else outcome
        return self.requeue(job, due=False) or outcome

    # ------------------------------------------------------------ producers

    @rule(
        n=st.integers(0, 9),
        priority=st.sampled_from(venturi.Priority.values),
        delayed=st.booleans(),
    )
    def enqueue_plain(self, n: int, priority: int, delayed: bool) -> None:
        job = Plain(n=n).enqueue(
            priority=venturi.Priority(priority), delay=DELAY if delayed else None, using=self.alias
        )
        assert job.pk not in self.jobs
        self.jobs[job.pk] = Model(job.pk, PLAIN, None, {"n": n}, priority, due=not delayed)

    @rule(
        key=st.sampled_from(KEYS),
        decision=st.sampled_from(DECISIONS),
        value=st.integers(1, 5),
        priority=st.sampled_from(venturi.Priority.values),
        delayed=st.booleans(),
    )
    def enqueue_keyed(
        self, key: str, decision: str, value: int, priority: int, delayed: bool
    ) -> None:
        payload = {"key": key, "decision": decision, "value": value}
        ready = self.of_key(key, "ready")
        running = [job for job in self.of_key(key, "running") if not job.cancel_requested]
        existing = ready[0] if ready else max(running, key=lambda job: job.id, default=None)
        options = {
            "priority": venturi.Priority(priority),
            "delay": DELAY if delayed else None,
            "using": self.alias,
        }
        if existing is not None and existing.state == "ready" and decision == "enqueue":
            with pytest.raises(ValueError, match="a follow-up may only be queued behind a running"):
                Keyed(**payload).enqueue(**options)
            return
        job = Keyed(**payload).enqueue(**options)
        if existing is None or decision == "enqueue":
            assert job.pk not in self.jobs and job.state == "ready"
            self.jobs[job.pk] = Model(job.pk, KEYED, key, payload, priority, due=not delayed)
            return
        assert job.pk == existing.id, (job.pk, existing)
        self.absorb_enqueue(existing, payload)

    def absorb_enqueue(self, existing: Model, payload: dict[str, Any]) -> None:
        if payload["decision"] == "replace":
            existing.payload = dict(payload)
        elif payload["decision"] == "update":
            existing.payload = {
                **existing.payload,
                "value": existing.payload["value"] + payload["value"],
            }
        existing.merged_count += 1

    # ------------------------------------------------------------ workers

    @rule(target=runs, limit=st.integers(1, 4))
    def claim(self, limit: int) -> Any:
        request = ClaimRequest(
            worker="w", limit=limit, kinds=[PLAIN, KEYED], leases=[LEASE, LEASE], queues=None
        )
        claimed = claim(self.alias, request, self.clock)
        busy = {job.key for job in self.jobs.values() if job.state == "running" and job.key}
        eligible = {
            job.id
            for job in self.jobs.values()
            if job.state == "ready" and job.due and job.key not in busy
        }
        assert len(claimed) == min(limit, len(eligible)), (claimed, eligible)
        for run in claimed:
            assert run.id in eligible, (run, eligible)
            job = self.jobs[run.id]
            job.state, job.token, job.attempt = "running", run.claim_token, job.attempt + 1
            assert (run.attempt, run.failures) == (job.attempt, job.failures)
        assert len({self.jobs[run.id].key for run in claimed if self.jobs[run.id].key}) == len(
            [run for run in claimed if self.jobs[run.id].key]
        ), "two jobs of one key claimed together"
        return multiple(*claimed)

    @rule(
        batch=st.lists(
            st.tuples(
                runs,
                st.sampled_from(
                    ["completed", "paused", "retry", "failed", "released", "cancelled", "timed_out"]
                ),
                st.integers(0, 9),
            ),
            min_size=1,
            max_size=3,
        )
    )
    def write_verdicts(self, batch: list[tuple[ClaimedJob, str, int]]) -> None:
        written = [self.verdict(run, kind, carry) for run, kind, carry in batch]
        before = self.rows()
        applied = write_verdicts(self.alias, "w", written)
        expected: set[int] = set()
        for run, kind, carry in batch:
            job = self.jobs.get(run.id)
            if job is None or run.id in self.deleted:
                continue  # cleanup deleted it: nothing to journal against
            if not job.holds(run):
                job.journal.append((run.attempt, "discarded"))
                continue
            expected.add(run.id)
            job.journal.append((run.attempt, self.apply(job, kind, carry)))
        assert applied == expected
        after = self.rows()
        for run, _, _ in batch:
            if run.id not in expected and run.id in before:
                assert after[run.id] == before[run.id], "a verdict under an old claim changed a row"

    def verdict(self, run: ClaimedJob, kind: str, carry: int) -> verdicts.Verdict:
        spec = registry.get(run.kind)
        return {
            "completed": lambda: verdicts.completed(run),
            "paused": lambda: verdicts.from_outcome(run, spec, venturi.Outcome.paused(carry)),
            "retry": lambda: verdicts.from_outcome(run, spec, venturi.Outcome.retry()),
            "failed": lambda: verdicts.from_outcome(run, spec, venturi.Outcome.failed("no")),
            "released": lambda: verdicts.released(run),
            "cancelled": lambda: verdicts.cancelled(run),
            "timed_out": lambda: verdicts.timed_out(run, spec, timedelta(seconds=1), ""),
        }[kind]()

    def apply(self, job: Model, kind: str, carry: int) -> str:
        """Apply the verdict of the job's current run to the model; return its journal outcome."""
        if kind in ("completed", "cancelled"):
            job.state, job.token, job.expired = kind, None, False
            return kind
        if kind == "failed":
            job.state, job.token, job.expired = "failed", None, False
            job.failures += 1
            return "failed"
        if kind == "paused":
            return self.requeue(job, due=True, carry=carry, set_carry=True) or "paused"
        if kind == "released":
            return self.requeue(job, due=True) or "released"
        return self.fail(job, "retry" if kind == "retry" else "timeout")

    @rule(chosen=st.lists(runs, min_size=1, max_size=3))
    def heartbeat(self, chosen: list[ClaimedJob]) -> None:
        extension = leases.extend(self.alias, chosen)
        expected = {
            run.run_key for run in chosen if run.id in self.jobs and self.jobs[run.id].holds(run)
        }
        # One session at a time here: no row is locked by another, none is skipped.
        assert extension.busy == set()
        assert extension.extended == expected
        for job_id, _ in extension.extended:
            self.jobs[job_id].expired = False

    @precondition(lambda self: any(job.state == "running" for job in self.jobs.values()))
    @rule(data=st.data())
    def lease_runs_out(self, data: st.DataObject) -> None:
        running = sorted(job.id for job in self.jobs.values() if job.state == "running")
        job_id = data.draw(st.sampled_from(running))
        Job.objects.using(self.alias).filter(pk=job_id).update(
            lease_expires_at=database_time(self.alias) - timedelta(seconds=1)
        )
        self.jobs[job_id].expired = True

    @rule()
    def recover(self) -> None:
        recovered = leases.recover_expired(self.alias, "rescuer")
        expired = sorted(
            job.id for job in self.jobs.values() if job.state == "running" and job.expired
        )
        assert sorted(recovered) == expired
        for job_id in expired:
            job = self.jobs[job_id]
            job.journal.append((job.attempt, self.fail(job, "lease_expired")))

    # ------------------------------------------------------------ operations

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        known = sorted(self.jobs)
        ids = data.draw(st.lists(st.sampled_from(known), max_size=3)) if known else []
        result = venturi.cancel(ids, using=self.alias)
        present = [i for i in set(ids) if i not in self.deleted]
        ready = [i for i in present if self.jobs[i].state == "ready"]
        # Running jobs asked before are stopping all the same.
        stopping = [i for i in present if self.jobs[i].state == "running"]
        finished = [i for i in present if self.jobs[i].finished]
        assert result == venturi.CancelResult(
            cancelled=len(ready),
            stopping=len(stopping),
            already_finished=len(finished),
            unknown=len(set(ids)) - len(present),
        )
        for job_id in ready:
            self.jobs[job_id].state = "cancelled"
        for job_id in stopping:
            self.jobs[job_id].cancel_requested = True

    @rule(data=st.data())
    def retry_now(self, data: st.DataObject) -> None:
        known = sorted(self.jobs)
        ids = data.draw(st.lists(st.sampled_from(known), max_size=3)) if known else []
        result = retry_now(ids, using=self.alias)
        retried, clashes = [], []
        present = [i for i in sorted(set(ids)) if i not in self.deleted]
        for job_id in present:
            if self.jobs[job_id].state == "ready":
                self.jobs[job_id].due = True
                retried.append(job_id)
        for job_id in present:
            job = self.jobs[job_id]
            if job.state != "failed":
                continue
            if job.key is not None and self.of_key(job.key, "ready"):
                clashes.append(job_id)
                continue
            job.state, job.due, job.aged = "ready", True, False
            job.cancel_requested, job.failures = False, 0  # a fresh set of attempts
            retried.append(job_id)
        assert (result.retried, result.clashes) == (sorted(retried), clashes)

    @rule()
    def time_passes(self) -> None:
        jobs = Job.objects.using(self.alias)
        for job in jobs.filter(state="ready"):
            jobs.filter(pk=job.pk).update(run_at=job.run_at - AGE)
        for job in jobs.filter(finished_at__isnull=False):
            jobs.filter(pk=job.pk).update(finished_at=job.finished_at - AGE)
        for job in self.jobs.values():
            job.due = job.due or job.state == "ready"
            job.aged = job.aged or job.finished

    @rule()
    def cleanup(self) -> None:
        result = venturi.cleanup(older_than=AGE / 2, using=self.alias)
        old = [
            job
            for job in self.jobs.values()
            if job.finished and job.aged and job.id not in self.deleted
        ]
        assert result.jobs == len(old)
        assert result.journal_entries == sum(len(job.journal) for job in old)
        self.deleted.update(job.id for job in old)

    # ------------------------------------------------------------ checks

    def rows(self) -> dict[int, dict[str, Any]]:
        return {row["id"]: row for row in Job.objects.using(self.alias).values()}

    @invariant()
    def checks(self) -> None:
        rows = self.rows()
        journals: dict[int, list[tuple[int, str]]] = {job_id: [] for job_id in rows}
        entries = JournalEntry.objects.using(self.alias).order_by("id")
        for job_id, attempt, outcome in entries.values_list("job_id", "attempt", "outcome"):
            journals[job_id].append((attempt, outcome))
        self.the_table_is_as_the_model_says(rows, journals)
        self.one_ready_and_one_running_job_per_key(rows)
        self.one_journal_entry_per_run(rows, journals)
        self.failures_within_max_attempts(rows)

    def the_table_is_as_the_model_says(
        self, rows: dict[int, dict[str, Any]], journals: dict[int, list[tuple[int, str]]]
    ) -> None:
        kept = {job_id for job_id in self.jobs if job_id not in self.deleted}
        assert set(rows) == kept, f"lost: {kept - set(rows)}, unknown: {set(rows) - kept}"
        now = database_time(self.alias)
        for job_id, row in rows.items():
            job = self.jobs[job_id]
            spec = registry.get(job.kind)
            actual = {
                "state": row["state"],
                "attempt": row["attempt"],
                "failures": row["failures"],
                "payload": row["payload"],
                "carry": row["carry"],
                "merged_count": row["merged_count"],
                "cancel_requested": row["cancel_requested_at"] is not None,
                "token": row["claim_token"],
                "finished": row["finished_at"] is not None,
                "due": row["run_at"] <= now if row["state"] == "ready" else None,
                "journal": journals[job_id],
            }
            wanted = {
                "state": job.state,
                "attempt": job.attempt,
                "failures": job.failures,
                "payload": spec.encode(spec.decode(job.payload)),
                "carry": None if job.carry is None else spec.encode_carry(job.carry),
                "merged_count": job.merged_count,
                "cancel_requested": job.cancel_requested,
                "token": job.token,
                "finished": job.finished,
                "due": job.due if job.state == "ready" else None,
                "journal": job.journal,
            }
            assert actual == wanted, f"job #{job_id}"

    def one_ready_and_one_running_job_per_key(self, rows: dict[int, dict[str, Any]]) -> None:
        counts = Counter(
            (row["kind"], row["dedup_key"], row["state"])
            for row in rows.values()
            if row["dedup_key"] is not None and row["state"] in ("ready", "running")
        )
        assert all(count == 1 for count in counts.values()), counts

    def one_journal_entry_per_run(
        self, rows: dict[int, dict[str, Any]], journals: dict[int, list[tuple[int, str]]]
    ) -> None:
        for job_id, row in rows.items():
            runs = [attempt for attempt, outcome in journals[job_id] if outcome != "discarded"]
            ended = row["attempt"] - (1 if row["state"] == "running" else 0)
            assert runs == list(range(1, ended + 1)), (job_id, journals[job_id])

    def failures_within_max_attempts(self, rows: dict[int, dict[str, Any]]) -> None:
        for job_id, row in rows.items():
            assert row["failures"] <= MAX_ATTEMPTS[row["kind"]], (job_id, row)


class LifecycleOnSQLite(Lifecycle):
    alias = "sqlite"


@pytest.mark.parametrize(
    ("machine", "database"), [(Lifecycle, "postgresql"), (LifecycleOnSQLite, "sqlite")]
)
@pytest.mark.timeout(3600 if LONG else 300)  # a failure's shrinking takes a while
def test_random_operations_keep_the_job_lifecycle_invariants(
    machine: type[Lifecycle], database: str
) -> None:
    assert connections[machine.alias].vendor == database
    run_state_machine_as_test(
        machine,
        settings=settings(
            PROFILE,
            database=None if not LONG else settings.default.database,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
