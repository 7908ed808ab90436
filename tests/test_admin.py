"""The admin with Django's test client: every page and action, with and without permission."""

from __future__ import annotations

import dataclasses
import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

import django_venturi as venturi
from django_venturi.admin import job_list
from django_venturi.models import Job, JournalEntry, WorkerProcess
from tests.conftest import ROOT
from tests.testapp import dedup_tasks, tasks

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:django_venturi_job_changelist")
STATS = reverse("admin:django_venturi_job_stats")
CLEANUP = reverse("admin:django_venturi_job_cleanup")
JOURNAL = reverse("admin:django_venturi_journalentry_changelist")


@venturi.task(kind="tests.admin_login")
@dataclasses.dataclass
class Login(venturi.Task):
    user: str
    password: str = venturi.secret()

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        return venturi.Outcome.completed()


def finished(
    state: str, *, kind: str = "tests.noop", age: timedelta = timedelta(0), **fields: Any
) -> Job:
    return Job.objects.create(
        kind=kind,
        payload=fields.pop("payload", {"n": 1}),
        state=state,
        attempt=1,
        failures=1 if state == "failed" else 0,
        finished_at=timezone.now() - age,
        **fields,
    )


def staff(*permissions: str) -> Client:
    """A logged-in staff user holding the view permission and the given codenames."""
    return staff_with("view_job", "view_journalentry", *permissions)


def staff_with(*codenames: str) -> Client:
    """A logged-in staff user holding exactly these permissions."""
    user = User.objects.create_user(f"staff{User.objects.count()}", password="x", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    assert user.user_permissions.count() == len(codenames)
    client = Client()
    client.force_login(user)
    return client


def act(client: Client, action: str, jobs: list[Job], *, confirm: bool) -> Any:
    data = {"action": action, "_selected_action": [job.pk for job in jobs], "index": 0}
    if confirm:
        data["post"] = "yes"
    return client.post(CHANGELIST, data, follow=confirm)


# ---------------------------------------------------------------- access


@pytest.mark.parametrize(
    "url", [CHANGELIST, STATS, CLEANUP, reverse("admin:app_list", args=["django_venturi"])]
)
def test_anonymous_users_are_sent_to_the_login_page(client: Client, url: str) -> None:
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))


def test_staff_without_view_permission_cannot_see_jobs_or_stats() -> None:
    user = User.objects.create_user("nobody", password="x", is_staff=True)
    client = Client()
    client.force_login(user)
    assert client.get(CHANGELIST).status_code == 403
    assert client.get(STATS).status_code == 403
    assert client.get(CLEANUP).status_code == 403


# ---------------------------------------------------------------- secrets


SECRET = "SUPERSECRET1-hunter2"


def secret_job() -> Job:
    """A failed login job whose password is a secret field (with a journal entry)."""
    job = Login(user="ada", password=SECRET).enqueue()
    Job.objects.filter(pk=job.pk).update(
        state="failed", attempt=1, failures=1, finished_at=timezone.now(), last_error="E: no"
    )
    JournalEntry.objects.create(job=job, attempt=1, outcome="failed", error_type="E")
    return job


def periodic_url(view: str, *args: object) -> str:
    return f"/admin/django_venturi/periodictask/{'/'.join(map(str, args))}/{view}/"


def test_the_periodic_tasks_admin_shows_no_job_of_its_own() -> None:
    """Its model is a proxy of Job: Django's views would show any job, unmasked."""
    job = secret_job()
    client = staff_with("view_periodictask")
    assert client.get("/admin/django_venturi/periodictask/").status_code == 200
    for view in ("change", "history", "delete"):
        response = client.get(periodic_url(view, job.pk))
        assert response.status_code == 404, view
        assert SECRET not in response.content.decode()
    assert client.get(reverse("admin:django_venturi_job_change", args=[job.pk])).status_code == 403
    assert client.get(CHANGELIST).status_code == 403


