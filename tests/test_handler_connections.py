"""Handler threads keep their database connection from job to job (CONN_MAX_AGE = 0
included), and a kept connection the server closed is replaced before the next job.

Real `venturi_worker` subprocesses on PostgreSQL; the test settings leave
CONN_MAX_AGE at Django's default, 0.
"""

from __future__ import annotations

import pytest
from django.db import connections

import django_venturi as venturi
from django_venturi.models import Job
from tests.conftest import Workers, wait_until
from tests.testapp import tasks
from tests.testapp.models import Record

pytestmark = pytest.mark.django_db(transaction=True, databases=["default"])

CONCURRENCY = 3


def backend_pids() -> list[int]:
    return list(Record.objects.filter(kind="backend_pid").values_list("value", flat=True))


def live_backends() -> list[int]:
    """The server's backends now (a terminated one leaves once its socket is closed)."""
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity")
        return [pid for (pid,) in cursor.fetchall()]


def all_completed(count: int) -> bool:
    return Job.objects.filter(state=venturi.State.COMPLETED).count() == count


def test_handler_threads_keep_one_connection_each_with_conn_max_age_0(
    workers: Workers,
) -> None:
    assert connections["default"].settings_dict["CONN_MAX_AGE"] == 0
    venturi.enqueue_many([tasks.BackendPid(n=i) for i in range(60)])
    workers.burst("default", "--concurrency", str(CONCURRENCY))
    pids = backend_pids()
    assert len(pids) == 60
    assert len(set(pids)) <= CONCURRENCY, f"{len(set(pids))} connections for 60 jobs"


def test_a_kept_connection_the_server_closed_is_replaced_before_the_next_job(
    workers: Workers,
) -> None:
    workers.start("default", "--concurrency", str(CONCURRENCY))
    venturi.enqueue_many([tasks.BackendPid(n=i) for i in range(12)])
    wait_until(lambda: all_completed(12), message="the first wave", timeout=60)
    first = set(backend_pids())
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", [list(first)]
        )
    # The backends are gone (their sockets closed) before the next wave is enqueued.
    wait_until(lambda: not first & set(live_backends()), message="the backends to exit")
    venturi.enqueue_many([tasks.BackendPid(n=i) for i in range(12, 24)])
    wait_until(lambda: all_completed(24), message="the second wave", timeout=60)
    second = set(backend_pids()) - first
    assert second, "the second wave ran on the terminated connections"
    retried = Job.objects.exclude(attempt=1).count()
    assert retried == 0, f"{retried} jobs failed on a terminated connection:\n{workers.log()}"


def test_an_alias_whose_backend_cannot_load_does_not_stop_a_handler_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Handler threads make their wrappers when they start; an alias whose driver this
    process lacks (never used here) is left out instead of failing every run."""
    from django.db.utils import ConnectionHandler

    from django_venturi.store import connections as store_connections

    handler = ConnectionHandler(
        {
            "default": {**connections.settings["default"]},
            "legacy": {"ENGINE": "no_such_driver.backend", "NAME": "x"},
        }
    )
    monkeypatch.setattr(store_connections, "connections", handler)
    kept = store_connections.JobConnections()
    assert [wrapper.alias for wrapper in kept._wrappers] == ["default"]
    kept.before_job()
    kept.after_job()
    handler.close_all()
