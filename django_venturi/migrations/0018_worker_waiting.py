"""Whether a worker has room and waits for a wake-up (`store/waiting_workers.py`): an
enqueue sends its NOTIFY after its commit, and only while a worker of its queue waits.
One column with a database default: existing rows read False, nothing is rewritten."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_venturi', '0017_error_type'),
    ]

    operations = [
        migrations.AddField(
            model_name='workerprocess',
            name='waiting',
            field=models.BooleanField(db_default=False, default=False, help_text='It has room and waits for a wake-up: enqueues send one after their commit.'),
        ),
    ]
