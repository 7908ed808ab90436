"""The locks of dedup keys: one producer of a key at a time, and no waiting where it could hurt.

A producer of a keyed job holds its key's transaction-level advisory lock until it
commits (`merging.py`, `enqueue.py`), so that two producers of one key take turns.
Whoever also locks job rows must not wait for a key while holding them (producers
take the key first, then the rows): lease recovery takes the free keys only
(`with_keys_locked_now`), and a worker's results writer, which must never stall
behind someone else's open transaction, asks which keys are busy (`busy_keys`) and
holds back the verdicts that need them (`KeysBusy`). On databases other than
PostgreSQL, whose write transactions serialise, there is nothing to lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from django.db import connections

if TYPE_CHECKING:
    from django_venturi.models import Job
    from django_venturi.store.verdicts import Verdict


def lock_name(kind: str, key: str) -> str:
    """The name whose hash is the advisory lock of a (kind, key)."""
    return f"venturi.dedup\x1f{kind}\x1f{key}"


def lock_keys(alias: str, keys: Sequence[tuple[str, str]]) -> None:
    """Take the advisory locks of these (kind, key) pairs, in a stable order (PostgreSQL).

    Never call this while holding row locks of jobs: producers take a key's lock
    before the rows of that key, so waiting here with rows held can deadlock.
    Such a caller uses `with_keys_locked_now` instead.
    """
    connection = connections[alias]
    if connection.vendor != "postgresql" or not keys:
        return
    with connection.cursor() as cursor:
        # One statement; the locks are taken in array order, which is sorted, so
        # two transactions locking overlapping keys cannot wait on each other in a cycle.
        cursor.execute(
            "SELECT count(pg_advisory_xact_lock(hashtextextended(k, 0))) "
            "FROM unnest(%s::text[]) WITH ORDINALITY AS t(k, n)",
            [sorted(lock_name(kind, key) for kind, key in set(keys))],
        )


class KeysBusy(Exception):
    """Verdicts that need a dedup key another session holds (`fold_returning` asked not to
    wait): the caller writes the others and tries these again later."""

    def __init__(self, verdicts: Sequence[Verdict]) -> None:
        super().__init__(f"{len(verdicts)} verdicts wait for a dedup key another session holds")
        self.verdicts = list(verdicts)


def busy_keys(alias: str, keys: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
    """Take the free ones of these keys' locks without waiting; return the others, which
    another session holds (PostgreSQL; none elsewhere)."""
    connection = connections[alias]
    if connection.vendor != "postgresql" or not keys:
        return set()
    names = {lock_name(kind, key): (kind, key) for kind, key in set(keys)}
    held = _take_free(alias, sorted(names))
    return {pair for name, pair in names.items() if name not in held}


def with_keys_locked_now(alias: str, jobs: Sequence[Job]) -> list[Job]:
    """The `jobs` whose key lock this transaction holds now, taking the free ones without waiting.

    For a caller that already holds the jobs' row locks (lease recovery): it must
    not wait for a key, since a producer holding that key may be waiting for one
    of those rows. Jobs without a key are all kept; a job whose key another
    session holds is left out (its caller leaves it for a later round). Every job
    is kept on databases other than PostgreSQL, whose transactions serialise.
    """
    connection = connections[alias]
    names = sorted({lock_name(job.kind, job.dedup_key) for job in jobs if job.dedup_key})
    if connection.vendor != "postgresql" or not names:
        return list(jobs)
    held = _take_free(alias, names)
    return [job for job in jobs if not job.dedup_key or lock_name(job.kind, job.dedup_key) in held]


def _take_free(alias: str, names: list[str]) -> set[str]:
    """Take the locks of `names` (sorted) that no other session holds, without waiting;
    return the names taken."""
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT k FROM unnest(%s::text[]) WITH ORDINALITY AS t(k, n) "
            "WHERE pg_try_advisory_xact_lock(hashtextextended(k, 0)) ORDER BY n",
            [names],
        )
        return {row[0] for row in cursor.fetchall()}
