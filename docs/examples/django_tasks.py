"""Django's Tasks framework on venturi: a `@task` function, enqueued with its data, read back.

The import below takes Django's own framework (Django 6.0+) and falls back to the
django-tasks backport (Django 5.2), so this module runs under either; a project
writes the one import it needs.
"""

from __future__ import annotations

from django.contrib.auth.models import User
from django.core.mail import send_mail
from django.db import transaction

try:
    from django.tasks import task  # Django 6.0+
except ImportError:
    from django_tasks import task  # the backport, on Django 5.2

# [settings]
TASKS = {
    "default": {
        "BACKEND": "django_venturi.backend.VenturiBackend",
        "QUEUES": ["default", "emails"],  # the queue_name values Tasks may use
        "OPTIONS": {"MAX_ATTEMPTS": 3},  # up to 3 runs; the default, 1, never retries
    }
}
# [settings end]


# [task]
@task(queue_name="emails", priority=10)  # priority above 0: venturi's HIGH tier
def send_invoice(user_id: int, amount_cents: int) -> str:
    user = User.objects.get(pk=user_id)
    send_mail("Your invoice", f"Amount due: {amount_cents / 100:.2f}", None, [user.email])
    return user.email  # stored as JSON: result.return_value


# [task end]


# [enqueue]
def close_account(user_id: int, amount_cents: int) -> str:
    with transaction.atomic():
        User.objects.filter(pk=user_id).update(is_active=False)
        result = send_invoice.enqueue(user_id, amount_cents)  # in this transaction
    return str(result.id)  # keep the id to read the result back later


# [enqueue end]


# [result]
def invoice_status(result_id: str) -> str:
    result = send_invoice.get_result(result_id)  # from any process
    if result.status == "SUCCESSFUL":
        return f"sent to {result.return_value}"
    if result.status == "FAILED":
        return f"failed after {result.attempts} run(s): {result.errors[-1].exception_class_path}"
    return str(result.status).lower()  # "ready" or "running"


# [result end]
