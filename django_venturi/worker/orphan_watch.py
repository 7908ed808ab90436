"""A worker's look, at start and now and then, for orphan kinds.

What an orphan kind is, and how one is found, is `store/orphan_kinds.py`. At
start, once registered and before it claims, a worker looks at every queue
(`look_at_start`): a `--burst` worker may be gone before its first heartbeat,
and a newcomer whose jobs sit in a queue no worker serves should hear it at
once. After that the look runs on the heartbeat thread, never on the claim
path, at the queues the worker serves, and warns about each orphan kind once,
then again every `WARN_AGAIN_AFTER` while its jobs wait.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from django_venturi.store.orphan_kinds import OrphanKind, find_orphan_kinds

logger = logging.getLogger("django_venturi.worker")

LOOK_EVERY = 60.0
"""Seconds between a worker's looks for orphan kinds in its queues."""
WARN_AGAIN_AFTER = 300.0
"""Seconds before a worker warns again about an orphan kind whose jobs still wait."""


class OrphanWatch:
    """A worker's look, now and then, for orphan kinds in the queues it serves."""

    def __init__(
        self,
        *,
        alias: str,
        worker: str,
        queues: Sequence[str] | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.alias = alias
        self.worker = worker
        self.queues = list(queues) if queues else None
        self._clock = clock
        self._next_look = clock()
        self._warned: dict[str, float] = {}
        """Orphan kind -> when this worker last warned about it."""

    def look_if_due(self) -> None:
        """Look if `LOOK_EVERY` has passed since the last look (the first look: at once)."""
        now = self._clock()
        if now < self._next_look:
            return
        self._next_look = now + LOOK_EVERY
        self.look()

    def look_at_start(self) -> list[OrphanKind]:
        """Warn about every orphan kind of every queue; call it once the worker's row is
        written (the worker counts itself among the live ones)."""
        now = self._clock()
        self._next_look = now + LOOK_EVERY  # the heartbeat's first look comes after this one
        orphans = find_orphan_kinds(self.alias)
        for kind, waiting in by_kind(orphans):
            served = any(self.queues is None or o.queue in self.queues for o in waiting)
            if served:  # the later looks see these: not again before WARN_AGAIN_AFTER
                self._warned[kind] = now
            self._warn(kind, waiting, again=served)
        return orphans

    def look(self) -> list[OrphanKind]:
        """Warn about each orphan kind not warned about within `WARN_AGAIN_AFTER`."""
        orphans = find_orphan_kinds(self.alias, queues=self.queues)
        now = self._clock()
        grouped = by_kind(orphans)
        for kind in set(self._warned) - {kind for kind, _ in grouped}:
            del self._warned[kind]  # its jobs ran or went: if they come back, say so at once
        for kind, waiting in grouped:
            last = self._warned.get(kind)
            if last is None or now - last >= WARN_AGAIN_AFTER:
                self._warned[kind] = now
                self._warn(kind, waiting)
        return orphans

    def _warn(self, kind: str, waiting: list[OrphanKind], *, again: bool = True) -> None:
        jobs = sum(orphan.jobs for orphan in waiting)
        queues = ", ".join(orphan.queue for orphan in waiting)
        oldest = max(orphan.oldest_due_age for orphan in waiting)
        cause = (
            "a live worker knows the kind but none serves its queue"
            if all(orphan.known for orphan in waiting)
            else "no live worker has a task of that kind: is its module one venturi imports "
            "(an app's tasks.py, or VENTURI['TASK_MODULES'])? was the task removed or "
            "renamed? is the kind a typo?"
        )
        repeat = f" (said again every {WARN_AGAIN_AFTER / 60:.0f} min while they wait)"
        logger.warning(
            "worker %s: %d due job%s of kind %r wait%s in queue %s (the oldest for %.0f s) "
            "and no live worker can run them: %s%s",
            self.worker,
            jobs,
            "" if jobs == 1 else "s",
            kind,
            "s" if jobs == 1 else "",
            queues,
            oldest.total_seconds(),
            cause,
            repeat if again else "",
            extra={"worker": self.worker, "kind": kind, "jobs": jobs, "queues": queues},
        )


def by_kind(orphans: Sequence[OrphanKind]) -> list[tuple[str, list[OrphanKind]]]:
    """The orphans grouped by kind (one per queue each), kinds in name order."""
    grouped: dict[str, list[OrphanKind]] = {}
    for orphan in orphans:
        grouped.setdefault(orphan.kind, []).append(orphan)
    return sorted(grouped.items())
