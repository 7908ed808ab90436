"""Traces: the enqueueing span's W3C context is kept with the job, each run's span links to
it, and the job page shows its trace id (a link with `TRACE_URL`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.db import transaction
from django.test import Client, override_settings
from django.urls import reverse
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

import django_venturi as venturi
from django_venturi.checks import check_settings
from django_venturi.models import Job
from django_venturi.observe import telemetry
from tests.test_django_tasks import tasks as django_tasks  # noqa: F401 - the fixture
from tests.test_telemetry import run_script
from tests.testapp import dedup_tasks, tasks

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])

TEMPO = "https://tempo.example/trace/{trace_id}"
TRACER = TracerProvider().get_tracer("tests")
"""A tracer of recording spans (real ids)."""


def metrics_on() -> override_settings:
    return override_settings(VENTURI={**settings.VENTURI, "METRICS": True})


@pytest.fixture
def tracer() -> Iterator[trace.Tracer]:
    """`TRACER`, with `METRICS` on."""
    with metrics_on():
        yield TRACER


def traceparent(span: trace.Span) -> str:
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def stored(alias: str, job: Job) -> Any:
    """What the job's row holds, read back from the database."""
    return Job.objects.using(alias).get(pk=job.pk).trace_context


def test_every_enqueue_path_stores_the_current_span(alias: str, tracer: trace.Tracer) -> None:
    with tracer.start_as_current_span("request") as span:
        one = tasks.Noop(n=1).enqueue(using=alias)
        many = venturi.enqueue_many([tasks.Noop(n=2), tasks.Noop(n=3)], using=alias)
        after = tasks.Noop(n=4).enqueue(using=alias, after=[one])
        keyed = dedup_tasks.Recompute(account="a").enqueue(using=alias)
        chained = venturi.chain(tasks.Noop(n=5), tasks.Noop(n=6)).enqueue(using=alias)
        awaited = async_to_sync(tasks.Noop(n=7).aenqueue)(using=alias)
    expected = {"traceparent": traceparent(span)}
    for job in [one, *many, after, keyed, *chained, awaited]:
        assert stored(alias, job) == expected, job
        assert job.trace_context == expected  # the returned row says so too


def test_a_tracestate_is_kept_beside_the_traceparent(alias: str, tracer: trace.Tracer) -> None:
    remote = SpanContext(
        trace_id=0x4BF92F3577B34DA6A3CE929D0E0E4736,
        span_id=0x00F067AA0BA902B7,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=TraceState([("tempo", "t61rcWkgMzE")]),
    )
    with trace.use_span(NonRecordingSpan(remote)):
        job = tasks.Noop(n=1).enqueue(using=alias)
    assert stored(alias, job) == {
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "tracestate": "tempo=t61rcWkgMzE",
    }


def test_enqueue_on_commit_keeps_the_span_of_the_ask(alias: str, tracer: trace.Tracer) -> None:
    with transaction.atomic(using=alias):
        with tracer.start_as_current_span("request") as span:
            tasks.Noop(n=1).enqueue_on_commit(using=alias)
        with tracer.start_as_current_span("later"):
            pass  # the commit comes after the asking span ended
    (job,) = Job.objects.using(alias).filter(kind="tests.noop")
    assert job.trace_context == {"traceparent": traceparent(span)}


def test_nothing_is_stored_outside_a_span_or_with_metrics_off(
    alias: str, tracer: trace.Tracer
) -> None:
    outside = tasks.Noop(n=1).enqueue(using=alias)
    metrics_off = override_settings(VENTURI={**settings.VENTURI, "METRICS": False})
    with metrics_off, tracer.start_as_current_span("request"):
        off = tasks.Noop(n=2).enqueue(using=alias)
        off_many = venturi.enqueue_many([tasks.Noop(n=3)], using=alias)
    for job in [outside, off, *off_many]:
        assert stored(alias, job) is None


def test_a_django_tasks_enqueue_stores_the_current_span(
    django_tasks: ModuleType,  # noqa: F811 - the fixture
    tracer: trace.Tracer,
) -> None:
    with tracer.start_as_current_span("request") as span:
        result = django_tasks.add.enqueue(2, 3)
    job = Job.objects.get(pk=int(result.id))
    assert job.trace_context == {"traceparent": traceparent(span)}


WORKER_WITH_SPANS = """
import json
import sys
import django
django.setup()
from django.conf import settings
from django.test import override_settings
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from django_venturi.observe import telemetry
from django_venturi.worker.process import Worker
spans = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(spans))
with override_settings(VENTURI={**settings.VENTURI, "METRICS": True}):
    telemetry.install(database=sys.argv[1], tracer_provider=provider)
    Worker(burst=True, database=sys.argv[1], concurrency=2, poll_interval=0.05).run()
for span in spans.get_finished_spans():
    print(json.dumps({
        "job": span.attributes["venturi.job_id"],
        "attempt": span.attributes["venturi.attempt"],
        "trace": format(span.context.trace_id, "032x"),
        "parent": span.parent is not None,
        "links": [
            [format(link.context.trace_id, "032x"), format(link.context.span_id, "016x"),
             dict(link.attributes)]
            for link in span.links
        ],
    }))
"""


