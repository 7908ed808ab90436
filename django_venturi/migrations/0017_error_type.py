"""Jobs get `error_type`, the exception type of their `last_error`, for the admin's filter.

The column is added with a constant default (no table rewrite on PostgreSQL 11+).
Rows that failed before it existed get their type derived from `last_error`
(`store.error_types.error_type_of`), a batch of ids at a time, each batch its own
short transaction (`atomic = False`), so a large table is never locked whole.
The partial index on the typed rows whose error is current (failed, or ready
again after a failed run) is then built concurrently on PostgreSQL.
"""

from typing import Any

from django.db import migrations, models, transaction

from django_venturi.migration_operations import AddIndexConcurrently
from django_venturi.store.error_types import error_type_of

BATCH = 5_000


def fill_error_types(apps: Any, schema_editor: Any) -> None:
    """Derive the type of each row with a `last_error`, in batches by id."""
    alias = schema_editor.connection.alias
    jobs = apps.get_model("django_venturi", "Job").objects.using(alias)
    after = 0
    while True:
        rows = list(
            jobs.filter(id__gt=after)
            .exclude(last_error="")
            .order_by("id")
            .values_list("id", "last_error")[:BATCH]
        )
        if not rows:
            return
        by_type: dict[str, list[int]] = {}
        for job_id, last_error in rows:
            error_type = error_type_of(last_error)
            if error_type:
                by_type.setdefault(error_type, []).append(job_id)
        with transaction.atomic(using=alias):
            for error_type, ids in by_type.items():
                jobs.filter(id__in=ids, error_type="").update(error_type=error_type)
        after = rows[-1][0]


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_venturi", "0016_history_rollups"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="error_type",
            field=models.CharField(
                blank=True,
                db_default="",
                help_text="The exception type of last_error (`module.Name`), for the admin's filter.",
                max_length=300,
            ),
        ),
        migrations.RunPython(fill_error_types, migrations.RunPython.noop, elidable=True),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(
                    models.Q(("error_type", ""), _negated=True),
                    models.Q(
                        ("state", "failed"),
                        models.Q(("failures__gt", 0), ("state", "ready")),
                        _connector="OR",
                    ),
                ),
                fields=["error_type", "id"],
                name="venturi_job_error_type_idx",
            ),
        ),
    ]
