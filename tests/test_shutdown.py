"""Stopping a worker: SIGTERM drains, releases what is left, a second signal forces."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time

import pytest

import django_venturi as venturi
from django_venturi.models import Job
from django_venturi.worker.process import Worker
from tests.conftest import ROOT, Workers, wait_until, worker_env
from tests.testapp import tasks
from tests.testapp.models import Record

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])


def started(alias: str, job: Job) -> bool:
    return Record.objects.using(alias).filter(job_id=job.pk).exists()


def outcomes(alias: str, job: Job) -> list[str]:
    return list(job.journal.using(alias).order_by("id").values_list("outcome", flat=True))


def test_sigterm_lets_a_short_job_finish(alias: str, workers: Workers) -> None:
    job = tasks.Sleeper(seconds=1.0, cooperative=False).enqueue(using=alias)
    process = workers.start(alias, "--shutdown-timeout", "10")
    wait_until(lambda: started(alias, job), message="the job to start")
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=20) == 0
    job.refresh_from_db()
    assert job.state == venturi.State.COMPLETED
    assert outcomes(alias, job) == ["completed"]
    assert "stopped after 1 run\n" in workers.log()  # runs, not jobs (one job, one run here)


def test_a_cooperative_job_sees_should_stop_and_pauses(alias: str, workers: Workers) -> None:
    job = tasks.Sleeper(seconds=60, cooperative=True).enqueue(using=alias)
    process = workers.start(alias, "--shutdown-timeout", "10")
    wait_until(lambda: started(alias, job), message="the job to start")
    process.send_signal(signal.SIGTERM)
    # Out of its 60 s sleep well before the 10 s shutdown timeout would release it:
    # "paused" (not "released") is the handler's own answer to should_stop.
    assert process.wait(timeout=20) == 0
    job.refresh_from_db()
    assert job.state == venturi.State.READY
    assert outcomes(alias, job) == ["paused"]


def test_a_job_that_ignores_should_stop_is_released_at_the_timeout(
    alias: str, workers: Workers
) -> None:
    job = tasks.Sleeper(seconds=60, cooperative=False).enqueue(using=alias)
    waiting = tasks.Noop(n=1).enqueue(delay=None, using=alias)
    process = workers.start(alias, "--shutdown-timeout", "1", "--concurrency", "1")
    wait_until(lambda: started(alias, job), message="the job to start")
    begun = time.monotonic()
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=20) == 0  # not the job's 60 s
    assert time.monotonic() - begun >= 0.8  # it gave the job its shutdown timeout first
    job.refresh_from_db()
    assert job.state == venturi.State.READY
    assert outcomes(alias, job) == ["released"]
    assert job.failures == 0 and job.claim_token is None
    # With one slot, the second job was claimed into the local buffer behind the
    # first: the first signal hands it back at once, not counted as a failure.
    waiting.refresh_from_db()
    assert waiting.state == venturi.State.READY
    assert outcomes(alias, waiting) == ["released"]
    assert (waiting.attempt, waiting.failures) == (1, 0)
    assert not Record.objects.using(alias).filter(job_id=waiting.pk).exists()  # never ran


def test_a_second_sigterm_skips_the_wait(alias: str, workers: Workers) -> None:
    job = tasks.Sleeper(seconds=60, cooperative=False).enqueue(using=alias)
    process = workers.start(alias, "--shutdown-timeout", "60")
    wait_until(lambda: started(alias, job), message="the job to start")
    process.send_signal(signal.SIGTERM)
    wait_until(
        lambda: "got SIGTERM: stopping" in workers.log(),
        message="the worker to take the first SIGTERM",
    )
    assert process.poll() is None  # still waiting for the job, up to its 60 s timeout
    process.send_signal(signal.SIGTERM)
    wait_until(
        lambda: "got SIGTERM: forcing" in workers.log(),
        message="the worker to take the second SIGTERM",
    )
    assert process.wait(timeout=20) == 0  # well before the 60 s shutdown timeout
    job.refresh_from_db()
    assert job.state == venturi.State.READY
    assert outcomes(alias, job) == ["released"]


def test_a_killed_workers_job_is_recovered_after_its_lease(alias: str, workers: Workers) -> None:
    job = tasks.Sleeper(seconds=0.5, cooperative=False).enqueue(using=alias)
    doomed = workers.start(alias)
    wait_until(lambda: started(alias, job), message="the job to start")
    doomed.kill()
    doomed.wait(timeout=10)
    rescuer = workers.start(alias)
    # The lease is 3 s: the rescuer recovers the job, backs off ~1 s, runs it again.
    wait_until(
        lambda: Job.objects.using(alias).get(pk=job.pk).state == venturi.State.COMPLETED,
        timeout=30,
        message="the job to complete on the second worker",
    )
    assert outcomes(alias, job) == ["lease_expired", "completed"]
    rescuer.send_signal(signal.SIGTERM)
    assert rescuer.wait(timeout=20) == 0


def stopped_then_exited(process: subprocess.Popen[bytes], workers: Workers) -> None:
    """Wait for the worker's exit (30 s at most); it said "stopped" and exited cleanly."""
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the worker did not exit:\n{workers.log()}")
    assert process.returncode == 0, workers.log()
    assert "stopped after" in workers.log()


