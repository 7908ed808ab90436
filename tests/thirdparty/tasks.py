"""The app's background tasks, written against the backport (or Django's own framework)."""

from __future__ import annotations

from typing import Any

try:  # like Wagtail: the backport where installed, even on Django 6
    from django_tasks import TaskResult, task
except ImportError:
    from django.tasks import TaskResult, task  # type: ignore[no-redef]


@task(priority=10)
def make_thumbnail(name: str, size: int) -> dict[str, Any]:
    return {"name": name, "thumbnail": f"{name}@{size}px"}


def request_thumbnail(name: str, size: int = 64) -> str:
    """The app's public API: queue a thumbnail and return a handle to poll."""
    return str(make_thumbnail.enqueue(name, size).id)


def thumbnail_status(handle: str) -> TaskResult:  # type: ignore[type-arg]
    return make_thumbnail.get_result(handle)
