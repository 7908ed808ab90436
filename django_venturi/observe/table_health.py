"""The job table's health: its rows by state, dead rows, sizes, the last vacuum, analyze and
reindex, and warnings past thresholds (`venturi_stats`, the admin's stats page).

Cheap on a table of millions of rows: live states are counted (their partial
indexes keep that small), finished rows are PostgreSQL's estimate (the table's
live rows in its statistics, less the live jobs), and the rest is read from the
statistics views and the catalog. Off PostgreSQL there are counts only.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from typing import Any

from django.db import connections
from django.db.models import Count

from django_venturi.conf import venturi_settings
from django_venturi.states import State
from django_venturi.store.clock import database_time
from django_venturi.store.reindex import indexes

DEAD_SHARE_WARNING = 0.2
"""Warn when dead rows are more than this share of the table's rows..."""
DEAD_ROWS_WARNING = 10_000
"""...and more than this many (a small table's dead rows do not matter)."""
VACUUM_AGE_WARNING = timedelta(days=1)
"""Warn when dead rows wait and no vacuum ran for this long."""

LIVE_STATES = (State.WAITING, State.READY, State.RUNNING)

_STATISTICS_SQL = """
SELECT n_live_tup, n_dead_tup, pg_table_size(relid), pg_indexes_size(relid),
       greatest(last_vacuum, last_autovacuum), greatest(last_analyze, last_autoanalyze),
       current_setting('autovacuum')
FROM pg_stat_user_tables WHERE relid = %s::regclass
"""


@dataclasses.dataclass(frozen=True, slots=True)
class TableHealth:
    """The job table's figures at one moment, with what looks wrong in them."""

    table: str
    rows_by_state: dict[str, int]
    """Live states counted; finished states together under `finished` (an estimate)."""
    dead_rows: int | None = None
    table_bytes: int | None = None
    index_bytes: int | None = None
    last_vacuum: datetime | None = None
    """The latest vacuum, by autovacuum or by hand."""
    last_analyze: datetime | None = None
    last_reindex: datetime | None = None
    """When the latest `venturi_maintenance reindex` (or a worker's) finished."""
    warnings: list[str] = dataclasses.field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: times as ISO 8601."""
        values = dataclasses.asdict(self)
        for key, value in values.items():
            if isinstance(value, datetime):
                values[key] = value.isoformat()
        return values

    def lines(self) -> list[str]:
        """The figures in words, for a terminal."""
        states = ", ".join(f"{n:,} {state}" for state, n in self.rows_by_state.items())
        lines = [f"job table {self.table}: {states}"]
        if self.table_bytes is not None and self.index_bytes is not None:
            lines.append(
                f"  {self.dead_rows or 0:,} dead rows; table {megabytes(self.table_bytes)}, "
                f"indexes {megabytes(self.index_bytes)}; last vacuum {when(self.last_vacuum)}, "
                f"analyze {when(self.last_analyze)}, reindex {when(self.last_reindex)}"
            )
        lines.extend(f"  WARNING: {warning}" for warning in self.warnings)
        return lines


def table_health(using: str | None = None) -> TableHealth:
    """The job table's health on `using` (default: `VENTURI["DATABASE"]`)."""
    from django_venturi.models import Job

    alias = using or venturi_settings.DATABASE
    table = Job._meta.db_table
    live = dict(
        Job.objects.using(alias)
        .filter(state__in=LIVE_STATES)
        .values_list("state")
        .annotate(n=Count("id"))
        .values_list("state", "n")
    )
    counted = {str(state): live.get(state, 0) for state in LIVE_STATES}
    if connections[alias].vendor != "postgresql":
        finished = Job.objects.using(alias).exclude(state__in=LIVE_STATES).count()
        return TableHealth(table, {**counted, "finished": finished})
    return _postgresql_health(alias, table, counted)


def _postgresql_health(alias: str, table: str, counted: dict[str, int]) -> TableHealth:
    with connections[alias].cursor() as cursor:
        cursor.execute(_STATISTICS_SQL, [connections[alias].ops.quote_name(table)])
        row = cursor.fetchone()
    if row is None:  # no statistics row yet: a table never read or written
        row = (0, 0, 0, 0, None, None, "on")
    live_rows, dead, table_bytes, index_bytes, vacuumed, analyzed, autovacuum = row
    finished = max(0, live_rows - sum(counted.values()))
    health = TableHealth(
        table,
        {**counted, "finished": finished},
        dead_rows=dead,
        table_bytes=table_bytes,
        index_bytes=index_bytes,
        last_vacuum=vacuumed,
        last_analyze=analyzed,
        last_reindex=_last_reindex(alias),
    )
    health.warnings.extend(_warnings(alias, health, live_rows, autovacuum == "on"))
    return health


def _last_reindex(alias: str) -> datetime | None:
    from django_venturi.models import MaintenanceRun
    from django_venturi.store.maintenance import REINDEX

    run = MaintenanceRun.objects.using(alias).filter(task=REINDEX).first()
    return None if run is None else run.finished_at


def _warnings(alias: str, health: TableHealth, live_rows: int, autovacuum: bool) -> list[str]:
    warnings = []
    dead = health.dead_rows or 0
    if not autovacuum:
        warnings.append(
            "autovacuum is off on this server: nothing reclaims what updates and deletes leave"
        )
    if dead > DEAD_ROWS_WARNING and dead > DEAD_SHARE_WARNING * (dead + live_rows):
        warnings.append(
            f"{dead:,} dead rows, {dead / (dead + live_rows):.0%} of the table: "
            "autovacuum is not keeping up (see 'Table health' in the production guide)"
        )
    now = database_time(alias)
    if dead > DEAD_ROWS_WARNING and (
        health.last_vacuum is None or now - health.last_vacuum > VACUUM_AGE_WARNING
    ):
        warnings.append(f"{dead:,} dead rows and no vacuum for more than a day")
    for index in indexes(alias):
        if index.table != health.table:
            continue
        if index.leftover and not index.valid:
            warnings.append(
                f"{index.name} is left by an interrupted rebuild: "
                "run manage.py venturi_maintenance reindex"
            )
        elif index.bloated and index.packed_size:
            warnings.append(
                f"{index.name} is {index.size / index.packed_size:.1f}x the size its entries "
                "need: run manage.py venturi_maintenance reindex"
            )
    return warnings


def megabytes(size: int) -> str:
    """`12.3 MB`."""
    return f"{size / (1 << 20):.1f} MB"


def when(moment: datetime | None) -> str:
    """`2026-12-08 01:02 UTC`, or `never`."""
    return "never" if moment is None else f"{moment:%Y-%m-%d %H:%M %Z}".rstrip()
