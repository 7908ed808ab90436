"""The chaos soak: producers and workers under injected faults, then the invariants.

    python benchmarks/chaos.py --minutes 2            # what CI runs
    python benchmarks/chaos.py --minutes 30 --seed 7  # replay a schedule

Needs root and Debian's postgresql-common: the soak makes a private PostgreSQL
cluster (tests/clusters.py, named by VENTURI_TEST_RUN) and a throwaway database in
it, and never touches the shared server. Four `venturi_worker` processes reach it
through a TCP proxy (tests/tcp_proxy.py) while a producer enqueues a steady mix of
plain, atomic, keyed, workflow, rate-limited, capped and slow jobs, and the fault
schedule (benchmarks/chaos_faults.py; random, its seed printed) kills, freezes
and restarts things, makes the server read-only, cuts and blackholes the network,
pauses kinds and cancels jobs. Then the faults stop, the backlog drains, the
workers are stopped with SIGTERM, and the invariants (benchmarks/chaos_checks.py)
are checked by SQL. The table lists faults by type, jobs by state and violations by
invariant, each with its job and the faults injected just before it. Exits 1 on
any violation, 2 when the soak cannot run here.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.chaos_faults import FAULTS  # noqa: E402

DATABASE = "venturi_chaos"
SETTINGS = "benchmarks.bench_project.chaos_settings"
TICK = 0.1
SAMPLE_EVERY = 2.0
"""Seconds between two looks at whether the backlog is drained."""
DRAIN_TIMEOUT = 180.0
STOP_TIMEOUT = 45.0
"""SIGTERM to exit: the workers' SHUTDOWN_TIMEOUT (30 s) and some."""
SETTLE = 40.0
"""Seconds after the faults end before live workers must have beaten recently."""
SILENT_AFTER = 30.0
"""A live worker whose last heartbeat is older than this is stuck (3 heartbeat intervals)."""
BEFORE, AFTER = 15.0, 2.0
"""Faults listed beside a violation: those from BEFORE s before its moment to AFTER s after."""


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=2.0, help="minutes of faults (2)")
    parser.add_argument("--seed", type=int, default=None, help="replay a fault schedule")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--rate", type=float, default=20.0, help="jobs enqueued a second")
    parser.add_argument("--keep", action="store_true", help="keep the worker logs' folder")
    parser.add_argument(
        "--skip",
        default="",
        help=f"faults not to inject, comma-separated (of {', '.join(FAULTS)})",
    )
    args = parser.parse_args(argv)
    if args.minutes <= 0:
        parser.error("--minutes must be positive")
    args.skip = frozenset(name.strip() for name in args.skip.split(",") if name.strip())
    if unknown := args.skip - set(FAULTS):
        parser.error(f"--skip: unknown faults {', '.join(sorted(unknown))}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    # SIGTERM (a CI timeout, a test's) unwinds like an exception: workers and cluster go.
    signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(128 + number))
    from tests import clusters
    from tests.tcp_proxy import TcpProxy

    reason = clusters.available()
    if reason is not None:
        print(f"chaos: {reason}", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    skipped = f", skipping {', '.join(sorted(args.skip))}" if args.skip else ""
    print(f"chaos: seed {seed}, {args.minutes:g} min, {args.workers} workers{skipped}", flush=True)
    folder = Path(tempfile.mkdtemp(prefix="venturi-chaos-"))
    with clusters.private_cluster("chaos") as cluster, TcpProxy(cluster_address(cluster)) as proxy:
        cluster.create_database(DATABASE)
        violations = soak(cluster, proxy, folder, args, seed)
    if args.keep or violations:
        print(f"chaos: worker logs and runs file in {folder}; replay with --seed {seed}")
    else:
        shutil.rmtree(folder, ignore_errors=True)
    return 1 if violations else 0


def cluster_address(cluster: Any) -> tuple[str, int]:
    return ("127.0.0.1", cluster.port)


def setup_django(port: int) -> None:
    """This process talks to the server directly (it must know what it enqueued)."""
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": SETTINGS,
            "VENTURI_BENCH_DB": DATABASE,
            "VENTURI_BENCH_HOST": "127.0.0.1",
            "VENTURI_BENCH_PORT": str(port),
        }
    )
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def worker_env(proxy_port: int, runs: Path) -> dict[str, str]:
    """The workers reach the server only through the proxy."""
    from benchmarks.bench_project.benchapp.chaos_tasks import RUNS_ENV

    env = dict(os.environ)
    env.update(
        {
            "VENTURI_BENCH_PORT": str(proxy_port),
            "PYTHONPATH": str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
            "PYTHONUNBUFFERED": "1",
            RUNS_ENV: str(runs),
        }
    )
    return env


