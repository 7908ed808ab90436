"""Scheduling with real workers: priority tiers, concurrency caps, wake-ups, delays."""

from __future__ import annotations

import json
import signal
import time
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

import django_venturi as venturi
from django_venturi.models import Job
from tests.conftest import Workers, wait_until
from tests.testapp.models import Record
from tests.testapp.scheduling_tasks import Capped, Stamped, Uncapped
from tests.testapp.tasks import Noop

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])


def all_done(alias: str) -> bool:
    return not Job.objects.using(alias).exclude(state=venturi.State.COMPLETED).exists()


def test_low_priority_is_not_starved_by_a_flood_of_high(alias: str, workers: Workers) -> None:
    venturi.enqueue_many(
        [Noop(n=i) for i in range(300)], priority=venturi.Priority.HIGH, using=alias
    )
    venturi.enqueue_many(
        [Noop(n=1000 + i) for i in range(30)], priority=venturi.Priority.LOW, using=alias
    )
    workers.burst(alias, "--concurrency", "1")
    order = list(Record.objects.using(alias).order_by("id").values_list("value", flat=True))
    assert len(order) == 330
    first_low = next(i for i, n in enumerate(order) if n >= 1000)
    assert order[0] < 1000  # HIGH runs first
    assert first_low < 20  # ~1 in 7 claims goes to LOW while HIGH has work
    high_done = max(i for i, n in enumerate(order) if n < 1000)
    assert sum(1 for n in order[:high_done] if n >= 1000) >= 25  # LOW flowed all along


def overlap(intervals: list[tuple[float, float]]) -> int:
    """The largest number of intervals open at one instant."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    open_now = peak = 0
    for _, change in events:
        open_now += change
        peak = max(peak, open_now)
    return peak


def intervals(alias: str, kind: str) -> list[tuple[float, float]]:
    values: list[dict[str, Any]] = list(
        Record.objects.using(alias).filter(kind=kind).values_list("value", flat=True)
    )
    return [(value["start"], value["end"]) for value in values]


def test_a_global_cap_holds_across_worker_processes(alias: str, workers: Workers) -> None:
    venturi.enqueue_many([Capped(seconds=0.15) for _ in range(24)], using=alias)
    venturi.enqueue_many([Uncapped(seconds=0.02) for _ in range(60)], using=alias)
    processes = [workers.start(alias, "--concurrency", "4") for _ in range(3)]
    wait_until(lambda: all_done(alias), timeout=60, message="every job to complete")
    for process in processes:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    capped = intervals(alias, "capped")
    assert len(capped) == 24
    assert overlap(capped) == 2  # never more than the cap, and the cap is used
    # Other kinds ran while capped jobs were running: they were not held back.
    first, last = min(s for s, _ in capped), max(e for _, e in capped)
    uncapped = intervals(alias, "uncapped")
    assert sum(1 for start, _ in uncapped if first < start < last) >= 10


def test_a_local_cap_limits_one_worker(alias: str, workers: Workers) -> None:
    venturi.enqueue_many([Uncapped(seconds=0.1) for _ in range(12)], using=alias)
    workers.burst(alias, "--concurrency", "6", "--kind-concurrency", "tests.uncapped=1")
    assert overlap(intervals(alias, "uncapped")) == 1


LONG_POLL = "3600"
"""The longest poll interval: a job that starts within WAKE_DEADLINE was woken for."""
WAKE_DEADLINE = 30
"""Generous for a loaded machine, and two orders of magnitude short of LONG_POLL."""


def wait_for_probe(
    alias: str, workers: Workers, monkeypatch: pytest.MonkeyPatch, *args: str
) -> None:
    """Start a worker whose loop wakes for nothing but a notification and its poll (the
    test settings' half-second recovery sweep would wake it too, and claim); wait until
    it has run a probe job and written its verdict."""
    chores = {"RESCUE_INTERVAL": int(LONG_POLL), "PERIODIC_INTERVAL": int(LONG_POLL)}
    monkeypatch.setenv("VENTURI_TEST_SETTINGS", json.dumps(chores))
    probe = Noop(n=-1).enqueue(using=alias)
    workers.start(alias, *args)
    wait_until(
        lambda: Job.objects.using(alias).get(pk=probe.pk).state == venturi.State.COMPLETED,
        message="the worker to be ready",
    )


@pytest.mark.django_db(transaction=True)
def test_an_idle_worker_is_woken_by_each_commit_not_by_its_poll(
    workers: Workers, monkeypatch: pytest.MonkeyPatch
) -> None:
    wait_for_probe("default", workers, monkeypatch, "--poll-interval", LONG_POLL)
    latencies = []
    for i in range(40):
        committed = time.time()
        job = Stamped(label=str(i)).enqueue()
        record = wait_until(
            lambda job=job: Record.objects.filter(job_id=job.pk).first(),
            timeout=WAKE_DEADLINE,
            message=f"job {i} to start (an hour's poll away, were it not woken)",
        )
        latencies.append(record.value["t"] - committed)
        # The next commit finds the worker done with this job, most often idle again.
        wait_until(
            lambda job=job: Job.objects.get(pk=job.pk).state == venturi.State.COMPLETED,
            message=f"job {i} to complete",
        )
    # How fast is benchmarks/latency.py's question (W3); printed for the curious only.
    print(f"wake latency over 40 jobs: median {sorted(latencies)[20] * 1000:.1f} ms")


def test_a_delayed_job_runs_on_time_not_early(
    alias: str, workers: Workers, monkeypatch: pytest.MonkeyPatch
) -> None:
    # PostgreSQL: the enqueue's NOTIFY tells the idle worker when to wake, whatever the
    # poll interval. SQLite has no notifications: the worker learns of it at its next poll.
    poll = LONG_POLL if alias == "default" else "0.5"
    wait_for_probe(alias, workers, monkeypatch, "--poll-interval", poll)
    job = Stamped(label="later").enqueue(delay=timedelta(seconds=1.5), using=alias)
    job.refresh_from_db()
    record = wait_until(
        lambda: Record.objects.using(alias).filter(job_id=job.pk).first(),
        timeout=WAKE_DEADLINE + 10,
        message="the delayed job to run",
    )
    started = record.value["t"]
    due = job.run_at.timestamp()
    assert started >= due  # never early (one machine: database and worker clocks agree)
    assert started - due < WAKE_DEADLINE  # and on its due time, not at the hour's poll
    assert timezone.now() > job.run_at
