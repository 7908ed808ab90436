"""The admin's history: the stats page's charts per range, their JSON view, the per-kind page."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_venturi.models import HISTOGRAM_BUCKETS, Job
from django_venturi.observe.history import RANGES, read_history
from django_venturi.store import history
from django_venturi.store.clock import database_time
from tests.testapp import tasks

pytestmark = pytest.mark.django_db

STATS = reverse("admin:django_venturi_job_stats")
HISTORY = reverse("admin:django_venturi_job_stats_history")
CHANGELIST = reverse("admin:django_venturi_job_changelist")


def kind_page(kind: str) -> str:
    return reverse("admin:django_venturi_job_kind", args=[kind])


def figures(completed: int, failed: int = 0, run_seconds: float = 0.01) -> list[int]:
    values = [completed, failed, 0] + [0] * (2 * HISTOGRAM_BUCKETS)
    values[history.RUN_OFFSET + history.bucket(run_seconds)] = completed + failed
    values[history.WAIT_OFFSET + history.bucket(0.002)] = completed + failed
    return values


def write_now(queue: str, kind: str, values: list[int], *, ago: timedelta = timedelta(0)) -> None:
    start = history.minute_of(database_time("default") - ago)
    history.write_minutes("default", "w1", {(start, queue, kind): values})


@pytest.mark.parametrize("range_name", list(RANGES))
def test_the_stats_page_draws_each_range(admin_client: Client, range_name: str) -> None:
    write_now("default", "tests.noop", figures(7, 1))
    response = admin_client.get(STATS, {"range": range_name})
    assert response.status_code == 200
    page = response.content.decode()
    section = page[page.index('id="venturi-history"') : page.index("history.js")]
    assert section.count('<svg class="venturi-chart"') == 4
    assert f"the last {RANGES[range_name].label}" in section
    assert 'class="selected" aria-current="true">' + RANGES[range_name].label in section
    assert '<span data-figure="completed">7</span>' in section
    assert '<span data-figure="failed">1</span>' in section


def test_a_bad_range_is_named_and_the_last_hour_shown(admin_client: Client) -> None:
    response = admin_client.get(STATS, {"range": "1y"}, follow=True)
    page = response.content.decode()
    assert "Range: expected one of 1h, 24h, 7d, 30d, got &#x27;1y&#x27;" in page
    assert "the last 1 hour" in page


def test_the_json_view_gives_the_figures_of_a_queue_and_kind(admin_client: Client) -> None:
    write_now("default", "tests.noop", figures(5, run_seconds=0.5))
    write_now("mail", "tests.noop", figures(3))
    write_now("mail", "tests.permanent", figures(0, failed=2), ago=timedelta(minutes=10))
    everything = json.loads(admin_client.get(HISTORY).content)
    assert (everything["completed"], everything["failed"]) == (8, 2)
    assert len(everything["points"]) == 60
    assert sorted(everything["charts"]) == ["depth", "run", "throughput", "wait"]
    mail = json.loads(admin_client.get(HISTORY, {"queue": "mail"}).content)
    assert (mail["completed"], mail["failed"], mail["failure_rate"]) == (3, 2, 0.4)
    noop = json.loads(admin_client.get(HISTORY, {"kind": "tests.noop", "range": "24h"}).content)
    assert (noop["completed"], noop["failed"], noop["range"]) == (8, 0, "24h")
    assert 0.256 <= noop["run_p95"] < 0.512  # five runs of 0.5 s in eight


def test_the_last_hour_reads_minutes_and_the_day_reads_hours_and_fresh_minutes() -> None:
    now = database_time("default")
    hour = history.hour_of(now) - timedelta(hours=3)
    history.write_minutes("default", "w1", {(hour, "q", "k"): figures(4)})
    history.take_minute("default", hour)
    history.derive_hour("default", hour)
    write_now("q", "k", figures(2))
    assert read_history("default", "1h").completed == 2
    day = read_history("default", "24h")
    assert day.completed == 6
    assert [p.completed for p in day.points if p.completed] == [4, 2]


def test_the_kind_page_shows_history_settings_and_its_errors(admin_client: Client) -> None:
    tasks.Noop(n=1).enqueue()
    write_now("default", "tests.always_fails", figures(0, failed=3))
    response = admin_client.get(kind_page("tests.always_fails"))
    assert response.status_code == 200
    page = response.content.decode()
    assert "History of tests.always_fails" in page
    assert '<span data-figure="failed">3</span>' in page
    assert 'failure rate <span data-figure="failure_rate_text">100.0%</span>' in page
    assert '<th scope="row">max attempts</th><td>3</td>' in page
    assert 'id="venturi-kind-errors"' in page
    assert "kind=tests.always_fails" in page.split('data-url="', 1)[1].split('"', 1)[0]


def test_the_kind_page_groups_the_current_errors_of_its_kind_only(admin_client: Client) -> None:
    def fail(kind: str, message: str) -> None:
        job = Job.objects.create(kind=kind, payload={})
        Job.objects.filter(pk=job.pk).update(
            state="failed",
            finished_at=timezone.now(),
            last_error=f"shop.Declined: {message}",
            error_type="shop.Declined",
        )

    fail("tests.always_fails", "card refused")
    fail("tests.always_fails", "card refused")
    fail("tests.always_fails", "card expired")
    fail("tests.noop", "not this kind's error")
    page = admin_client.get(kind_page("tests.always_fails")).content.decode()
    errors = page[page.index('id="venturi-kind-errors"') :]
    errors = errors[: errors.index("</table>")]
    assert errors.count("<tr><td>") == 2
    assert "<tr><td>2</td>" in errors and "card refused" in errors
    assert "<tr><td>1</td>" in errors and "card expired" in errors
    assert "not this kind" not in errors
    assert "error_type=shop.Declined&amp;kind=tests.always_fails" in errors


def test_kind_names_link_to_their_page(admin_client: Client) -> None:
    job = tasks.Noop(n=1).enqueue()
    assert f'href="{kind_page(job.kind)}"' in admin_client.get(CHANGELIST).content.decode()
    assert f'href="{kind_page(job.kind)}"' in admin_client.get(STATS).content.decode()


def test_a_kind_no_code_defines_still_has_a_page(admin_client: Client) -> None:
    Job.objects.create(kind="gone.away", payload={})
    page = admin_client.get(kind_page("gone.away")).content.decode()
    assert "No task of the code this page runs in defines this kind." in page


def test_the_history_and_kind_pages_need_the_view_permission() -> None:
    user = User.objects.create_user("nobody", password="x", is_staff=True)
    client = Client()
    client.force_login(user)
    assert client.get(HISTORY).status_code == 403
    assert client.get(kind_page("tests.noop")).status_code == 403
    user.user_permissions.add(Permission.objects.get(codename="view_job"))
    client.force_login(User.objects.get(pk=user.pk))
    assert client.get(HISTORY).status_code == 200
    assert client.get(kind_page("tests.noop")).status_code == 200
    anonymous = Client().get(HISTORY)
    assert anonymous.status_code == 302 and reverse("admin:login") in anonymous["Location"]


def test_the_history_refreshes_from_a_static_script_not_inline(admin_client: Client) -> None:
    """A strict Content-Security-Policy blocks inline scripts and styles."""
    for url in (STATS, kind_page("tests.noop")):
        page = admin_client.get(url).content.decode()
        assert "django_venturi/history.js" in page, url
        assert "<script>" not in page.split('id="venturi-history"', 1)[1], url
        assert 'style="' not in page, url
