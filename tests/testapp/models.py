from django.db import models


class Record(models.Model):
    """What test handlers leave behind, so tests can see what ran and with what."""

    job_id = models.BigIntegerField()
    kind = models.CharField(max_length=200)
    attempt = models.PositiveIntegerField()
    value = models.JSONField(null=True)
    created_at = models.DateTimeField(auto_now_add=True)


class Account(models.Model):
    """A model saved in the same transaction as an enqueue."""

    email = models.CharField(max_length=200)
