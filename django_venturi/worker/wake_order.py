"""Which idle workers answer a wake-up notification, so that one enqueue costs at
most two claims however many workers listen.

Every worker LISTENs on the wake-up channel, and every enqueue NOTIFYs it with
the job's queue. If each listening worker claimed at each notification, eight idle
workers would send eight claims for one job, seven of them empty.

Workers alike (the same queues and the same runnable kinds, read from the
registry's live rows at each heartbeat) form a group, ordered by name. A
notification `"<queue>"` calls the group's first two workers (ranks 0 and 1: two,
so that a worker that died a moment ago, still listed as live, leaves one);
`"<queue> <hop>"` calls ranks `hop` and `hop + 1`. A called worker claims. If it
had no room, or its claim came back full (more may be due), it hands the call on
to the next two (`hop + 2`) with a notification of its own, at most once per
HAND_ON_INTERVAL for the same call, so that a busy group does not answer each
enqueue with a chain of notifications. Workers of other groups answer for
themselves: each group has its own first two.

A worker killed without a word (`kill -9`, a lost node) keeps a registry row that
looks live for `registration.stale_after()` (30 s by default): as the first of its
group it would be called, and would answer nothing, all that time. So the group
counts only workers whose listener is connected, as PostgreSQL sees it: each
listener holds a lock named after its worker (`store/listener_locks.py`), and
`ListenerLocks` looks at who holds one when the listener connects, when the
registry lists other workers than at the last look, and when a call passes this
worker by (at most once per LOOK_INTERVAL): a call that passed it by and calls it
once the dead are left out is answered then, one round trip late.

Nothing here is needed for a job to run: every worker still claims at each
poll (`POLL_INTERVAL`), whether it was called or not. A worker not (yet) in its own
view of the registry answers every notification, as do notifications without a
payload (a raw `NOTIFY venturi`) and the listener's reconnects.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django_venturi.store import listener_locks
from django_venturi.store.registration import Peer

if TYPE_CHECKING:
    import psycopg

logger = logging.getLogger("django_venturi.worker")

RESPONDERS = 2
"""How many workers of a group each notification (or each hand-on) calls."""
HAND_ON_INTERVAL = 0.05
"""A worker hands the same call on at most once per this many seconds."""
LOOK_INTERVAL = 1.0
"""A call passing a worker by makes it look at whose listeners are connected at most
once per this many seconds."""
PASSED_MEMORY = 1.0
"""How long a call that passed a worker by may still be answered by it, should a look
show that the workers it called are gone."""


@dataclass(frozen=True, slots=True)
class Call:
    """A notification that called this worker: its queue, and the first rank it called."""

    queue: str
    hop: int

    @classmethod
    def parse(cls, payload: str) -> Call:
        queue, _, hop = payload.partition(" ")
        return cls(queue, int(hop) if hop.isdigit() else 0)

    def handed_on(self) -> str:
        """The payload that calls the next workers of the group."""
        return f"{self.queue} {self.hop + RESPONDERS}"


class WakeOrder:
    """One worker's place in its group, and the calls it has to answer or hand on.

    `see` runs in the heartbeat thread, `answers` in the listener's, the rest in
    the claim loop's (the main thread): only the calls that came cross threads.
    """

    def __init__(
        self, *, worker: str, queues: Sequence[str] | None, kinds: Sequence[str] | None
    ) -> None:
        self.worker = worker
        self._serves = None if not queues else frozenset(queues)
        self._profile = _profile(queues, kinds)
        self._place: tuple[int, int] | None = None
        """(rank, group size), or None while this worker is not in its own view."""
        self._lock = threading.Lock()
        self._calls: set[Call] = set()
        """Calls from the listener, not yet taken (under `_lock`)."""
        self._deferred: dict[Call, float] = {}
        """Calls to hand on again, and when (the claim loop's own)."""
        self._handed_at: dict[Call, float] = {}
        """When each call was last handed on (the claim loop's own)."""
        self._view_lock = threading.Lock()
        self._alike: list[str] = []
        """The registry's live workers alike to this one, by name (under `_view_lock`)."""
        self._listening: frozenset[int] | None = None
        """The listener-lock keys held at the last look; None: not known (under `_view_lock`)."""
        self._looked_at = float("-inf")
        """When the listener last looked (`time.monotonic()`; the listener's own)."""
        self._look_wanted = True
        """The registry lists workers the last look did not know of."""
        self._passed: dict[Call, float] = {}
        """Calls that passed this worker by, and when (the listener's own)."""

    def see(self, peers: Iterable[Peer]) -> None:
        """Take the registry's live workers as the group's members."""
        alike = sorted(
            peer.name for peer in peers if _profile(peer.queues, peer.kinds) == self._profile
        )
        with self._view_lock:
            if self._listening is None or any(
                listener_locks.key(name) not in self._listening for name in alike
            ):
                self._look_wanted = True
            self._alike = alike
            self._arrange()

    def hear(self, listening: frozenset[int] | None) -> bool:
        """Take the workers whose listeners hold their lock (None: not known) as the only
        ones that can answer; True if a call that passed this worker by calls it now
        (it is noted: wake the claim loop)."""
        now = time.monotonic()
        with self._view_lock:
            self._listening = listening
            self._looked_at = now
            self._look_wanted = False
            self._arrange()
        called = [
            call
            for call, at in self._passed.items()
            if now - at <= PASSED_MEMORY and self._calls_this_worker(call)
        ]
        self._passed.clear()
        if called:
            with self._lock:
                self._calls.update(called)
        return bool(called)

    def look_due(self) -> bool:
        """Whether the listener should look at whose listeners are connected now."""
        if self._look_wanted:
            return True
        return bool(self._passed) and time.monotonic() - self._looked_at >= LOOK_INTERVAL

    def _arrange(self) -> None:
        """This worker's place among the workers alike that can hear (under `_view_lock`).

        The listener locks count only when this worker's own is seen: otherwise its
        listener is away, or looks at another database than its peers' locks."""
        group = self._alike
        listening = self._listening
        if listening is not None and listener_locks.key(self.worker) in listening:
            group = [name for name in group if listener_locks.key(name) in listening]
        place = (group.index(self.worker), len(group)) if self.worker in group else None
        if place != self._place:
            logger.debug(
                "worker %s is %s of its wake-up group",
                self.worker,
                "not yet listed" if place is None else f"number {place[0] + 1} of {place[1]}",
            )
        self._place = place

    def answers(self, payload: str | None) -> bool:
        """Whether a notification calls this worker; if it does, note the call."""
        if not payload:
            return True
        call = Call.parse(payload)
        if self._serves is not None and call.queue not in self._serves:
            return False
        if not self._calls_this_worker(call):
            self._passed[call] = time.monotonic()
            return False
        with self._lock:
            self._calls.add(call)
        return True

    def _calls_this_worker(self, call: Call) -> bool:
        place = self._place
        if place is None:
            return True
        rank, _ = place
        return call.hop <= rank < call.hop + RESPONDERS

    def take(self) -> list[Call]:
        """The calls to answer now: those that came, and those deferred until now."""
        now = time.monotonic()
        due = {call for call, at in self._deferred.items() if at <= now}
        for call in due:
            del self._deferred[call]
        with self._lock:
            came, self._calls = self._calls, set()
        return list(came | due)

    def hand_on(self, calls: Iterable[Call]) -> list[str]:
        """The payloads that call the next workers for `calls` this worker could not
        answer in full; a call handed on less than HAND_ON_INTERVAL ago waits."""
        place = self._place
        size = place[1] if place is not None else 0
        now = time.monotonic()
        payloads = []
        for call in calls:
            if call.hop + RESPONDERS >= size:
                continue  # every worker of the group was called
            last = self._handed_at.get(call)
            if last is not None and now - last < HAND_ON_INTERVAL:
                self._deferred[call] = last + HAND_ON_INTERVAL
                continue
            self._handed_at[call] = now
            payloads.append(call.handed_on())
        return payloads

    def next_deferred(self) -> float | None:
        """When the first deferred call is due (`time.monotonic()`), or None."""
        return min(self._deferred.values(), default=None)


class ListenerLocks:
    """The listener's side of the wake order: it holds this worker's listener lock and
    looks at who holds theirs (a `listener.Session`, run in the listener's thread on
    its connection)."""

    def __init__(self, order: WakeOrder, *, wake: Callable[[], None]) -> None:
        self.order = order
        self._wake = wake

    def opened(self, connection: psycopg.Connection[Any]) -> None:
        if not listener_locks.take(connection, self.order.worker):
            logger.debug("worker %s shares its listener lock", self.order.worker)
        self._look(connection)

    def between(self, connection: psycopg.Connection[Any]) -> bool:
        if not self.order.look_due():
            return False
        self._look(connection)
        return True

    def closed(self) -> None:
        self.order.hear(None)

    def _look(self, connection: psycopg.Connection[Any]) -> None:
        if self.order.hear(listener_locks.holders(connection)):
            self._wake()


def _profile(
    queues: Sequence[str] | None, kinds: Sequence[str] | None
) -> tuple[tuple[str, ...] | None, tuple[str, ...] | None]:
    """What makes two workers alike: the queues they serve and the kinds they run."""
    return (
        None if not queues else tuple(sorted(set(queues))),
        None if kinds is None else tuple(sorted(set(kinds))),
    )
