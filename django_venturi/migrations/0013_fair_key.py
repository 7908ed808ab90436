"""Fair kinds (`fair_by=`): each job's key, and the index the claim finds the keys of
due jobs in. The column is added without a default (no table rewrite) and the index
is built concurrently on PostgreSQL, so enqueues and claims go on meanwhile."""

from django.db import migrations, models

from django_venturi.migration_operations import AddIndexConcurrently


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_venturi", "0012_journal_without_constraint"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="fair_key",
            field=models.TextField(
                blank=True,
                help_text="The value of the task's fair_by field: the kind's jobs take turns by it.",
                null=True,
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("fair_key__isnull", False), ("state", "ready")),
                fields=["queue", "priority", "rank", "kind", "fair_key", "run_at", "id"],
                name="venturi_job_fair_idx",
            ),
        ),
    ]