def test_a_superuser_meets_no_secret_on_any_page(admin_client: Client) -> None:
    job = secret_job()
    entry = JournalEntry.objects.get(job=job)
    for url in (
        CHANGELIST,
        reverse("admin:django_venturi_job_change", args=[job.pk]),
        reverse("admin:django_venturi_job_history", args=[job.pk]),
        reverse("admin:django_venturi_job_delete", args=[job.pk]),
        reverse("admin:django_venturi_journalentry_changelist"),
        reverse("admin:django_venturi_journalentry_change", args=[entry.pk]),
        STATS,
        "/admin/django_venturi/periodictask/",
    ):
        response = admin_client.get(url)
        assert response.status_code == 200, url
        assert SECRET not in response.content.decode(), url
    for action in ("retry_now", "cancel_jobs", "delete_selected"):
        confirmation = act(admin_client, action, [job], confirm=False)
        assert f"#{job.pk}" in confirmation.content.decode() or "ada" in str(job)
        assert SECRET not in confirmation.content.decode(), action


@pytest.mark.parametrize("guess", ["SUPERSECRET1", "hunter2", SECRET])
def test_search_never_looks_into_secret_fields(admin_client: Client, guess: str) -> None:
    job = secret_job()
    by_kind = admin_client.get(f"{CHANGELIST}?q=admin_login").context["cl"].result_list
    assert [row.pk for row in by_kind] == [job.pk]
    # A kind with secret fields keeps its whole payload out of the search.
    assert list(admin_client.get(f"{CHANGELIST}?q=ada").context["cl"].result_list) == []
    assert list(admin_client.get(f"{CHANGELIST}?q={guess}").context["cl"].result_list) == []

    def autocomplete(term: str) -> list[str]:
        response = admin_client.get(
            "/admin/autocomplete/",
            {"app_label": "django_venturi", "model_name": "journalentry", "field_name": "job"}
            | {"term": term},
        )
        assert response.status_code == 200
        return [result["id"] for result in response.json()["results"]]

    assert autocomplete("admin_login") == [str(job.pk)]
    assert autocomplete(guess) == []
    assert autocomplete("ada") == []
    assert list(admin_client.get(f"{JOURNAL}?q={guess}").context["cl"].result_list) == []


@pytest.mark.parametrize(
    "url",
    [
        f"{CHANGELIST}?payload__password__startswith=SUPER",
        f"{CHANGELIST}?payload__icontains=SUPER",
        f"{CHANGELIST}?payload__password=x",
        f"{CHANGELIST.replace('/job/', '/journalentry/')}?job__payload__password__startswith=SUPER",
    ],
)
def test_no_filter_tests_a_secret_from_the_url(url: str) -> None:
    secret_job()
    response = staff().get(url)
    assert response.status_code == 400  # Django's answer to a lookup it does not allow


def test_narrow_permissions_see_no_secret_anywhere() -> None:
    job = secret_job()
    viewer = staff()  # view_job and view_journalentry only
    page = viewer.get(reverse("admin:django_venturi_job_change", args=[job.pk]))
    assert page.status_code == 200 and SECRET not in page.content.decode()
    assert "********" in page.content.decode()
    assert viewer.get(reverse("admin:django_venturi_job_delete", args=[job.pk])).status_code == 403
    history = viewer.get(reverse("admin:django_venturi_job_history", args=[job.pk]))
    assert SECRET not in history.content.decode()
    for action in ("retry_now", "cancel_jobs", "delete_selected"):
        response = act(viewer, action, [job], confirm=False)
        assert SECRET not in response.content.decode(), action
    journal_only = staff_with("view_journalentry")
    entry = JournalEntry.objects.get(job=job)
    journal_page = journal_only.get(
        reverse("admin:django_venturi_journalentry_change", args=[entry.pk])
    )
    assert journal_page.status_code == 200 and SECRET not in journal_page.content.decode()
    assert journal_only.get(f"{JOURNAL}?q=SUPERSECRET1").context["cl"].result_list.count() == 0


# ---------------------------------------------------------------- the list


