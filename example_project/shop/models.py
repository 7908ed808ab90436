from django.db import models


class Signup(models.Model):
    """Someone who signed up; the welcome email goes out through a venturi job."""

    email = models.EmailField()
    created_at = models.DateTimeField(auto_now_add=True)
    welcome_sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return self.email
