"""Fair kinds in the claim statement (`@venturi.task(fair_by="account_id")`).

A fair kind keeps the places that enqueue order gives it in each slot (queue, tier
and rank) of a claim: the statement scans the slot as for any kind. Which of its
jobs take those places is decided by turns, round by round: each known key gets a
first job, then a second, and so on, and the k-th of those takes the k-th place.
So an account with 100,000 jobs queued first takes one place per round, like an
account with one.

The known keys are those the scan reached (their rows are the candidates, locked
already) and those visited in the fair index, one probe per key, from the key
after the one this worker served last (`TierClock.fair_cursor`, wrapping round).
A claim visits as many keys as the most rows of one key in its scan beyond the
first, plus `FAIR_BEYOND`, at most `FAIR_KEYS`: when one account's backlog filled
the scan, the claim looks for as many other accounts as it has places; when the
scan's rows all have keys of their own (a drain over many accounts) it looks 8
keys further, so a key the scan does not reach still gets its turn within
(keys) / 8 claims. In each round
the visited keys come first, in key order from the cursor, then the keys only
reached, in enqueue order. A visited key the scan did not reach gives its first
due jobs, up to its share of the places (rounded up). The cost of a claim does
not follow the number of keys or the backlog.

`claim_statement.py` puts this between the slots' scan (`scanned`) and the pool,
in the full claim and in the fair one (`FAIR_CLAIM_SQL`, the lean claim with the
turns); a full claim without fair kinds takes the scan as its pool (`UNFAIR_POOL`).
"""

from __future__ import annotations

import collections
from collections.abc import Collection, Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db.models import QuerySet

if TYPE_CHECKING:
    from django_venturi.models import Job
    from django_venturi.store.scheduling import TierClock

FAIR_KEYS = 64
"""The most keys of one fair kind a claim visits in one slot (the rest take their
turns in the next claims, from where this one stopped)."""

FAIR_BEYOND = 8
"""The keys a claim visits beyond the places its scan gave one key after its first:
when the scan's rows all have keys of their own, the claim costs 8 probes, and a
key the scan does not reach still gets its turn within (keys with due jobs) / 8
claims."""

