"""Where a claim looks: the queues it serves, the paused queues and kinds, the slots
(queue, tier, rank) that hold ready jobs, and the scan of each slot's due jobs.

The fragments of every claim statement's first part (`claim_statement.fragments`
formats them; the full, lean and fair claims and `claim_next_due.py` share them).
"""

from __future__ import annotations

SERVED_QUEUES_LISTED = "SELECT unnest(%(queues)s::text[])"

# Every queue with ready jobs, found by skipping through the claim index from one
# distinct queue to the next (one index probe per queue, not a scan of the backlog).
SERVED_QUEUES_ALL = """
    (SELECT queue FROM {table} WHERE state = 'ready' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM {table} AS j
            WHERE j.state = 'ready' AND j.queue > served.queue
            ORDER BY j.queue LIMIT 1)
    FROM served WHERE served.queue IS NOT NULL
"""

PAUSED = """
-- Paused queues and kinds (`pauses.py`): read by the statement itself, so a pause
-- committed before it began is never missed.
paused_queues(names) AS (
    SELECT coalesce(array_agg(name), '{{}}') FROM {pause_table} WHERE scope = 'queue'
),
paused_kinds(names) AS (
    SELECT coalesce(array_agg(name), '{{}}') FROM {pause_table} WHERE scope = 'kind'
)
"""

# The due jobs of a slot (`slots`) that the claim may take: its kinds that are
# `eligible`, and Django Tasks jobs, whatever their function (NULL prefix: none).
DUE_IN_SLOT = """FROM {table}
        WHERE state = 'ready' AND queue = slots.queue AND priority = slots.priority
          AND rank = slots.rank AND run_at <= now()
          AND (kind = ANY((SELECT kinds FROM eligible)::text[])
               OR (starts_with(kind, %(kind_prefix)s::text)
                   AND kind <> ALL((SELECT names FROM paused_kinds)::text[])))"""

# The claimable kinds of a claim that counts nothing: those not paused.
ELIGIBLE_UNPAUSED = """eligible(kinds) AS (
    SELECT coalesce(array_agg(kind), '{}') FROM unnest(%(kinds)s::text[]) AS known(kind)
    WHERE known.kind <> ALL((SELECT names FROM paused_kinds)::text[])
)"""

SLOTS = """
-- The (tier, rank) pairs that hold ready jobs in each served queue, found by
-- skipping through the claim index from one pair to the next: one index probe
-- per pair (usually one rank per tier), not a scan of the backlog.
slots(queue, priority, rank) AS (
    SELECT served.queue, lowest.priority, lowest.rank
    FROM served
    CROSS JOIN LATERAL (
        SELECT priority, rank FROM {table}
        WHERE state = 'ready' AND queue = served.queue
        ORDER BY priority, rank LIMIT 1
    ) AS lowest
    WHERE served.queue IS NOT NULL
      AND served.queue <> ALL((SELECT names FROM paused_queues)::text[])
    UNION ALL
    SELECT slots.queue, following.priority, following.rank
    FROM slots
    CROSS JOIN LATERAL (
        SELECT priority, rank FROM {table}
        WHERE state = 'ready' AND queue = slots.queue
          AND (priority, rank) > (slots.priority, slots.rank)
        ORDER BY priority, rank LIMIT 1
    ) AS following
)
"""

SCANNED = """
-- For each slot, the due jobs in claim order. Each lateral scan is a range of
-- the partial claim index (queue, priority, rank, run_at, id), so its cost does
-- not grow with the backlog. SKIP LOCKED passes over rows that another worker
-- is claiming right now instead of waiting for it. The full claim's rows carry
-- their rate and cap keys and pass its gates (`claim_gates.py`).
scanned AS (
    SELECT c.id, c.kind, slots.queue, c.priority, c.rank, c.run_at, c.rate_key, c.cap_key,
           c.fair_key, {slot_turns}
    FROM slots
    {slot_joins}
    CROSS JOIN LATERAL (
        SELECT id, kind, priority, rank, run_at, fair_key,
               {row_keys}
        {due_in_slot}
          {row_gates}
        ORDER BY run_at, id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS c
)"""
