"""A worker stopped in the middle of its claim pipeline holds up the capped kinds for a
bounded time (`store/stuck_claims.py`).

The stopped worker is a client that sends what a claim of capped kinds sends first
(the caps lock's statement, in pipeline mode) and then nothing: not the claim, not
the Sync. That is a worker frozen between two writes, exactly; its session is
active and reads from its client, where no PostgreSQL timeout applies. A real
worker's lease sweep ends that session, and the capped and rate-limited jobs run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import psycopg
import pytest
from django.db import connection

import django_venturi as venturi
from django_venturi.store.claim import CAPS_LOCK_KEY
from django_venturi.store.connections import connection_params
from tests.conftest import Workers, wait_until
from tests.test_frozen_claimer import caps_lock_holder, completed
from tests.testapp.flow_tasks import Rated
from tests.testapp.scheduling_tasks import Capped
from tests.testapp.tasks import Noop

pytestmark = pytest.mark.django_db(transaction=True, databases=["default"])


@pytest.fixture
def stopped_mid_pipeline() -> Iterator[int]:
    """A session that took the caps lock in a pipeline whose Sync never comes; its pid."""
    client = psycopg.connect(**connection_params("default"), autocommit=True)
    pgconn = client.pgconn
    try:
        pgconn.enter_pipeline_mode()
        pgconn.send_query_params(
            b"SELECT pg_try_advisory_xact_lock($1::bigint)", [str(CAPS_LOCK_KEY).encode()]
        )
        pgconn.flush()
        pid = wait_until(caps_lock_holder, message="the stopped client to take the caps lock")
        assert pid == pgconn.backend_pid
        wait_until(
            lambda: activity(pid) == ("active", "ClientRead"),
            message="the session to wait on its client, mid-pipeline",
        )
        yield pid
    finally:
        client.close()


def activity(pid: int) -> tuple[str, str] | None:
    """The state of backend `pid` and what it waits for (None once it has ended)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT state, wait_event FROM pg_stat_activity WHERE pid = %s", [pid])
        row = cursor.fetchone()
    return None if row is None else (row[0], row[1])


def test_a_worker_ends_a_session_stuck_mid_pipeline_and_the_capped_jobs_run(
    stopped_mid_pipeline: int, workers: Workers, monkeypatch: pytest.MonkeyPatch
) -> None:
    limited = venturi.enqueue_many([Capped(seconds=0.01) for _ in range(3)])
    limited += venturi.enqueue_many([Rated(n=n) for n in range(3)])
    plain = venturi.enqueue_many([Noop(n=n) for n in range(3)])
    monkeypatch.setenv("VENTURI_TEST_SETTINGS", json.dumps({"RESCUE_INTERVAL": 1}))
    workers.start("default", "--poll-interval", "0.2")
    wait_until(lambda: completed(plain), message="the plain jobs, beside the stuck lock")
    # Ended by the worker's lease sweep, once it had waited past CAPS_LOCK_HOLD.
    wait_until(lambda: activity(stopped_mid_pipeline) is None, message="the stuck session")
    wait_until(lambda: completed(limited), message="the capped and rate-limited jobs")
    assert caps_lock_holder() != stopped_mid_pipeline
