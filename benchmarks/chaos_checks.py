"""The chaos soak's invariants (benchmarks/chaos.py), checked on the end state by SQL.

Each violation names its invariant, its job and the moment it concerns, so the
report can list the faults injected around it:

- `not terminal`: every job ends completed, failed or cancelled once the faults stop;
- `failed`: no job fails (none of the soak's handlers fails for good, attempts are many);
- `lost`: every job the producer enqueued has its row;
- `cancelled unasked`: only jobs asked to be cancelled (or waiting for one that was,
  or a keyed follow-up folded into its survivor) end cancelled;
- `atomic effect`: an atomic job has exactly one effect row if completed, none otherwise;
- `completed without a run`: the attempt that completed a job ran its handler;
- `journal vs state`: a completed job has exactly one `completed` entry, another none;
  every claim of a finished job is closed by an entry;
- `duplicate verdict`: no claim has two closing entries, and no claim ran its handler twice;
- `discarded applied verdict`: a `discarded` entry only follows a lost claim (`lease_expired`);
- `verdict not written`: no run's outcome is replaced because the database refused it
  (an `UnwritableVerdict` entry): a refused write must wait for a writable primary;
- `workflow order`: a step runs only after the step before it completed;
- `keyed count`: the counts of a key's completed jobs add up to its enqueues;
- `running past its lease`, `claims stalled`: sampled while the soak runs
  (benchmarks/chaos_watch.py);
- `worker exited 0 unasked`, `worker ignored SIGTERM`, `worker failed at shutdown`,
  `worker silent`: every worker is alive and beating, or exited non-zero.
"""

from __future__ import annotations

import collections
import itertools
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks.chaos_producer import Produced

GRACE = 30.0
"""Seconds past its lease after which a running job counts as stuck: the sweepers run
every 5 s (RESCUE_INTERVAL), and leave alone the jobs of a worker that beat within two
10 s heartbeat intervals before their lease ran out (it recovers them itself when it
wakes). Only sampled once the database has been back this long."""
UNWRITABLE = "django_venturi.UnwritableVerdict"
"""The error type of a run failed because its verdict could not be written."""
LOST_CLAIM = "django_venturi.LeaseExpired"
"""The error type of the entry closing a claim whose lease ran out (its outcome is
`lease_expired`, or `cancelled` when a cancel had been asked)."""
FINAL = {"completed", "failed", "cancelled"}


@dataclass
class Violation:
    invariant: str
    job: int | None
    detail: str
    at: float | None
    """Wall clock of the moment concerned (for the faults around it), if known."""
    attempt: int | None = None
    """The claim concerned, if one (a stuck run: the end state says how it ended)."""


@dataclass
class Entry:
    attempt: int
    outcome: str
    worker: str
    error_type: str
    started: float | None
    finished: float


@dataclass
class Row:
    id: int
    kind: str
    state: str
    attempt: int
    last_error: str
    payload: Any
    finished: float | None
    enqueued: float


