"""Deduplication: one live job per key, and a merge that folds new requests into it."""

from __future__ import annotations

import dataclasses

import django_venturi as venturi


# [dedup]
@venturi.task(kind="docs.recompute_score")
@dataclasses.dataclass
class RecomputeScore(venturi.Task):
    user_id: int
    requests: int = 1

    def dedup_key(self) -> str | None:
        return f"user:{self.user_id}"  # at most one live job per user

    def merge(self, existing: venturi.Existing[RecomputeScore]) -> venturi.Merge:
        if existing.state == venturi.State.RUNNING:
            # It may have read the old data already: run once more after it.
            return venturi.Merge.enqueue()
        # Still waiting: fold this request into it.
        requests = existing.payload.requests + self.requests
        return venturi.Merge.update(dataclasses.replace(existing.payload, requests=requests))

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        return venturi.Outcome.completed()


# [dedup end]
