"""Django's Tasks framework on venturi: the documented behaviours, with real workers.

Every test runs once per installed framework: Django's own `django.tasks`
(Django 6+) and the django-tasks backport (`django_tasks`). On Django 6.1 with
the backport installed both run, in one project, against one TASKS setting.
"""

from __future__ import annotations

import gc
import importlib
import json
import math
import sys
import uuid
import weakref
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core import checks
from django.core.signing import Signer
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

import django_venturi as venturi
from django_venturi.models import Job, JournalEntry
from django_venturi.store.claim import ClaimRequest, claim
from django_venturi.store.claim_statement import postgresql_statement
from django_venturi.store.scheduling import TierClock
from django_venturi.tasks_backend import envelope, frameworks, runner
from tests.conftest import Workers, wait_until
from tests.query_plans import most_rows_read_by_one_node
from tests.test_run_times import assert_sequential
from tests.test_tampering import tripwire  # noqa: F401 - the fixture
from tests.testapp import tasks as venturi_tasks
from tests.testapp.models import Account, Record

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])

MODULES = {
    "django.tasks": "tests.testapp.tasks_django",
    "django_tasks": "tests.testapp.tasks_backport",
}
INSTALLED = [framework.name for framework in frameworks.available()]


@pytest.fixture(params=list(MODULES), ids=["django.tasks", "backport"])
def tasks(request: pytest.FixtureRequest) -> ModuleType:
    """The test task functions of one framework (skipped where it is not installed)."""
    if request.param not in INSTALLED:
        pytest.skip(f"{request.param} is not installed")
    return importlib.import_module(MODULES[request.param])


def framework_of(tasks: ModuleType) -> frameworks.Framework:
    return frameworks.by_name(tasks.FRAMEWORK)


def exceptions_of(tasks: ModuleType) -> ModuleType:
    return importlib.import_module(f"{tasks.FRAMEWORK}.exceptions")


def records(kind: str, job_id: str | int) -> list[Any]:
    return list(
        Record.objects.filter(kind=kind, job_id=int(job_id))
        .order_by("id")
        .values_list("value", flat=True)
    )


# ---------------------------------------------------------------- enqueue, run, results


def test_enqueue_returns_a_ready_result_and_a_worker_runs_it(
    tasks: ModuleType, workers: Workers
) -> None:
    framework = framework_of(tasks)
    result = tasks.add.enqueue(2, 3)

    assert type(result) is framework.result_class
    assert result.status == framework.status.READY
    assert result.enqueued_at is not None and result.started_at is None
    assert (result.args, result.kwargs, result.errors, result.worker_ids) == ([2, 3], {}, [], [])
    assert result.backend == "default" and result.task.func is tasks.add.func
    job = Job.objects.get(pk=int(result.id))
    module = tasks.__name__
    assert (job.kind, job.queue, job.state) == (f"tasks:{module}.add", "default", "ready")
    assert (job.priority, job.rank) == (venturi.Priority.NORMAL, 0)

    workers.burst("default")

    result.refresh()
    assert result.status == framework.status.SUCCESSFUL
    assert result.return_value == 5
    assert result.is_finished and result.errors == []
    assert len(result.worker_ids) == 1 and result.attempts == 1
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.last_attempted_at == result.started_at
    fetched = tasks.add.get_result(result.id)
    assert type(fetched) is framework.result_class and fetched.return_value == 5
    job.refresh_from_db()
    assert (job.state, job.result, job.attempt) == ("completed", 5, 1)
    (entry,) = JournalEntry.objects.filter(job=job)
    assert entry.outcome == "completed" and entry.worker == result.worker_ids[0]


def test_arguments_and_the_return_value_round_trip_as_json(
    tasks: ModuleType, workers: Workers
) -> None:
    result = tasks.echo.enqueue(
        1, "two", [3.5, None], (4, 5), "café".encode(), flag=True, nested={"a": [1]}
    )
    workers.burst("default")
    result.refresh()
    # UTF-8 bytes become text, as Django's own TaskResult makes them.
    assert result.return_value == {
        "args": [1, "two", [3.5, None], [4, 5], "café"],
        "kwargs": {"flag": True, "nested": {"a": [1]}},
    }
    assert result.args == [1, "two", [3.5, None], [4, 5], "café"]


