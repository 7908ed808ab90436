"""Orphan kinds: due jobs no live worker can run, in stats(), the commands, the admin and
the worker's own log."""

from __future__ import annotations

import io
import json
import logging
import subprocess
from collections.abc import Sequence
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.utils import timezone

import django_venturi as venturi
from django_venturi.models import Job, WorkerProcess
from django_venturi.store import registration
from django_venturi.store.orphan_kinds import can_run, find_orphan_kinds
from django_venturi.worker import orphan_watch
from django_venturi.worker.orphan_watch import OrphanWatch
from tests.conftest import Workers, wait_until, worker_env

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])


def waiting(alias: str, kind: str, queue: str = "default", *, jobs: int = 1) -> None:
    """Ready jobs of `kind` written as rows, as a producer whose task a worker lacks does."""
    for _ in range(jobs):
        Job.objects.using(alias).create(kind=kind, queue=queue, payload={})


def worker(
    alias: str,
    name: str,
    *,
    kinds: Sequence[str] | None,
    queues: Sequence[str] | None = None,
) -> None:
    registration.register(alias, name=name, queues=queues, concurrency=1, kinds=kinds)


def orphans(alias: str) -> list[tuple[str, str, int, bool]]:
    return [
        (orphan.kind, orphan.queue, orphan.jobs, orphan.known)
        for orphan in venturi.stats(using=alias).orphan_kinds
    ]


def test_kinds_no_live_worker_runs_are_orphans(alias: str) -> None:
    waiting(alias, "tests.noop")
    waiting(alias, "shop.SendMail", jobs=2)  # a typo, a removed task, a module never imported
    Job.objects.using(alias).create(
        kind="gone.Later", queue="default", payload={}, run_at=timezone.now() + timedelta(hours=1)
    )
    assert orphans(alias) == []  # no live worker: every job waits, the workers list says why
    worker(alias, "w1", kinds=["tests.noop", "tests.flaky"])
    assert orphans(alias) == [("shop.SendMail", "default", 2, False)]  # not due: not listed
    snapshot = venturi.stats(using=alias)
    assert snapshot.orphan_kinds[0].oldest_due_age >= timedelta(0)
    data = json.loads(json.dumps(snapshot.as_dict()))["orphan_kinds"]
    assert [(item["kind"], item["queue"], item["jobs"]) for item in data] == [
        ("shop.SendMail", "default", 2)
    ]


def test_a_worker_that_knows_the_kind_counts_only_for_the_queues_it_serves(alias: str) -> None:
    waiting(alias, "tests.noop", queue="mail")
    waiting(alias, "tests.noop", queue="default")
    worker(alias, "default-only", kinds=["tests.noop"], queues=["default"])
    worker(alias, "mail-without-the-task", kinds=["tests.flaky"], queues=["mail"])
    assert orphans(alias) == [("tests.noop", "mail", 1, True)]
    assert find_orphan_kinds(alias, queues=["default"]) == []  # a worker's look at its queues
    worker(alias, "mail", kinds=["tests.noop"], queues=["mail", "other"])
    assert orphans(alias) == []


def test_stopped_and_stale_workers_do_not_count_and_older_ones_run_anything(
    alias: str,
) -> None:
    waiting(alias, "tests.noop")
    worker(alias, "live", kinds=["tests.flaky"])
    worker(alias, "stopped", kinds=["tests.noop"])
    registration.stopped(alias, name="stopped", processed=0)
    worker(alias, "stale", kinds=["tests.noop"])
    WorkerProcess.objects.using(alias).filter(name="stale").update(
        heartbeat_at=timezone.now() - timedelta(hours=1)
    )
    assert orphans(alias) == [("tests.noop", "default", 1, False)]
    # A worker from before WorkerProcess.kinds (null) might run the kind: no false alarm.
    worker(alias, "older", kinds=None, queues=["default"])
    assert orphans(alias) == []


def test_a_wildcard_entry_runs_every_kind_with_its_prefix() -> None:
    assert can_run(["tests.noop", "tasks:*"], "tasks:myapp.tasks.send")
    assert can_run(["tests.noop"], "tests.noop")
    assert not can_run(["tests.noop"], "tasks:myapp.tasks.send")
    assert not can_run(["tasks:*"], "tests.noop")


