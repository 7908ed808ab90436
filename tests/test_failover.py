"""Failover for real: a primary, a streaming standby, and a proxy that moves between them.

Three `venturi_worker` processes reach PostgreSQL only through a TCP proxy
(tests/tcp_proxy.py), as applications reach a managed database through a
virtual IP. While they drain a backlog the failover happens as an operator or a
managed service does it: the old primary is fenced read-only (every write now
answers SQLSTATE 25006, as a demoted primary does), the standby replays the last
of its WAL (once the transactions begun before the fence, which may still write,
have ended) and is promoted, and the proxy switches to it, cutting every open
connection. Fencing first is what keeps an asynchronous standby from missing
commits the old primary accepted after the last byte streamed.

The workers must carry on against the new primary within 10 s, and in the end
every job is completed, once in the journal, none failed, no worker exited.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.db import connections
from pytest_django import DjangoDbBlocker

import django_venturi as venturi
from tests import clusters
from tests.cluster_workers import (
    DATABASE,
    WorkerPool,
    add_alias,
    environment,
    remove_alias,
    require_private_clusters,
)
from tests.conftest import wait_until
from tests.tcp_proxy import TcpProxy
from tests.test_postgres_restart import check_the_journal, runs_by_job
from tests.testapp.soak_tasks import Journalled

ALIAS = "failover"
JOBS = 1200
FENCE_AT = 300
"""Completed jobs at which the failover starts (the drain takes ~6 s)."""
CARRY_ON_WITHIN = 10.0
"""Seconds after the switch by which a job must complete on the new primary."""
REFUSED = "in a read-only transaction"
"""What PostgreSQL logs for a write refused with 25006."""


@dataclass
class Pair:
    primary: clusters.Cluster
    standby: clusters.Cluster
    proxy: TcpProxy


@pytest.fixture
def pair(django_db_blocker: DjangoDbBlocker) -> Iterator[Pair]:
    """A primary with the migrated database, its standby, and this process's `ALIAS`
    through the proxy (so it follows the failover as the workers do)."""
    require_private_clusters()
    with (
        django_db_blocker.unblock(),
        clusters.private_cluster("failover_primary") as primary,
        TcpProxy(("127.0.0.1", primary.port)) as proxy,
    ):
        primary.create_database(DATABASE)
        add_alias(ALIAS, proxy_url(proxy))
        try:
            with clusters.private_standby("failover_standby", primary) as standby:
                yield Pair(primary, standby, proxy)
        finally:
            remove_alias(ALIAS)


def proxy_url(proxy: TcpProxy) -> str:
    return f"postgres://postgres@127.0.0.1:{proxy.port}/{DATABASE}"


def count(cluster: clusters.Cluster, state: str) -> int:
    """Jobs in `state` on `cluster`, asked directly (not through the proxy)."""
    sql = f"SELECT count(*) FROM django_venturi_job WHERE state = '{state}'"
    return int(str(cluster.execute(sql, DATABASE)[0][0]))


def unfinished(cluster: clusters.Cluster) -> int:
    sql = "SELECT count(*) FROM django_venturi_job WHERE state IN ('ready', 'running')"
    return int(str(cluster.execute(sql, DATABASE)[0][0]))


def states(cluster: clusters.Cluster) -> dict[object, object]:
    sql = "SELECT state, count(*) FROM django_venturi_job GROUP BY state"
    return {row[0]: row[1] for row in cluster.execute(sql, DATABASE)}


def not_completed(cluster: clusters.Cluster) -> str:
    """The jobs not completed, with their journal: for the failure message."""
    rows = cluster.execute(
        "SELECT j.id, j.state, j.attempt, j.last_error, "
        "array_agg(concat_ws(' ', e.attempt, e.outcome, e.error_type, left(e.error_message, 200)) "
        "ORDER BY e.id) "
        "FROM django_venturi_job j LEFT JOIN django_venturi_journalentry e ON e.job_id = j.id "
        "WHERE j.state <> 'completed' GROUP BY j.id ORDER BY j.id LIMIT 20",
        DATABASE,
    )
    return "\n".join(" | ".join(str(field) for field in row) for row in rows)


def refusals(cluster: clusters.Cluster, since: int) -> int:
    """Writes the cluster refused with 25006 since log offset `since`."""
    return cluster.log()[since:].count(REFUSED)


@pytest.mark.thorough  # two clusters and a drain: about 20 s
@pytest.mark.parametrize("cut", [True, False], ids=["address-moves", "name-moves"])
def test_workers_carry_on_after_a_failover_to_a_promoted_standby(
    pair: Pair, tmp_path: Path, cut: bool
) -> None:
    """`address-moves`: a virtual IP moves to the new primary and every open connection
    is reset. `name-moves`: a DNS name points to the new primary, and open connections
    stay with the old one, which refuses their writes for as long as they last: every
    connection of the worker (handler threads' and the listener's too) must leave it."""
    primary, standby, proxy = pair.primary, pair.standby, pair.proxy
    path = tmp_path / "runs.log"
    jobs = venturi.enqueue_many([Journalled(path=str(path), sleep=0.05)] * JOBS, using=ALIAS)
    ids = {job.pk for job in jobs}
    pool = WorkerPool(tmp_path, environment(proxy_url(proxy)), "--concurrency", "4")
    pool.start(3)
    try:
        wait_until(lambda: count(primary, "completed") >= FENCE_AT, timeout=60, message="the drain")
        # Fence: the old primary refuses writes while the workers are connected to it.
        log_offset = len(primary.log())
        primary.set_read_only()
        fenced_at = primary.clock()
        wait_until(
            lambda: refusals(primary, log_offset) > 0,
            timeout=10,
            message="the fenced primary to refuse a worker's write",
        )
        assert proxy.open_connections > 0, "the workers were not connected through the proxy"
        assert proxy.target == ("127.0.0.1", primary.port)
        # Promote once the standby has every commit, those of transactions begun before
        # the fence included; jobs are running as it happens.
        primary.wait_transactions_end(fenced_at)
        standby.wait_replayed(primary.wal_position())
        standby.promote()
        running_at_promotion = count(standby, "running")
        completed_at_promotion = count(standby, "completed")
        assert running_at_promotion > 0, "no job was running at the promotion"
        assert completed_at_promotion < JOBS - 300, "too little left to fail over"
        refused = refusals(primary, log_offset)
        proxy.switch(("127.0.0.1", standby.port), cut=cut)
        switched = time.monotonic()
        connections[ALIAS].close()  # its connection was cut with the workers'
        wait_until(
            lambda: count(standby, "completed") > completed_at_promotion,
            timeout=CARRY_ON_WITHIN,
            message="a job completed on the new primary",
        )
        carried_on = time.monotonic() - switched
        assert not pool.exited(), pool.logs()
        try:
            wait_until(
                lambda: unfinished(standby) == 0,
                timeout=60,
                message="every job to end on the new primary",
            )
        except AssertionError as error:
            raise AssertionError(f"{error}: {states(standby)}\n{pool.logs()[-6000:]}") from None
        assert not pool.exited(), pool.logs()
        codes = pool.stop()
    finally:
        pool.kill_all()
    assert codes == [0, 0, 0], pool.logs()
    assert count(standby, "completed") == JOBS, f"{states(standby)}\n{not_completed(standby)}"
    extra = check_the_journal(ids, runs_by_job(path), alias=ALIAS)
    print(
        f"\nfailover: {JOBS} jobs, {running_at_promotion} running at the promotion, "
        f"{refused} writes refused by the fenced primary, first completion on the new "
        f"primary {carried_on:.1f} s after the switch; runs that did not complete: "
        f"{dict(extra)}"
    )
