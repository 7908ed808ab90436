"""The claim statement: what it takes, in which order, and that it stays cheap."""

from __future__ import annotations

import json
import threading
import uuid
from datetime import timedelta

import pytest
from django.db import connection, connections

import django_venturi as venturi
from django_venturi.models import Job
from django_venturi.registry import registry
from django_venturi.store import completion, leases, verdicts
from django_venturi.store.claim import ClaimRequest, claim
from django_venturi.store.clock import now_expression
from django_venturi.store.scheduling import TierClock
from tests.query_plans import most_rows_read_by_one_node
from tests.testapp.tasks import Noop

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])


def request(limit: int = 10, queues: list[str] | None = None, worker: str = "w1") -> ClaimRequest:
    kinds = registry.kinds()
    return ClaimRequest(
        worker=worker,
        limit=limit,
        kinds=kinds,
        leases=[timedelta(minutes=5)] * len(kinds),
        queues=queues,
    )


def test_claim_marks_jobs_running_under_a_lease(alias: str) -> None:
    venturi.enqueue_many([Noop(n=i) for i in range(5)], using=alias)
    claimed = claim(alias, request(limit=3), TierClock((6, 3, 1)))
    assert len(claimed) == 3
    assert len({job.claim_token for job in claimed}) == 1
    rows = Job.objects.using(alias).filter(state=venturi.State.RUNNING)
    assert sorted(rows.values_list("id", flat=True)) == [job.id for job in claimed]
    for row in rows:
        assert row.attempt == 1 and row.claimed_by == "w1"
        assert row.lease_expires_at is not None and row.started_at is not None
        assert row.lease_expires_at - row.started_at == timedelta(minutes=5)


def test_within_a_tier_jobs_are_claimed_in_enqueue_order(alias: str) -> None:
    jobs = venturi.enqueue_many([Noop(n=i) for i in range(20)], using=alias)
    clock = TierClock((6, 3, 1))
    taken = [job.id for _ in range(4) for job in claim(alias, request(limit=5), clock)]
    assert taken == [job.pk for job in jobs]


def test_within_a_tier_a_lower_rank_is_claimed_first(alias: str) -> None:
    jobs = venturi.enqueue_many([Noop(n=i) for i in range(6)], using=alias)
    ranks = [0, -50, 10, -50, 0, -90]
    for job, rank in zip(jobs, ranks, strict=True):
        Job.objects.using(alias).filter(pk=job.pk).update(rank=rank)
    clock = TierClock((6, 3, 1))
    batches = [{job.id for job in claim(alias, request(limit=2), clock)} for _ in range(3)]
    by_rank = [pk for _, pk in sorted(zip(ranks, [job.pk for job in jobs], strict=True))]
    assert batches == [set(by_rank[0:2]), set(by_rank[2:4]), set(by_rank[4:6])]


def test_a_claimed_job_is_not_claimed_again(alias: str) -> None:
    venturi.enqueue_many([Noop(n=i) for i in range(10)], using=alias)
    first = claim(alias, request(limit=10), TierClock((6, 3, 1)))
    second = claim(alias, request(limit=10, worker="w2"), TierClock((6, 3, 1)))
    assert len(first) == 10 and second == []


def test_queues_filter_the_claim(alias: str) -> None:
    Noop(n=1).enqueue(queue="a", using=alias)
    Noop(n=2).enqueue(queue="b", using=alias)
    Noop(n=3).enqueue(queue="c", using=alias)
    claimed = claim(alias, request(queues=["a", "c"]), TierClock((6, 3, 1)))
    assert sorted(job.queue for job in claimed) == ["a", "c"]
    assert [job.queue for job in claim(alias, request(), TierClock((6, 3, 1)))] == ["b"]


def test_future_jobs_are_not_claimed(alias: str) -> None:
    Noop().enqueue(delay=timedelta(minutes=10), using=alias)
    assert claim(alias, request(), TierClock((6, 3, 1))) == []


def test_weighted_tiers_share_a_single_slot_worker(alias: str) -> None:
    venturi.enqueue_many(
        [Noop(n=i) for i in range(60)], priority=venturi.Priority.HIGH, using=alias
    )
    venturi.enqueue_many(
        [Noop(n=i) for i in range(60)], priority=venturi.Priority.NORMAL, using=alias
    )
    venturi.enqueue_many([Noop(n=i) for i in range(60)], priority=venturi.Priority.LOW, using=alias)
    clock = TierClock((6, 3, 1))
    tiers = [job.priority for _ in range(50) for job in claim(alias, request(limit=1), clock)]
    assert tiers[0] == venturi.Priority.HIGH
    assert (tiers.count(0), tiers.count(1), tiers.count(2)) == (30, 15, 5)


