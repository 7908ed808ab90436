"""MariaDB as the job database: real workers drain jobs there, two at once never run one
job twice, and the features it cannot hold yet are refused (`venturi.E060`).

Collected only when VENTURI_TEST_MARIADB_URL names a server (tests/conftest.py); the
backend-neutral tests run there too, through the `alias` fixture."""

from __future__ import annotations

import subprocess
from collections import Counter

import pytest

import django_venturi as venturi
from django_venturi.database_support import unsupported_feature_errors
from django_venturi.models import Job, JournalEntry, WorkerProcess
from django_venturi.registry import registry
from tests.conftest import ROOT, Workers, wait_until, worker_env
from tests.testapp.models import Record
from tests.testapp.tasks import Sleeper

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "mariadb"])

QUEUE = "mariadb"
"""A queue of its own: the suite's tasks on `default` include dedup, caps and rate limits,
which a MariaDB worker serving that queue refuses."""


def test_two_workers_drain_the_jobs_and_run_each_exactly_once(workers: Workers) -> None:
    for _ in range(2):
        workers.start("mariadb", "--queues", QUEUE, "--concurrency", "4")
    # Both registered before the jobs exist: else the first to start could drain all 300
    # before the second claims (a worker starts in about a second), and nothing contends.
    registered = WorkerProcess.objects.using("mariadb").filter(stopped_at=None)
    wait_until(lambda: registered.count() == 2, timeout=60, message="two workers registered")
    # 20 ms each: one worker alone would take 1.5 s, many of the other's polls.
    jobs = venturi.enqueue_many(
        [Sleeper(seconds=0.02) for _ in range(300)], using="mariadb", queue=QUEUE
    )

    def drained() -> bool:
        ready = Job.objects.using("mariadb").exclude(state=venturi.State.COMPLETED)
        return not ready.exists()

    wait_until(drained, timeout=60, message="the two workers did not drain 300 jobs")
    runs = Counter(Record.objects.using("mariadb").values_list("job_id", flat=True))
    assert runs == Counter({job.pk: 1 for job in jobs})
    claims = Counter(JournalEntry.objects.using("mariadb").values_list("job_id", flat=True))
    assert claims == Counter({job.pk: 1 for job in jobs})
    both = set(JournalEntry.objects.using("mariadb").values_list("worker", flat=True))
    assert len(both) == 2, "one worker took every job: the claim was not contended"


def test_a_worker_refuses_tasks_whose_features_mariadb_cannot_hold(workers: Workers) -> None:
    command = workers.command("mariadb", "--burst")
    result = subprocess.run(
        command, env=worker_env(), cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    assert "venturi.E060" in result.stderr
    assert "which venturi does not support on MariaDB or MySQL yet" in result.stderr


def test_the_check_names_each_refused_feature_of_a_task() -> None:
    specs = {spec.kind: spec for spec in registry.specs()}
    keyed, limited = specs["tests.recompute"], specs["docs.charge_account"]
    errors = unsupported_feature_errors("mariadb", [keyed, limited, specs["tests.noop"]])
    assert [error.id for error in errors] == ["venturi.E060", "venturi.E060"]
    assert "'tests.recompute' uses dedup_key()" in errors[0].msg
    assert "'docs.charge_account' uses rate_limit=" in errors[1].msg
    assert unsupported_feature_errors("default", [keyed, limited]) == []
    assert unsupported_feature_errors("sqlite", [keyed, limited]) == []
