"""Each periodic schedule's state in the database (enabled or disabled, by whom, and when a
worker first saw it: `store/schedule_states.py`), and the permission of the periodic
page's run now, disable and enable buttons. A new table: nothing existing is rewritten."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_venturi', '0014_trace_context'),
    ]

    operations = [
        migrations.CreateModel(
            name='ScheduleState',
            fields=[
                ('kind', models.CharField(max_length=200, primary_key=True, serialize=False)),
                ('enabled', models.BooleanField(default=True, help_text="Whether workers enqueue its ticks (a disabled one's are skipped).")),
                ('changed_by', models.CharField(blank=True, default='', help_text='Who last disabled or enabled it.', max_length=200)),
                ('changed_at', models.DateTimeField(blank=True, help_text='When it was last disabled or enabled.', null=True)),
                ('first_seen_at', models.DateTimeField(help_text='When a worker first saw the schedule: a missed tick before it is not caught up.')),
            ],
            options={
                'verbose_name': 'schedule state',
            },
        ),
        migrations.AlterModelOptions(
            name='job',
            options={'permissions': [('retry_job', 'Can retry jobs now (admin action)'), ('cancel_job', 'Can cancel jobs (admin action)'), ('cleanup_jobs', 'Can clean up finished jobs (admin page)'), ('pause_queues', 'Can pause and resume queues and kinds (admin stats page)'), ('manage_schedules', 'Can run, disable and enable periodic schedules (admin periodic page)')]},
        ),
    ]
