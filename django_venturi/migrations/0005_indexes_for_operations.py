"""The claim index gains the rank column; periodic ticks get their unique index.

Both are built concurrently on PostgreSQL, so enqueues and claims go on while a
large job table is indexed (the new claim index is in place before the old one
is dropped, so claims never lose their index).
"""

from django.db import migrations, models

from django_venturi.migration_operations import (
    AddIndexConcurrently,
    AddUniqueIndexConcurrently,
    RemoveIndexConcurrently,
)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_venturi", "0004_schema_for_operations"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("state", "ready")),
                fields=["queue", "priority", "rank", "run_at", "id"],
                name="venturi_job_claim_rank_idx",
            ),
        ),
        RemoveIndexConcurrently(model_name="job", name="venturi_job_claim_idx"),
        AddUniqueIndexConcurrently(
            model_name="job",
            constraint=models.UniqueConstraint(
                condition=models.Q(("periodic_tick__isnull", False)),
                fields=("kind", "periodic_tick"),
                name="venturi_job_periodic_tick_uniq",
            ),
        ),
    ]
