"""The live jobs' counts (`venturi.stats()`, the table's health on the stats page) read the
live jobs' own index, `venturi_job_live_idx`, never the finished rows: their plans on a
table of finished jobs, against the real PostgreSQL.

On 10,000,000 finished jobs and 10,000 ready ones, each of the stats page's two live counts
took 120-170 ms through `venturi_job_kind_state_idx` (which holds every row), and 10-14 ms
through the live index (tests/measure_history_at_scale.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import django_venturi as venturi
from django_venturi.models import Job
from django_venturi.observe.table_health import table_health
from tests.query_plans import most_rows_read_by_one_node

FINISHED = 50_000


def explained(sql: str) -> Any:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql)
        return cursor.fetchone()[0]


def fill_finished_and_a_few_ready() -> None:
    table = connection.ops.quote_name(Job._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"""INSERT INTO {table} (kind, queue, priority, state, payload, attempt, failures,
                                     run_at, enqueued_at, finished_at, claimed_by, last_error,
                                     error_type)
                SELECT 'tests.noop', 'default', 1, 'completed', '{{"n": 0}}', 1, 0,
                       now(), now(), now(), '', '', '' FROM generate_series(1, %s)""",
            [FINISHED],
        )
    for kind, queue in [("tests.noop", "default"), ("tests.noop", "mail"), ("tests.flaky", "mail")]:
        Job.objects.create(kind=kind, queue=queue, payload={"n": 1}, run_at=timezone.now())
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {table}")  # as autovacuum would have


@pytest.mark.django_db
def test_the_live_counts_read_the_live_jobs_index_not_the_finished_rows() -> None:
    fill_finished_and_a_few_ready()
    with CaptureQueriesContext(connection) as captured:
        stats = venturi.stats()
        health = table_health()
    assert (stats.ready, stats.waiting, stats.running) == (3, 0, 0)
    assert stats.live == {
        ("ready", "tests.noop", "default"): 1,
        ("ready", "tests.noop", "mail"): 1,
        ("ready", "tests.flaky", "mail"): 1,
    }
    assert health.rows_by_state["ready"] == 3
    counts = [
        query["sql"]
        for query in captured.captured_queries
        if "IN ('waiting', 'ready', 'running')" in query["sql"]
    ]
    assert len(counts) == 2, [query["sql"] for query in captured.captured_queries]
    for sql in counts:
        plan = explained(sql)
        assert "venturi_job_live_idx" in json.dumps(plan), (sql, plan)
        assert most_rows_read_by_one_node(plan) <= 10, (sql, plan)
