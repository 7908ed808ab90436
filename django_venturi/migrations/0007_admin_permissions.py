"""Permissions of the admin actions: retry, cancel and cleanup (delete uses Django's own)."""


from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('django_venturi', '0006_periodic_task'),
    ]

    operations = [
        migrations.AlterModelOptions(
            name='job',
            options={'permissions': [('retry_job', 'Can retry jobs now (admin action)'), ('cancel_job', 'Can cancel jobs (admin action)'), ('cleanup_jobs', 'Can clean up finished jobs (admin page)')]},
        ),
    ]
