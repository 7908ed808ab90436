"""OpenTelemetry: metrics and spans when enabled, and no import at all when not."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from django_venturi.checks import check_settings
from django_venturi.observe import telemetry
from django_venturi.worker.process import Worker
from tests.conftest import ROOT, worker_env
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])

WITHOUT_METRICS = """
import sys
import django
django.setup()
import django_venturi.admin
from django_venturi.worker.process import Worker
from tests.testapp import tasks
tasks.Noop(n=1).enqueue(using=sys.argv[1])
Worker(burst=True, database=sys.argv[1], concurrency=2).run()
print(sorted(name for name in sys.modules if name.startswith("opentelemetry")))
"""


def run_script(script: str, alias: str) -> subprocess.CompletedProcess[str]:
    """Run `script` in a fresh interpreter, as a worker process of this run would start."""
    return subprocess.run(
        [sys.executable, "-c", script, alias],
        env=worker_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_nothing_imports_opentelemetry_when_metrics_are_off(alias: str) -> None:
    result = run_script(WITHOUT_METRICS, alias)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"
    assert "completed" in result.stderr  # the job ran


@pytest.fixture
def recorded() -> Iterator[tuple[Any, ...]]:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    reader = InMemoryMetricReader()
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    with override_settings(VENTURI={**settings.VENTURI, "METRICS": True}):
        telemetry.uninstall()
        yield reader, spans, MeterProvider(metric_readers=[reader]), tracer_provider
        telemetry.uninstall()


def points(reader: Any) -> dict[str, list[Any]]:
    found: dict[str, list[Any]] = {}
    for resource in reader.get_metrics_data().resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found.setdefault(metric.name, []).extend(metric.data.data_points)
    return found


def test_runs_durations_gauges_and_spans_are_recorded(alias: str, recorded: Any) -> None:
    reader, spans, meter_provider, tracer_provider = recorded
    telemetry.install(
        database=alias, meter_provider=meter_provider, tracer_provider=tracer_provider
    )
    tasks.Noop(n=1).enqueue(using=alias)
    tasks.Flaky(failures=1).enqueue(using=alias)
    tasks.Permanent().enqueue(using=alias)
    Worker(burst=True, database=alias, concurrency=2, poll_interval=0.05).run()
    tasks.Noop(n=2).enqueue(using=alias, queue="mail")
    tasks.Noop(n=3).enqueue(using=alias, queue="mail", delay=timedelta(hours=1))

    data = points(reader)
    runs = {
        (p.attributes["venturi.kind"], p.attributes["venturi.outcome"]): p.value
        for p in data["venturi.job.runs"]
    }
    assert runs == {
        ("tests.noop", "completed"): 1,
        ("tests.flaky", "retry"): 1,
        ("tests.flaky", "completed"): 1,
        ("tests.permanent", "failed"): 1,
    }
    assert sum(p.count for p in data["venturi.job.duration"]) == 4
    ready = {p.attributes["venturi.queue"]: p.value for p in data["venturi.jobs.ready"]}
    assert ready == {"mail": 2}
    latency = {p.attributes["venturi.queue"]: p.value for p in data["venturi.queue.latency"]}
    assert set(latency) == {"mail"} and latency["mail"] >= 0

    finished = spans.get_finished_spans()
    assert sorted(span.name for span in finished) == [
        "venturi.job tests.flaky",
        "venturi.job tests.flaky",
        "venturi.job tests.noop",
        "venturi.job tests.permanent",
    ]
    failed = next(span for span in finished if span.name == "venturi.job tests.permanent")
    assert failed.status.status_code.name == "ERROR"
    assert failed.attributes["venturi.outcome"] == "failed"
    assert failed.end_time >= failed.start_time


def test_due_and_waiting_jobs_are_gauges_per_queue(alias: str, recorded: Any) -> None:
    reader, _, meter_provider, tracer_provider = recorded
    telemetry.install(
        database=alias, meter_provider=meter_provider, tracer_provider=tracer_provider
    )
    first = tasks.Noop(n=1).enqueue(using=alias, queue="mail")
    tasks.Noop(n=2).enqueue(using=alias, queue="mail", delay=timedelta(hours=1))
    tasks.Noop(n=3).enqueue(using=alias, queue="reports", after=[first])

    data = points(reader)

    def per_queue(name: str) -> dict[str, int]:
        return {p.attributes["venturi.queue"]: p.value for p in data[name]}

    assert per_queue("venturi.jobs.ready") == {"mail": 2}
    # Only the job whose time has come is backlog; a queue with live jobs shows 0.
    assert per_queue("venturi.jobs.due") == {"mail": 1, "reports": 0}
    assert per_queue("venturi.jobs.waiting") == {"reports": 1}


WITHOUT_OPENTELEMETRY = """
import sys
sys.modules["opentelemetry"] = None  # as if it were not installed
import django
django.setup()
from django.conf import settings
from django.core import checks
from django.test import override_settings
from django_venturi.models import WorkerProcess
from django_venturi.worker.process import Worker
with override_settings(VENTURI={**settings.VENTURI, "METRICS": True}):
    print("checks:", [m.id for m in checks.run_checks() if m.id.startswith("venturi.")])
    try:
        Worker(burst=True, database=sys.argv[1], name="never-ran").run()
    except RuntimeError as error:
        print("refused:", error)
print("registered:", WorkerProcess.objects.using(sys.argv[1]).filter(name="never-ran").count())
"""


def test_metrics_without_opentelemetry_is_a_check_error_and_the_worker_never_registers(
    alias: str,
) -> None:
    result = run_script(WITHOUT_OPENTELEMETRY, alias)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0] == "checks: ['venturi.E037']"
    assert lines[1].startswith("refused: ") and "django-venturi[metrics]" in lines[1]
    # Not listed as a live worker: it stopped before registering.
    assert lines[2] == "registered: 0"


def test_metrics_must_be_a_bool() -> None:
    with override_settings(VENTURI={"METRICS": "yes"}):
        assert [message.id for message in check_settings()] == ["venturi.E036"]