def test_arguments_that_are_not_json_are_refused_at_enqueue(tasks: ModuleType) -> None:
    with pytest.raises(TypeError, match=r"args\[0\] is a builtins.object, which is not JSON"):
        tasks.add.enqueue(object(), 1)
    with pytest.raises(TypeError, match=r"kwargs\['when'\] is a datetime.datetime"):
        tasks.echo.enqueue(when=timezone.now())
    with pytest.raises(ValueError, match=r"args\[0\]\[1\] is nan, which JSON cannot hold"):
        tasks.echo.enqueue([1, math.nan])
    with pytest.raises(TypeError, match=r"has the key 1 \(int\); JSON keys must be str"):
        tasks.echo.enqueue({1: "one"})
    with pytest.raises(ValueError, match=r"kwargs\['raw'\] is bytes that are not UTF-8 text"):
        tasks.echo.enqueue(raw=b"\xff\xfe")
    assert not Job.objects.exists()


def test_a_return_value_that_is_not_json_fails_the_task(
    tasks: ModuleType, workers: Workers
) -> None:
    framework = framework_of(tasks)
    result = tasks.bad_return.enqueue()
    workers.burst("default")
    result.refresh()
    assert result.status == framework.status.FAILED
    (error,) = result.errors
    assert error.exception_class is TypeError
    assert "the return value is a builtins.set" in error.traceback


def test_a_return_value_is_stored_as_a_json_round_trip_makes_it(
    tasks: ModuleType, workers: Workers
) -> None:
    framework = framework_of(tasks)
    keys = tasks.non_str_keys.enqueue()
    nan = tasks.not_a_number.enqueue()
    workers.burst("default")

    keys.refresh()
    assert keys.status == framework.status.SUCCESSFUL, keys.errors
    # What Django's database-backed backends store and read back: the `json` round trip.
    expected = json.loads(json.dumps(tasks.non_str_keys.call()))
    assert expected == {"7": "int", "2.5": "float", "false": "bool", "null": "none"}
    assert keys.return_value == expected
    assert Job.objects.get(pk=int(keys.id)).result == expected
    # NaN: PostgreSQL's jsonb cannot hold it, so the task fails, saying why.
    nan.refresh()
    assert nan.status == framework.status.FAILED
    (error,) = nan.errors
    assert error.exception_class is ValueError
    assert "the return value is nan, which JSON cannot hold (nor can PostgreSQL's jsonb)" in (
        error.traceback
    )
    assert Job.objects.get(pk=int(nan.id)).state == "failed"


def test_return_value_keys_json_would_merge_or_cannot_write_are_refused() -> None:
    assert envelope.stored_result({"a": [{2: None}], "b": b"x"}) == {"a": [{"2": None}], "b": "x"}
    with pytest.raises(ValueError, match=r"has the keys 1 and '1', which JSON writes as one key"):
        envelope.stored_result({1: "a", "1": "b"})
    with pytest.raises(ValueError, match=r"\['x'\] has the keys True and 'true'"):
        envelope.stored_result({"x": {True: 1, "true": 2}})
    with pytest.raises(TypeError, match=r"has the key \(1, 2\) \(tuple\); JSON keys must be"):
        envelope.stored_result({(1, 2): "a"})
    with pytest.raises(TypeError, match=r"has the key nan \(float\)"):
        envelope.stored_result({math.nan: "a"})
    with pytest.raises(ValueError, match=r"\[1\] is inf, which JSON cannot hold"):
        envelope.stored_result([1, math.inf])


def test_unknown_ids_raise_task_result_does_not_exist(tasks: ModuleType) -> None:
    does_not_exist = exceptions_of(tasks).TaskResultDoesNotExist
    venturi_job = venturi_tasks.Noop(n=1).enqueue()
    for unknown in ["999999999", "9" * 40, "", "not-a-number", str(venturi_job.pk)]:
        with pytest.raises(does_not_exist):
            tasks.add.get_result(unknown)
        with pytest.raises(does_not_exist):
            tasks.add.get_backend().get_result(unknown)