def test_changelist_shows_columns_filters_and_links(admin_client: Client) -> None:
    ready = tasks.Noop(n=1).enqueue()
    Job.objects.filter(pk=ready.pk).update(run_at=timezone.now() - timedelta(minutes=3))
    failed = finished("failed", last_error="ValueError: no stock\nTraceback ...")
    finished(
        "failed",
        last_error="builtins.ConnectionError: gave up after 3 failed attempts (max_attempts=3)"
        "; last error: refused",
    )
    response = admin_client.get(CHANGELIST)
    assert response.status_code == 200
    page = response.content.decode()
    assert "waiting 3m" in page
    assert "ValueError: no stock" in page
    assert ">ConnectionError: refused<" in page  # a give-up shows its last error
    assert f"/{failed.pk}/change/" in page
    for filter_title in ("By state", "By kind", "By queue", "By priority", "By last error"):
        assert filter_title in page
    assert "tests.recompute" in page  # kinds come from the registry
    assert STATS in page and CLEANUP in page
    assert "Retry now" in page and "Cancel" in page and "Delete selected" in page


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("state=failed", {"failed"}),
        ("has_error=yes", {"failed"}),
        ("has_error=no", {"ready", "completed"}),
        ("kind=tests.recompute", {"completed"}),
        ("queue=mail", {"ready"}),
        ("q=account:7", {"completed"}),  # dedup key
        ("q=needle", {"ready"}),  # payload text
        ("q=%23999999", set()),  # an id that does not exist
        ("priority=0", {"ready"}),
        ("o=-8", {"ready", "failed", "completed"}),  # sorted by a column
    ],
)
def test_changelist_filters_search_and_sorting(
    admin_client: Client, query: str, expected: set[str]
) -> None:
    Job.objects.create(kind="tests.noop", payload={"note": "a needle"}, queue="mail", priority=0)
    finished("failed", last_error="boom")
    finished("completed", kind="tests.recompute", dedup_key="account:7", payload={"account": "7"})
    response = admin_client.get(f"{CHANGELIST}?{query}")
    assert response.status_code == 200
    assert {job.state for job in response.context["cl"].result_list} == expected


def test_search_by_exact_id(admin_client: Client) -> None:
    jobs = [finished("completed") for _ in range(3)]
    for term in (str(jobs[1].pk), f"%23{jobs[1].pk}", f"+{jobs[1].pk}+"):
        response = admin_client.get(f"{CHANGELIST}?q={term}")
        assert [job.pk for job in response.context["cl"].result_list] == [jobs[1].pk]


def test_changelist_query_count_does_not_grow_with_the_page(admin_client: Client) -> None:
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert admin_client.get(CHANGELIST).status_code == 200
        return len(captured.captured_queries)

    finished("completed")
    few = queries()
    for i in range(60):
        finished("failed" if i % 2 else "completed", last_error="x" if i % 2 else "")
    assert queries() == few <= 8


