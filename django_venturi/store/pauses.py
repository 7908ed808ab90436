"""Pausing queues and kinds: workers stop claiming from them, running jobs finish.

A pause is a `Pause` row, so it outlives worker restarts and deploys. Every
claim reads the rows in its own statement (`claim_statement.py`): once a pause
commits, no worker anywhere claims from it. Jobs a worker already claimed but
has not started (its local buffer) are handed back when the worker learns of the
pause: at once through a NOTIFY on PostgreSQL, within a poll interval elsewhere
(`worker/pause_watch.py`).
"""

from __future__ import annotations

import dataclasses
from datetime import datetime

from django.db import connections, transaction

from django_venturi.conf import PAUSE_CHANNEL_SUFFIX, venturi_settings
from django_venturi.payloads import text
from django_venturi.registry import MAX_KIND_LENGTH, MAX_QUEUE_LENGTH, validate_name
from django_venturi.store.notify import wake_workers

API = "api"
"""Who paused it, when paused through `venturi.pause()` without `by=`."""


@dataclasses.dataclass(frozen=True, slots=True)
class Paused:
    """One paused queue or kind."""

    scope: str
    """"queue" or "kind"."""
    name: str
    paused_by: str
    paused_at: datetime

    def describe(self) -> str:
        return f"{self.scope} {self.name}"

    def as_dict(self) -> dict[str, str]:
        """Plain JSON-ready data."""
        return {**dataclasses.asdict(self), "paused_at": self.paused_at.isoformat()}


def pause_channel() -> str:
    """The PostgreSQL channel that tells workers a pause or resume happened."""
    return venturi_settings.NOTIFY_CHANNEL + PAUSE_CHANNEL_SUFFIX


def pause(
    *, queue: str | None = None, kind: str | None = None, by: str = API, using: str | None = None
) -> bool:
    """Pause a queue or a kind: no worker claims its jobs until `resume`; running jobs finish.

    In the caller's transaction if there is one. Returns False if it was paused already.
    """
    from django_venturi.models import Pause  # at call time: the package loads no models

    scope, name = _target(queue, kind)
    if not isinstance(by, str) or not by:
        raise ValueError(f"by must name who pauses (a non-empty str), got {by!r}")
    if problem := text.problem(by):
        raise ValueError(f"by {problem}")
    alias = using or venturi_settings.DATABASE
    with transaction.atomic(using=alias):
        _, created = Pause.objects.using(alias).get_or_create(
            scope=scope, name=name, defaults={"paused_by": by[:200]}
        )
        if created:
            _notify(alias, scope, name, resumed=False)
    return created


def resume(*, queue: str | None = None, kind: str | None = None, using: str | None = None) -> bool:
    """Let workers claim from a paused queue or kind again. False if it was not paused."""
    from django_venturi.models import Pause

    scope, name = _target(queue, kind)
    alias = using or venturi_settings.DATABASE
    with transaction.atomic(using=alias):
        deleted, _ = Pause.objects.using(alias).filter(scope=scope, name=name).delete()
        if deleted:
            _notify(alias, scope, name, resumed=True)
    return bool(deleted)


def paused(*, using: str | None = None) -> list[Paused]:
    """The paused queues and kinds, queues first, by name."""
    from django_venturi.models import Pause

    alias = using or venturi_settings.DATABASE
    return [
        Paused(scope=row.scope, name=row.name, paused_by=row.paused_by, paused_at=row.paused_at)
        for row in Pause.objects.using(alias).order_by("-scope", "name")
    ]


def paused_names(alias: str) -> tuple[set[str], set[str]]:
    """The names of the paused queues, and of the paused kinds."""
    from django_venturi.models import Pause

    queues: set[str] = set()
    kinds: set[str] = set()
    for scope, name in Pause.objects.using(alias).values_list("scope", "name"):
        (queues if scope == Pause.QUEUE else kinds).add(name)
    return queues, kinds


def _target(queue: str | None, kind: str | None) -> tuple[str, str]:
    """("queue", name) or ("kind", name): exactly one of the two must be given."""
    if (queue is None) == (kind is None):
        raise ValueError("give exactly one of queue= and kind=")
    if queue is not None:
        return "queue", validate_name(queue, field="queue", max_length=MAX_QUEUE_LENGTH)
    assert kind is not None
    return "kind", validate_name(kind, field="kind", max_length=MAX_KIND_LENGTH)


def _notify(alias: str, scope: str, name: str, *, resumed: bool) -> None:
    """Tell the workers at commit: a pause hands back their buffered jobs of it, a
    resume wakes them to claim."""
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [pause_channel(), f"{scope}:{name}"])
    if resumed:
        wake_workers(alias, [name if scope == "queue" else ""])
