"""Concurrent producers and the wake-up NOTIFY: what does waking workers cost an enqueue?

    python benchmarks/producers.py                  # 5 alternating rounds (~2 min)
    python benchmarks/producers.py --rounds 1 --seconds 2 --producers 4

PostgreSQL takes one database-wide lock at the commit of every transaction that sent a
NOTIFY, and flushes that commit's WAL record while holding it. Each round starts
`--producers` (16) processes with Django set up and a connection open, and one idle
`venturi_worker` listening (serving another queue, so it drains nothing). Then every
producer runs each variant for `--seconds` (3), all at once, one job per transaction
(autocommit), in an order that alternates from round to round:

  insert    the job's INSERT alone, the statement venturi sends, with no NOTIFY;
  notify    the same INSERT with `pg_notify` in it: what `enqueue()` sent before issue 36;
  enqueue_silent  `SinkJob(i=i).enqueue()` with the wake-up switched off: venturi's
            own INSERTs without any NOTIFY (the target's reference);
  enqueue   `SinkJob(i=i).enqueue()`, the code of this checkout (since issue 36: no
            worker of the queue waits, so nothing is notified);
  enqueue_waiting  the same with a worker of the queue marked waiting all along: each
            enqueue NOTIFYs after its commit (the design's worst case).

It prints, per variant, the median over the rounds of the jobs per second of all
producers together, its ratios to `insert` and to `enqueue_silent` (the target:
`enqueue` at 0.80 or more of the same INSERTs without any NOTIFY), and
the CPU time per job of the producer processes and of the PostgreSQL backends of the
benchmark's database (read from /proc: steadier than rates on a shared machine).

Then the wake-up: one `venturi_worker` serving the queue, idle, and one producer
enqueueing `--wakes` (40) jobs 100 ms apart; the latency of a job is the handler's
start (its own clock) minus the time just before `enqueue()` was called (its commit
included), and minus the time it returned. It prints p50 and p95 over all rounds' jobs
(the target: p50 at 5 ms or less).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.flow_control import admin_dsn, env, fresh_database  # noqa: E402
from benchmarks.idle_fleet import live_workers  # noqa: E402
from benchmarks.sink import SinkReader  # noqa: E402

DBNAME = "venturi_bench_producers"
VARIANTS = ("insert", "notify", "enqueue_silent", "enqueue", "enqueue_waiting")
AFTER = {
    "after": "SELECT pg_notify('venturi', 'default')",
    "after_async": "SELECT set_config('synchronous_commit', 'off', true), "
    "pg_notify('venturi', 'default')",
}
"""Variants measured while choosing the design (`--variants`): the NOTIFY in a
transaction of its own right after the INSERT's commit, with a synchronous commit
and with an asynchronous one."""
GAP = 1.0
"""Seconds between two variants: the CPU readings are taken in the middle."""
WAKE_INTERVAL = 0.1
WAKE_BASE = 10_000_000
"""The `i` of the wake-up jobs, apart from the producers' (8 digits in the sink)."""
TICKS = os.sysconf("SC_CLK_TCK")
WAITING_ROW = """
    INSERT INTO django_venturi_workerprocess
        (name, host, pid, queues, kinds, concurrency, running, processed, heartbeat_grace)
    VALUES ('bench-waiting', 'bench', 0, '["default"]', NULL, 1, 0, 0, interval '0')
"""
"""A registry row that `enqueue_waiting` marks waiting: every enqueue then finds a
waiting worker of its queue and NOTIFYs after its commit (the worst case of the design:
in a real run a worker that falls behind clears its mark)."""

_INSERT = """
    WITH inserted AS (
        INSERT INTO django_venturi_job
            (kind, queue, priority, state, payload, fair_key, trace_context, attempt,
             failures, run_at, enqueued_at, claimed_by, last_error)
        VALUES (%s, %s, %s, %s, %s::jsonb, %s, %s::jsonb, 0, 0,
                coalesce(%s::timestamptz, now() + coalesce(%s::interval, interval '0')),
                now(), '', '')
        RETURNING id, queue, run_at, enqueued_at
    )
    SELECT id, run_at, enqueued_at{notify} FROM inserted
"""
"""The single-job INSERT of `enqueue.py`, and (`notify`) the NOTIFY it sent before."""


# ---------------------------------------------------------------- the producer side


