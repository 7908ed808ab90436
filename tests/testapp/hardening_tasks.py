"""Tasks of the worker hardening tests (tests/test_worker_hardening.py)."""

from __future__ import annotations

import dataclasses
import os
import time
from datetime import timedelta
from typing import Any

import django_venturi as venturi
from django_venturi import signals
from tests.testapp.tasks import NO_WAIT, record, wait_for_file


@venturi.task(kind="tests.held_key", lease=timedelta(seconds=3), backoff=NO_WAIT)
@dataclasses.dataclass
class HeldKey(venturi.Task):
    """A keyed job that runs for `seconds`, or until the file `gate` exists (60 s at
    most); a clashing enqueue is merged into it (keep)."""

    key: str
    seconds: float = 0.0
    gate: str = ""

    def dedup_key(self) -> str | None:
        return self.key

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        record(ctx, "held_key", os.getpid())
        if self.gate:
            wait_for_file(self.gate)
        else:
            time.sleep(self.seconds)
        return venturi.Outcome.completed()


def _break_results_writer(sender: type, **kwargs: Any) -> None:
    """A receiver that ends the thread it runs in (SystemExit is no Exception)."""
    raise SystemExit("a job_finished receiver ended its thread")


if os.environ.get("VENTURI_TEST_BREAK_RESULTS"):
    signals.job_finished.connect(_break_results_writer, weak=False)