def stamp(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def stuck_running(origin: float, grace: float = GRACE) -> list[Violation]:
    """Jobs running more than `grace` s past their lease, now (by the database's clock);
    times in the detail are seconds since `origin` (the soak's start)."""
    from django.db.models.functions import Now

    from django_venturi.models import Job

    rows = Job.objects.filter(
        state="running", lease_expires_at__lt=Now() - timedelta(seconds=grace)
    ).values_list("id", "kind", "claimed_by", "lease_expires_at", "attempt")
    seen = time.time()
    found = []
    for job_id, kind, worker, expires, attempt in rows:
        expired = stamp(expires) or seen
        detail = (
            f"{kind} attempt {attempt} held by {worker}: its lease ran out at "
            f"{expired - origin:.1f}s, still running at {seen - origin:.1f}s"
        )
        found.append(Violation("running past its lease", job_id, detail, expired, attempt))
    return found


def due_jobs(kind: str) -> int:
    """Jobs of `kind` ready and due now (by the database's clock)."""
    from django.db.models.functions import Now

    from django_venturi.models import Job

    return Job.objects.filter(kind=kind, state="ready", run_at__lte=Now()).count()


def how_stuck_runs_ended(
    violations: list[Violation], journal: dict[int, list[Entry]], origin: float
) -> None:
    """Add to each stuck run's detail the entry that closed its claim in the end."""
    for violation in violations:
        if violation.invariant != "running past its lease" or violation.job is None:
            continue
        closed = [
            f"{entry.outcome} by {entry.worker} at {entry.finished - origin:.1f}s"
            for entry in journal.get(violation.job, [])
            if entry.attempt == violation.attempt
        ]
        violation.detail += f"; closed as {closed or 'nothing'}"


def load_rows() -> dict[int, Row]:
    from django_venturi.models import Job

    fields = ("id", "kind", "state", "attempt", "last_error", "payload", "finished_at")
    rows = {}
    for values in Job.objects.values_list(*fields, "enqueued_at"):
        job_id, kind, state, attempt, error, payload, finished, enqueued = values
        rows[job_id] = Row(
            job_id, kind, state, attempt, error, payload, stamp(finished), enqueued.timestamp()
        )
    return rows


def load_journal() -> dict[int, list[Entry]]:
    from django_venturi.models import JournalEntry

    journal: dict[int, list[Entry]] = collections.defaultdict(list)
    fields = ("job_id", "attempt", "outcome", "worker", "error_type", "started_at", "finished_at")
    entries = JournalEntry.objects.order_by("id").values_list(*fields)
    for job_id, attempt, outcome, worker, error_type, started, finished in entries:
        entry = Entry(attempt, outcome, worker, error_type, stamp(started), finished.timestamp())
        journal[job_id].append(entry)
    return journal


def load_runs(path: Path) -> dict[int, list[tuple[int, float]]]:
    """Job id -> (attempt, start time) of every handler run, from the runs file."""
    runs: dict[int, list[tuple[int, float]]] = collections.defaultdict(list)
    if path.exists():
        for line in path.read_text().splitlines():
            _kind, job_id, attempt, _pid, at = line.split()
            runs[int(job_id)].append((int(attempt), float(at)))
    return runs


def effects() -> collections.Counter[int]:
    """Job id -> effect rows written by atomic runs."""
    from benchmarks.bench_project.benchapp.models import Counter

    return collections.Counter(Counter._default_manager.values_list("value", flat=True))


def check_end_state(
    produced: Produced, runs_path: Path, sampled: list[Violation], origin: float
) -> list[Violation]:
    """The violations of the end state; `sampled` (stuck runs) learn how they ended."""
    rows, journal, runs = load_rows(), load_journal(), load_runs(runs_path)
    how_stuck_runs_ended(sampled, journal, origin)
    found: list[Violation] = []
    found += check_rows(rows, produced)
    found += check_atomic(rows, effects())
    for row in rows.values():
        found += check_journal(row, journal[row.id], runs[row.id])
    found += check_chains(rows, journal, runs, produced)
    found += check_keys(rows, produced)
    return found


def check_rows(rows: dict[int, Row], produced: Produced) -> list[Violation]:
    found = []
    for kind, ids in produced.ids.items():
        found += [Violation("lost", i, f"{kind} job has no row", None) for i in ids - set(rows)]
    doomed = set(produced.cancel_asked)
    for chain in produced.chains:  # a cancelled step cancels the steps after it
        for index, job_id in enumerate(chain):
            if job_id in produced.cancel_asked or (index and chain[index - 1] in doomed):
                doomed.add(job_id)
    for row in rows.values():
        at = row.finished or row.enqueued
        if row.state not in FINAL:
            found.append(Violation("not terminal", row.id, f"{row.kind} {row.state}", at))
        elif row.state == "failed":
            found.append(Violation("failed", row.id, f"{row.kind}: {row.last_error[:300]}", at))
        elif row.state == "cancelled":
            folded = row.last_error.startswith("merged into job #")
            if row.id not in doomed and not folded:
                detail = f"{row.kind}: {row.last_error[:200]}"
                found.append(Violation("cancelled unasked", row.id, detail, at))
    return found


def check_atomic(rows: dict[int, Row], written: collections.Counter[int]) -> list[Violation]:
    found = []
    for row in rows.values():
        if row.kind != "chaos.atomic":
            continue
        expected = 1 if row.state == "completed" else 0
        if written[row.id] != expected:
            detail = f"{row.state}, {written[row.id]} effect rows (expected {expected})"
            found.append(Violation("atomic effect", row.id, detail, row.finished))
    for job_id in set(written) - set(rows):
        found.append(Violation("atomic effect", job_id, "effect rows of no job", None))
    return found


def check_journal(row: Row, entries: list[Entry], ran: list[tuple[int, float]]) -> list[Violation]:
    found = []

    def add(invariant: str, detail: str, at: float | None) -> None:
        summary = ", ".join(f"{e.attempt}:{e.outcome}" for e in entries)
        found.append(
            Violation(
                invariant, row.id, f"{row.kind} {row.state}: {detail}; journal [{summary}]", at
            )
        )

    closing: dict[int, list[Entry]] = collections.defaultdict(list)
    for entry in entries:
        if entry.outcome != "discarded" and entry.attempt > 0:
            closing[entry.attempt].append(entry)
    completions = [e for e in entries if e.outcome == "completed"]
    if len(completions) != (1 if row.state == "completed" else 0):
        add("journal vs state", f"{len(completions)} completed entries", row.finished)
    if row.state in FINAL and set(closing) != set(range(1, row.attempt + 1)):
        missing = sorted(set(range(1, row.attempt + 1)) - set(closing))
        add("journal vs state", f"claims {missing} not closed", row.finished)
    for attempt, closed in closing.items():
        if len(closed) > 1:
            add(
                "duplicate verdict",
                f"attempt {attempt} closed {len(closed)} times",
                closed[1].finished,
            )
    for attempt, times in collections.Counter(a for a, _ in ran).items():
        if times > 1:
            add("duplicate verdict", f"attempt {attempt} ran its handler {times} times", None)
    for entry in entries:
        if entry.error_type == UNWRITABLE:
            add("verdict not written", f"attempt {entry.attempt} {entry.outcome}", entry.finished)
        if entry.outcome != "discarded":
            continue
        closed = closing.get(entry.attempt, [])
        if not any(e.outcome == "lease_expired" or e.error_type == LOST_CLAIM for e in closed):
            closed_as = sorted(f"{e.outcome} by {e.worker}" for e in closed)
            detail = f"attempt {entry.attempt} discarded by {entry.worker}, closed as {closed_as}"
            add("discarded applied verdict", detail, entry.finished)
    if completions:
        attempt = completions[0].attempt
        if attempt not in {a for a, _ in ran}:
            add("completed without a run", f"attempt {attempt} never ran", completions[0].finished)
    return found


def check_chains(
    rows: dict[int, Row],
    journal: dict[int, list[Entry]],
    runs: dict[int, list[tuple[int, float]]],
    produced: Produced,
) -> list[Violation]:
    found = []
    for chain in produced.chains:
        for before, after in itertools.pairwise(chain):
            started = [at for _, at in runs.get(after, [])]
            if not started:
                continue
            done = [e.finished for e in journal.get(before, []) if e.outcome == "completed"]
            first = min(started)
            if not done or first < done[0]:
                state = rows[before].state if before in rows else "missing"
                detail = f"step ran at {first:.3f} before job {before} completed ({state})"
                found.append(Violation("workflow order", after, detail, first))
    return found


def check_keys(rows: dict[int, Row], produced: Produced) -> list[Violation]:
    counted: collections.Counter[str] = collections.Counter()
    unfinished: collections.Counter[str] = collections.Counter()
    for row in rows.values():
        if row.kind == "chaos.keyed" and row.state == "completed":
            counted[row.payload["key"]] += row.payload["count"]
        elif row.kind == "chaos.keyed" and row.state not in FINAL:
            unfinished[row.payload["key"]] += 1
    found = []
    for key, enqueues in sorted(produced.keyed.items()):
        if key not in produced.uncertain_keys and counted[key] != enqueues:
            detail = f"key {key}: {enqueues} enqueues, {counted[key]} counted by completed jobs"
            if unfinished[key]:
                detail += f" ({unfinished[key]} of its jobs not finished)"
            found.append(Violation("keyed count", None, detail, None))
    return found


def silent_workers(pids: set[int], older_than: float) -> list[Violation]:
    """Live workers (by pid) whose registry heartbeat is older than `older_than` s."""
    from django.db.models.functions import Now

    from django_venturi.models import WorkerProcess

    rows = WorkerProcess.objects.filter(
        pid__in=pids,
        stopped_at__isnull=True,
        heartbeat_at__lt=Now() - timedelta(seconds=older_than),
    ).values_list("name", "heartbeat_at")
    return [
        Violation("worker silent", None, f"{name}: last heartbeat {beat:%H:%M:%S}", stamp(beat))
        for name, beat in rows
    ]
