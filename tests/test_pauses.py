"""Pausing queues and kinds: the API, the claim, the command, the admin, and real workers."""

from __future__ import annotations

import io
import json
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

import django_venturi as venturi
from django_venturi.models import Job, Pause
from django_venturi.registry import registry
from django_venturi.store.claim import ClaimRequest, claim
from django_venturi.store.scheduling import TierClock
from tests.conftest import Workers, wait_until
from tests.test_admin import staff
from tests.testapp.flow_tasks import Held
from tests.testapp.models import Record
from tests.testapp.tasks import Noop

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])

LEASE = timedelta(minutes=5)
STATS = reverse("admin:django_venturi_job_stats")
PAUSE = reverse("admin:django_venturi_job_pause")
RESUME = reverse("admin:django_venturi_job_resume")


def take(alias: str, limit: int = 50) -> list[str]:
    kinds = registry.kinds()
    request = ClaimRequest(
        worker="w1",
        limit=limit,
        kinds=kinds,
        leases=[LEASE] * len(kinds),
        queues=None,
        kind_prefix="tasks:",
        prefix_lease=LEASE,
    )
    return sorted(f"{job.queue}/{job.kind}" for job in claim(alias, request, TierClock((6, 3, 1))))


# ---------------------------------------------------------------- the API


def test_pause_resume_and_paused(alias: str) -> None:
    assert venturi.pause(queue="emails", using=alias) is True
    assert venturi.pause(queue="emails", using=alias) is False
    assert venturi.pause(kind="tests.noop", by="ops", using=alias) is True
    listed = venturi.paused(using=alias)
    assert [(item.scope, item.name, item.paused_by) for item in listed] == [
        ("queue", "emails", "api"),
        ("kind", "tests.noop", "ops"),
    ]
    assert all(item.paused_at is not None for item in listed)
    assert venturi.resume(queue="emails", using=alias) is True
    assert venturi.resume(queue="emails", using=alias) is False
    assert [item.name for item in venturi.paused(using=alias)] == ["tests.noop"]


def test_a_pause_names_exactly_one_valid_target(alias: str) -> None:
    with pytest.raises(ValueError, match="exactly one of queue= and kind="):
        venturi.pause(using=alias)
    with pytest.raises(ValueError, match="exactly one of queue= and kind="):
        venturi.pause(queue="a", kind="b", using=alias)
    with pytest.raises(ValueError, match="queue 'no spaces' may contain only"):
        venturi.pause(queue="no spaces", using=alias)
    with pytest.raises(ValueError, match="by must name who pauses"):
        venturi.pause(queue="a", by="", using=alias)
    assert not Pause.objects.using(alias).exists()


def test_a_pause_rolls_back_with_the_callers_transaction(alias: str) -> None:
    from django.db import transaction

    with pytest.raises(RuntimeError), transaction.atomic(using=alias):
        venturi.pause(queue="emails", using=alias)
        raise RuntimeError("the caller's work failed")
    assert venturi.paused(using=alias) == []


# ---------------------------------------------------------------- the claim


def test_the_claim_takes_nothing_from_a_paused_queue_or_kind(alias: str) -> None:
    Noop(n=1).enqueue(queue="emails", using=alias)
    Noop(n=2).enqueue(queue="other", using=alias)
    Held(n=3).enqueue(queue="other", using=alias)
    venturi.pause(queue="emails", using=alias)
    venturi.pause(kind="tests.held", using=alias)
    assert take(alias) == ["other/tests.noop"]
    venturi.resume(queue="emails", using=alias)
    venturi.resume(kind="tests.held", using=alias)
    assert take(alias) == ["emails/tests.noop", "other/tests.held"]


def test_a_paused_kind_of_a_django_tasks_job_is_not_claimed(alias: str) -> None:
    for kind in ("tasks:tests.example.one", "tasks:tests.example.two"):
        Job.objects.using(alias).create(kind=kind, payload={})
    venturi.pause(kind="tasks:tests.example.one", using=alias)
    assert take(alias) == ["default/tasks:tests.example.two"]


# ---------------------------------------------------------------- the command


