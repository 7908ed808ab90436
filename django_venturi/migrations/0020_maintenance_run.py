"""The latest run of each maintenance task (`venturi_maintenance`, `VENTURI["MAINTENANCE"]`):
workers read it to run a task once per interval between them all. A new table."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_venturi', '0019_job_table_storage'),
    ]

    operations = [
        migrations.CreateModel(
            name='MaintenanceRun',
            fields=[
                ('task', models.CharField(max_length=50, primary_key=True, serialize=False)),
                ('started_at', models.DateTimeField(help_text='When the latest run began.')),
                ('finished_at', models.DateTimeField(blank=True, help_text='When it ended; empty while it runs or if it failed.', null=True)),
                ('report', models.TextField(blank=True, default='', help_text='What it did, or its error.')),
            ],
            options={
                'verbose_name': 'maintenance run',
            },
        ),
    ]