def produce(variants: list[str], seconds: float) -> None:
    """A child with Django set up: say "ready", read the start time from stdin, run each
    variant from start + k x (seconds + GAP) for `seconds`, one job per transaction, and
    print {variant: [jobs, cpu seconds]} as JSON."""
    import django

    django.setup()
    from django.db import connection

    from benchmarks.bench_project.benchapp.tasks import SinkJob
    from django_venturi.store import waiting_workers

    wake = waiting_workers.wake_after_commit
    connection.ensure_connection()
    print("ready", flush=True)
    start = float(sys.stdin.readline())
    results: dict[str, list[float]] = {}
    for k, variant in enumerate(variants):
        begin = start + k * (seconds + GAP)
        time.sleep(max(0.0, begin - time.time()))
        step = _step(variant, SinkJob)
        silent = variant == "enqueue_silent"  # no wake-up at all
        waiting_workers.wake_after_commit = (lambda alias, queues: None) if silent else wake
        jobs, cpu = 0, time.process_time()
        while time.time() < begin + seconds:
            step(jobs)
            jobs += 1
        results[variant] = [jobs, time.process_time() - cpu]
    time.sleep(max(0.0, start + len(variants) * (seconds + GAP) - time.time()))
    print(json.dumps(results))


def _step(variant: str, task: Any) -> Any:
    if variant.startswith("enqueue"):
        return lambda i: task(i=i).enqueue()
    from django.db import connection

    sql = _INSERT.format(notify=", pg_notify('venturi', queue)" if variant == "notify" else "")

    def insert(i: int) -> None:
        params = ["bench.sink", "default", 2, "ready", json.dumps({"i": i}), None, None]
        with connection.cursor() as cursor:
            cursor.execute(sql, [*params, None, None])
            cursor.fetchall()
            if variant in AFTER:
                cursor.execute(AFTER[variant])

    return insert


def wake(count: int) -> None:
    """A child with Django set up: enqueue `count` jobs WAKE_INTERVAL apart; print the
    times just before each enqueue and just after it returned, as JSON."""
    import django

    django.setup()
    from django.db import connection

    from benchmarks.bench_project.benchapp.tasks import SinkJob

    connection.ensure_connection()
    times = []
    for i in range(count):
        time.sleep(WAKE_INTERVAL)
        before = time.time()
        SinkJob(i=WAKE_BASE + i).enqueue()
        times.append([before, time.time()])
    print(json.dumps(times))


# ---------------------------------------------------------------- the parent side


def backend_cpu(pids: set[int] | None = None) -> dict[int, float]:
    """CPU seconds (user + system) of the benchmark database's backends, by pid."""
    with psycopg.connect(admin_dsn(), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            [DBNAME],
        ).fetchall()
    cpu = {}
    for pid in {int(row[0]) for row in rows} | (pids or set()):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        cpu[pid] = (int(fields[11]) + int(fields[12])) / TICKS
    return cpu


