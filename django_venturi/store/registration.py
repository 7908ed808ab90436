"""The worker registry: one `WorkerProcess` row per worker process, kept fresh by its heartbeat.

A worker upserts its row when it starts (with the queues it serves and the
kinds it can run), refreshes `heartbeat_at`, `running`
and `processed` at each heartbeat, and sets `stopped_at` when it stops. A
worker killed without a chance to say so keeps its row with an old heartbeat:
`is_stale()` tells those apart, so the admin and health checks can show them.
Rows of stopped workers are pruned by `venturi.cleanup()`.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Q

from django_venturi.conf import venturi_settings
from django_venturi.store.clock import now_expression

STALE_HEARTBEATS = 3
"""A worker whose heartbeat is older than this many heartbeat intervals is stale."""


@dataclass(frozen=True, slots=True)
class Peer:
    """A live worker as the registry lists it."""

    name: str
    queues: Sequence[str] | None
    """The queues it serves; None: all."""
    kinds: Sequence[str] | None
    """The kinds it can run; None: not reported."""


def stale_after() -> timedelta:
    """How old a heartbeat may be before its worker counts as stale."""
    return venturi_settings.HEARTBEAT_INTERVAL * STALE_HEARTBEATS


def is_stale(heartbeat_at: datetime, now: datetime, *, after: timedelta | None = None) -> bool:
    """True when a running worker's last heartbeat is too old (it died or hangs)."""
    return now - heartbeat_at > (stale_after() if after is None else after)


def register(
    alias: str,
    *,
    name: str,
    queues: Sequence[str] | None,
    concurrency: int,
    heartbeat_interval: timedelta = timedelta(0),
    kinds: Sequence[str] | None = None,
) -> None:
    """Create or reset the row of a starting worker (a reused name starts afresh).

    `kinds`: the kinds it can run (`orphan_kinds.runnable_kinds`), so that jobs no
    live worker can run are found (None: not reported, as from an older worker).

    `heartbeat_interval`: how often it beats. Its leases are not recovered by
    others while it beat within two intervals before they ran out
    (`leases.recover_expired`).
    """
    from django_venturi.models import (  # at call time: importing the package must not load models
        WorkerProcess,
    )

    now = now_expression(alias)
    WorkerProcess.objects.using(alias).update_or_create(
        name=name,
        defaults={
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "queues": list(queues) if queues else None,
            "kinds": None if kinds is None else list(kinds),
            "concurrency": concurrency,
            "started_at": now,
            "heartbeat_at": now,
            "stopped_at": None,
            "running": 0,
            "processed": 0,
            "heartbeat_grace": heartbeat_interval * 2,
            "waiting": False,
        },
    )


def beat(alias: str, *, name: str, running: int, processed: int) -> bool:
    """Refresh a live worker's row; False if the row is gone (pruned while it ran)."""
    from django_venturi.models import WorkerProcess

    updated = (
        WorkerProcess.objects.using(alias)
        .filter(name=name)
        .update(heartbeat_at=now_expression(alias), running=running, processed=processed)
    )
    return updated > 0


def stopped(alias: str, *, name: str, processed: int) -> None:
    """Mark a worker's row as stopped, holding no jobs."""
    from django_venturi.models import WorkerProcess

    now = now_expression(alias)
    WorkerProcess.objects.using(alias).filter(name=name).update(
        stopped_at=now, heartbeat_at=now, running=0, processed=processed, waiting=False
    )


def live_peers(alias: str) -> list[Peer]:
    """The workers that run and beat (this one too): the members of wake-up groups."""
    from django_venturi.models import WorkerProcess

    rows = (
        WorkerProcess.objects.using(alias)
        .filter(stopped_at__isnull=True, heartbeat_at__gte=now_expression(alias) - stale_after())
        .values_list("name", "queues", "kinds")
    )
    return [Peer(name, queues, kinds) for name, queues, kinds in rows]


def prune(alias: str, *, older_than: timedelta) -> int:
    """Delete rows of workers stopped (or silent) for longer than `older_than`."""
    from django_venturi.models import WorkerProcess

    cutoff = now_expression(alias) - older_than
    deleted, _ = (
        WorkerProcess.objects.using(alias)
        .filter(Q(stopped_at__lt=cutoff) | Q(stopped_at__isnull=True, heartbeat_at__lt=cutoff))
        .delete()
    )
    return deleted