def test_get_result_takes_exactly_the_ids_results_have(tasks: ModuleType) -> None:
    does_not_exist = exceptions_of(tasks).TaskResultDoesNotExist
    result_id = tasks.add.enqueue(1, 2).id
    arabic_indic = result_id.translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩"))
    near_misses = [f" {result_id} ", f"0_{result_id}", f"0{result_id}", f"+{result_id}"]
    near_misses += [f"{result_id}\n", arabic_indic]
    for near_miss in near_misses:
        assert int(near_miss) == int(result_id)  # what `int()` alone would accept
        with pytest.raises(does_not_exist, match="no task result has the id"):
            tasks.add.get_result(near_miss)
        with pytest.raises(does_not_exist):
            tasks.add.get_backend().get_result(near_miss)
    with pytest.raises(does_not_exist):
        tasks.add.get_backend().get_result(int(result_id))  # ids are str
    assert tasks.add.get_result(result_id).id == result_id


def test_runs_on_one_slot_report_their_own_start_not_the_claims(
    tasks: ModuleType, workers: Workers
) -> None:
    nap = 0.3
    results = [tasks.nap.enqueue(nap), tasks.nap.enqueue(nap)]

    workers.burst("default", "--concurrency", "1")

    for result in results:
        result.refresh()
        assert result.return_value == nap
        assert result.last_attempted_at == result.started_at
    assert results[0].started_at != results[1].started_at
    assert_sequential([(result.started_at, result.finished_at) for result in results], nap)


# ---------------------------------------------------------------- defer and priority


def test_run_after_defers_the_task(tasks: ModuleType, workers: Workers) -> None:
    framework = framework_of(tasks)
    later = tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(1, 1)
    soon_at = timezone.now() + timedelta(seconds=2)
    soon = tasks.add.using(run_after=soon_at).enqueue(2, 2)
    assert soon.task.run_after == soon_at

    workers.burst("default")
    later.refresh()
    assert later.status == framework.status.READY, "ran before its run_after"

    wait_until(lambda: timezone.now() > soon_at + timedelta(milliseconds=100), message="due")
    workers.burst("default")
    soon.refresh()
    later.refresh()
    assert soon.status == framework.status.SUCCESSFUL and soon.started_at >= soon_at
    assert soon.task.run_after == soon_at
    assert later.status == framework.status.READY


def test_priority_maps_onto_tiers_and_orders_within_them(
    tasks: ModuleType, workers: Workers
) -> None:
    priorities = [-50, 0, 10, 100, -100, 50, 1]
    results = {p: tasks.ordered.using(priority=p).enqueue(f"p{p}") for p in priorities}
    rows = {p: Job.objects.get(pk=int(r.id)) for p, r in results.items()}
    assert {p: (row.priority, row.rank) for p, row in rows.items()} == {
        -50: (venturi.Priority.LOW, 50),
        0: (venturi.Priority.NORMAL, 0),
        10: (venturi.Priority.HIGH, -10),
        100: (venturi.Priority.HIGH, -100),
        -100: (venturi.Priority.LOW, 100),
        50: (venturi.Priority.HIGH, -50),
        1: (venturi.Priority.HIGH, -1),
    }

    # One job per claim and one handler: the run order is the claim order.
    workers.burst("default", "--concurrency", "1", "--batch-size", "1")

    order = [
        int(name.removeprefix("p"))
        for name in Record.objects.filter(kind="ordered")
        .order_by("id")
        .values_list("value", flat=True)
    ]
    assert sorted(order) == sorted(priorities)
    assert order[0] == 100 and order[-1] == -100
    assert [p for p in order if p > 0] == [100, 50, 10, 1], "HIGH tier out of priority order"
    assert [p for p in order if p < 0] == [-50, -100], "LOW tier out of priority order"


