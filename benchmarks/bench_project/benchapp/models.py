"""The benchmark app's one table: the rows W5's realistic handler reads and updates."""

from __future__ import annotations

from django.db import models


class Counter(models.Model):
    """One row per counter; `bench.orm` reads one and increments it (benchmarks/scale.py)."""

    value = models.BigIntegerField(default=0)
    touched_at = models.DateTimeField(null=True)

    def __str__(self) -> str:
        return f"counter {self.pk}: {self.value}"