def soak(cluster: Any, proxy: Any, folder: Path, args: argparse.Namespace, seed: int) -> list[Any]:
    """Run the soak; print the table; the violations. The faults and the producer draw
    from generators of their own: the schedule a seed gives does not depend on the mix."""
    setup_django(cluster.port)
    from benchmarks import chaos_checks as checks
    from benchmarks.chaos_faults import Injector
    from benchmarks.chaos_fleet import Fleet
    from benchmarks.chaos_producer import Producer
    from benchmarks.chaos_watch import Watch

    runs = folder / "runs.log"
    fleet = Fleet(folder, worker_env(proxy.port, runs), args.workers, args.concurrency)
    producer = Producer(args.rate, random.Random(seed + 1))
    injector = Injector(cluster, proxy, fleet, producer, random.Random(seed), args.skip)
    violations: list[checks.Violation] = []
    watch = Watch(runs)
    drained = False
    try:
        loop(fleet, injector, args.minutes * 60, watch, producer=producer)
        drained = drain(fleet, injector, watch)
        violations += settle(fleet, injector, watch)
        violations += stop(fleet)
    finally:
        try:
            injector.stop()
        finally:
            fleet.kill_all()  # whatever happened: no worker outlives the soak
    violations += watch.violations()
    violations += worker_exits(fleet)
    violations += checks.check_end_state(producer.produced, runs, violations, injector.origin)
    report(injector, fleet, producer, violations, drained)
    return violations


def loop(
    fleet: Any,
    injector: Any,
    seconds: float,
    watch: Any,
    producer: Any = None,
    until: Any = None,
) -> None:
    """The soak's one loop: every TICK, produce (if a producer is given), supervise the
    workers, inject faults (while producing) and let `watch` sample; ends after `seconds`
    or, looked at every SAMPLE_EVERY s, when `until()` is true."""
    from django.db import DatabaseError, connections

    begun = last = time.monotonic()
    next_look = begun + SAMPLE_EVERY
    while (now := time.monotonic()) < begun + seconds:
        if producer is not None:
            producer.tick(now - last)
            injector.tick()
        last = now
        fleet.supervise(now)
        watch.sample(injector, fleet)
        if until is not None and now >= next_look:
            next_look = now + SAMPLE_EVERY
            try:
                if until():
                    break
            except DatabaseError:
                connections.close_all()
        time.sleep(TICK)


def drain(fleet: Any, injector: Any, watch: Any) -> bool:
    """End the faults and wait until every job is finished (or DRAIN_TIMEOUT)."""
    from django_venturi.models import Job

    injector.stop()
    print("chaos: faults over, draining", flush=True)

    def drained() -> bool:
        return not Job.objects.filter(state__in=["waiting", "ready", "running"]).exists()

    loop(fleet, injector, DRAIN_TIMEOUT, watch, until=drained)
    return drained()


