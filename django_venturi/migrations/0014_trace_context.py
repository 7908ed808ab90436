"""The W3C trace context of the span that enqueued a job (`tracing.py`). A nullable
column without a default: added without rewriting the table, and NULL for every job
enqueued before it, or without `METRICS`."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_venturi", "0013_fair_key"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="trace_context",
            field=models.JSONField(
                blank=True,
                help_text="The W3C trace context (traceparent, tracestate) of the span that "
                "enqueued the job, with METRICS on: each run's span links to it.",
                null=True,
            ),
        ),
    ]
