"""Weighted priority slots: HIGH, NORMAL and LOW share claims 6:3:1 by default.

Each tier has a virtual clock. The k-th job a claim could take from tier t gets
the turn `clock[t] + k / weight[t]`; a claim takes the lowest turns first. A tier
that keeps being chosen advances its clock faster, so a lower tier's turn comes
up regularly: LOW is never starved, and HIGH still runs first. A tier with no
work does not bank credit: its clock is brought up to the others', so it cannot
burst ahead when work arrives.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from django_venturi.states import Priority

TIERS: tuple[int, ...] = tuple(int(priority) for priority in Priority)


class TierClock:
    """The per-worker state of the weighted tiers."""

    def __init__(self, weights: Sequence[int]) -> None:
        if len(weights) != len(TIERS) or any(weight < 1 for weight in weights):
            raise ValueError("PRIORITY_WEIGHTS needs three positive integers")
        self.strides = [1.0 / weight for weight in weights]
        self.clocks = [0.0 for _ in TIERS]

    def offsets(self) -> list[float]:
        """The clock of each tier, in `TIERS` order."""
        return list(self.clocks)

    def turns(self, tier: int, count: int) -> list[float]:
        """The turns of the first `count` candidates of a tier."""
        return [self.clocks[tier] + k * self.strides[tier] for k in range(1, count + 1)]

    def record(self, claimed_tiers: Iterable[int], *, limit: int) -> None:
        """Advance the clocks after a claim that took jobs of `claimed_tiers`."""
        counts = [0 for _ in TIERS]
        for tier in claimed_tiers:
            counts[tier] += 1
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
