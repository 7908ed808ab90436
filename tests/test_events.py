"""Events: structured log records and Django signals for every execution."""

from __future__ import annotations

import logging
from typing import Any

import pytest

import django_venturi as venturi
from django_venturi import signals
from django_venturi.worker.process import Worker
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])


def run_burst(alias: str) -> None:
    Worker(burst=True, database=alias, concurrency=2, poll_interval=0.05).run()


def test_each_execution_logs_one_record_with_structured_extra(
    alias: str, caplog: pytest.LogCaptureFixture
) -> None:
    done = tasks.Noop(n=1).enqueue(using=alias)
    failed = tasks.Permanent().enqueue(using=alias)
    with caplog.at_level(logging.INFO, logger="django_venturi"):
        run_burst(alias)
    records = {r.job_id: r for r in caplog.records if getattr(r, "job_id", None)}  # type: ignore[attr-defined]
    assert set(records) == {done.pk, failed.pk}
    ok, bad = records[done.pk], records[failed.pk]
    assert (ok.levelno, ok.kind, ok.attempt, ok.outcome) == (
        logging.INFO,
        "tests.noop",
        1,
        "completed",
    )  # type: ignore[attr-defined]
    assert ok.duration is not None and ok.duration >= 0  # type: ignore[attr-defined]
    assert (bad.levelno, bad.outcome) == (logging.ERROR, "failed")  # type: ignore[attr-defined]
    assert "the address does not exist" in bad.getMessage()
    assert "n" not in ok.getMessage().split()  # no payload in the line


def test_job_started_and_job_finished_signals(alias: str) -> None:
    events: list[tuple[str, dict[str, Any]]] = []

    def on_started(sender: object, **kwargs: Any) -> None:
        events.append(("started", kwargs))

    def on_finished(sender: object, **kwargs: Any) -> None:
        events.append(("finished", kwargs))

    def broken(sender: object, **kwargs: Any) -> None:
        raise RuntimeError("a receiver bug must not stop the worker")

    signals.job_started.connect(on_started)
    signals.job_finished.connect(on_finished)
    signals.job_finished.connect(broken)
    try:
        flaky = tasks.Flaky(failures=1).enqueue(using=alias)
        run_burst(alias)
    finally:
        signals.job_started.disconnect(on_started)
        signals.job_finished.disconnect(on_finished)
        signals.job_finished.disconnect(broken)
    started = [e for name, e in events if name == "started"]
    finished = [e for name, e in events if name == "finished"]
    assert [e["attempt"] for e in started] == [1, 2]
    assert [(e["outcome"], e["attempt"]) for e in finished] == [("retry", 1), ("completed", 2)]
    assert all(e["job_id"] == flaky.pk and e["kind"] == "tests.flaky" for e in started + finished)
    assert finished[0]["error_type"] == "builtins.RuntimeError"
    assert all(e["duration"] is not None for e in finished)
    flaky.refresh_from_db()
    assert flaky.state == venturi.State.COMPLETED