def test_an_idle_worker_says_it_stopped_and_exits(alias: str, workers: Workers) -> None:
    process = workers.start(alias)
    wait_until(lambda: "starting" in workers.log(), message="the worker to start")
    process.send_signal(signal.SIGTERM)
    stopped_then_exited(process, workers)
    assert "stopped after 0 runs" in workers.log()


def test_a_released_async_handler_does_not_hold_up_the_exit(alias: str, workers: Workers) -> None:
    """Its `sync_to_async` call runs in a thread the interpreter would join at exit."""
    job = tasks.AsyncBlocking(seconds=120).enqueue(using=alias)
    process = workers.start(alias, "--shutdown-timeout", "0.5")
    wait_until(lambda: started(alias, job), message="the job to start")
    process.send_signal(signal.SIGTERM)
    stopped_then_exited(process, workers)  # within 30 s: not the handler's two minutes
    job.refresh_from_db()
    assert job.state == venturi.State.READY
    assert outcomes(alias, job) == ["released"]


def test_the_stopped_line_counts_runs_not_jobs(
    alias: str, caplog: pytest.LogCaptureFixture
) -> None:
    tasks.Flaky(failures=2).enqueue(using=alias)
    with caplog.at_level(logging.INFO, logger="django_venturi.worker"):
        Worker(burst=True, database=alias, poll_interval=0.05).run()
    assert "stopped after 3 runs" in caplog.text  # one job, two retries and a completion


SIGNAL_WHILE_THE_LOOP_HOLDS_ITS_EVENT = """
import os, signal, sys, time
import django
django.setup()
from django_venturi.worker.process import Worker

worker = Worker(concurrency=1)
restore = worker.install_signal_handlers()
# The claim loop (the main thread) clears and waits on the wake event; each takes
# the event's lock. SIGTERM arrives while it holds it: the handler runs right here.
with worker._wake._cond:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)
stopped = worker._stop.wait(10)
restore()
print("stopped" if stopped else "not stopped")
"""


def test_sigterm_while_the_claim_loop_holds_its_wake_event_still_stops_the_worker() -> None:
    """The hang seen once: the log ended at "got SIGTERM: stopping" and the worker
    never exited. The handler had set an event whose lock the interrupted main
    thread held."""
    try:
        result = subprocess.run(
            [sys.executable, "-c", SIGNAL_WHILE_THE_LOOP_HOLDS_ITS_EVENT],
            env=worker_env(),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the signal handler waited for a lock its own thread held")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "stopped", result.stderr
    assert "got SIGTERM: stopping" in result.stderr
