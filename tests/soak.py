"""The chaos soak: mixed jobs, workers SIGKILLed at random, one PostgreSQL restart.

    python3 -m tests.soak                      # 10,000 jobs over five minutes
    python3 -m tests.soak --duration 60 --jobs 2000   # a short run

Needs root and Debian's postgresql-common (a private cluster, never the shared
server). Four `venturi_worker` processes run while a producer enqueues the jobs
over the run: plain jobs, jobs that pause with a carry, jobs that fail and are
retried, keyed jobs that merge, and slow jobs of which some are cancelled. Every
0.5-2 s a random worker is SIGKILLed and another started; the server is
restarted once. Then the chaos stops, the backlog drains and the workers stop.

The table at the end: jobs lost, runs unaccounted for (a handler run that no
lost claim explains: a job completed twice), jobs left running (each must be 0),
and totals. Exits 1 if a must-be-0 figure is not 0.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KEYS = 50
"""Keys of the keyed (merging) jobs."""
DRAIN_TIMEOUT = 180.0


@dataclass
class Plan:
    """What the producer did, to check the end state against."""

    path: str
    ids: set[int] = field(default_factory=set)
    slow: list[int] = field(default_factory=list)
    cancel_asked: set[int] = field(default_factory=set)
    tally_enqueues: collections.Counter[str] = field(default_factory=collections.Counter)
    kills: int = 0
    restarts: int = 0
    enqueued: int = 0


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=300, help="seconds of chaos")
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs enqueued over the run")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the worker logs' folder")
    return parser.parse_args()


def main() -> int:
    args = parse()
    from tests import clusters

    reason = clusters.available()
    if reason is not None:
        print(f"soak: {reason}", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    print(f"soak: seed {seed}, {args.jobs} jobs, {args.duration:.0f} s", flush=True)
    folder = Path(tempfile.mkdtemp(prefix="venturi-soak-"))
    with clusters.private_cluster("soak") as cluster:
        failed = soak(cluster, folder, args, random.Random(seed))
    print(f"soak: worker logs in {folder}" if args.keep or failed else "", flush=True)
    if not (args.keep or failed):
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
    return 1 if failed else 0


def soak(cluster: Any, folder: Path, args: argparse.Namespace, rng: random.Random) -> bool:
    """Run the soak on `cluster`; True if a must-be-0 figure is not 0."""
    DATABASE = "venturi"  # tests.cluster_workers.DATABASE, importable only after setup
    cluster.create_database(DATABASE)
    os.environ.pop("VENTURI_TEST_DATABASE_NAMES", None)
    os.environ["DATABASE_URL"] = cluster.url(DATABASE)
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    import django

    django.setup()
    from django.core.management import call_command

    from tests.cluster_workers import WorkerPool, environment

    call_command("migrate", verbosity=0)
    plan = Plan(path=str(folder / "runs.log"))
    pool = WorkerPool(
        folder, environment(cluster.url(DATABASE)), "--concurrency", str(args.concurrency)
    )
    pool.start(args.workers)
    try:
        chaos(cluster, pool, plan, args, rng)
        drained = drain(pool, plan)
        codes = pool.stop(timeout=60)
    finally:
        pool.kill_all()
    figures = report(plan, pool, drained, codes)
    return any(figures[name] for name in MUST_BE_ZERO)


def chaos(
    cluster: Any, pool: Any, plan: Plan, args: argparse.Namespace, rng: random.Random
) -> None:
    """Enqueue the jobs over the run, kill workers, restart the server once."""
    from django.db import connections

    begun = time.monotonic()
    end = begun + args.duration
    restart_at = begun + args.duration * rng.uniform(0.3, 0.6)
    next_kill = begun + rng.uniform(0.5, 2.0)
    while (now := time.monotonic()) < end:
        due = min(args.jobs, int(args.jobs * (now - begun) / (args.duration * 0.8)) + 1)
        if due > plan.enqueued:
            produce(plan, due - plan.enqueued, rng)
        if now >= next_kill:
            pool.kill(rng.randrange(len(pool.slots)))
            plan.kills += 1
            next_kill = now + rng.uniform(0.5, 2.0)
        if plan.restarts == 0 and now >= restart_at:
            print(f"soak: restarting PostgreSQL at {now - begun:.0f} s", flush=True)
            cluster.restart()
            connections.close_all()
            plan.restarts += 1
        if exited := pool.exited():
            raise SystemExit(f"soak: a worker exited on its own: {exited}\n{pool.logs()[-5000:]}")
        time.sleep(0.1)
    if plan.enqueued < args.jobs:
        produce(plan, args.jobs - plan.enqueued, rng)
    print(f"soak: chaos over: {plan.kills} kills, {plan.restarts} restart", flush=True)


def produce(plan: Plan, count: int, rng: random.Random) -> None:
    """Enqueue `count` jobs of mixed kinds; ask some slow ones to be cancelled."""
    import django_venturi as venturi
    from tests.testapp.soak_tasks import Flaky, Journalled, Slow, Steps, Tally

    batch: list[venturi.Task] = []
    slow: list[int] = []
    for _ in range(count):
        pick = rng.random()
        if pick < 0.15:
            key = f"k{rng.randrange(KEYS)}"
            job = Tally(path=plan.path, key=key).enqueue()
            plan.tally_enqueues[key] += 1
            plan.ids.add(job.pk)
        elif pick < 0.30:
            batch.append(Steps(path=plan.path, steps=rng.randint(2, 4)))
        elif pick < 0.45:
            batch.append(Flaky(path=plan.path, failures=rng.randint(1, 3)))
        elif pick < 0.55:
            slow.append(len(batch))
            batch.append(Slow(path=plan.path, seconds=rng.uniform(0.2, 1.0)))
        else:
            batch.append(Journalled(path=plan.path, sleep=0.01))
    jobs = venturi.enqueue_many(batch)
    plan.ids.update(job.pk for job in jobs)
    plan.enqueued += count
    # Cancel about a third of the slow jobs, chosen among all so far: some are still
    # waiting, some running (their handler sees should_stop), some already done.
    plan.slow.extend(jobs[index].pk for index in slow)
    asked = [job_id for job_id in plan.slow if rng.random() < 0.33 / 10]
    if asked:
        venturi.cancel(asked)
        plan.cancel_asked.update(asked)


def drain(pool: Any, plan: Plan) -> bool:
    """Wait until no job is ready or running (no more kills); False at the deadline."""
    import django_venturi as venturi
    from django_venturi.models import Job

    deadline = time.monotonic() + DRAIN_TIMEOUT
    live = [venturi.State.READY, venturi.State.RUNNING]
    while time.monotonic() < deadline:
        # Done, and the workers started last are up (SIGTERM before that would kill them).
        if not Job.objects.filter(state__in=live).exists() and pool.started():
            return True
        if exited := pool.exited():
            print(f"soak: a worker exited on its own while draining: {exited}", flush=True)
        time.sleep(0.25)
    return False


MUST_BE_ZERO = ("jobs lost", "runs unaccounted for (completed twice)", "jobs left running")


def report(plan: Plan, pool: Any, drained: bool, codes: list[int | None]) -> dict[str, int]:
    """Check the end state; print the table; return its figures."""
    from django_venturi.models import Job, JournalEntry

    rows = {row.pk: row for row in Job.objects.all()}
    entries: dict[int, list[tuple[int, str]]] = collections.defaultdict(list)
    for job_id, attempt, outcome in JournalEntry.objects.order_by("id").values_list(
        "job_id", "attempt", "outcome"
    ):
        entries[job_id].append((attempt, outcome))
    runs: dict[int, list[int]] = collections.defaultdict(list)
    for line in Path(plan.path).read_text().splitlines():
        job_id, attempt, _pid = (int(part) for part in line.split())
        runs[job_id].append(attempt)

    problems: dict[str, list[str]] = collections.defaultdict(list)
    every = set(rows) | plan.ids  # follow-ups of keyed jobs are rows the producer never saw
    for job_id in sorted(every):
        row = rows.get(job_id)
        if row is None:
            problems["jobs lost"].append(f"job {job_id}: no row")
            continue
        # A keyed follow-up folded into its job when that job went back to ready ends
        # `cancelled`, naming the survivor; its count went into the survivor's payload.
        folded = row.state == "cancelled" and row.last_error.startswith("merged into job #")
        asked = job_id in plan.cancel_asked or folded
        expected = {"completed", "cancelled"} if asked else {"completed"}
        if row.state == "running":
            problems["jobs left running"].append(f"job {job_id} by {row.claimed_by}")
        elif row.state not in expected:
            problems["jobs lost"].append(f"job {job_id} ({row.kind}): {row.state}")
        problems["runs unaccounted for (completed twice)"].extend(
            unaccounted(job_id, entries[job_id], runs[job_id])
        )
    tallies: collections.Counter[str] = collections.Counter()
    for row in rows.values():
        if row.kind == "soak.tally" and row.state == "completed":
            tallies[row.payload["key"]] += row.payload["count"]
    for key, enqueues in sorted(plan.tally_enqueues.items()):
        if tallies[key] != enqueues:
            problems["jobs lost"].append(f"key {key}: {enqueues} enqueues, {tallies[key]} counted")

    outcomes = collections.Counter(o for job in entries.values() for _, o in job)
    states = collections.Counter(row.state for row in rows.values())
    figures = {name: len(problems[name]) for name in MUST_BE_ZERO}
    totals = {
        "jobs enqueued (rows)": len(rows),
        "keyed follow-ups folded back": sum(
            1 for row in rows.values() if row.last_error.startswith("merged into job #")
        ),
        "keyed enqueues merged into other jobs": sum(plan.tally_enqueues.values())
        - sum(1 for row in rows.values() if row.kind == "soak.tally"),
        **{f"jobs {state}": count for state, count in sorted(states.items())},
        "handler runs": sum(len(r) for r in runs.values()),
        **{f"journal: {outcome}": count for outcome, count in sorted(outcomes.items())},
        "workers SIGKILLed": plan.kills,
        "PostgreSQL restarts": plan.restarts,
        "worker exit codes at the end": 0 if all(code == 0 for code in codes) else 1,
        "drained before the deadline": int(drained),
    }
    width = max(len(name) for name in [*figures, *totals]) + 2
    print("\n" + "-" * (width + 10))
    for name, value in figures.items():
        print(f"{name:<{width}}{value:>8}  {'ok' if value == 0 else 'FAIL'}")
    print("-" * (width + 10))
    for name, value in totals.items():
        print(f"{name:<{width}}{value:>8}")
    print("-" * (width + 10), flush=True)
    for name in MUST_BE_ZERO:
        for line in problems[name][:20]:
            print(f"{name}: {line}")
    if codes and not all(code == 0 for code in codes):
        print(f"worker exit codes at the end: {codes}")
    return figures


def unaccounted(job_id: int, entries: list[tuple[int, str]], ran: list[int]) -> list[str]:
    """The runs of a job that no claim accounts for, and completions beyond the first."""
    closing = {attempt: outcome for attempt, outcome in entries if outcome != "discarded"}
    problems = []
    if list(closing.values()).count("completed") > 1:
        problems.append(f"job {job_id}: completed twice: {entries}")
    for attempt, times in collections.Counter(ran).items():
        if times > 1:
            problems.append(f"job {job_id}: attempt {attempt} ran {times} times: {entries}")
        if attempt not in closing:
            problems.append(f"job {job_id}: attempt {attempt} ran, no entry closes it: {entries}")
    return problems


if __name__ == "__main__":
    sys.exit(main())