# `{row_keys}` (the rate and cap keys of a row) and `{row_gates}` (what it must pass to
# be claimed now) are the slot scan's; each starts with a comment line of its own.
FAIR_CTES = """
fair(kind, cursor) AS (
    SELECT * FROM unnest(%(fair_kinds)s::text[], %(fair_cursors)s::text[])
),
-- The rows each fair kind took in each slot's scan; the keys they reached (locked
-- already) and how many rows each; per slot and kind, their number (its places),
-- how many keys and the most rows of one key.
fair_places AS (
    SELECT * FROM scanned WHERE kind = ANY(%(fair_kinds)s::text[])
),
fair_reached AS (
    SELECT queue, priority, rank, kind, fair_key AS key, count(*) AS rows
    FROM fair_places GROUP BY queue, priority, rank, kind, fair_key
),
fair_slots AS (
    SELECT queue, priority, rank, kind, sum(rows)::bigint AS places, count(key) AS reached,
           max(rows) AS most
    FROM fair_reached GROUP BY queue, priority, rank, kind
),
-- Its keys with ready jobs in the slot, from the one after the cursor, wrapping round:
-- one probe of the fair index per key, as many more as the scan's rows of one key
-- beyond the first, plus `fair_beyond` (up to `fair_keys`).
fair_keys(queue, priority, rank, kind, cursor, key, n, wrapped, probes) AS (
    SELECT s.queue, s.priority, s.rank, s.kind, fair.cursor, first.key, 1, first.wrapped,
           least(%(fair_keys)s::integer, s.most::integer - 1 + %(fair_beyond)s::integer)
    FROM fair_slots AS s JOIN fair ON fair.kind = s.kind
    CROSS JOIN LATERAL (
        (SELECT fair_key AS key, false AS wrapped FROM {table}
         WHERE state = 'ready' AND fair_key IS NOT NULL AND queue = s.queue
           AND priority = s.priority AND rank = s.rank AND kind = s.kind
           AND fair_key > fair.cursor
         ORDER BY fair_key LIMIT 1)
        UNION ALL
        (SELECT fair_key, true FROM {table}
         WHERE state = 'ready' AND fair_key IS NOT NULL AND queue = s.queue
           AND priority = s.priority AND rank = s.rank AND kind = s.kind
         ORDER BY fair_key LIMIT 1)
        LIMIT 1
    ) AS first
    WHERE s.most - 1 + %(fair_beyond)s::integer > 0
    UNION ALL
    SELECT k.queue, k.priority, k.rank, k.kind, k.cursor, next.key, k.n + 1, next.wrapped,
           k.probes
    FROM fair_keys AS k
    CROSS JOIN LATERAL (
        (SELECT fair_key AS key, k.wrapped AS wrapped FROM {table}
         WHERE state = 'ready' AND fair_key IS NOT NULL AND queue = k.queue
           AND priority = k.priority AND rank = k.rank AND kind = k.kind
           AND fair_key > k.key
         ORDER BY fair_key LIMIT 1)
        UNION ALL
        (SELECT fair_key, true FROM {table}
         WHERE NOT k.wrapped AND state = 'ready' AND fair_key IS NOT NULL
           AND queue = k.queue AND priority = k.priority AND rank = k.rank AND kind = k.kind
         ORDER BY fair_key LIMIT 1)
        LIMIT 1
    ) AS next
    WHERE k.n < k.probes AND NOT (next.wrapped AND next.key > k.cursor)
),
-- The visited keys the slot's scan did not reach.
fair_unreached AS (
    SELECT k.* FROM fair_keys AS k
    WHERE NOT EXISTS (
        SELECT 1 FROM fair_reached AS r
        WHERE r.queue = k.queue AND r.priority = k.priority AND r.rank = k.rank
          AND r.kind = k.kind AND r.key = k.key)
),
-- Each known key's share of the places (the keys reached and the visited ones),
-- rounded up.
fair_shares AS (
    SELECT u.queue, u.priority, u.rank, u.kind,
           ceil(s.places::float8 / (s.reached + count(*)))::integer AS share
    FROM fair_unreached AS u JOIN fair_slots AS s USING (queue, priority, rank, kind)
    GROUP BY u.queue, u.priority, u.rank, u.kind, s.places, s.reached
),
-- The candidates: the scan's rows of the kind, with their key's turn if it was
-- visited (a key only reached gets none: it comes after the visited ones); and
-- for each visited key the scan did not reach, its first due jobs, up to its share,
-- as the scan takes them (its gates, SKIP LOCKED). That key is bounded as a range and
-- the order names it, so that the fair index gives the rows in order: with
-- `fair_key = key`, the planner took the claim index (in `run_at` order too) and
-- filtered its way through other keys' backlogs.
fair_picked AS (
    SELECT places.queue, places.priority, places.rank, places.kind, k.n, places.id,
           places.run_at, places.rate_key, places.cap_key, places.fair_key AS key
    FROM fair_places AS places
    LEFT JOIN fair_keys AS k
      ON k.queue = places.queue AND k.priority = places.priority AND k.rank = places.rank
     AND k.kind = places.kind AND k.key = places.fair_key
    UNION ALL
    SELECT u.queue, u.priority, u.rank, u.kind, u.n, c.id, c.run_at, c.rate_key, c.cap_key,
           u.key
    FROM fair_unreached AS u
    JOIN fair_shares AS shares USING (queue, priority, rank, kind)
    CROSS JOIN LATERAL (
        SELECT id, run_at,
               {row_keys}
        FROM {table}
        WHERE state = 'ready' AND fair_key >= u.key AND fair_key <= u.key
          AND queue = u.queue AND priority = u.priority AND rank = u.rank AND kind = u.kind
          AND run_at <= now()
          {row_gates}
        ORDER BY fair_key, run_at, id
        LIMIT shares.share
        FOR UPDATE SKIP LOCKED
    ) AS c
),
-- Round by round; in each, the visited keys from the cursor, then the keys only
-- reached, in enqueue order: the k-th takes the k-th place, with the due time and id
-- of the scan's k-th row (`place_id`: what the later turns and caps order by, so
-- jobs enqueued together keep their turns) and the slot's turn values.
fair_order AS (
    SELECT queue, priority, rank, kind, array_agg(run_at ORDER BY run_at, id) AS run_ats,
           array_agg(id ORDER BY run_at, id) AS ids,
           min(tier_clock) AS tier_clock, min(tier_stride) AS tier_stride,
           min(queue_clock) AS queue_clock, min(queue_stride) AS queue_stride
    FROM fair_places GROUP BY queue, priority, rank, kind
),
fair_turns AS (
    SELECT *, row_number() OVER (PARTITION BY queue, priority, rank, kind
                                 ORDER BY round, n IS NULL, n, run_at, id) AS place
    FROM (
        SELECT *, row_number() OVER (PARTITION BY queue, priority, rank, kind, key
                                     ORDER BY run_at, id) AS round
        FROM fair_picked
    ) AS rounds
),
-- With one slot and no visited key the scan missed, every candidate takes a place, and
-- unless a cap or rate limit on the kind then takes them in turn order, the places'
-- order is no one's turn: the scan's rows are the picks, with their keys' turns, and
-- the rounds are not sorted (a claim of 500 jobs over 100 accounts).
fair_all_reached(held) AS (
    SELECT %(fair_unordered)s::boolean AND (SELECT count(*) FROM slots) = 1
           AND NOT EXISTS (SELECT 1 FROM fair_unreached)
),
pool AS (
    SELECT id, kind, queue, priority, rank, run_at, id AS place_id, rate_key, cap_key,
           NULL::bigint AS fair_turn, tier_clock, tier_stride, queue_clock, queue_stride
    FROM scanned WHERE kind <> ALL(%(fair_kinds)s::text[])
    UNION ALL
    SELECT places.id, places.kind, places.queue, places.priority, places.rank, places.run_at,
           places.id, places.rate_key, places.cap_key, k.n,
           places.tier_clock, places.tier_stride, places.queue_clock, places.queue_stride
    FROM fair_places AS places
    LEFT JOIN fair_keys AS k
      ON k.queue = places.queue AND k.priority = places.priority AND k.rank = places.rank
     AND k.kind = places.kind AND k.key = places.fair_key
    WHERE (SELECT held FROM fair_all_reached)
    UNION ALL
    SELECT turns.id, turns.kind, s.queue, s.priority, s.rank, s.run_ats[turns.place],
           s.ids[turns.place], turns.rate_key, turns.cap_key, turns.n,
           s.tier_clock, s.tier_stride, s.queue_clock, s.queue_stride
    FROM fair_turns AS turns JOIN fair_order AS s USING (queue, priority, rank, kind)
    JOIN fair_slots AS slot USING (queue, priority, rank, kind)
    WHERE NOT (SELECT held FROM fair_all_reached) AND turns.place <= slot.places
)"""


