"""Answers lost after the server committed: nothing journalled twice, nothing left held.

Two workers drain a backlog through a TCP proxy. Mid-drain the proxy stops passing
the server's answers on (the requests still go through, so the server runs and
commits them) and then closes every connection: verdict batches and claims that the
server applied, whose answers never came. The workers must tell the truth afterwards:
an applied verdict is found in the journal and not written again (no `discarded`
beside a `completed` of the same attempt), and the jobs of a claim whose answer was
lost are handed back at once instead of waiting out their lease.

Whether a drain worker's verdict happens to be in flight when the answers stop is
chance, so a third worker makes it certain: it runs one job of its own queue, held
until the answers have stopped, and the test waits for that job's verdict to be
applied before it closes the connections. Its writer has written only a warm-up
verdict before (so that it is connected), whose answer the worker logged before the
fault: nothing sent earlier can hold the held job's verdict back.
"""

from __future__ import annotations

import collections
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from django.db import connections

import django_venturi as venturi
from django_venturi.models import Job, JournalEntry
from tests import cluster_workers
from tests.conftest import ROOT, wait_until
from tests.tcp_proxy import TcpProxy
from tests.testapp.soak_tasks import Gated, Once

pytestmark = pytest.mark.django_db(transaction=True)

JOBS = 3000
LOST_AT = 300
"""Completed jobs when the answers start being lost."""
DEAF_FOR = 0.5
"""Seconds the server's answers are dropped before every connection is closed (and
after the held job's verdict was applied)."""
GATE_QUEUE = "lost-answer-gate"


@pytest.fixture
def proxy() -> Iterator[TcpProxy]:
    with TcpProxy(("127.0.0.1", connections["default"].settings_dict["PORT"] or 5432)) as proxy:
        yield proxy


def server_clock() -> datetime:
    """The server's clock now (the held job's `finished_at` is the server's `now()`)."""
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def completed() -> int:
    return Job.objects.filter(state=venturi.State.COMPLETED).count()


def test_verdicts_and_claims_whose_answers_were_lost_are_settled_once(
    proxy: TcpProxy, tmp_path: Path
) -> None:
    path = tmp_path / "runs.log"
    held, gate = tmp_path / "held.log", tmp_path / "gate"
    # The held worker's writer connects on a first verdict, answered before the fault.
    warm_up = Once(path=str(tmp_path / "warm-up.log")).enqueue(queue=GATE_QUEUE)
    held_job = Gated(path=str(held), gate=str(gate)).enqueue(queue=GATE_QUEUE)
    jobs = venturi.enqueue_many([Once(path=str(path))] * JOBS)
    name = connections["default"].settings_dict["NAME"]
    # The default 5-minute lease: a claim left to its lease would not end in time.
    env = cluster_workers.environment(f"postgres://postgres@127.0.0.1:{proxy.port}/{name}")
    roles = {"drain-0": "default", "drain-1": "default", "held": GATE_QUEUE}
    logs = [tmp_path / f"worker-{role}.log" for role in roles]
    worker = [sys.executable, "-m", "django", "venturi_worker", "--concurrency", "4"]
    workers = []
    for log, queue in zip(logs, roles.values(), strict=True):
        with log.open("wb") as output:
            workers.append(
                subprocess.Popen(
                    [*worker, "--queues", queue],
                    env=env,
                    cwd=ROOT,
                    stdout=output,
                    stderr=output,
                )
            )
    try:
        warmed_up = f"job {warm_up.pk} (soak.once) attempt 1: completed"
        wait_until(
            lambda: (
                completed() >= LOST_AT
                and held.exists()
                and warmed_up in logs[-1].read_text(errors="replace")
            ),
            timeout=60,
            message=f"{LOST_AT} completed, the held job started, the warm-up's answer logged",
        )
        proxy.deafen()
        deaf_since = server_clock()
        gate.touch()  # the held job ends now: its verdict goes out, its answer is lost
        wait_until(
            lambda: Job.objects.filter(
                pk=held_job.pk, state=venturi.State.COMPLETED, finished_at__gt=deaf_since
            ).exists(),
            timeout=30,
            message="the held job's verdict applied while no answer came back",
        )
        time.sleep(DEAF_FOR)  # the fault's length: writes committed, answers dropped
        assert proxy.cut() > 0, "the workers' connections went through the proxy"
        proxy.heal()
        wait_until(
            lambda: completed() == JOBS + 2,
            timeout=60,
            message="every job completed (none left to a 5-minute lease)",
        )
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        codes = [worker.wait(timeout=60) for worker in workers]
    output = "".join(log.read_text(errors="replace") for log in logs)
    assert codes == [0, 0, 0], output[-4000:]
    # The scenario: writes applied whose answers were lost, found again.
    held_output = logs[-1].read_text(errors="replace")
    assert "found in the journal, not written again" in held_output, held_output[-4000:]
    entries = collections.defaultdict(list)
    for job_id, attempt, outcome in JournalEntry.objects.filter(
        job_id__in=[job.pk for job in [warm_up, held_job, *jobs]]
    ).values_list("job_id", "attempt", "outcome"):
        entries[job_id, attempt].append(outcome)
    twice = {run: outcomes for run, outcomes in entries.items() if len(outcomes) > 1}
    assert not twice, f"runs journalled more than once: {list(twice.items())[:5]}"
    discarded = [run for run, outcomes in entries.items() if "discarded" in outcomes]
    assert not discarded, f"runs journalled discarded: {discarded[:5]}"
    by_job = collections.Counter(outcome for outcomes in entries.values() for outcome in outcomes)
    assert by_job[venturi.JournalOutcome.COMPLETED] == JOBS + 2, by_job
    assert set(by_job) <= {"completed", "released"}, by_job