def run(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("venturi_queue", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_the_command_pauses_lists_and_resumes() -> None:
    assert run("list") == ("nothing is paused\n", "")
    out, err = run("pause", "default", "--kind", "tests.noop")
    assert out.splitlines() == [
        "paused queue default: workers claim none of its jobs",
        "paused kind tests.noop: workers claim none of its jobs",
    ]
    assert err == ""
    out, err = run("pause", "defualt", "--by", "alice")
    assert "no registered task uses queue 'defualt' (did you mean 'default'?)" in err
    assert out == "paused queue defualt: workers claim none of its jobs\n"
    listed, _ = run("list")
    lines = listed.splitlines()
    assert lines[0].split() == ["scope", "name", "paused", "by", "paused", "at"]
    assert [line.split()[:3] for line in lines[1:]] == [
        ["queue", "default", "api"],
        ["queue", "defualt", "alice"],
        ["kind", "tests.noop", "api"],
    ]
    as_json = json.loads(run("list", "--json")[0])
    assert [item["name"] for item in as_json] == ["default", "defualt", "tests.noop"]
    assert run("pause", "default")[0] == "queue default was paused already\n"
    assert run("resume", "default", "defualt")[0].splitlines() == [
        "resumed queue default",
        "resumed queue defualt",
    ]
    assert run("resume", "default")[0] == "queue default was not paused\n"


def test_the_command_refuses_what_it_cannot_do() -> None:
    with pytest.raises(CommandError, match="pause: name at least one queue, or a --kind"):
        run("pause")
    with pytest.raises(CommandError, match="list takes no queue or --kind"):
        run("list", "emails")
    with pytest.raises(CommandError, match="pause: queue 'bad name' may contain only"):
        run("pause", "bad name")


def test_stats_show_pauses_and_rate_limits() -> None:
    venturi.pause(queue="emails")
    out = io.StringIO()
    call_command("venturi_stats", stdout=out)
    assert "paused queue emails by api at " in out.getvalue()
    assert "rate limit tests.rated: 5 per 0.4s; 0 started in the window; 0 due waiting" in (
        out.getvalue()
    )
    out = io.StringIO()
    call_command("venturi_stats", "--json", stdout=out)
    data = json.loads(out.getvalue())
    assert [item["name"] for item in data["pauses"]] == ["emails"]
    rated = [use for use in data["rate_limits"] if use["kind"] == "tests.rated_per_account"]
    assert rated == [
        {
            "kind": "tests.rated_per_account",
            "limit": "3 per 1s per account",
            "used": 0,
            "busiest": 0,
            "keys_at_limit": 0,
            "waiting": 0,
        }
    ]


# ---------------------------------------------------------------- the admin


def test_the_admin_pauses_and_resumes_behind_its_own_permission() -> None:
    viewer = staff()
    page = viewer.get(STATS)
    assert page.status_code == 200
    assert b"Nothing is paused." in page.content
    assert b'value="Pause"' not in page.content
    assert viewer.post(PAUSE, {"scope": "queue", "name": "emails"}).status_code == 403
    assert venturi.paused() == []

    operator = staff("pause_queues")
    assert b'value="Pause"' in operator.get(STATS).content
    response = operator.post(PAUSE, {"scope": "queue", "name": "emails"}, follow=True)
    assert b"Paused queue emails" in response.content
    [item] = venturi.paused()
    assert (item.scope, item.name) == ("queue", "emails")
    assert item.paused_by.startswith("staff")
    assert b'value="Resume"' in response.content
    assert operator.get(PAUSE).status_code == 405
    response = operator.post(PAUSE, {"scope": "table", "name": "x"}, follow=True)
    assert b"Scope must be queue or kind" in response.content  # the admin capitalises
    response = operator.post(PAUSE, {"scope": "kind", "name": "bad name"}, follow=True)
    assert b"Kind &#x27;bad name&#x27; may contain only" in response.content
    assert viewer.post(RESUME, {"scope": "queue", "name": "emails"}).status_code == 403
    response = operator.post(RESUME, {"scope": "queue", "name": "emails"}, follow=True)
    assert b"Resumed queue emails" in response.content
    assert venturi.paused() == []


# ---------------------------------------------------------------- real workers


def held_state(n: int) -> str:
    return str(Job.objects.get(payload__n=n, kind="tests.held").state)


def test_a_pause_hands_back_a_running_workers_buffered_job_and_outlives_the_worker(
    workers: Workers, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    Held(n=1, gate=str(gate)).enqueue(queue="slow")
    Held(n=2).enqueue(queue="slow")
    workers.start("default", "--concurrency", "1", "--queues", "slow")
    # Job 1 runs; job 2 waits in the worker's buffer, claimed.
    wait_until(lambda: Record.objects.filter(kind="held").exists(), message="job 1 to start")
    wait_until(lambda: held_state(2) == "running", message="job 2 to be claimed ahead")
    venturi.pause(queue="slow")
    # Job 1 holds the only slot until the gate opens: nothing but the pause, reaching the
    # running worker, can hand job 2 back.
    wait_until(lambda: held_state(2) == "ready", message="job 2 handed back")
    assert held_state(1) == "running"
    gate.touch()
    # The running job finishes; the handed-back one does not run.
    wait_until(lambda: held_state(1) == "completed", message="job 1 to finish")
    assert [r.value["n"] for r in Record.objects.filter(kind="held")] == [1]
    journal = Job.objects.get(payload__n=2, kind="tests.held").journal.get()
    assert journal.outcome == "released" and journal.error_message == ""

    # A restarted worker still claims nothing from the paused queue.
    workers.stop_all()
    workers.start("default", "--concurrency", "1", "--queues", "slow,other")
    for n in range(3):
        # Each run of `other` is a claim made while job 2 was due in `slow`: unpaused,
        # job 2 (enqueued first, and a claim fills more places than one) would go with it.
        job = Noop(n=n).enqueue(queue="other")
        wait_until(
            lambda job=job: Job.objects.get(pk=job.pk).state == venturi.State.COMPLETED,
            message=f"the other queue's job {n}",
        )
        assert held_state(2) == "ready"
    second = Job.objects.get(payload__n=2, kind="tests.held")
    assert (second.attempt, list(second.journal.values_list("outcome", flat=True))) == (
        1,
        ["released"],
    ), "job 2 was claimed again while paused"
    venturi.resume(queue="slow")
    wait_until(lambda: held_state(2) == "completed", message="job 2 after resume")


def test_a_paused_kind_waits_while_other_kinds_run(workers: Workers) -> None:
    venturi.pause(kind="tests.held")
    Held(n=1).enqueue()
    Noop(n=2).enqueue()
    workers.start("default", "--concurrency", "2")
    wait_until(
        lambda: Job.objects.filter(kind="tests.noop", state="completed").exists(),
        message="the unpaused kind to run",
    )
    assert held_state(1) == "ready"
    venturi.resume(kind="tests.held")
    wait_until(lambda: held_state(1) == "completed", message="the resumed kind")


def test_on_sqlite_a_pause_hands_back_a_running_workers_buffered_job(
    workers: Workers, tmp_path: Path
) -> None:
    def state(n: int) -> str:
        return str(Job.objects.using("sqlite").get(payload__n=n, kind="tests.held").state)

    gate = tmp_path / "gate"
    Held(n=1, gate=str(gate)).enqueue(queue="slow", using="sqlite")
    Held(n=2).enqueue(queue="slow", using="sqlite")
    workers.start("sqlite", "--concurrency", "1", "--queues", "slow")
    wait_until(lambda: state(1) == "running" and state(2) == "running", message="both claimed")
    venturi.pause(queue="slow", using="sqlite")
    # No notifications on SQLite: the worker learns of the pause at a poll, while job 1
    # still holds the only slot (until the gate opens).
    wait_until(lambda: state(2) == "ready", message="job 2 handed back")
    assert state(1) == "running"
    gate.touch()
    wait_until(lambda: state(1) == "completed", message="job 1 to finish")
    venturi.resume(queue="slow", using="sqlite")
    wait_until(lambda: state(2) == "completed", message="job 2 after resume")
