"""Rebuild venturi's indexes without blocking enqueues or claims: `REINDEX INDEX CONCURRENTLY`.

Autovacuum makes dead index entries reusable but never shrinks an index: after a
burst, the job table's indexes stay as large as the burst made them, and the claim
reads their empty pages. A concurrent rebuild writes a packed copy beside each
index and swaps them, holding no lock that blocks writes.

A rebuild interrupted (its session cancelled or killed, the server restarted)
leaves an invalid copy behind, named `<index>_ccnew` (before the swap) or
`<index>_ccold` (after it), which every write of the table still maintains.
`reindex()` drops those first (`DROP INDEX CONCURRENTLY`), then rebuilds every
index of the job table and those of venturi's other tables that look bloated
(`BLOAT_FACTOR`). PostgreSQL only: `MaintenanceRefused` elsewhere, and inside a
transaction (PostgreSQL refuses concurrent rebuilds there).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from django.db import connections

BLOAT_FACTOR = 2.0
"""An index of a table other than the job table is rebuilt when it is this many times
the size its entries need, estimated from the planner's statistics."""
MIN_BLOATED_BYTES = 1 << 20
"""Smaller indexes are never called bloated: rebuilding them gains next to nothing."""

# Indexes of venturi's tables: name, table, validity, size and whether the name
# is a leftover of an interrupted concurrent rebuild (`_ccnew`, `_ccnew1`, `_ccold`...).
_INDEXES_SQL = r"""
SELECT index_class.relname, table_class.relname, pg_index.indisvalid,
       pg_relation_size(index_class.oid),
       index_class.relname ~ '_cc(new|old)[0-9]*$',
       -- the estimated packed size: entries x (key widths + tuple header and line
       -- pointer), on pages nine tenths full; NULL until the table has statistics
       index_class.reltuples * (12 + (
           SELECT sum(coalesce(stats.avg_width, 8))
           FROM unnest(pg_index.indkey) AS key(attnum)
           JOIN pg_attribute ON pg_attribute.attrelid = table_class.oid
                            AND pg_attribute.attnum = key.attnum
           LEFT JOIN pg_stats AS stats ON stats.schemaname = namespace.nspname
                                      AND stats.tablename = table_class.relname
                                      AND stats.attname = pg_attribute.attname
       )) / (current_setting('block_size')::int * 0.9)
         * current_setting('block_size')::int
FROM pg_index
JOIN pg_class AS index_class ON index_class.oid = pg_index.indexrelid
JOIN pg_class AS table_class ON table_class.oid = pg_index.indrelid
JOIN pg_namespace AS namespace ON namespace.oid = table_class.relnamespace
WHERE table_class.relname = ANY(%s) AND namespace.nspname = current_schema()
ORDER BY table_class.relname, index_class.relname
"""


class MaintenanceRefused(Exception):
    """Maintenance cannot run here: not PostgreSQL, or inside a transaction."""


@dataclasses.dataclass(frozen=True, slots=True)
class IndexInfo:
    """One index of a venturi table, as the catalog describes it."""

    name: str
    table: str
    valid: bool
    size: int
    """Bytes."""
    leftover: bool
    """An invalid copy left by an interrupted concurrent rebuild."""
    packed_size: float | None
    """The estimated size of the same entries in a fresh index; None without statistics."""

    @property
    def bloated(self) -> bool:
        """Well past the size its entries need (and big enough to matter)."""
        if self.packed_size is None or self.size < MIN_BLOATED_BYTES:
            return False
        return self.size > BLOAT_FACTOR * self.packed_size


@dataclasses.dataclass(frozen=True, slots=True)
class Rebuilt:
    """One index rebuilt: its size before and after, and the seconds it took."""

    name: str
    before: int
    after: int
    seconds: float


@dataclasses.dataclass(frozen=True, slots=True)
class ReindexReport:
    """What `reindex()` did."""

    dropped: list[str]
    """Leftovers of interrupted rebuilds, dropped."""
    rebuilt: list[Rebuilt]
    skipped: list[str]
    """Indexes of other venturi tables left alone (not bloated)."""

    def lines(self) -> list[str]:
        """The report in words, one line per index."""
        lines = [_dropped_line(name) for name in self.dropped]
        lines += [_rebuilt_line(index) for index in self.rebuilt]
        if self.skipped:
            lines.append(f"left alone (not bloated): {len(self.skipped)} indexes of other tables")
        return lines


