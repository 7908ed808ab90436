"""The worker registry with real worker processes: rows, heartbeats, stop, SIGKILL, pruning."""

from __future__ import annotations

import signal
import subprocess
import sys
from datetime import timedelta

import pytest
from django.utils import timezone

import django_venturi as venturi
from django_venturi.models import WorkerProcess
from tests.conftest import Workers, wait_until, worker_env
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])


def live_row(alias: str, pid: int) -> WorkerProcess | None:
    return WorkerProcess.objects.using(alias).filter(pid=pid, stopped_at__isnull=True).first()


def test_a_worker_registers_beats_and_says_when_it_stops(alias: str, workers: Workers) -> None:
    process = workers.start(alias, "--concurrency", "3", "--queues", "default")
    row = wait_until(lambda: live_row(alias, process.pid), message="the worker's row")
    assert row.concurrency == 3 and row.queues == ["default"] and row.host
    tasks.Noop(n=1).enqueue(using=alias)
    # The heartbeat (a third of the shortest test lease, under a second) moves the row on.
    beaten = wait_until(
        lambda: (
            WorkerProcess.objects.using(alias)
            .filter(pk=row.pk, heartbeat_at__gt=row.heartbeat_at, processed__gte=1)
            .first()
        ),
        message="a heartbeat counting the processed job",
    )
    snapshot = venturi.stats(using=alias)
    assert [worker.name for worker in snapshot.workers] == [row.name]
    assert not snapshot.workers[0].stale and snapshot.workers[0].processed >= 1
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0
    stopped = WorkerProcess.objects.using(alias).get(pk=row.pk)
    assert stopped.stopped_at is not None and stopped.running == 0
    assert stopped.processed >= beaten.processed
    assert venturi.stats(using=alias).workers == []


def test_a_sigkilled_worker_shows_as_stale(alias: str, workers: Workers) -> None:
    killed = workers.start(alias)
    alive = workers.start(alias)
    wait_until(lambda: live_row(alias, killed.pid) and live_row(alias, alive.pid))
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=10)

    def stale_names() -> set[str] | None:
        snapshot = venturi.stats(using=alias, stale_after=timedelta(seconds=2))
        stale = {worker.name for worker in snapshot.stale_workers}
        return stale or None

    stale = wait_until(stale_names, message="the killed worker marked stale")
    dead_row = WorkerProcess.objects.using(alias).get(pid=killed.pid)
    assert stale == {dead_row.name}  # the live worker keeps beating
    assert dead_row.stopped_at is None


def test_cleanup_prunes_rows_of_long_stopped_or_silent_workers(alias: str) -> None:
    long_ago = timezone.now() - timedelta(days=10)
    rows = WorkerProcess.objects.using(alias)
    rows.create(name="old-stopped", host="h", pid=1, concurrency=1, stopped_at=long_ago)
    rows.create(name="old-silent", host="h", pid=2, concurrency=1, heartbeat_at=long_ago)
    rows.create(name="recent-stopped", host="h", pid=3, concurrency=1, stopped_at=timezone.now())
    rows.create(name="alive", host="h", pid=4, concurrency=1)
    result = venturi.cleanup(older_than=timedelta(days=7), using=alias)
    assert result.workers == 2
    assert set(rows.values_list("name", flat=True)) == {"recent-stopped", "alive"}


def test_check_workers_passes_with_a_live_worker_and_fails_after_a_kill(
    alias: str, workers: Workers
) -> None:
    def check(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "django", "venturi_stats", "--database", alias, *args],
            env=worker_env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    first = check("--check-workers")
    assert first.returncode == 1 and "no worker with a fresh heartbeat" in first.stderr
    process = workers.start(alias)
    wait_until(lambda: live_row(alias, process.pid))
    alive = check("--check-workers", "--stale-after", "5")
    assert alive.returncode == 0, alive.stderr
    assert alive.stdout.startswith("ok: 1 live worker(s) on ")
    assert check("--check-workers", "--host", "elsewhere").returncode == 1
    report = check()
    assert f"(pid {process.pid})" in report.stdout
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=10)
    dead = wait_until(
        lambda: (
            (result := check("--check-workers", "--stale-after", "1")).returncode == 1 and result
        ),
        message="the check failing once the killed worker's heartbeat is old",
    )
    assert "stale: " in dead.stderr