def test_each_run_of_a_worker_links_to_the_enqueuing_span(alias: str) -> None:
    with metrics_on():
        with TRACER.start_as_current_span("request") as span:
            flaky = tasks.Flaky(failures=1).enqueue(using=alias)  # fails once: two runs
        untraced = tasks.Noop(n=1).enqueue(using=alias)
    result = run_script(WORKER_WITH_SPANS, alias)
    assert result.returncode == 0, result.stderr
    runs = [json.loads(line) for line in result.stdout.splitlines()]
    request = span.get_span_context()
    link = [f"{request.trace_id:032x}", f"{request.span_id:016x}", {"venturi.link": "enqueued"}]
    flaky_runs = sorted((run for run in runs if run["job"] == flaky.pk), key=lambda r: r["attempt"])
    assert [run["attempt"] for run in flaky_runs] == [1, 2]
    for run in flaky_runs:
        assert run["links"] == [link]
        # Its own trace, linked to the request's: not a child of it.
        assert run["parent"] is False and run["trace"] != link[0]
    (plain,) = (run for run in runs if run["job"] == untraced.pk)
    assert plain["links"] == []


@pytest.mark.parametrize(
    "stored_context",
    [
        None,
        {"traceparent": "<script>alert(1)</script>"},
        {"traceparent": "00-00000000000000000000000000000000-00f067aa0ba902b7-01"},
        ["00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"],
    ],
)
def test_a_missing_or_unreadable_context_gives_no_link(stored_context: Any) -> None:
    assert telemetry.enqueue_links(stored_context) == []


# ---------------------------------------------------------------- the job page


def job_page(client: Client, job: Job) -> str:
    response = client.get(reverse("admin:django_venturi_job_change", args=[job.pk]))
    assert response.status_code == 200
    return response.content.decode()


def trace_row(page: str) -> str:
    """What the job page's `trace` field shows, as HTML."""
    readonly = page.index('class="readonly"', page.index("field-trace"))
    start = page.index(">", readonly) + 1
    return page[start : page.index("</div>", start)]


def test_the_job_page_shows_the_trace_id_and_links_it_with_trace_url(
    admin_client: Client, tracer: trace.Tracer
) -> None:
    with tracer.start_as_current_span("request") as span:
        job = tasks.Noop(n=1).enqueue()
    trace_id = f"{span.get_span_context().trace_id:032x}"
    assert trace_row(job_page(admin_client, job)) == f"<code>{trace_id}</code>"
    with override_settings(VENTURI={**settings.VENTURI, "TRACE_URL": TEMPO}):
        row = trace_row(job_page(admin_client, job))
    assert row == (
        f'<a href="https://tempo.example/trace/{trace_id}" '
        f'target="_blank" rel="noopener noreferrer"><code>{trace_id}</code></a>'
    )


def test_a_job_without_a_readable_trace_shows_none(admin_client: Client) -> None:
    plain = tasks.Noop(n=1).enqueue()
    forged = tasks.Noop(n=2).enqueue()
    Job.objects.filter(pk=forged.pk).update(
        trace_context={"traceparent": '00-"><script>alert(1)</script>-00f067aa0ba902b7-01'}
    )
    with override_settings(VENTURI={**settings.VENTURI, "TRACE_URL": TEMPO}):
        for job in (plain, forged):
            page = job_page(admin_client, job)
            assert trace_row(page) == "-"
            assert "<script>alert(1)" not in page


# ---------------------------------------------------------------- the check


@pytest.mark.parametrize(
    "value",
    [
        42,
        b"https://tempo.example/trace/{trace_id}",
        "https://tempo.example/trace/",
        "https://tempo.example/{trace_id}?span={span_id}",
        "https://tempo.example/{}",
        "https://tempo.example/{0}",
        "https://tempo.example/{trace_id.hex}",
        "https://tempo.example/{trace_id",
        "https://tempo.example/{trace_id!x}",
    ],
)
def test_a_bad_trace_url_is_a_check_error_naming_it(value: Any) -> None:
    with override_settings(VENTURI={"TRACE_URL": value}):
        (error,) = check_settings()
    assert error.id == "venturi.E038"
    assert error.msg.startswith("VENTURI['TRACE_URL'] ")


@pytest.mark.parametrize(
    "value", [None, TEMPO, "https://jaeger.example/trace/{trace_id}?uiEmbed=v0&x={trace_id}"]
)
def test_a_good_trace_url_passes(value: Any) -> None:
    with override_settings(VENTURI={"TRACE_URL": value}):
        assert check_settings() == []
