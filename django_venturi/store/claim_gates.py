"""What a job must pass to be claimed now, as the claim statement words it: the rate
limits' counts (`RATES`), and per job row its rate and cap keys (`ROW_KEYS`) and the
gates of dedup, rate limits and caps per key (`ROW_GATES`); a claim without limits
has only the dedup gate (`DEDUP_GATE`) and no keys (`NO_ROW_KEYS`). `claim_statement.py`
puts them in the full claim; `claim_fair.py` applies the same row parts to a fair
kind's picks. Each is formatted with `{table}` (and `{ledger}`, for `RATES`).
"""

RATES = """
-- Rate-limited kinds, and the starts each one's window still counts, per key. A
-- claim of a limited kind holds the caps advisory lock, taken before this
-- statement began, so the counts are exact. `clock_timestamp()` is read once,
-- after that lock: the time the starts are recorded at.
rates(kind, cap, seconds, field) AS (
    SELECT * FROM unnest(%(rate_kinds)s::text[], %(rate_caps)s::integer[],
                         %(rate_seconds)s::float8[], %(rate_fields)s::text[])
),
clock(at) AS (SELECT clock_timestamp()),
used(kind, key, used) AS (
    SELECT counted.kind, counted.key, count(*)
    FROM rates JOIN {ledger} AS counted ON counted.kind = rates.kind
    WHERE counted.started_at > (SELECT at FROM clock) - make_interval(secs => rates.seconds)
    GROUP BY counted.kind, counted.key
),
-- Kinds and keys at their limit: their jobs are left out of the scan, so they
-- never crowd out others.
exhausted(kind, key, keyed) AS (
    SELECT used.kind, used.key, rates.field IS NOT NULL
    FROM used JOIN rates ON rates.kind = used.kind
    WHERE used.used >= rates.cap
),
keyed_exhausted(kinds) AS (
    SELECT coalesce(array_agg(DISTINCT kind), '{{}}') FROM exhausted WHERE keyed
)
"""


# The rate and cap keys of a job row (of `{table}`), as the limits count its start.
ROW_KEYS = """-- The value a keyed rate limit counts this job's start under.
               CASE WHEN kind = ANY(%(keyed_kinds)s::text[])
                    THEN coalesce(payload ->> (SELECT field FROM rates
                                               WHERE rates.kind = {table}.kind), '')
                    ELSE '' END AS rate_key,
               -- The value a keyed cap counts this job's run under.
               CASE WHEN kind = ANY(%(cap_keyed_kinds)s::text[])
                    THEN coalesce(payload ->> (SELECT field FROM limits
                                               WHERE limits.kind = {table}.kind), '')
                    ELSE '' END AS cap_key"""

# A dedup follow-up waits behind the running job of its key (every claim's gate).
DEDUP_GATE = """AND (dedup_key IS NULL OR NOT EXISTS (
                SELECT 1 FROM {table} AS ahead
                WHERE ahead.state = 'running' AND ahead.kind = {table}.kind
                  AND ahead.dedup_key = {table}.dedup_key))"""

# What a job row (of `{table}`) must pass, beside its slot, to be claimed now.
# `{dedup_gate}` is `DEDUP_GATE`, formatted.
ROW_GATES = """-- A dedup follow-up waits behind the running job of its key.
          {dedup_gate}
          -- A job whose rate-limit key is at its limit waits, out of the way.
          AND (kind <> ALL((SELECT kinds FROM keyed_exhausted)::text[]) OR NOT EXISTS (
                SELECT 1 FROM exhausted JOIN rates ON rates.kind = exhausted.kind
                WHERE exhausted.kind = {table}.kind AND exhausted.keyed
                  AND exhausted.key = coalesce({table}.payload ->> rates.field, '')))
          -- So does a job whose cap key is at its cap.
          AND (kind <> ALL(%(cap_keyed_kinds)s::text[]) OR NOT EXISTS (
                SELECT 1 FROM full_keys JOIN limits ON limits.kind = full_keys.kind
                WHERE full_keys.kind = {table}.kind
                  AND full_keys.key = coalesce({table}.payload ->> limits.field, '')))"""

# A claim without rate limits or caps: a row has neither key.
NO_ROW_KEYS = "NULL::text AS rate_key, NULL::text AS cap_key"
