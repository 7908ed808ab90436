"""The chaos soak's producer (benchmarks/chaos.py): a steady mix of jobs, and what it made.

It enqueues through its own connection straight to the server (not through the
proxy the workers use), so it knows what exists; a read-only window or a restart
refuses its enqueues, which it counts and tries again at the next tick. An error
at a keyed enqueue leaves that key's count uncertain (the merge may have been
committed before the answer was lost): that key's sum is then not checked.
"""

from __future__ import annotations

import collections
import random
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError, connections

KEYS = 40
"""Keys of the keyed (merging) jobs."""
CHAIN_STEPS = 3
MIX = (
    ("plain", 0.30),
    ("atomic", 0.20),
    ("keyed", 0.15),
    ("chain", 0.05),
    ("limited", 0.10),
    ("capped", 0.05),
    ("slow", 0.15),
)


@dataclass
class Produced:
    """What the producer enqueued and asked for: the checks compare the end state to it."""

    ids: dict[str, set[int]] = field(default_factory=lambda: collections.defaultdict(set))
    """Kind (short name) -> job ids."""
    keyed: collections.Counter[str] = field(default_factory=collections.Counter)
    """Key -> enqueues accepted."""
    uncertain_keys: set[str] = field(default_factory=set)
    chains: list[list[int]] = field(default_factory=list)
    cancel_asked: dict[int, float] = field(default_factory=dict)
    """Job id -> when its cancel was asked (wall clock)."""
    refused: int = 0
    """Batches of enqueues the database refused (read-only, restarting): tried again later."""

    @property
    def enqueued(self) -> int:
        return sum(len(ids) for ids in self.ids.values())


class Producer:
    """Enqueues `rate` jobs a second on average, in small batches at each tick."""

    def __init__(self, rate: float, rng: random.Random) -> None:
        self.rate = rate
        self.rng = rng
        self.produced = Produced()
        self._owed = 0.0

    def tick(self, elapsed: float) -> None:
        """Enqueue the jobs due for the `elapsed` seconds since the last tick."""
        self._owed += self.rate * elapsed
        count = int(self._owed)
        if count == 0:
            return
        try:
            self._enqueue(count)
        except DatabaseError:
            self.produced.refused += 1
            connections.close_all()  # a restart left the connection broken
        else:
            self._owed -= count

    def _enqueue(self, count: int) -> None:
        import django_venturi as venturi
        from benchmarks.bench_project.benchapp import chaos_tasks as tasks

        simple: dict[str, Any] = {
            "plain": tasks.Plain,
            "atomic": tasks.Atomic,
            "limited": tasks.Limited,
            "capped": tasks.Capped,
        }
        batch: list[tuple[str, venturi.Task]] = []
        names = [name for name, _ in MIX]
        weights = [weight for _, weight in MIX]
        for name in self.rng.choices(names, weights, k=count):
            if name in simple:
                batch.append((name, simple[name](n=self.rng.randrange(1 << 30))))
            elif name == "slow":
                batch.append((name, tasks.Slow(seconds=self.rng.uniform(0.5, 2.0))))
            elif name == "keyed":
                self._keyed(tasks.Keyed(key=f"k{self.rng.randrange(KEYS)}"))
            else:
                self._chain()
        if batch:
            jobs = venturi.enqueue_many([task for _, task in batch])
            for (name, _), job in zip(batch, jobs, strict=True):
                self.produced.ids[name].add(job.pk)

    def _keyed(self, task: object) -> None:
        key: str = task.key  # type: ignore[attr-defined]
        try:
            job = task.enqueue()  # type: ignore[attr-defined]
        except DatabaseError:
            self.produced.uncertain_keys.add(key)
            raise
        self.produced.keyed[key] += 1
        self.produced.ids["keyed"].add(job.pk)

    def _chain(self) -> None:
        import django_venturi as venturi
        from benchmarks.bench_project.benchapp.chaos_tasks import Step

        number = len(self.produced.chains)
        jobs = venturi.chain(*(Step(chain=number, index=i) for i in range(CHAIN_STEPS))).enqueue()
        ids = [job.pk for job in jobs]
        self.produced.chains.append(ids)
        self.produced.ids["step"].update(ids)

    def cancel_some(self, now: float) -> list[int]:
        """Cancel a few slow jobs and, now and then, a chain's first step (its dependents
        end cancelled with it); the ids asked."""
        slow = sorted(self.produced.ids["slow"] - set(self.produced.cancel_asked))
        asked = self.rng.sample(slow[-50:], min(len(slow[-50:]), self.rng.randint(1, 4)))
        if self.produced.chains and self.rng.random() < 0.3:
            asked.append(self.rng.choice(self.produced.chains[-20:])[0])
        if asked:
            import django_venturi as venturi

            venturi.cancel(asked)
            self.produced.cancel_asked.update(dict.fromkeys(asked, now))
        return asked
