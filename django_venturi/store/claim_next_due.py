"""What an idle claimer asks: when the next scheduled job becomes due, and when a
rate limit has room again (`claim.upcoming`), from the claim statement's parts."""

from __future__ import annotations

from typing import Any

from django_venturi.store.claim_statement import fragments, rate_params
from django_venturi.store.claim_types import ClaimRequest

_NEXT_DUE_SQL = """
WITH RECURSIVE served(queue) AS ({served}),
{paused},
{slots},
{rates},
-- When each kind or key at its rate limit, with due jobs waiting on it, has room
-- again: when its limit-th newest start leaves the window.
openings(at) AS (
    SELECT (array_agg(counted.started_at ORDER BY counted.started_at DESC))[min(rates.cap)]
           + make_interval(secs => min(rates.seconds))
    FROM exhausted
    JOIN rates ON rates.kind = exhausted.kind
    JOIN {ledger} AS counted ON counted.kind = exhausted.kind AND counted.key = exhausted.key
    WHERE counted.started_at > (SELECT at FROM clock) - make_interval(secs => rates.seconds)
      AND exhausted.kind <> ALL((SELECT names FROM paused_kinds)::text[])
      AND EXISTS (
        SELECT 1 FROM {table} AS waiting
        WHERE waiting.state = 'ready' AND waiting.kind = exhausted.kind
          AND waiting.run_at <= now()
          AND (rates.field IS NULL
               OR coalesce(waiting.payload ->> rates.field, '') = exhausted.key))
    GROUP BY exhausted.kind, exhausted.key
)
SELECT
    extract(epoch FROM
        (SELECT min(upcoming.run_at)
         FROM slots
         CROSS JOIN LATERAL (
            SELECT run_at FROM {table}
            WHERE state = 'ready' AND queue = slots.queue AND priority = slots.priority
              AND rank = slots.rank AND run_at > now()
              AND (kind = ANY(%(kinds)s::text[]) OR starts_with(kind, %(kind_prefix)s::text))
            ORDER BY run_at
            LIMIT 1
         ) AS upcoming) - (SELECT at FROM clock)),
    extract(epoch FROM (SELECT min(at) FROM openings) - (SELECT at FROM clock))
"""


def next_due_statement(alias: str, request: ClaimRequest) -> tuple[str, dict[str, Any]]:
    """The statement that finds when the next scheduled job becomes due and when a
    rate limit has room again, and its parameters (for `claim.upcoming`)."""
    sql = _NEXT_DUE_SQL.format(**fragments(alias, request.queues is not None))
    params = {
        "queues": list(request.queues or []),
        "kinds": list(request.kinds),
        "kind_prefix": request.kind_prefix,
        **rate_params(request),
    }
    return sql, params
