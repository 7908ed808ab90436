"""The live jobs (waiting, ready, running) get an index of their own, by state, kind and
queue: `venturi.stats()`, the stats page and the table's health count them there, at a
cost that follows the backlog rather than the millions of finished rows (on 10,000,000
finished jobs the stats page's two live counts took 120-170 ms each through
`venturi_job_kind_state_idx`, 10-14 ms here). Built concurrently on PostgreSQL."""

from django.db import migrations, models

from django_venturi.migration_operations import AddIndexConcurrently


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_venturi", "0020_maintenance_run"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("state__in", ("waiting", "ready", "running"))),
                fields=["state", "kind", "queue"],
                name="venturi_job_live_idx",
            ),
        ),
    ]
