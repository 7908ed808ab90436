"""Waking workers: NOTIFY on the wake-up channel, sent when the caller's transaction commits.

Each worker's listener (`worker/listener.py`) LISTENs on the channel; on
SQLite and MariaDB there is no NOTIFY and workers poll.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import connections

from django_venturi.conf import venturi_settings


def wake_workers(alias: str, queues: Iterable[str]) -> None:
    """Notify the wake-up channel once per queue (PostgreSQL; elsewhere workers poll).

    Delivered when the caller's transaction commits, like an enqueue's notification.
    A queue may carry the first rank to call (`wake_order.Call.handed_on`).
    """
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        for queue in sorted(set(queues)):
            cursor.execute("SELECT pg_notify(%s, %s)", [venturi_settings.NOTIFY_CHANNEL, queue])