def test_the_claim_of_tasks_jobs_uses_the_partial_index_on_a_fresh_backlog() -> None:
    """100,000 ready Tasks jobs (four priorities a tier), not analysed: no scan, no sort."""
    table = connection.ops.quote_name(Job._meta.db_table)
    with connection.cursor() as cursor:
        # A table never vacuumed nor analysed, whatever earlier tests did to it: a VACUUM
        # of a few rows spread over many pages (tests/test_table_health.py) leaves a row
        # density that makes 100,000 new rows look like a few hundred to the planner.
        cursor.execute(f"TRUNCATE {table} CASCADE")
        cursor.execute(
            f"""INSERT INTO {table} (kind, queue, priority, rank, state, payload, attempt,
                                     failures, run_at, enqueued_at, claimed_by, last_error)
                SELECT 'tasks:app.tasks.f' || (i % 7), 'default', i % 3, -10 * (i % 4), 'ready',
                       '{{}}', 0, 0, now(), now(), '', '' FROM generate_series(1, 100000) AS i"""
        )
    request = ClaimRequest(
        worker="w",
        limit=100,
        kinds=["tests.noop"],
        leases=[timedelta(minutes=5)],
        queues=None,
        kind_prefix="tasks:",
        prefix_lease=timedelta(minutes=1),
    )
    sql, params = postgresql_statement("default", request, TierClock((6, 3, 1)), uuid.uuid4())
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params)
        plan = cursor.fetchone()[0]
    text = json.dumps(plan)
    assert "venturi_job_claim_rank_idx" in text
    assert '"Seq Scan"' not in text
    # At most `limit` rows from each tier's and rank's index scan (1,200 here), never the
    # backlog's 100,000: what a sort or a scan of the backlog would read.
    assert most_rows_read_by_one_node(plan) <= 20 * 100
    running = Job.objects.filter(state=venturi.State.RUNNING)
    assert running.count() == 100
    assert all(
        timedelta(seconds=50) < job.lease_expires_at - job.started_at <= timedelta(minutes=1)
        for job in running
    )


def test_a_worker_claims_tasks_jobs_only_when_tasks_names_the_backend(tasks: ModuleType) -> None:
    result = tasks.add.enqueue(1, 2)
    request = ClaimRequest(
        worker="w", limit=10, kinds=["tests.noop"], leases=[timedelta(minutes=5)], queues=None
    )
    assert claim("default", request, TierClock((6, 3, 1))) == []
    from django_venturi.tasks_backend.runner import claimable_prefix

    assert claimable_prefix() == "tasks:"
    with override_settings(TASKS={"default": {"BACKEND": "somewhere.else.Backend"}}):
        assert claimable_prefix() is None
    assert Job.objects.get(pk=int(result.id)).state == "ready"


# ---------------------------------------------------------------- async, context, failures


def test_async_tasks_run_on_the_workers_event_loop(tasks: ModuleType, workers: Workers) -> None:
    framework = framework_of(tasks)
    plain = tasks.async_add.enqueue(20, 22)
    with_context = tasks.async_context.enqueue("hello")
    workers.burst("default")
    plain.refresh()
    with_context.refresh()
    assert (plain.status, plain.return_value) == (framework.status.SUCCESSFUL, 42)
    assert with_context.return_value == {"value": "hello", "attempt": 1, "id": with_context.id}


def test_aenqueue_aget_result_and_arefresh(tasks: ModuleType, workers: Workers) -> None:
    framework = framework_of(tasks)
    result = async_to_sync(tasks.add.aenqueue)(40, 2)
    assert result.status == framework.status.READY
    workers.burst("default")
    fetched = async_to_sync(tasks.add.aget_result)(result.id)
    assert fetched.return_value == 42
    async_to_sync(result.arefresh)()
    assert result.status == framework.status.SUCCESSFUL


def test_takes_context_gives_the_framework_context_with_attempt_and_result(
    tasks: ModuleType, workers: Workers
) -> None:
    framework = framework_of(tasks)
    result = tasks.with_context.enqueue(7)
    workers.burst("default")
    result.refresh()
    assert result.return_value == {
        "value": 7,
        "attempt": 1,
        "id": result.id,
        "status": str(framework.status.RUNNING),
        "worker_ids": 1,
        "context_class": f"{framework.context_class.__module__}.TaskContext",
        "result_class": framework.result_class.__module__,
    }


def test_an_exception_fails_the_task_with_its_error_and_no_retry(
    tasks: ModuleType, workers: Workers
) -> None:
    framework = framework_of(tasks)
    result = tasks.fail.enqueue("boom")
    workers.burst("default")
    result.refresh()
    assert result.status == framework.status.FAILED
    assert result.finished_at is not None and result.attempts == 1
    (error,) = result.errors
    assert error.exception_class_path == "builtins.ValueError"
    assert error.exception_class is ValueError
    assert "ValueError: boom" in error.traceback and "in fail" in error.traceback
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018
    job = Job.objects.get(pk=int(result.id))
    assert (job.state, job.attempt, job.failures) == ("failed", 1, 1)
    assert job.last_error.startswith("builtins.ValueError: boom")


