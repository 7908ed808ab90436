"""Workers and their listener over TLS, as docs/production.md tells how to set it up.

A private cluster with ssl on refuses every TCP connection without TLS
(pg_hba.conf: hostssl only), so a worker that drains the backlog at all did so
over TLS; `pg_stat_ssl` shows it of each worker connection, the listener's too.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from django.db import connections
from pytest_django import DjangoDbBlocker

import django_venturi as venturi
from django_venturi.models import Job
from tests import clusters
from tests.cluster_workers import DATABASE, WorkerPool, cluster_database, environment
from tests.conftest import wait_until
from tests.testapp.soak_tasks import Journalled

ALIAS = "tls"
JOBS = 300

# The worker backends of the private database (not this test's), with their TLS state.
WORKER_BACKENDS = """
    SELECT a.pid, s.ssl, s.version, a.query LIKE 'LISTEN%%'
    FROM pg_stat_activity AS a JOIN pg_stat_ssl AS s USING (pid)
    WHERE a.datname = current_database() AND a.backend_type = 'client backend'
    AND a.pid <> pg_backend_pid()
"""


@pytest.fixture
def cluster(django_db_blocker: DjangoDbBlocker) -> Iterator[clusters.Cluster]:
    with django_db_blocker.unblock(), cluster_database("tls", ALIAS, ssl=True) as cluster:
        cluster.require_tls()
        yield cluster


def worker_backends() -> list[tuple[int, bool, str | None, bool]]:
    with connections[ALIAS].cursor() as cursor:
        cursor.execute(WORKER_BACKENDS)
        return list(cursor.fetchall())


def test_workers_and_their_listener_drain_a_backlog_over_tls(
    cluster: clusters.Cluster, tmp_path: Path
) -> None:
    assert cluster.cert_file is not None
    # What makes the drain a proof: a connection without TLS does not get in.
    with pytest.raises(psycopg.OperationalError, match="no encryption"):
        psycopg.connect(cluster.url(DATABASE, sslmode="disable"), connect_timeout=10).close()
    # Workers: TLS required. Listener (LISTEN_DATABASE): TLS with the server's
    # certificate verified against a root certificate, as docs/production.md shows.
    env = environment(
        cluster.url(DATABASE, sslmode="require"),
        listen_url=cluster.url(DATABASE, sslmode="verify-ca", sslrootcert=str(cluster.cert_file)),
    )
    pool = WorkerPool(tmp_path, env, "--concurrency", "2")
    path = tmp_path / "runs.log"
    jobs = venturi.enqueue_many([Journalled(path=str(path))] * JOBS, using=ALIAS)
    pool.start(2)
    seen: dict[int, tuple[bool, str | None, bool]] = {}

    def drained() -> bool:
        for pid, ssl, version, listening in worker_backends():
            seen[pid] = (ssl, version, listening or seen.get(pid, (False, None, False))[2])
        done = Job.objects.using(ALIAS).filter(state=venturi.State.COMPLETED).count()
        return done == JOBS and any(listening for _, _, listening in seen.values())

    try:
        wait_until(drained, timeout=60, message=f"{JOBS} jobs done and a listener seen")
        assert not pool.exited(), pool.logs()
        assert pool.stop() == [0, 0], pool.logs()
    finally:
        pool.kill_all()
    assert len(path.read_text().splitlines()) == JOBS
    assert {job.pk for job in jobs} == set(
        Job.objects.using(ALIAS).filter(state=venturi.State.COMPLETED).values_list("pk", flat=True)
    )
    # Each worker has a connection per thread that used the database, and a listener.
    assert len(seen) >= 4, seen
    assert all(ssl and version for ssl, version, _ in seen.values()), seen
    assert "lost the database" not in pool.logs() and "listener lost" not in pool.logs()
    versions = sorted({version for _, version, _ in seen.values() if version})
    print(f"\nTLS: {JOBS} jobs drained over {len(seen)} TLS connections ({', '.join(versions)})")