# The claim when a fair kind is claimable and no kind is capped or rate-limited: the
# lean claim's selection (`claim_statement.py`), with the fair kinds' places given
# to their keys in turn (`FAIR_CTES`) between the scan and the pool. Formatted with
# `claim_statement.fragments`.
FAIR_CLAIM_SQL = """
WITH RECURSIVE
served(queue) AS ({served}),
{tiers},
{paused},
{eligible_unpaused},
{slots},
{scanned},
{fair},
{queued},
ranked AS (
    SELECT id, kind, priority, fair_turn, {tier_turn} AS turn
    FROM queued
),
-- As in the lean claim: with one slot, its candidates are the claim (no sort).
chosen AS (
    SELECT id, kind, fair_turn FROM pool WHERE (SELECT count(*) FROM slots) = 1
    UNION ALL
    (SELECT id, kind, fair_turn FROM ranked WHERE (SELECT count(*) FROM slots) > 1
     ORDER BY turn, priority
     LIMIT %(limit)s)
),
{claim_tail}"""

# The full claim's pool when no fair kind may be claimed: the scan's rows as they are.
UNFAIR_POOL = """
pool AS (
    SELECT id, kind, queue, priority, rank, run_at, id AS place_id, rate_key, cap_key,
           NULL::bigint AS fair_turn, tier_clock, tier_stride, queue_clock, queue_stride
    FROM scanned
)"""