def test_retries_when_the_backend_options_allow_them(tasks: ModuleType, workers: Workers) -> None:
    framework = framework_of(tasks)
    result = tasks.flaky.using(backend="retrying").enqueue(1)
    assert result.backend == "retrying"
    worker = workers.start("default")
    wait_until(
        lambda: Job.objects.get(pk=int(result.id)).state == "completed",
        timeout=60,
        message="the retried task to succeed",
    )
    worker.terminate()
    result.refresh()
    assert result.status == framework.status.SUCCESSFUL and result.return_value == 2
    (error,) = result.errors
    assert error.exception_class is RuntimeError and "attempt 1 fails" in error.traceback
    assert len(result.worker_ids) == 2
    outcomes = list(
        JournalEntry.objects.filter(job_id=int(result.id))
        .order_by("id")
        .values_list("outcome", flat=True)
    )
    assert outcomes == ["retry", "completed"]


# ---------------------------------------------------------------- signals, transactions


def test_signals_of_the_tasks_framework_are_sent(tasks: ModuleType, workers: Workers) -> None:
    framework = framework_of(tasks)
    ok = tasks.add.enqueue(1, 2)
    bad = tasks.fail.enqueue("no")
    workers.burst("default")

    name = framework.name
    for result, final in ((ok, "SUCCESSFUL"), (bad, "FAILED")):
        enqueued = records(f"{name}:task_enqueued", result.id)
        started = records(f"{name}:task_started", result.id)
        finished = records(f"{name}:task_finished", result.id)
        assert [v["status"] for v in enqueued + started + finished] == [
            "READY",
            "RUNNING",
            final,
        ]
        assert {v["result_class"] for v in enqueued + started + finished} == {
            framework.result_class.__module__
        }
        assert {v["sender"] for v in enqueued + started + finished} == {"VenturiBackend"}
    assert records(f"{name}:task_finished", bad.id)[0]["errors"] == 1
    others = [other for other in INSTALLED if other != name]
    for other in others:
        assert not Record.objects.filter(kind__startswith=f"{other}:").exists()


@pytest.mark.parametrize("function", ["fail", "async_fail"])
def test_task_finished_of_a_failed_task_is_sent_inside_its_exception_handler(
    tasks: ModuleType, workers: Workers, function: str
) -> None:
    """The frameworks' own `task_finished` receivers log `sys.exc_info()`: the worker's
    log shows the FAILED record with the task's own traceback, as `TaskError` stores it."""
    task = getattr(tasks, function)
    message = f"boom {uuid.uuid4().hex}"
    result = task.enqueue(message)
    log = workers.burst("default").stderr
    result.refresh()
    (error,) = result.errors
    assert f"in {function}\n" in error.traceback
    assert error.traceback.rstrip().endswith(f"ValueError: {message}")
    record = f"Task id={result.id} path={task.module_path} state=FAILED"
    assert f"{record}\n{error.traceback.rstrip()}\n" in log, log
    assert "NoneType: None" not in log


class Boom(Exception):
    """An exception that can be weakly referenced (built-in ones cannot)."""


def caught_boom() -> Boom:
    try:
        raise Boom("from the task")
    except Boom as error:
        return error


def test_the_exception_handler_of_task_finished_keeps_the_traceback_and_no_cycle() -> None:
    error = caught_boom()
    traceback = error.__traceback__
    seen: list[Any] = []
    gc.disable()
    try:
        runner._in_handler_of(error, lambda: seen.append(sys.exc_info()))
        assert seen == [(Boom, error, traceback)]
        assert error.__traceback__ is traceback and error.__context__ is None
        freed = weakref.ref(error)
        seen.clear()
        del error
        assert freed() is None, "a reference cycle keeps the exception alive"
    finally:
        gc.enable()