def test_venturi_stats_lists_them_and_check_orphans_fails_on_them(alias: str) -> None:
    waiting(alias, "shop.SendMail")
    worker(alias, "w1", kinds=["tests.noop"])
    out = io.StringIO()
    call_command("venturi_stats", "--database", alias, stdout=out)
    text = out.getvalue()
    assert "due jobs that no live worker can run" in text
    assert "shop.SendMail in queue default: 1 due" in text
    assert "does not import" in text and "typo" in text
    with pytest.raises(CommandError, match=r"shop\.SendMail \(1 in default\)"):
        call_command("venturi_stats", "--check-orphans", "--database", alias)
    # The liveness check does not fail on them (a restart would not help): it warns.
    out, err = io.StringIO(), io.StringIO()
    call_command(
        "venturi_stats",
        "--check-workers",
        "--host",
        "*",
        "--database",
        alias,
        stdout=out,
        stderr=err,
    )
    assert out.getvalue().startswith("ok: 1 live worker(s)")
    assert "shop.SendMail" in err.getvalue()
    Job.objects.using(alias).filter(kind="shop.SendMail").delete()
    out = io.StringIO()
    call_command("venturi_stats", "--check-orphans", "--database", alias, stdout=out)
    assert out.getvalue().startswith("ok: ")


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_the_admin_stats_page_explains_them(admin_client: Client) -> None:
    waiting("default", "shop.SendMail", queue="mail")
    worker("default", "w1", kinds=["tests.noop"])
    page = admin_client.get("/admin/django_venturi/job/stats/").content.decode()
    assert 'id="venturi-orphan-kinds"' in page
    assert "shop.SendMail" in page and "no live worker knows this kind" in page
    assert "tasks.py" in page and "typo" in page
    Job.objects.filter(kind="shop.SendMail").delete()
    page = admin_client.get("/admin/django_venturi/job/stats/").content.decode()
    assert 'id="venturi-orphan-kinds"' not in page


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_watch_warns_once_per_kind_then_again_while_they_wait(
    alias: str, caplog: pytest.LogCaptureFixture
) -> None:
    worker(alias, "me", kinds=["tests.noop"], queues=["default"])
    waiting(alias, "shop.SendMail", jobs=3)
    waiting(alias, "shop.Elsewhere", queue="other")  # not a queue it serves
    clock = Clock()
    watch = OrphanWatch(alias=alias, worker="me", queues=["default"], clock=clock)

    def warnings() -> list[str]:
        said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        caplog.clear()
        return said

    with caplog.at_level(logging.WARNING, logger="django_venturi.worker"):
        watch.look_if_due()
        said = warnings()
        assert len(said) == 1
        assert "3 due jobs of kind 'shop.SendMail' wait in queue default" in said[0]
        assert "tasks.py" in said[0] and "typo" in said[0]
        clock.now += orphan_watch.LOOK_EVERY
        watch.look_if_due()
        assert warnings() == []  # said once; not again until WARN_AGAIN_AFTER
        clock.now += orphan_watch.WARN_AGAIN_AFTER
        watch.look_if_due()
        assert len(warnings()) == 1
        Job.objects.using(alias).filter(kind="shop.SendMail").delete()
        clock.now += orphan_watch.LOOK_EVERY
        watch.look_if_due()
        assert warnings() == []
        waiting(alias, "shop.SendMail")  # back: said at once
        clock.now += orphan_watch.LOOK_EVERY
        watch.look_if_due()
        assert len(warnings()) == 1


def test_a_worker_names_its_kinds_stores_them_and_warns_of_orphans(
    alias: str, workers: Workers
) -> None:
    waiting(alias, "shop.SendMail", jobs=2)
    process = workers.start(alias, "--queues", "default")
    row = wait_until(
        lambda: WorkerProcess.objects.using(alias).filter(pid=process.pid).first(),
        message="the worker's row",
    )
    assert row.kinds is not None and "tests.noop" in row.kinds
    wait_until(
        lambda: "2 due jobs of kind 'shop.SendMail' wait in queue default" in workers.log(),
        message="the worker's warning about the orphan kind",
    )
    start_line = next(line for line in workers.log().splitlines() if "starting" in line)
    assert f"kinds={len(row.kinds)} (" in start_line and "-v 2 lists them all" in start_line
    assert "tests.noop" not in start_line  # the first few only, in alphabetical order
    listing = subprocess.run(
        [*workers.command(alias, "--burst", "--queues", "empty", "-v", "2")],
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=90,
        check=True,
    )
    start_line = next(line for line in listing.stderr.splitlines() if "starting" in line)
    assert all(kind in start_line for kind in row.kinds)


def test_kind_concurrency_refuses_a_kind_no_task_registered() -> None:
    with pytest.raises(
        CommandError, match=r"--kind-concurrency: .*'tests\.nope'.*did you mean 'tests\.noop'"
    ):
        call_command("venturi_worker", "--kind-concurrency", "tests.noop=1,tests.nope=2")
    with pytest.raises(CommandError, match=r"--kind-concurrency: .*'zzz'.*registered: "):
        call_command("venturi_worker", "--kind-concurrency", "zzz=2")


def test_queues_warns_of_a_queue_no_task_uses(alias: str, workers: Workers) -> None:
    result = workers.burst(alias, "--queues", "default,defualt")
    assert "--queues: no registered task uses queue 'defualt'" in result.stderr
    assert "did you mean 'default'" in result.stderr
    assert "queue 'default'" not in result.stderr
