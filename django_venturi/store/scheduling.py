"""Weighted turns: between priority tiers (6:3:1 by default) and, within a tier,
between the queues a worker serves (equal turns, or `QUEUE_WEIGHTS`).

Each tier has a virtual clock. The k-th job a claim could take from tier t gets
the turn `clock[t] + k / weight[t]`; a claim takes the lowest turns first. A tier
that keeps being chosen advances its clock faster, so a lower tier's turn comes
up regularly: LOW is never starved, and HIGH still runs first. A tier with no
work does not bank credit: its clock is brought up to the others', so it cannot
burst ahead when work arrives.

Within a tier the queues take turns the same way, one level down: the k-th due
job of queue q gets the queue turn `queue_clock[t][q] + k / weight[q]`, and the
tier's candidates are put in the order of their queue turns before they get the
tier's turns. So a queue with a million due jobs and a queue with one share a
worker's claims (round robin at equal weights) instead of the older backlog
going first; within a queue the order stays `rank, run_at, id`. The queue clocks
of a tier are kept relative to the turn its last claim reached: a queue this
worker took nothing from lately (no clock, or one that fell below the reached
turn) starts one stride below it, just ahead of the queues that were served,
and banks no credit while it had no work.

A fair kind's keys (`fair_by`) take turns round robin within the places the kind
gets (`claim_fair.py`): each worker keeps, per fair kind, the last key it served
(`fair_cursor`), and its next claim starts at the key after it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from django_venturi.states import Priority

TIERS: tuple[int, ...] = tuple(int(priority) for priority in Priority)

MAX_QUEUE_CLOCKS = 1000
"""The most queue clocks a worker keeps per tier (each claim sends them all). Past it,
the clocks nearest the default go first: those queues lose at most a stride."""


class TierClock:
    """The per-worker state of the weighted turns: the tiers' clocks and, per tier,
    the clocks of the queues claimed from lately."""

    def __init__(
        self, weights: Sequence[int], queue_weights: Mapping[str, int] | None = None
    ) -> None:
        if len(weights) != len(TIERS) or any(weight < 1 for weight in weights):
            raise ValueError("PRIORITY_WEIGHTS needs three positive integers")
        queue_weights = queue_weights or {}
        if any(weight < 1 for weight in queue_weights.values()):
            raise ValueError("QUEUE_WEIGHTS needs positive integers")
        self.strides = [1.0 / weight for weight in weights]
        self.clocks = [0.0 for _ in TIERS]
        self.queue_strides = {queue: 1.0 / weight for queue, weight in queue_weights.items()}
        """The stride of each weighted queue; every other queue's is 1."""
        self.queues: list[dict[str, float]] = [{} for _ in TIERS]
        """Per tier, the clock of each queue claimed from lately (relative to the
        turn the tier's last claim reached; a queue not listed is at `-stride`)."""
        self.fair_cursors: dict[str, str] = {}
        """Per fair kind, the key this worker served last ("": none yet)."""

    def fair_cursor(self, kind: str) -> str:
        """The key of `kind` this worker served last: its next claim starts after it."""
        return self.fair_cursors.get(kind, "")

    def advance_fair(self, last_keys: Mapping[str, str]) -> None:
        """Move each fair kind's cursor to the key of its last turn in a claim."""
        self.fair_cursors.update(last_keys)

    def offsets(self) -> list[float]:
        """The clock of each tier, in `TIERS` order."""
        return list(self.clocks)

    def turns(self, tier: int, count: int) -> list[float]:
        """The turns of the first `count` candidates of a tier."""
        return [self.clocks[tier] + k * self.strides[tier] for k in range(1, count + 1)]

    def queue_stride(self, queue: str) -> float:
        return self.queue_strides.get(queue, 1.0)

    def queue_turns(self, tier: int, queue: str, count: int) -> list[float]:
        """The queue turns of the first `count` candidates of a queue in a tier."""
        stride = self.queue_stride(queue)
        clock = self.queues[tier].get(queue, -stride)
        return [clock + k * stride for k in range(1, count + 1)]

    def queue_offsets(self) -> tuple[list[int], list[str], list[float], list[float]]:
        """Four parallel lists, tier, queue, clock and stride, of every queue with a
        clock or a weight (a queue not listed has the clock -1 and the stride 1)."""
        entries = [
            (tier, queue, self.queues[tier].get(queue, -stride), stride)
            for tier in TIERS
            for queue, stride in self.queue_strides.items()
        ]
        entries += [
            (tier, queue, clock, 1.0)
            for tier, clocks in enumerate(self.queues)
            for queue, clock in clocks.items()
            if queue not in self.queue_strides
        ]
        return (
            [entry[0] for entry in entries],
            [entry[1] for entry in entries],
            [entry[2] for entry in entries],
            [entry[3] for entry in entries],
        )

    def record(self, claimed: Iterable[tuple[int, str]], *, limit: int) -> None:
        """Advance the clocks after a claim that took jobs of these (tier, queue)s."""
        counts = Counter(claimed)
        tier_counts = [0 for _ in TIERS]
        for (tier, _), count in counts.items():
            tier_counts[tier] += count
        self._record_tiers(tier_counts, limit=limit)
        for tier in TIERS:
            taken = {queue: count for (t, queue), count in counts.items() if t == tier}
            if taken:
                self._record_queues(tier, taken)

    def _record_tiers(self, counts: list[int], *, limit: int) -> None:
        for tier, count in enumerate(counts):
            self.clocks[tier] += count * self.strides[tier]
        if sum(counts) < limit:
            # The claim was not full, so every tier it took nothing from was empty.
            reached = max(
                (self.clocks[tier] for tier, count in enumerate(counts) if count),
                default=min(self.clocks),
            )
            for tier, count in enumerate(counts):
                if not count:
                    self.clocks[tier] = max(self.clocks[tier], reached)
        floor = min(self.clocks)
        self.clocks = [clock - floor for clock in self.clocks]

    def _record_queues(self, tier: int, taken: dict[str, int]) -> None:
        """Advance the claimed queues of a tier, then make the turn the claim reached
        the tier's zero and forget the queues left a stride or more below it (they
        had no claimable job: their next one comes at the reached turn)."""
        clocks = self.queues[tier]
        for queue, count in taken.items():
            stride = self.queue_stride(queue)
            clocks[queue] = clocks.get(queue, -stride) + count * stride
        reached = max(clocks[queue] for queue in taken)
        kept = {
            queue: clock - reached
            for queue, clock in clocks.items()
            if clock - reached > -self.queue_stride(queue)
        }
        if len(kept) > MAX_QUEUE_CLOCKS:
            highest = sorted(kept, key=kept.__getitem__, reverse=True)[:MAX_QUEUE_CLOCKS]
            kept = {queue: kept[queue] for queue in highest}
        self.queues[tier] = kept