def venturi_tables() -> tuple[str, list[str]]:
    """The job table's name, and those of venturi's other tables."""
    from django.apps import apps

    from django_venturi.models import Job

    tables = [model._meta.db_table for model in apps.get_app_config("django_venturi").get_models()]
    job_table = Job._meta.db_table
    return job_table, [table for table in tables if table != job_table]


def indexes(alias: str) -> list[IndexInfo]:
    """Every index of venturi's tables on `alias` (PostgreSQL)."""
    job_table, others = venturi_tables()
    with connections[alias].cursor() as cursor:
        cursor.execute(_INDEXES_SQL, [[job_table, *others]])
        rows = cursor.fetchall()
    return [
        IndexInfo(name, table, valid, size, leftover, None if packed is None else float(packed))
        for name, table, valid, size, leftover, packed in rows
    ]


def reindex(
    alias: str, *, progress: Callable[[str], None] | None = None, dry_run: bool = False
) -> ReindexReport:
    """Drop leftovers of interrupted rebuilds, then rebuild the job table's indexes and
    the bloated ones of venturi's other tables, concurrently. With `dry_run`, report
    what would be done and do nothing. `progress` gets a line as each index is done."""
    refuse_unless_possible(alias)
    job_table, _ = venturi_tables()
    found = indexes(alias)
    leftovers = [index for index in found if index.leftover and not index.valid]
    kept = [index for index in found if index not in leftovers]
    chosen = [index for index in kept if index.table == job_table or index.bloated]
    skipped = [index.name for index in kept if index not in chosen]
    if dry_run:
        rebuilt = [Rebuilt(index.name, index.size, index.size, 0.0) for index in chosen]
        return ReindexReport([index.name for index in leftovers], rebuilt, skipped)
    quote = connections[alias].ops.quote_name
    report = ReindexReport([], [], skipped)
    for index in leftovers:
        _execute(alias, f"DROP INDEX CONCURRENTLY IF EXISTS {quote(index.name)}")
        report.dropped.append(index.name)
        _tell(progress, _dropped_line(index.name))
    for index in chosen:
        started = time.monotonic()
        _execute(alias, f"REINDEX INDEX CONCURRENTLY {quote(index.name)}")
        seconds = time.monotonic() - started
        done = Rebuilt(index.name, index.size, _size_of(alias, quote(index.name)), seconds)
        report.rebuilt.append(done)
        _tell(progress, _rebuilt_line(done))
    return report


def refuse_unless_possible(alias: str) -> None:
    """Raise `MaintenanceRefused` unless `alias` is PostgreSQL outside a transaction."""
    connection = connections[alias]
    if connection.vendor != "postgresql":
        raise MaintenanceRefused(
            f"maintenance rebuilds indexes concurrently, which only PostgreSQL does; "
            f"database {alias!r} is {connection.display_name}"
        )
    if connection.in_atomic_block:
        raise MaintenanceRefused(
            "maintenance cannot run inside a transaction: PostgreSQL refuses "
            "REINDEX CONCURRENTLY there"
        )


def _execute(alias: str, sql: str) -> None:
    with connections[alias].cursor() as cursor:
        cursor.execute(sql)


def _size_of(alias: str, name: str) -> int:
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT pg_relation_size(to_regclass(%s))", [name])
        row = cursor.fetchone()
    return int(row[0] or 0) if row else 0


def _tell(progress: Callable[[str], None] | None, line: str) -> None:
    if progress is not None:
        progress(line)


def _dropped_line(name: str) -> str:
    return f"dropped {name} (left by an interrupted rebuild)"


def _rebuilt_line(index: Rebuilt) -> str:
    before, after = _size(index.before), _size(index.after)
    return f"rebuilt {index.name}: {before} -> {after} in {index.seconds:.1f} s"


def _size(size: int) -> str:
    if size < 1 << 20:
        return f"{size / 1024:.0f} kB"
    return f"{size / (1 << 20):.1f} MB"