def test_enqueue_is_part_of_the_callers_transaction(tasks: ModuleType) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        Account.objects.create(email="a@example.com")
        tasks.add.enqueue(1, 2)
        raise RuntimeError("roll back")
    assert not Job.objects.exists() and not Account.objects.exists()

    with transaction.atomic():
        Account.objects.create(email="b@example.com")
        result = tasks.add.enqueue(3, 4)
    assert Job.objects.filter(pk=int(result.id)).exists() and Account.objects.exists()


# ---------------------------------------------------------------- validation and checks


def test_validate_task_refuses_what_cannot_run_with_the_frameworks_exception(
    tasks: ModuleType,
) -> None:
    invalid = framework_of(tasks).invalid_task
    task = importlib.import_module(tasks.FRAMEWORK).task

    def nested(a: int) -> int:
        return a

    with pytest.raises(invalid, match="module level"):
        task(nested)
    with pytest.raises(invalid, match="Queue 'nope' is not valid"):
        tasks.add.using(queue_name="nope")
    with pytest.raises(invalid, match="priority must be a whole number"):
        tasks.add.using(priority=101)
    # A module outside installed apps is no reason: its jobs carry the module's signature.
    assert task(outside_any_app).func is outside_any_app
    result = tasks.on_emails.enqueue("a@example.com")
    assert Job.objects.get(pk=int(result.id)).queue == "emails"


def outside_any_app(a: int) -> int:
    """A module-level function of a module that no installed app contains."""
    return a


# ---------------------------------------------------------------- task modules outside apps


def test_a_library_task_module_imported_late_runs_on_a_worker_by_its_signature(
    workers: Workers,
) -> None:
    # Imported now, long after start-up, as a library is on first use; not an installed
    # app and not in VENTURI["TASK_MODULES"] (Wagtail's search enqueues modelsearch.tasks).
    from tests.library import tasks as library

    module = "tests.library.tasks"
    assert not envelope.module_is_allowed(module)
    result = library.shout.enqueue("hello")
    job = Job.objects.get(pk=int(result.id))
    assert job.kind == f"tasks:{module}.shout"
    assert job.payload["module_signature"] == envelope.module_signature(module)

    workers.burst("default")

    result.refresh()
    assert str(result.status) == "SUCCESSFUL", result.errors
    assert result.return_value == "HELLO!"


