"""Autovacuum and analyze thresholds of the job table, sized for a churning queue
(PostgreSQL only; elsewhere a no-op).

PostgreSQL vacuums a table once 20 % of it is dead rows (analyzes at 10 % changed):
with a week of finished jobs kept, millions of dead rows pile up between vacuums
while the queue churns. Here: 1,000 rows plus 1 % of the table. `benchmarks/churn.py`
measured it against the defaults (docs/production.md has the figures).

No `fillfactor`: every update of a job changes its `state`, which the job table's
indexes name (partial indexes' conditions count), so no update of a job can be a
HOT update whatever room its page has; measured, a fillfactor of 80 made the table
28 % larger and not one update HOT. Setting storage parameters rewrites nothing.
"""

from django.db import migrations

from django_venturi.migration_operations import SetStorageParameters


class Migration(migrations.Migration):

    dependencies = [
        ('django_venturi', '0018_worker_waiting'),
    ]

    operations = [
        SetStorageParameters(
            model_name='job',
            parameters={
                'autovacuum_vacuum_scale_factor': 0.01,
                'autovacuum_vacuum_threshold': 1000,
                'autovacuum_vacuum_insert_scale_factor': 0.01,
                'autovacuum_vacuum_insert_threshold': 1000,
                'autovacuum_analyze_scale_factor': 0.01,
                'autovacuum_analyze_threshold': 1000,
            },
        ),
    ]