# ---------------------------------------------------------------- off PostgreSQL

Row = tuple[int, datetime, int, str, Any]
"""A job as the claim off PostgreSQL scans it: rank, run_at, id, kind, payload."""


def fair_rows_orm(
    due: QuerySet[Job],
    rows: list[Row],
    fair_kinds: Collection[str],
    clock: TierClock,
    turns: dict[int, tuple[str, int, str]],
) -> list[Row]:
    """`rows` (the scan of one queue in one tier, from `due`) with each fair kind's
    places given to its keys in turn, as `FAIR_CTES` does; each pick's (kind, turn,
    key) goes into `turns` by job id (the claim moves the cursors by those it takes)."""
    for kind in sorted({row[3] for row in rows if row[3] in fair_kinds}):
        of_kind = due.filter(kind=kind)
        places = [index for index, row in enumerate(rows) if row[3] == kind]
        scanned = [(row[1], row[2], row[4]) for row in rows if row[3] == kind]
        payloads = [payload for _, _, payload in scanned]
        keys_of = dict(
            of_kind.filter(id__in=[job_id for _, job_id, _ in scanned]).values_list(
                "id", "fair_key"
            )
        )
        rows_of = collections.Counter(keys_of.get(job_id) for _, job_id, _ in scanned)
        reached = set(rows_of) - {None}
        probes = min(len(rows), FAIR_KEYS, max(rows_of.values()) - 1 + FAIR_BEYOND)
        visited = _keys_in_turn(of_kind, clock.fair_cursor(kind), probes)
        unreached = [key for key in visited if key not in reached]
        share = -(-len(places) // max(1, len(reached) + len(unreached)))
        candidates = [
            (run_at, job_id, keys_of.get(job_id) or "", payload)
            for (run_at, job_id, _), payload in zip(scanned, payloads, strict=True)
        ]
        for key in unreached:
            fetched = of_kind.filter(fair_key=key).order_by("run_at", "id")
            candidates += [
                (run_at, job_id, key, payload)
                for run_at, job_id, payload in fetched.values_list("run_at", "id", "payload")[
                    :share
                ]
            ]
        order = {key: turn for turn, key in enumerate(visited, 1)}
        rounds: dict[str, int] = {}
        ranked = []
        for run_at, job_id, key, payload in sorted(candidates, key=lambda c: (c[0], c[1])):
            rounds[key] = rounds.get(key, 0) + 1
            turn = order.get(key)
            ranked.append(
                ((rounds[key], turn is None, turn or 0, run_at, job_id), job_id, key, turn, payload)
            )
        ranked.sort(key=lambda entry: entry[0])
        given = dict(zip(places, ranked, strict=False))
        fresh: list[Row] = []
        for index, row in enumerate(rows):
            if row[3] != kind:
                fresh.append(row)
            elif index in given:
                _, job_id, key, turn, payload = given[index]
                fresh.append((row[0], row[1], job_id, kind, payload))
                if turn is not None:
                    turns[job_id] = (kind, turn, key)
        rows = fresh
    return rows


def _keys_in_turn(due: QuerySet[Job], cursor: str, limit: int) -> list[str]:
    """The keys with due jobs, from the one after `cursor`, wrapping round (as SQLite
    orders text: by code point, as Python does)."""
    found = due.exclude(fair_key=None).order_by("fair_key").values_list("fair_key", flat=True)
    keys = [key for key in found.distinct() if key is not None]
    return ([key for key in keys if key > cursor] + [key for key in keys if key <= cursor])[:limit]


def last_turns(chosen: Iterable[int], turns: Mapping[int, tuple[str, int, str]]) -> dict[str, str]:
    """Per fair kind, the key of its last turn among the `chosen` jobs."""
    last: dict[str, tuple[int, str]] = {}
    for job_id in chosen:
        if job_id in turns:
            kind, turn, key = turns[job_id]
            if kind not in last or turn > last[kind][0]:
                last[kind] = (turn, key)
    return {kind: key for kind, (_, key) in last.items()}
