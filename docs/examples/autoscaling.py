"""Autoscaling workers on the backlog: the query KEDA's PostgreSQL scaler polls.

KEDA runs the query itself, against the jobs database; `backlog()` runs the same
text here, so that the docs' query is checked against the real table.
"""

from __future__ import annotations

from django.db import connections

# [backlog query]
# Due jobs of the "default" queue that a worker could claim now: ready, their time
# come, and neither their queue nor their kind paused. Jobs scheduled for later,
# waiting for dependencies or running are not backlog.
BACKLOG_QUERY = """
SELECT count(*) FROM django_venturi_job AS job
WHERE job.state = 'ready'
  AND job.queue = 'default'
  AND job.run_at <= now()
  AND NOT EXISTS (
    SELECT FROM django_venturi_pause AS pause
    WHERE (pause.scope = 'queue' AND pause.name = job.queue)
       OR (pause.scope = 'kind' AND pause.name = job.kind)
  )
"""
# [backlog query end]


def backlog(using: str = "default") -> int:
    """What the scaler sees: the query's one number."""
    with connections[using].cursor() as cursor:
        cursor.execute(BACKLOG_QUERY)
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])
