"""The library's tasks; nothing imports this module at start-up (not an app, not in
VENTURI["TASK_MODULES"]): the tests import it late, as a library is imported on first use."""

from __future__ import annotations

try:  # the backport where installed, as Wagtail and its libraries do, even on Django 6
    from django_tasks import task
except ImportError:
    from django.tasks import task  # type: ignore[no-redef]


@task
def shout(word: str) -> str:
    return f"{word.upper()}!"