def test_a_rotated_secret_key_runs_jobs_signed_with_a_key_in_its_fallbacks(
    workers: Workers, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.conf import settings

    from tests.library import tasks as library

    old_key = settings.SECRET_KEY
    signed_with_old_key = library.shout.enqueue("rotated")
    monkeypatch.setenv("VENTURI_TEST_SECRET_KEY", "tests-only-the-new-key")
    monkeypatch.setenv("VENTURI_TEST_SECRET_KEY_FALLBACKS", json.dumps([old_key]))
    workers.burst("default")
    signed_with_old_key.refresh()
    assert str(signed_with_old_key.status) == "SUCCESSFUL", signed_with_old_key.errors
    assert signed_with_old_key.return_value == "ROTATED!"

    # A worker that no longer knows the old key does not import the module: the job
    # fails saying why, and keeps its arguments (retry it once the key is back).
    forgotten = library.shout.enqueue("forgotten")
    monkeypatch.setenv("VENTURI_TEST_SECRET_KEY_FALLBACKS", "[]")
    workers.burst("default")
    job = Job.objects.get(pk=int(forgotten.id))
    (entry,) = JournalEntry.objects.filter(job=job)
    assert (job.state, entry.error_type) == (
        "failed",
        "django_venturi.tasks_backend.frameworks.UnrunnableTask",
    )
    assert "the job's signature of it is not valid" in entry.error_message
    assert "SECRET_KEY_FALLBACKS" in entry.error_message
    assert job.payload["args"] == ["forgotten"]


def test_check_reports_a_misconfigured_tasks_entry() -> None:
    backend = "django_venturi.backend.VenturiBackend"
    bad = {
        "default": {
            "BACKEND": backend,
            "QUEUES": ["ok", "not ok!"],
            "OPTIONS": {"MAX_ATTEMPTS": 0, "DATABASE": "nowhere", "RETRIES": 3},
        },
        "empty": {"BACKEND": backend, "QUEUES": []},
        "options": {"BACKEND": backend, "OPTIONS": ["x"]},
    }
    with override_settings(TASKS=bad):
        messages = [m for m in checks.run_checks() if m.id.startswith("venturi.E07")]
    found = sorted((m.id, m.msg) for m in messages)
    assert (
        "venturi.E071",
        "TASKS['default']['QUEUES']: queue 'not ok!' may contain only "
        "letters, digits and _ . : - (and must not start with a punctuation mark)",
    ) in found
    assert ("venturi.E071", "TASKS['empty']['QUEUES'] must be a non-empty list, got []") in found
    assert ("venturi.E072", "TASKS['options']['OPTIONS'] must be a dict, got ['x']") in found
    assert any(
        i == "venturi.E072" and "['OPTIONS']['RETRIES'] is not an option" in m for i, m in found
    )
    assert any(
        i == "venturi.E073" and "MAX_ATTEMPTS'] must be a positive int, got 0" in m
        for i, m in found
    )
    assert any(i == "venturi.E074" and "got 'nowhere'" in m for i, m in found)
    assert len(found) == 6, found
    assert not [m for m in checks.run_checks() if m.id.startswith("venturi.E07")]


# ---------------------------------------------------------------- operations


def test_tasks_jobs_show_in_venturis_history_and_stats(tasks: ModuleType, workers: Workers) -> None:
    done = tasks.add.enqueue(1, 1)
    workers.burst("default")
    kind = f"tasks:{tasks.__name__}.add"
    assert [entry.job_id for entry in venturi.history(kind=kind)] == [int(done.id)]
    tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(2, 2)
    assert venturi.stats().live[("ready", kind, "default")] == 1


def test_a_cancelled_tasks_job_reads_back_as_failed_with_task_cancelled(
    tasks: ModuleType,
) -> None:
    framework = framework_of(tasks)
    waiting = tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(2, 2)
    assert venturi.cancel(int(waiting.id)).cancelled == 1
    waiting.refresh()
    assert waiting.status == framework.status.FAILED and waiting.finished_at is not None
    (error,) = waiting.errors
    assert error.exception_class_path == "django_venturi.tasks_backend.frameworks.TaskCancelled"
    assert error.exception_class is frameworks.TaskCancelled


def test_tasks_run_on_sqlite_through_a_backend_with_the_sqlite_database(
    tasks: ModuleType, workers: Workers
) -> None:
    framework = framework_of(tasks)
    result = tasks.add.using(backend="sqlite").enqueue(5, 6)
    assert Job.objects.using("sqlite").filter(pk=int(result.id)).exists()
    workers.burst("sqlite")
    result.refresh()
    assert (result.status, result.return_value) == (framework.status.SUCCESSFUL, 11)
    assert records(f"{framework.name}:task_finished", result.id) == []  # default db only
    assert (
        Record.objects.using("sqlite").filter(kind=f"{framework.name}:task_finished").count() == 1
    )


# ---------------------------------------------------------------- both frameworks, apps


@pytest.mark.skipif(len(INSTALLED) < 2, reason="needs Django 6+ and the backport")
def test_both_frameworks_in_one_project_each_get_their_own_types(workers: Workers) -> None:
    from tests.testapp import tasks_backport, tasks_django

    backports = frameworks.by_name("django_tasks")
    django_own = frameworks.by_name("django.tasks")
    assert type(tasks_django.add) is django_own.task_class
    assert type(tasks_backport.add) is backports.task_class
    mine = tasks_django.with_context.enqueue(1)
    theirs = tasks_backport.with_context.enqueue(2)
    workers.burst("default")

    assert type(mine.task.get_backend()) is type(theirs.task.get_backend())
    for result, framework in ((mine, django_own), (theirs, backports)):
        result.refresh()
        assert type(result) is framework.result_class
        assert result.return_value["context_class"].startswith(framework.name)
        # Whichever framework's backend reads it, a job answers in its own types.
        for reader in (django_own, backports):
            fetched = reader.task_backends["default"].get_result(result.id)
            assert type(fetched) is framework.result_class
            assert fetched.status == framework.status.SUCCESSFUL
    assert isinstance(mine.task.get_backend(), django_own.base_backend)
    assert isinstance(mine.task.get_backend(), backports.base_backend)


def test_a_third_party_app_runs_its_tasks_on_venturi_workers(workers: Workers) -> None:
    from tests.thirdparty import tasks as thirdparty

    handle = thirdparty.request_thumbnail("cat.png", size=32)
    job = Job.objects.get(pk=int(handle))
    assert job.kind == "tasks:tests.thirdparty.tasks.make_thumbnail"
    assert (job.priority, job.rank) == (venturi.Priority.HIGH, -10)
    workers.burst("default")
    result = thirdparty.thumbnail_status(handle)
    assert str(result.status) == "SUCCESSFUL"
    assert result.return_value == {"name": "cat.png", "thumbnail": "cat.png@32px"}


# ---------------------------------------------------------------- tampering


def test_tampered_tasks_jobs_never_call_anything_but_a_declared_task(
    tasks: ModuleType,
    workers: Workers,
    tripwire: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    framework = framework_of(tasks)
    os_system_ran = tmp_path / "os_system_ran"
    command = f"touch {os_system_ran}"

    not_valid = "'venturi_tripwire' is not inside an installed app or VENTURI['TASK_MODULES'], "
    not_valid += "and the job's signature of it is not valid"

    def tampered(kind: str, **payload_changes: Any) -> int:
        job_id = int(tasks.echo.enqueue(command).id)
        job = Job.objects.get(pk=job_id)
        Job.objects.filter(pk=job_id).update(kind=kind, payload={**job.payload, **payload_changes})
        return job_id

    cases = {
        tampered("tasks:os.system"): "'os' is not inside an installed app",
        tampered("tasks:venturi_tripwire.boom"): "'venturi_tripwire' is not inside an installed",
        tampered("tasks:subprocess.getoutput"): "'subprocess' is not inside an installed app",
        tampered("tasks:tests.testapp.tasks.record"): "is a function, not a",
        tampered("tasks:tests.testapp.tasks.os"): "is a module, not a",
        tampered(f"tasks:{tasks.__name__}.echo", framework="pickle"): "'pickle' is not installed",
        tampered(f"tasks:{tasks.__name__}.echo", args="x"): "no args list",
        tampered("tasks:tests.testapp.tasks.__import__"): "not a",
        tampered("tasks:os"): "is not a module path",
        # Signatures: none, forged, made with another key, of another module, not text.
        tampered(
            "tasks:venturi_tripwire.boom", module_signature=None
        ): "'venturi_tripwire' is not inside an installed app or VENTURI['TASK_MODULES'], "
        "and the job carries no signature of it: not imported",
        tampered("tasks:venturi_tripwire.boom", module_signature="forged"): not_valid,
        tampered(
            "tasks:venturi_tripwire.boom",
            module_signature=Signer(
                key="another-key", salt=envelope.MODULE_SIGNATURE_SALT
            ).signature("venturi_tripwire"),
        ): not_valid,
        tampered(
            "tasks:venturi_tripwire.boom",
            module_signature=envelope.module_signature("tests.library.tasks"),
        ): not_valid,
        tampered("tasks:venturi_tripwire.boom", module_signature=["x"]): not_valid,
    }
    other = [name for name in INSTALLED if name != framework.name]
    if other:  # a Task of the other framework under this framework's name
        module = MODULES[other[0]]
        cases[tampered(f"tasks:{module}.echo")] = f"not a {framework.name} Task"
    fine = tasks.add.enqueue(1, 1)
    # A row from before signatures (none) of an installed app's module keeps running.
    unsigned = tampered(f"tasks:{tasks.__name__}.echo", module_signature=None)

    workers.burst("default")

    assert sorted(path.name for path in tripwire.iterdir()) == [], "the tripwire tripped"
    assert Job.objects.get(pk=unsigned).result == {"args": [command], "kwargs": {}}
    assert not os_system_ran.exists()
    for job_id, reason in cases.items():
        job = Job.objects.get(pk=job_id)
        (entry,) = JournalEntry.objects.filter(job_id=job_id)
        assert (job.state, entry.outcome) == ("failed", "failed"), job.kind
        assert entry.error_type == "django_venturi.tasks_backend.frameworks.UnrunnableTask", (
            job.kind
        )
        assert reason in entry.error_message, (job.kind, entry.error_message)
    fine.refresh()
    assert fine.status == framework.status.SUCCESSFUL
