"""Progress: throttled writes from a real worker, visible in stats() and the admin."""

from __future__ import annotations

import itertools

import pytest
from django.contrib.auth.models import User
from django.test import Client

import django_venturi as venturi
from django_venturi.admin.display import progress_text
from django_venturi.models import Job
from tests.conftest import Workers, wait_until
from tests.testapp.control_tasks import ReportsProgress

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])


def test_progress_is_visible_while_running_and_final_with_the_verdict(
    alias: str, workers: Workers
) -> None:
    # 400 steps of 10 ms: about 4 s of run, reported at every step, written once a second.
    job = ReportsProgress(steps=400).enqueue(using=alias)
    workers.start(alias)

    def reported() -> object:
        snapshot = venturi.stats(using=alias)
        return next((p for p in snapshot.progress if p.job_id == job.id and p.done > 0), None)

    seen = wait_until(reported, timeout=20, message="progress in stats()")
    assert seen.total == 400 and seen.note == f"step {seen.done}" and seen.kind == job.kind
    assert 0 < seen.done < 400
    assert seen.fraction == seen.done / 400
    assert venturi.stats(using=alias).as_dict()["progress"][0]["job_id"] == job.id

    wait_until(
        lambda: Job.objects.using(alias).get(id=job.id).state == venturi.State.COMPLETED,
        timeout=30,
    )
    job.refresh_from_db()
    # The last value went with the verdict, however recent.
    assert job.progress["done"] == 400 and job.progress["total"] == 400
    assert venturi.stats(using=alias).progress == []


def test_progress_in_the_admin_list_and_page(db: None) -> None:
    job = ReportsProgress(steps=10).enqueue()
    Job.objects.filter(id=job.id).update(
        progress={"done": 4, "total": 10, "note": "resizing", "at": "2026-01-01T00:00:00+00:00"}
    )
    User.objects.create_superuser("admin", "admin@example.com", "pw")
    client = Client()
    client.login(username="admin", password="pw")
    listing = client.get("/admin/django_venturi/job/")
    assert listing.status_code == 200
    assert "4 / 10 (40%) resizing" in listing.content.decode()
    page = client.get(f"/admin/django_venturi/job/{job.id}/change/")
    assert page.status_code == 200
    assert "4 / 10 (40%) resizing" in page.content.decode()


def test_progress_text_shows_done_total_share_and_note() -> None:
    assert progress_text(None) == "-"
    assert progress_text({"done": 3, "total": None, "note": ""}) == "3"
    assert progress_text({"done": 1, "total": 4, "note": "rows"}) == "1 / 4 (25%) rows"


def test_progress_arguments_are_checked() -> None:
    import threading
    from datetime import UTC, datetime

    context = venturi.Context(
        job_id=1,
        attempt=1,
        carry=None,
        enqueued_at=datetime.now(UTC),
        database="default",
        stop=threading.Event(),
        lease_lost=threading.Event(),
        heartbeat=lambda: True,
    )
    context.progress(1, 2, "fine")  # no worker: nothing to record, no error
    with pytest.raises(TypeError, match="done must be a number"):
        context.progress("1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="total must be a number"):
        context.progress(1, total="2")  # type: ignore[arg-type]


def test_venturi_stats_lists_running_jobs_with_progress(db: None) -> None:
    import uuid
    from datetime import timedelta
    from io import StringIO

    from django.core.management import call_command
    from django.utils import timezone

    job = ReportsProgress(steps=10).enqueue()
    Job.objects.filter(id=job.id).update(
        state=venturi.State.RUNNING,
        attempt=1,
        claim_token=uuid.uuid4(),
        lease_expires_at=timezone.now() + timedelta(minutes=5),
        progress={"done": 3, "total": 10, "note": "rows", "at": "2026-01-01T00:00:00+00:00"},
    )
    out = StringIO()
    call_command("venturi_stats", stdout=out)
    assert f"job {job.id} (tests.reports_progress): 3 / 10 rows" in out.getvalue()


@pytest.mark.django_db(transaction=True)
def test_progress_writes_are_throttled_to_one_per_second(workers: Workers) -> None:
    """300 ctx.progress() calls over ~3 s: a trigger counts the writes that reach the row."""
    from django.db import connection

    table = Job._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE progress_writes (job_id bigint, at timestamptz DEFAULT clock_timestamp())"
        )
        cursor.execute(
            """CREATE FUNCTION count_progress_writes() RETURNS trigger AS $$
               BEGIN
                 IF NEW.progress IS DISTINCT FROM OLD.progress THEN
                   INSERT INTO progress_writes (job_id) VALUES (NEW.id);
                 END IF;
                 RETURN NEW;
               END $$ LANGUAGE plpgsql"""
        )
        cursor.execute(
            f'CREATE TRIGGER count_progress_writes BEFORE UPDATE ON "{table}" '
            "FOR EACH ROW EXECUTE FUNCTION count_progress_writes()"
        )
    try:
        job = ReportsProgress(steps=300).enqueue()
        workers.start("default")
        wait_until(lambda: Job.objects.get(id=job.id).state == venturi.State.COMPLETED, timeout=30)
        with connection.cursor() as cursor:
            cursor.execute("SELECT at FROM progress_writes WHERE job_id = %s ORDER BY at", [job.id])
            writes = [row[0] for row in cursor.fetchall()]
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'DROP TRIGGER count_progress_writes ON "{table}"')
            cursor.execute("DROP FUNCTION count_progress_writes()")
            cursor.execute("DROP TABLE progress_writes")
    # About one write a second while running, plus the last value with the verdict.
    assert 2 <= len(writes) <= 8, writes
    throttled = writes[:-1]  # the verdict's write may follow the last throttled one closely
    gaps = [(later - earlier).total_seconds() for earlier, later in itertools.pairwise(throttled)]
    assert all(gap >= 0.9 for gap in gaps), gaps