def test_concurrent_claims_never_share_a_job() -> None:
    venturi.enqueue_many([Noop(n=i) for i in range(400)])
    taken: list[int] = []
    lock = threading.Lock()

    def claimer(name: str) -> None:
        clock = TierClock((6, 3, 1))
        try:
            while jobs := claim("default", request(limit=7, worker=name), clock):
                with lock:
                    taken.extend(job.id for job in jobs)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claimer, args=(f"w{i}",)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(taken) == 400 and len(set(taken)) == 400


def test_a_verdict_from_a_stale_claim_is_discarded(alias: str) -> None:
    Noop().enqueue(using=alias)
    (stale,) = claim(alias, request(), TierClock((6, 3, 1)))
    # The lease runs out and another worker recovers, then reclaims the job.
    Job.objects.using(alias).filter(pk=stale.id).update(
        lease_expires_at=now_expression(alias) - timedelta(seconds=1)
    )
    assert leases.recover_expired(alias, "rescuer") == [stale.id]
    Job.objects.using(alias).filter(pk=stale.id).update(
        run_at=now_expression(alias)
    )  # skip backoff
    (fresh,) = claim(alias, request(worker="w2"), TierClock((6, 3, 1)))
    assert fresh.id == stale.id and fresh.claim_token != stale.claim_token
    assert completion.write_verdicts(alias, "w1", [verdicts.completed(stale)]) == set()
    assert not leases.extend(alias, [stale]).held(stale.run_key)
    assert leases.extend(alias, [fresh]).extended == {fresh.run_key}
    job = Job.objects.using(alias).get(pk=stale.id)
    assert job.state == venturi.State.RUNNING and job.claim_token == fresh.claim_token
    outcomes = list(job.journal.using(alias).values_list("outcome", "worker"))
    assert outcomes == [("lease_expired", "w1"), ("discarded", "w1")]
    assert job.failures == 1 and job.attempt == 2
    assert completion.write_verdicts(alias, "w2", [verdicts.completed(fresh)]) == {fresh.id}


def test_the_claim_uses_the_partial_index_on_a_fresh_backlog() -> None:
    """100,000 ready jobs inserted and not analysed: the plan must not scan or sort them."""
    table = connection.ops.quote_name(Job._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"""INSERT INTO {table} (kind, queue, priority, state, payload, attempt, failures,
                                     run_at, enqueued_at, claimed_by, last_error)
                SELECT 'tests.noop', 'default', i % 3, 'ready', '{{"n": 0}}', 0, 0,
                       now(), now(), '', '' FROM generate_series(1, 100000) AS i"""
        )
    import uuid

    from django_venturi.store.claim_statement import postgresql_statement

    sql, params = postgresql_statement(
        "default", request(limit=100), TierClock((6, 3, 1)), uuid.uuid4()
    )
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params)
        plan = cursor.fetchone()[0]
    text = json.dumps(plan)
    assert "venturi_job_claim_rank_idx" in text
    assert '"Seq Scan"' not in text
    # At most `limit` rows from each tier's index scan (300 here), never the backlog's
    # 100,000: what a sort or a scan of the backlog would read, and what made it slow.
    assert most_rows_read_by_one_node(plan) <= 20 * 100
    assert Job.objects.filter(state=venturi.State.RUNNING).count() == 100


@pytest.mark.parametrize("queues", [None, ["a", "b"]])
def test_the_common_claim_fits_psycopgs_statement_cache(queues: list[str] | None) -> None:
    # psycopg parses the placeholders of a longer statement again on every call, about
    # 0.1 ms of client CPU per claim of 32 jobs (claim_statement._compact).
    from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH, MAX_CACHED_STATEMENT_PARAMS

    from django_venturi.store.claim_statement import postgresql_statement

    clock = TierClock((6, 3, 1), {"bulk": 1, "default": 4})
    sql, params = postgresql_statement("default", request(queues=queues), clock, uuid.uuid4())
    assert len(sql.encode()) <= MAX_CACHED_STATEMENT_LENGTH
    assert len(params) <= MAX_CACHED_STATEMENT_PARAMS