def cpu_between(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(value - before.get(pid, 0.0) for pid, value in after.items())


def worker(queues: str, sink: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "django", "venturi_worker", "-v", "0", "--queues", queues]
    return subprocess.Popen([*command, "--concurrency", "4"], env=env(sink, dbname=DBNAME))


def wait_for_workers(count: int) -> None:
    deadline = time.monotonic() + 60
    while live_workers(DBNAME) < count:
        if time.monotonic() > deadline:
            raise RuntimeError("the worker did not start")
        time.sleep(0.05)
    time.sleep(1.0)  # listening and idle


def producers_round(options: argparse.Namespace, order: list[str], sink: Path) -> dict[str, Any]:
    with psycopg.connect(admin_dsn(DBNAME), autocommit=True) as conn:
        conn.execute("TRUNCATE django_venturi_job CASCADE")
        conn.execute("DELETE FROM django_venturi_workerprocess")
        conn.execute(WAITING_ROW)
    idle = worker("elsewhere", sink)
    try:
        wait_for_workers(1)
        argv = [sys.executable, __file__, "produce", ",".join(order), str(options.seconds)]
        children = [
            subprocess.Popen(
                argv,
                env=env(sink, dbname=DBNAME),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(options.producers)
        ]
        for child in children:  # every child set up and connected
            assert child.stdout is not None and child.stdout.readline() == "ready\n"
        start = time.time() + 0.5
        for child in children:
            assert child.stdin is not None
            child.stdin.write(f"{start}\n")
            child.stdin.flush()
        readings = []
        for k in range(len(order) + 1):
            time.sleep(max(0.0, start + k * (options.seconds + GAP) - GAP / 2 - time.time()))
            readings.append(backend_cpu(set(readings[-1]) if readings else None))
            if k < len(order):
                mark_waiting(order[k] == "enqueue_waiting")
        outputs = [json.loads(child.communicate(timeout=120)[0]) for child in children]
        late = [variant for output in outputs for variant, (jobs, _) in output.items() if not jobs]
        if late:
            raise RuntimeError(f"a producer ran no job of {late}")
    finally:
        idle.terminate()
        idle.wait(timeout=60)
    result = {}
    for k, variant in enumerate(order):
        jobs = sum(output[variant][0] for output in outputs)
        own = sum(output[variant][1] for output in outputs)
        result[variant] = {
            "rate": jobs / options.seconds,
            "producer_us": 1e6 * own / jobs,
            "backend_us": 1e6 * cpu_between(readings[k], readings[k + 1]) / jobs,
        }
    return result


def wake_round(options: argparse.Namespace, sink: SinkReader) -> list[tuple[float, float]]:
    serving = worker("default", Path(sink.path))
    try:
        wait_for_workers(1)
        child = subprocess.run(
            [sys.executable, __file__, "wake", str(options.wakes)],
            env=env(dbname=DBNAME),
            check=True,
            capture_output=True,
            text=True,
        )
        before = json.loads(child.stdout)
        deadline = time.monotonic() + 30
        while not all(WAKE_BASE + i in sink.times for i in range(options.wakes)):
            if time.monotonic() > deadline:
                raise RuntimeError("the wake-up jobs did not all run")
            time.sleep(0.01)
            sink.poll()
    finally:
        serving.terminate()
        serving.wait(timeout=60)
    latencies = []
    for i, (called, returned) in enumerate(before):
        started = min(sink.times.pop(WAKE_BASE + i))
        latencies.append((1000 * (started - called), 1000 * (started - returned)))
    with psycopg.connect(admin_dsn(DBNAME), autocommit=True) as conn:
        conn.execute("DELETE FROM django_venturi_workerprocess")
    return latencies


def mark_waiting(waiting: bool) -> None:
    """Show the producers a waiting worker of their queue (the registry row alone)."""
    with psycopg.connect(admin_dsn(DBNAME), autocommit=True) as conn:
        conn.execute(
            "UPDATE django_venturi_workerprocess SET waiting = %s, heartbeat_at = now() "
            "WHERE name = 'bench-waiting'",
            [waiting],
        )


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--producers", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--wakes", type=int, default=40)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    options = parser.parse_args()
    variants = options.variants.split(",")
    fresh_database(DBNAME)
    rounds: list[dict[str, Any]] = []
    latencies: list[tuple[float, float]] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            sink = SinkReader(str(Path(tmp) / "sink"))
            for number in range(options.rounds):
                order = list(variants if number % 2 == 0 else reversed(variants))
                rounds.append(producers_round(options, order, Path(sink.path)))
                latencies += wake_round(options, sink)
                shown = ", ".join(f"{v} {r['rate']:,.0f}/s" for v, r in rounds[-1].items())
                print(f"round {number + 1}: {shown}", file=sys.stderr)
    finally:
        with psycopg.connect(admin_dsn(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{DBNAME}" WITH (FORCE)')
    print_table(options, rounds, latencies)


def print_table(
    options: argparse.Namespace,
    rounds: list[dict[str, Any]],
    waits: list[tuple[float, float]],
) -> None:
    def median(variant: str, figure: str) -> float:
        return statistics.median(result[variant][figure] for result in rounds)

    print(
        f"| {options.producers} producers, one job per transaction "
        f"(median of {len(rounds)} rounds) | jobs/s | vs insert | vs enqueue_silent "
        "| producer CPU µs/job | backend CPU µs/job |"
    )
    print("|---|---:|---:|---:|---:|---:|")

    def ratio(variant: str, reference: str) -> str:
        if reference not in rounds[0]:
            return "-"
        return f"{statistics.median(r[variant]['rate'] / r[reference]['rate'] for r in rounds):.2f}"

    for variant in rounds[0]:
        print(
            f"| {variant} | {median(variant, 'rate'):,.0f} | {ratio(variant, 'insert')} "
            f"| {ratio(variant, 'enqueue_silent')} "
            f"| {median(variant, 'producer_us'):,.0f} | {median(variant, 'backend_us'):,.0f} |"
        )
    print()
    apart = f"{WAKE_INTERVAL * 1000:.0f} ms apart"
    print(f"| idle worker's wake-up ({len(waits)} jobs, {apart}) | p50 | p95 |")
    print("|---|---:|---:|")
    for index, start in enumerate(("called", "returned")):
        values = [wait[index] for wait in waits]
        p50, p95 = percentile(values, 0.5), percentile(values, 0.95)
        print(f"| enqueue() {start} to handler start | {p50:.1f} ms | {p95:.1f} ms |")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "produce":
        produce(sys.argv[2].split(","), float(sys.argv[3]))
    elif len(sys.argv) == 3 and sys.argv[1] == "wake":
        wake(int(sys.argv[2]))
    else:
        main()