def test_large_results_show_an_estimated_count(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(job_list, "EXACT_COUNT_LIMIT", 20)
    Job.objects.bulk_create(
        Job(kind="tests.noop", payload={"n": i}, state="completed", finished_at=timezone.now())
        for i in range(30)
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE django_venturi_job")
    response = admin_client.get(CHANGELIST)
    cl = response.context["cl"]
    assert cl.paginator.estimated
    assert cl.result_count >= 21  # the planner's figure, never below what was seen
    assert "PostgreSQL's estimate" in response.content.decode()
    assert f"About {cl.result_count:,} jobs" in response.content.decode()
    small = admin_client.get(f"{CHANGELIST}?state=ready").context["cl"]
    assert not small.paginator.estimated and small.result_count == 0


# ---------------------------------------------------------------- the job page


def test_job_page_shows_json_history_and_folded_tracebacks(admin_client: Client) -> None:
    job = Login(user="ada", password="hunter2").enqueue()
    Job.objects.filter(pk=job.pk).update(
        state="failed", attempt=2, failures=2, finished_at=timezone.now(), carry={"step": 3}
    )
    JournalEntry.objects.create(
        job=job,
        attempt=1,
        worker="host:1:abc",
        started_at=timezone.now() - timedelta(seconds=2),
        outcome="retry",
        error_type="ConnectionError",
        error_message="refused",
        traceback="Traceback (most recent call last):\n  File 'x.py'\nConnectionError: refused",
    )
    JournalEntry.objects.create(
        job=job,
        attempt=2,
        worker="host:1:abc",
        started_at=timezone.now(),
        outcome="failed",
        error_type="ValueError",
        error_message="bad",
    )
    response = admin_client.get(reverse("admin:django_venturi_job_change", args=[job.pk]))
    assert response.status_code == 200
    page = response.content.decode()
    assert "hunter2" not in page
    assert "&quot;user&quot;: &quot;ada&quot;" in page  # indented JSON, escaped
    assert "&quot;step&quot;: 3" in page
    assert '<details class="venturi-traceback"><summary>ConnectionError: refused</summary>' in page
    assert "enqueued: ready" in page
    assert "attempt 1 by host:1:abc: running" in page
    assert "retry: ready" in page and "failed: failed" in page
    assert 'name="kind"' not in page and 'name="payload"' not in page  # read-only


def test_job_and_journal_pages_show_times_to_the_second(admin_client: Client) -> None:
    job = tasks.Noop(n=1).enqueue()
    started = timezone.now().replace(hour=9, minute=0, second=19, microsecond=0)
    Job.objects.filter(pk=job.pk).update(
        state="completed", started_at=started, finished_at=started + timedelta(seconds=1)
    )
    entry = JournalEntry.objects.create(
        job=job, attempt=1, worker="host:1:abc", started_at=started, outcome="completed"
    )
    shown = timezone.localtime(started).strftime("%Y-%m-%d %H:%M:%S")  # not "9 a.m."
    for url in (
        reverse("admin:django_venturi_job_change", args=[job.pk]),
        reverse("admin:django_venturi_journalentry_change", args=[entry.pk]),
    ):
        page = admin_client.get(url).content.decode()
        assert page.count(shown) >= 1, url
        assert " a.m." not in page, url
    journal = admin_client.get(JOURNAL).content.decode()
    assert shown.replace(" ", "<br>") in journal  # a list: the date over the time, half as wide
    assert " a.m." not in journal
    page = admin_client.get(reverse("admin:django_venturi_job_change", args=[job.pk]))
    assert "Start of the latest run." in page.content.decode()  # the field's help is kept


def test_the_list_shows_a_last_error_only_while_it_is_current(admin_client: Client) -> None:
    """A job that failed once and then completed is not in trouble: no red error for it."""
    failed = finished("failed", last_error="ValueError: gone for good")
    completed = finished("completed", last_error="ValueError: a blip before it worked")
    backing_off = tasks.Noop(n=1).enqueue()
    Job.objects.filter(pk=backing_off.pk).update(
        attempt=1, failures=1, last_error="ConnectionError: refused, will retry"
    )
    page = admin_client.get(CHANGELIST).content.decode()
    assert "gone for good" in page and "refused, will retry" in page
    assert "a blip before it worked" not in page
    with_error = admin_client.get(f"{CHANGELIST}?has_error=yes").context["cl"].result_list
    assert {job.pk for job in with_error} == {failed.pk, backing_off.pk}
    job_page = admin_client.get(reverse("admin:django_venturi_job_change", args=[completed.pk]))
    assert "From an earlier run; the job is completed now." in job_page.content.decode()


# ---------------------------------------------------------------- the journal


def test_the_journal_lists_newest_first_and_searches(admin_client: Client) -> None:
    first = finished("failed", kind="tests.recompute", payload={"account": "1"})
    second = finished("completed")
    old = JournalEntry.objects.create(
        job=first, attempt=1, outcome="failed", error_type="ValueError", error_message="no stock"
    )
    new = JournalEntry.objects.create(job=second, attempt=1, outcome="completed")

    def listed(query: str = "") -> list[int]:
        response = admin_client.get(f"{JOURNAL}?{query}")
        assert response.status_code == 200
        return [entry.pk for entry in response.context["cl"].result_list]

    assert listed() == [new.pk, old.pk]
    assert listed(f"q={second.pk}") == [new.pk]
    assert listed(f"q=%23{first.pk}") == [old.pk]
    assert listed("q=recompute") == [old.pk]
    assert listed("q=ValueError") == [old.pk]
    assert listed("q=stock") == [old.pk]
    assert listed("q=nothing+like+it") == []


# ---------------------------------------------------------------- the job page's buttons


def job_page(client: Client, job: Job) -> str:
    response = client.get(reverse("admin:django_venturi_job_change", args=[job.pk]))
    assert response.status_code == 200
    return response.content.decode()


def press(client: Client, button: str, job: Job, *, confirm: bool) -> Any:
    url = reverse(f"admin:django_venturi_job_{button}", args=[job.pk])
    return client.post(url, {"post": "yes"} if confirm else {}, follow=confirm)


def test_a_failed_job_page_retries_after_a_confirmation(admin_client: Client) -> None:
    job = finished("failed", last_error="boom")
    page = job_page(admin_client, job)
    retry_url = reverse("admin:django_venturi_job_retry", args=[job.pk])
    assert f'action="{retry_url}"' in page and ">Retry now</button>" in page
    assert "csrfmiddlewaretoken" in page
    assert reverse("admin:django_venturi_job_cancel", args=[job.pk]) not in page  # finished
    confirmation = press(admin_client, "retry", job, confirm=False)
    assert "Retry these jobs now?" in confirmation.content.decode()
    job.refresh_from_db()
    assert job.state == "failed"
    response = press(admin_client, "retry", job, confirm=True)
    assert response.redirect_chain[-1][0] == reverse(
        "admin:django_venturi_job_change", args=[job.pk]
    )
    assert "1 job will run now." in response.content.decode()
    job.refresh_from_db()
    assert job.state == "ready" and job.failures == 0


def test_a_ready_job_page_cancels_and_a_scheduled_one_runs_now(admin_client: Client) -> None:
    due = tasks.Noop(n=1).enqueue()
    later = tasks.Noop(n=2).enqueue(delay=timedelta(hours=1))
    assert ">Run now</button>" not in job_page(admin_client, due)  # already due
    assert ">Run now</button>" in job_page(admin_client, later)
    assert ">Cancel</button>" in job_page(admin_client, due)
    response = press(admin_client, "cancel", due, confirm=True)
    assert "1 job cancelled; 0 jobs running asked to stop." in response.content.decode()
    due.refresh_from_db()
    assert due.state == "cancelled"
    assert ">Cancel</button>" not in response.content.decode()  # the page after: cancelled
    press(admin_client, "retry", later, confirm=True)
    later.refresh_from_db()
    assert later.run_at <= timezone.now()


def test_a_running_job_page_asks_it_to_stop_once(admin_client: Client) -> None:
    running = tasks.Noop(n=1).enqueue()
    Job.objects.filter(pk=running.pk).update(
        state="running",
        claim_token="00000000-0000-0000-0000-000000000001",
        lease_expires_at=timezone.now() + timedelta(minutes=1),
        started_at=timezone.now(),
    )
    assert ">Cancel (ask it to stop)</button>" in job_page(admin_client, running)
    press(admin_client, "cancel", running, confirm=True)
    running.refresh_from_db()
    assert running.state == "running" and running.cancel_requested_at is not None
    assert "ask it to stop" not in job_page(admin_client, running)


def test_the_buttons_need_their_permission_and_a_post() -> None:
    failed = finished("failed")
    ready = tasks.Noop(n=1).enqueue()
    viewer = staff()
    assert "venturi-button" not in job_page(viewer, failed) + job_page(viewer, ready)
    assert press(viewer, "retry", failed, confirm=True).status_code == 403
    assert press(viewer, "cancel", ready, confirm=True).status_code == 403
    failed.refresh_from_db()
    ready.refresh_from_db()
    assert (failed.state, ready.state) == ("failed", "ready")
    retrier = staff("retry_job")
    assert ">Retry now</button>" in job_page(retrier, failed)
    assert ">Cancel</button>" not in job_page(retrier, ready)
    url = reverse("admin:django_venturi_job_retry", args=[failed.pk])
    assert retrier.get(url).status_code == 405
    assert press(retrier, "cancel", ready, confirm=True).status_code == 403
    missing = reverse("admin:django_venturi_job_retry", args=[10**9])
    assert retrier.post(missing, {"post": "yes"}).status_code == 404
    csrf_checked = Client(enforce_csrf_checks=True)
    csrf_checked.force_login(User.objects.get(pk=retrier.session["_auth_user_id"]))
    assert csrf_checked.post(url, {"post": "yes"}).status_code == 403
    failed.refresh_from_db()
    assert failed.state == "failed"


# ---------------------------------------------------------------- actions


def test_retry_asks_for_confirmation_then_makes_jobs_due(admin_client: Client) -> None:
    failed = finished("failed", last_error="boom")
    later = tasks.Noop(n=1).enqueue(delay=timedelta(hours=1))
    done = finished("completed")
    response = act(admin_client, "retry_now", [failed, later, done], confirm=False)
    assert response.status_code == 200
    assert "Retry these jobs now?" in response.content.decode()
    failed.refresh_from_db()
    assert failed.state == "failed"  # nothing happens before the confirmation
    response = act(admin_client, "retry_now", [failed, later, done], confirm=True)
    assert "2 jobs will run now." in response.content.decode()
    assert "1 job neither ready nor failed: left as it is." in response.content.decode()
    failed.refresh_from_db()
    later.refresh_from_db()
    done.refresh_from_db()
    assert failed.state == "ready" and failed.finished_at is None
    assert later.run_at <= timezone.now()
    assert failed.run_at <= timezone.now()
    assert done.state == "completed"


def test_retry_reports_a_dedup_clash_instead_of_crashing(admin_client: Client) -> None:
    live = dedup_tasks.Recompute(account="1").enqueue()
    old = finished(
        "failed", kind="tests.recompute", dedup_key=live.dedup_key, payload={"account": "1"}
    )
    response = act(admin_client, "retry_now", [old], confirm=True)
    assert response.status_code == 200
    assert f"same kind and dedup key: #{old.pk}" in response.content.decode()
    old.refresh_from_db()
    assert old.state == "failed"


def test_cancel_cancels_ready_jobs_and_asks_running_ones_to_stop(admin_client: Client) -> None:
    ready = tasks.Noop(n=1).enqueue()
    running = tasks.Noop(n=2).enqueue()
    Job.objects.filter(pk=running.pk).update(
        state="running",
        claim_token="00000000-0000-0000-0000-000000000001",
        lease_expires_at=timezone.now() + timedelta(minutes=1),
        started_at=timezone.now(),
    )
    response = act(admin_client, "cancel_jobs", [ready, running], confirm=False)
    assert "Cancel these jobs?" in response.content.decode()
    response = act(admin_client, "cancel_jobs", [ready, running], confirm=True)
    assert "1 job cancelled; 1 job running asked to stop." in response.content.decode()
    ready.refresh_from_db()
    running.refresh_from_db()
    assert ready.state == "cancelled"
    assert running.state == "running" and running.cancel_requested_at is not None


def test_cancel_says_which_jobs_had_already_finished(admin_client: Client) -> None:
    ready = tasks.Noop(n=1).enqueue()
    done, failed = finished("completed"), finished("failed")
    response = act(admin_client, "cancel_jobs", [ready, done, failed], confirm=True)
    page = response.content.decode()
    assert "1 job cancelled; 0 jobs running asked to stop." in page
    assert "2 jobs already finished: left as they are." in page
    done.refresh_from_db()
    assert done.state == "completed"


def test_delete_removes_jobs_with_their_journal(admin_client: Client) -> None:
    job = finished("completed")
    JournalEntry.objects.create(job=job, attempt=1, outcome="completed")
    response = admin_client.post(
        CHANGELIST, {"action": "delete_selected", "_selected_action": [job.pk]}
    )
    confirmation = response.content.decode().lower()
    assert 'value="delete_selected"' in confirmation and "journal entr" in confirmation
    assert "permission to delete" not in response.content.decode()
    admin_client.post(
        CHANGELIST, {"action": "delete_selected", "_selected_action": [job.pk], "post": "yes"}
    )
    assert not Job.objects.filter(pk=job.pk).exists()
    assert not JournalEntry.objects.filter(job_id=job.pk).exists()


@pytest.mark.parametrize(
    ("action", "permission", "state"),
    [
        ("retry_now", "retry_job", "failed"),
        ("cancel_jobs", "cancel_job", "ready"),
        ("delete_selected", "delete_job", "failed"),
    ],
)
def test_each_action_needs_its_own_permission(action: str, permission: str, state: str) -> None:
    job = finished("failed") if state == "failed" else tasks.Noop(n=1).enqueue()
    without = staff()
    page = without.get(CHANGELIST).content.decode()
    assert f'value="{action}"' not in page
    response = act(without, action, [job], confirm=True)
    assert response.status_code == 200
    job.refresh_from_db()
    assert job.state == state
    with_permission = staff(permission)
    assert f'value="{action}"' in with_permission.get(CHANGELIST).content.decode()
    act(with_permission, action, [job], confirm=True)
    assert not Job.objects.filter(pk=job.pk, state=state).exists()


def test_cleanup_page_counts_then_deletes_old_finished_jobs() -> None:
    old = finished("completed", age=timedelta(days=10))
    old_failed = finished("failed", age=timedelta(days=10))
    recent = finished("completed", age=timedelta(hours=1))
    ready = tasks.Noop(n=1).enqueue()
    client = staff("cleanup_jobs")
    assert client.get(CLEANUP).status_code == 200
    preview = client.post(CLEANUP, {"older_than": "7d", "states": ["completed"], "preview": "1"})
    assert "This deletes 1 job and 0 journal entries" in preview.content.decode()
    assert Job.objects.filter(pk=old.pk).exists()
    client.post(CLEANUP, {"older_than": "7d", "states": ["completed"], "confirm": "1"})
    assert set(Job.objects.values_list("pk", flat=True)) == {old_failed.pk, recent.pk, ready.pk}
    bad = client.post(CLEANUP, {"older_than": "soon", "states": ["completed"], "preview": "1"})
    assert "expected an age like 7d" in bad.content.decode()


def test_cleanup_page_needs_its_permission() -> None:
    client = staff("delete_job")
    assert client.get(CLEANUP).status_code == 403
    assert (
        client.post(
            CLEANUP, {"older_than": "0s", "states": ["completed"], "confirm": "1"}
        ).status_code
        == 403
    )
    assert CLEANUP not in client.get(CHANGELIST).content.decode()


# ---------------------------------------------------------------- stats


def test_stats_page_shows_counts_latency_chart_and_workers(admin_client: Client) -> None:
    tasks.Noop(n=1).enqueue()
    Job.objects.filter(kind="tests.noop").update(run_at=timezone.now() - timedelta(minutes=10))
    job = finished("completed")
    JournalEntry.objects.create(job=job, attempt=1, outcome="completed", started_at=timezone.now())
    WorkerProcess.objects.create(name="alive", host="web-1", pid=11, concurrency=4)
    WorkerProcess.objects.create(
        name="gone",
        host="web-2",
        pid=12,
        concurrency=4,
        heartbeat_at=timezone.now() - timedelta(hours=1),
    )
    WorkerProcess.objects.create(
        name="stopped", host="web-3", pid=13, concurrency=4, stopped_at=timezone.now()
    )
    response = admin_client.get(STATS)
    assert response.status_code == 200
    page = response.content.decode()
    assert "tests.noop" in page and "Queue latency" in page
    assert re.search(r"<td>default</td><td>1</td><td>(9|10)m \d\ds</td>", page)
    assert "<svg" in page and "1 completed, 0 failed" in page
    assert "alive" in page and "web-1" in page
    assert 'gone <span class="venturi-stale">stale</span>' in page
    assert "alive <span" not in page
    assert "stopped" not in page.split('id="venturi-workers"')[1].split("</tbody>")[0]
    last_hour = page.split('id="venturi-last-hour"')[1].split("</tbody>")[0]
    kind = reverse("admin:django_venturi_job_kind", args=["tests.noop"])
    cells = "<td>default</td><td>1</td><td>0</td><td>0</td>"
    assert f'<td><a href="{kind}">tests.noop</a></td>{cells}' in last_hour
    assert 'http-equiv="refresh"' not in page


def test_stats_page_can_reload_itself(admin_client: Client) -> None:
    page = admin_client.get(f"{STATS}?refresh=10").content.decode()
    assert '<meta http-equiv="refresh" content="10">' in page
    page = admin_client.get(f"{STATS}?refresh=0").content.decode()
    assert 'http-equiv="refresh"' not in page


def test_pages_style_themselves_from_a_static_file_not_inline(admin_client: Client) -> None:
    """A strict Content-Security-Policy (`style-src 'self'`) blocks inline styles."""
    job = tasks.Noop(n=1).enqueue()
    for url in (
        CHANGELIST,
        STATS,
        reverse("admin:django_venturi_job_change", args=[job.pk]),
        reverse("admin:app_list", args=["django_venturi"]),
    ):
        page = admin_client.get(url).content.decode()
        assert "django_venturi/admin.css" in page, url
        assert "<style" not in page and 'style="' not in page, url
    css = ROOT / "django_venturi" / "static" / "django_venturi" / "admin.css"
    assert ".venturi-state" in css.read_text()


def test_app_index_links_to_the_stats_page(admin_client: Client) -> None:
    page = admin_client.get(reverse("admin:app_list", args=["django_venturi"])).content.decode()
    assert STATS in page


@pytest.mark.django_db(databases=["default", "sqlite"])
def test_the_admin_reads_jobs_from_the_venturi_database(admin_client: Client) -> None:
    from django.conf import settings
    from django.test import override_settings

    job = Login(user="ada", password="hunter2").enqueue(using="sqlite")
    JournalEntry.objects.using("sqlite").create(job=job, attempt=1, outcome="retry")
    with override_settings(VENTURI={**settings.VENTURI, "DATABASE": "sqlite"}):
        listed = admin_client.get(f"{CHANGELIST}?q=admin_login").context["cl"].result_list
        assert [row.pk for row in listed] == [job.pk]
        page = admin_client.get(reverse("admin:django_venturi_job_change", args=[job.pk]))
        assert page.status_code == 200 and "retry: ready" in page.content.decode()
        act(admin_client, "cancel_jobs", [job], confirm=True)
        assert Job.objects.using("sqlite").get(pk=job.pk).state == "cancelled"
        assert "tests.admin_login" in admin_client.get(STATS).content.decode()


# ---------------------------------------------------------------- workflows


def test_job_page_lists_dependencies_and_dependents_with_their_states(
    admin_client: Client,
) -> None:
    first, second, third = venturi.chain(
        tasks.Noop(n=1), tasks.Noop(n=2), tasks.Noop(n=3)
    ).enqueue()
    page = admin_client.get(reverse("admin:django_venturi_job_change", args=[second.pk]))
    assert page.status_code == 200
    html = page.content.decode()
    workflow = html.split("Enqueued after:")[1]
    first_url = reverse("admin:django_venturi_job_change", args=[first.pk])
    third_url = reverse("admin:django_venturi_job_change", args=[third.pk])
    assert f'<a href="{first_url}">#{first.pk} tests.noop</a>' in workflow
    assert '<span class="venturi-state venturi-ready">ready</span>' in workflow
    dependents = workflow.split("Jobs enqueued after it:")[1]
    assert f'<a href="{third_url}">#{third.pk} tests.noop</a>' in dependents
    assert '<span class="venturi-state venturi-waiting">waiting</span>' in dependents
    assert f'<a href="{first_url}">' not in dependents


def test_job_list_filters_waiting_jobs_and_says_what_they_wait_for(admin_client: Client) -> None:
    first = tasks.Noop(n=1).enqueue()
    waiting = tasks.Noop(n=2).enqueue(after=[first])
    html = admin_client.get(f"{CHANGELIST}?state__exact=waiting").content.decode()
    assert f"#{waiting.pk}" in html or f">{waiting.pk}<" in html
    assert f">{first.pk}<" not in html
    assert "for 1 dependency" in html
    assert "?state__exact=waiting" in admin_client.get(CHANGELIST).content.decode()


def test_stats_page_counts_waiting_jobs_apart_from_ready_ones(admin_client: Client) -> None:
    venturi.group([tasks.Noop(n=i) for i in range(3)], then=tasks.Noop(n=9)).enqueue()
    assert (venturi.stats().ready, venturi.stats().waiting) == (3, 1)
    page = admin_client.get(STATS).content.decode()
    assert "<strong>3</strong> ready, <strong>1</strong> waiting" in page
    assert "<td>default</td><td>3</td><td>1</td><td>0</td>" in page