def settle(fleet: Any, injector: Any, watch: Any) -> list[Any]:
    """Give every worker SETTLE s after the faults to beat again, then list the silent ones:
    a worker stuck on a connection nobody answers (a dead NAT) must notice and exit."""
    from benchmarks import chaos_checks as checks

    left = SETTLE - (time.time() - injector.faults_over)
    if left > 0:
        loop(fleet, injector, left, watch)
    live = {process.pid for process in fleet.live()}
    return checks.silent_workers(live, older_than=SILENT_AFTER)


def stop(fleet: Any) -> list[Any]:
    """SIGTERM the workers: each must exit 0 in time."""
    from benchmarks.chaos_checks import Violation

    found = []
    for pid, code in fleet.terminate(STOP_TIMEOUT):
        if code is None:
            found.append(Violation("worker ignored SIGTERM", None, f"pid {pid}", time.time()))
        elif code != 0:
            found.append(Violation("worker failed at shutdown", None, f"pid {pid}: {code}", None))
    return found


def worker_exits(fleet: Any) -> list[Any]:
    """A worker may die of a fault (non-zero: its supervisor restarts it), never exit 0
    unasked: that is a worker that gave up and says all is well."""
    from benchmarks.chaos_checks import Violation

    return [
        Violation("worker exited 0 unasked", None, f"pid {e.pid}", e.at)
        for e in fleet.exits
        if e.code == 0 and not e.killed
    ]


def report(injector: Any, fleet: Any, producer: Any, violations: list[Any], drained: bool) -> None:
    from django_venturi.models import Job

    states = collections.Counter(Job.objects.values_list("state", flat=True))
    faults = collections.Counter(fault.kind for fault in injector.log)
    exits = collections.Counter(
        "killed by the soak" if e.killed else f"exited {e.code} on its own" for e in fleet.exits
    )
    by_invariant = collections.Counter(v.invariant for v in violations)
    produced = producer.produced
    sections = {
        "faults injected": {**dict(sorted(faults.items())), "total": len(injector.log)},
        "jobs": {
            "enqueued (rows)": sum(states.values()),
            **{state: states[state] for state in ("completed", "failed", "cancelled")},
            "not finished": sum(states.values())
            - sum(states[s] for s in ("completed", "failed", "cancelled")),
            "cancels asked": len(produced.cancel_asked),
            "enqueue batches refused (tried again)": produced.refused,
            "drained in time": int(drained),
        },
        "worker exits": {**dict(sorted(exits.items())), "processes started": fleet.started},
        "violations": {**dict(sorted(by_invariant.items())), "total": len(violations)},
    }
    print()
    for title, figures in sections.items():
        print(f"| {title} | |\n| --- | ---: |")
        for name, value in figures.items():
            print(f"| {name} | {value} |")
        print()
    print_violations(injector, violations)
    print(f"chaos: {'OK' if not violations else 'VIOLATIONS'}", flush=True)


def print_violations(injector: Any, violations: list[Any], most: int = 20) -> None:
    """Each violation (`most` of each invariant), then the faults around it: once for a
    run of violations that have the same ones."""
    shown: collections.Counter[str] = collections.Counter()
    listed = []
    for violation in violations:
        shown[violation.invariant] += 1
        if shown[violation.invariant] <= most:
            listed.append((violation, nearby(injector, violation.at)))
    for near, group in itertools.groupby(listed, key=lambda pair: pair[1]):
        for violation, _ in group:
            job = f"job {violation.job}: " if violation.job is not None else ""
            print(f"VIOLATION {violation.invariant}: {job}{violation.detail}")
        print("\n".join(near))
    for invariant, count in shown.items():
        if count > most:
            print(f"... {count - most} more {invariant}")


def nearby(injector: Any, at: float | None) -> list[str]:
    """The faults from BEFORE s before `at` to AFTER s after, as lines."""
    if at is None:
        return []
    lines = [f"    faults from {at - injector.origin - BEFORE:.1f}s:"]
    for fault in injector.log:
        if fault.at <= at + AFTER and (fault.ended or fault.at) >= at - BEFORE:
            lines.append(f"    {fault.line(injector.origin)}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
