"""Workflows: jobs enqueued after others, chains, groups with a callback, and results."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from unittest import mock

import pytest
from asgiref.sync import async_to_sync
from django.db import connections, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import django_venturi as venturi
from django_venturi.models import Dependency, Job, JournalEntry
from django_venturi.registry import registry
from django_venturi.store import dependencies, verdicts
from django_venturi.store.claim import ClaimedJob, ClaimRequest, claim
from django_venturi.store.completion import write_verdicts
from django_venturi.store.dependencies import DEPENDENCY_FAILED
from django_venturi.store.retention import cleanup, delete_jobs
from django_venturi.store.scheduling import TierClock
from django_venturi.store.verdicts import ErrorInfo
from django_venturi.testing import drain, eager
from tests.conftest import Workers, wait_until
from tests.testapp.dedup_tasks import Latest, Recompute
from tests.testapp.models import Record
from tests.testapp.tasks import Noop
from tests.testapp.workflow_tasks import Step, Summary

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])

WAITING = venturi.State.WAITING


def state(alias: str, job: Job) -> str:
    return Job.objects.using(alias).values_list("state", flat=True).get(id=job.id)


def steps_run(alias: str) -> list[str]:
    records = Record.objects.using(alias).filter(kind="step").order_by("id")
    return [record.value["name"] for record in records]


def journal(alias: str, job: Job) -> list[tuple[str, str]]:
    return list(job.journal.using(alias).order_by("id").values_list("outcome", "error_type"))


def test_a_job_after_another_waits_and_runs_after_it_completes(alias: str) -> None:
    first = Step("first").enqueue(using=alias)
    second = Step("second").enqueue(using=alias, after=[first])

    assert second.state == WAITING
    assert state(alias, second) == "waiting"
    assert Job.objects.using(alias).get(id=first.id).dependents == 1
    drain(using=alias)

    assert steps_run(alias) == ["first", "second"]
    assert state(alias, second) == "completed"
    second_record = Record.objects.using(alias).get(job_id=second.id)
    assert second_record.value["seen"] == ["first"]


def test_a_chain_runs_its_steps_in_order_whatever_their_priority(alias: str) -> None:
    jobs = venturi.chain(Step("a"), Step("b"), Step("c")).enqueue(using=alias)

    assert [state(alias, job) for job in jobs] == ["ready", "waiting", "waiting"]
    Job.objects.using(alias).filter(id=jobs[2].id).update(priority=venturi.Priority.HIGH)
    drain(using=alias)

    assert steps_run(alias) == ["a", "b", "c"]
    assert Job.objects.using(alias).get(id=jobs[2].id).result == "c"


def test_eager_mode_runs_chains_and_groups_in_order(alias: str) -> None:
    with eager():
        jobs = venturi.chain(Step("a"), Step("b")).enqueue(using=alias)
        members, callback = venturi.group([Step("m")], then=Summary(batch=1)).enqueue(using=alias)
    assert steps_run(alias) == ["a", "b", "m"]
    assert [state(alias, job) for job in [*jobs, *members, callback]] == ["completed"] * 4
    assert Record.objects.using(alias).get(kind="summary").value == 1


def test_a_failure_cancels_the_dependents_transitively_naming_the_dependency(
    alias: str,
) -> None:
    failing, after, last = venturi.chain(
        Step("fails", fail=True), Step("after"), Step("last")
    ).enqueue(using=alias)
    drain(using=alias)

    assert steps_run(alias) == ["fails"]
    assert state(alias, failing) == "failed"
    for job, dependency in ((after, failing), (last, after)):
        row = Job.objects.using(alias).get(id=job.id)
        assert row.state == "cancelled" and row.finished_at is not None
        assert f"job #{dependency.id}" in row.last_error
        assert row.last_error.startswith(DEPENDENCY_FAILED)
        assert journal(alias, row) == [("cancelled", DEPENDENCY_FAILED)]


def test_after_failure_run_runs_the_dependent_anyway(alias: str) -> None:
    failing = Step("fails", fail=True).enqueue(using=alias)
    cleanup = Step("cleanup").enqueue(using=alias, after=[failing], after_failure="run")
    next_step = Step("next").enqueue(using=alias, after=[cleanup])
    drain(using=alias)

    assert steps_run(alias) == ["fails", "cleanup", "next"]
    assert state(alias, next_step) == "completed"


def test_dependencies_that_already_finished_resolve_at_enqueue(alias: str) -> None:
    done = Step("done").enqueue(using=alias)
    failed = Step("failed", fail=True).enqueue(using=alias)
    drain(using=alias)

    after_done = Step("x").enqueue(using=alias, after=[done])
    after_failed = Step("y").enqueue(using=alias, after=[done, failed])
    anyway = Step("z").enqueue(using=alias, after=[failed], after_failure="run")

    assert state(alias, after_done) == "ready"
    assert state(alias, anyway) == "ready"
    row = Job.objects.using(alias).get(id=after_failed.id)
    assert row.state == "cancelled"
    assert f"job #{failed.id}" in row.last_error
    assert journal(alias, row) == [("cancelled", DEPENDENCY_FAILED)]
    assert Job.objects.using(alias).get(id=done.id).dependents == 0


def test_an_unknown_dependency_is_a_clear_error_and_writes_nothing(alias: str) -> None:
    first = Step("first").enqueue(using=alias)
    with pytest.raises(venturi.UnknownDependency, match=r"no job #999999"):
        Step("second").enqueue(using=alias, after=[first, 999999])
    assert Job.objects.using(alias).count() == 1
    assert Job.objects.using(alias).get(id=first.id).dependents == 0


def test_enqueue_on_commit_aenqueue_and_enqueue_many_wait_too(alias: str) -> None:
    first = Step("first").enqueue(using=alias)
    with transaction.atomic(using=alias):
        Step("on commit").enqueue_on_commit(using=alias, after=[first])
        assert Job.objects.using(alias).count() == 1
    later = async_to_sync(Step("async").aenqueue)(using=alias, after=[first.id])
    batch = venturi.enqueue_many([Step("m1"), Step("m2")], using=alias, after=[first])

    waiting = Job.objects.using(alias).filter(state="waiting")
    assert waiting.count() == 4 and later.state == WAITING
    assert {job.waiting_for for job in waiting} == {1}
    assert Job.objects.using(alias).get(id=first.id).dependents == 4
    drain(using=alias)
    assert steps_run(alias)[0] == "first" and len(steps_run(alias)) == 5
    assert all(state(alias, job) == "completed" for job in batch)


def test_bad_after_options_are_refused(alias: str) -> None:
    with pytest.raises(ValueError, match="after_failure"):
        Step("x").enqueue(using=alias, after=[], after_failure="ignore")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="after"):
        Step("x").enqueue(using=alias, after=["1"])  # type: ignore[list-item]
    assert not Job.objects.using(alias).exists()


def test_cancelling_a_waiting_job_cancels_its_dependents_too(alias: str) -> None:
    first, middle, last = venturi.chain(Step("a"), Step("b"), Step("c")).enqueue(using=alias)
    result = venturi.cancel(middle, using=alias)

    assert result.cancelled == 1
    assert state(alias, middle) == "cancelled"
    assert state(alias, last) == "cancelled"
    drain(using=alias)
    assert steps_run(alias) == ["a"]
    assert state(alias, first) == "completed"


def test_a_group_runs_its_callback_once_with_every_result(alias: str) -> None:
    members, callback = venturi.group(
        [Step(f"member {i}") for i in range(5)], then=Summary(batch=7)
    ).enqueue(using=alias)

    assert len(members) == 5 and state(alias, callback) == "waiting"
    drain(using=alias)

    assert Record.objects.using(alias).filter(kind="summary").count() == 1
    callback.refresh_from_db(using=alias)
    assert callback.state == "completed" and callback.result == {"members": 5}


def test_a_group_callback_is_cancelled_when_a_member_fails(alias: str) -> None:
    _, callback = venturi.group(
        [Step("ok"), Step("bad", fail=True)], then=Summary(batch=1)
    ).enqueue(using=alias)
    drain(using=alias)
    assert state(alias, callback) == "cancelled"
    assert not Record.objects.using(alias).filter(kind="summary").exists()


def test_dependency_results_maps_each_dependency_to_its_result(alias: str) -> None:
    left, right = Step("left").enqueue(using=alias), Step("right").enqueue(using=alias)
    joined = Summary(batch=2).enqueue(using=alias, after=[left, right.id])
    drain(using=alias)

    assert Job.objects.using(alias).get(id=left.id).result == "left"
    edges = Dependency.objects.using(alias).filter(dependent_id=joined.id)
    assert sorted(edges.values_list("dependency_id", flat=True)) == [left.id, right.id]
    assert Job.objects.using(alias).get(id=joined.id).result == {"members": 2}


def test_a_result_that_is_not_json_fails_the_run(alias: str) -> None:
    job = Noop().enqueue(using=alias)
    claimed = _claimed(alias, job)
    outcome = venturi.Outcome.completed(result={1, 2})
    verdict = verdicts.from_outcome(claimed, registry.get("tests.noop"), outcome)
    assert verdict.state == "failed"
    assert "is not JSON" in verdict.error.message


def test_a_merged_keyed_job_keeps_its_dependents_on_the_job_holding_the_key(alias: str) -> None:
    holder = Latest(name="k", value=1).enqueue(using=alias)
    merged = Latest(name="k", value=2).enqueue(using=alias)
    dependent = Step("after key").enqueue(using=alias, after=[merged])

    assert merged.id == holder.id
    edge = Dependency.objects.using(alias).get(dependent_id=dependent.id)
    assert edge.dependency_id == holder.id
    drain(using=alias)
    assert state(alias, dependent) == "completed"


def test_a_follow_up_folded_into_a_returning_job_hands_it_its_dependents(alias: str) -> None:
    Recompute(account="h").enqueue(using=alias)
    (running,) = claim(
        alias,
        ClaimRequest(
            worker="t",
            limit=1,
            kinds=["tests.recompute"],
            leases=[timedelta(minutes=5)],
            queues=None,
        ),
        TierClock((6, 3, 1)),
    )
    follow_up = Recompute(account="h", count=2).enqueue(using=alias)
    both = Step("after both").enqueue(using=alias, after=[running.id, follow_up])
    only = Step("after the follow-up").enqueue(using=alias, after=[follow_up])

    paused = verdicts.Verdict(running, venturi.JournalOutcome.PAUSED, venturi.State.READY)
    write_verdicts(alias, "t", [paused])

    assert state(alias, follow_up) == "cancelled"  # folded into the returning job
    for dependent, waiting_for in ((both, 1), (only, 1)):
        row = Job.objects.using(alias).get(id=dependent.id)
        assert (row.state, row.waiting_for) == ("waiting", waiting_for)
        edges = Dependency.objects.using(alias).filter(dependent_id=dependent.id)
        assert list(edges.values_list("dependency_id", flat=True)) == [running.id]
    drain(using=alias)
    assert state(alias, both) == "completed" and state(alias, only) == "completed"


def test_deleting_an_unfinished_job_cancels_the_jobs_waiting_for_it(alias: str) -> None:
    first, second, third = venturi.chain(Step("a"), Step("b"), Step("c")).enqueue(using=alias)
    delete_jobs(Job.objects.filter(id=first.id), using=alias)

    assert not Job.objects.using(alias).filter(id=first.id).exists()
    assert state(alias, second) == "cancelled" and state(alias, third) == "cancelled"
    assert f"job #{first.id}" in Job.objects.using(alias).get(id=second.id).last_error


def test_a_keyed_job_cannot_wait_for_others(alias: str) -> None:
    first = Step("first").enqueue(using=alias)
    with pytest.raises(ValueError, match="dedup key"):
        Latest(name="k", value=1).enqueue(using=alias, after=[first])


def test_a_plain_job_pays_no_extra_query_to_enqueue_or_finish() -> None:
    alias = "default"
    connection = connections[alias]
    with CaptureQueriesContext(connection) as enqueued:
        job = Noop().enqueue(using=alias)
    claimed = _claimed(alias, job)
    with CaptureQueriesContext(connection) as finished:
        write_verdicts(alias, "w", [verdicts.completed(claimed)])
    # The look for a waiting worker after the commit (store/waiting_workers.py) is the
    # wake-up's, not the workflow's: any enqueue pays it.
    inserts = [query for query in enqueued.captured_queries if "pg_notify" not in query["sql"]]
    assert len(inserts) == 1, enqueued.captured_queries
    assert len(finished.captured_queries) == 1, finished.captured_queries
    assert state(alias, job) == "completed"


def test_a_dependent_enqueued_while_its_dependency_runs_is_resolved_by_its_verdict(
    alias: str,
) -> None:
    first = Step("first").enqueue(using=alias)
    claimed = _claimed(alias, first)  # claimed before anything waits for it
    assert not claimed.has_dependents
    second = Step("second").enqueue(using=alias, after=[first])

    write_verdicts(alias, "w", [verdicts.completed(claimed)])
    assert state(alias, second) == "ready"


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_a_dependent_committed_while_the_verdict_waits_for_its_lock_is_resolved() -> None:
    """The verdict statement's snapshot predates the dependent's edge: it must notice."""
    alias = "default"
    first = Step("first").enqueue(using=alias)
    Step("known").enqueue(using=alias, after=[first])
    claimed = _claimed(alias, first)
    assert claimed.has_dependents  # the statement that resolves in place is used
    written: list[set[int]] = []

    def write() -> None:
        try:
            written.append(write_verdicts(alias, "w", [verdicts.completed(claimed)]))
        finally:
            connections.close_all()  # this thread's own connections

    with transaction.atomic(using=alias):
        late = Step("late").enqueue(using=alias, after=[first])  # holds the row lock
        writer = threading.Thread(target=write)
        writer.start()
        wait_until(lambda: _waits_for_a_lock(alias), message="the verdict to wait")
    writer.join(timeout=30)

    assert written == [{first.id}]
    assert state(alias, late) == "ready"
    assert Job.objects.using(alias).filter(state="waiting").count() == 0


def _waits_for_a_lock(alias: str) -> bool:
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")  # fresh inside a transaction
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        (waiting,) = cursor.fetchone()
    return bool(waiting)


def test_many_workers_finishing_a_group_at_once_start_one_callback(
    alias: str, workers: Workers
) -> None:
    members = 200 if alias == "default" else 40
    _, callback = venturi.group([Noop(n=i) for i in range(members)], then=Summary(batch=3)).enqueue(
        using=alias
    )
    for _ in range(4):
        workers.start(alias, "--concurrency", "4")

    wait_until(lambda: state(alias, callback) == "completed", timeout=120)
    assert Record.objects.using(alias).filter(kind="noop").count() == members
    assert Record.objects.using(alias).filter(kind="summary").count() == 1
    assert journal(alias, callback) == [("completed", "")]


def _claimed(alias: str, job: Job) -> ClaimedJob:
    """Claim `job` by hand, as a worker would."""
    token = uuid.uuid4()
    Job.objects.using(alias).filter(id=job.id).update(
        state="running", claim_token=token, attempt=1, lease_expires_at="2100-01-01T00:00Z"
    )
    row = Job.objects.using(alias).get(id=job.id)
    return ClaimedJob.from_row(
        row, attempt=1, started_at=row.enqueued_at, claim_token=token, lease=timedelta(minutes=5)
    )


# ---------------------------------------------------- dependents a killed worker stranded


class _Killed(BaseException):
    """The worker dies here."""


def _finish_without_resolving(alias: str, verdict: verdicts.Verdict) -> None:
    """Write `verdict` as a worker that dies right after the verdict's statement does:
    the job is finished, the dependents enqueued after its claim are left waiting
    (their edges stay open)."""
    if connections[alias].vendor != "postgresql":
        # SQLite resolves in the verdict's own transaction: no window there, so the
        # state a crash leaves on PostgreSQL is written by hand.
        Job.objects.using(alias).filter(id=verdict.job.id).update(
            state=verdict.state,
            finished_at=timezone.now(),
            claim_token=None,
            lease_expires_at=None,
            result=verdict.result if verdict.set_result else None,
        )
        return
    # The worker dies in the follow-up transaction, after the verdict's statement.
    with mock.patch.object(dependencies, "resolve", side_effect=_Killed), pytest.raises(_Killed):
        write_verdicts(alias, "w", [verdict])
    assert Job.objects.using(alias).get(id=verdict.job.id).state == verdict.state


def _stranded(alias: str) -> tuple[Job, Job, Job, Job, Job]:
    """A completed job and a failed one, each with dependents enqueued after its claim
    and left waiting by a worker killed between the verdict and its resolve."""
    first = Step("first").enqueue(using=alias)
    fails = Step("fails").enqueue(using=alias)
    first_claim, fails_claim = _claimed(alias, first), _claimed(alias, fails)
    second = Step("second").enqueue(using=alias, after=[first])
    doomed = Step("doomed").enqueue(using=alias, after=[fails])
    anyway = Step("anyway").enqueue(using=alias, after=[fails], after_failure="run")
    spec = registry.get(first.kind)
    result = venturi.Outcome.completed(result="first")
    _finish_without_resolving(alias, verdicts.from_outcome(first_claim, spec, result))
    error = ErrorInfo.from_reason("fails on purpose", type="tests.Boom")
    _finish_without_resolving(alias, verdicts.failed(fails_claim, error))
    assert [state(alias, job) for job in (second, doomed, anyway)] == [WAITING] * 3
    assert Dependency.objects.using(alias).filter(resolved=False).count() == 3
    return first, fails, second, doomed, anyway


def _assert_resolved_as_the_verdicts_would(alias: str, fails: Job, doomed: Job) -> None:
    row = Job.objects.using(alias).get(id=doomed.id)
    assert row.state == "cancelled" and row.finished_at is not None
    assert row.last_error.startswith(DEPENDENCY_FAILED)
    assert f"job #{fails.id}" in row.last_error and "ended failed" in row.last_error
    assert journal(alias, row) == [("cancelled", DEPENDENCY_FAILED)]
    assert not Dependency.objects.using(alias).filter(resolved=False).exists()


def test_a_running_worker_resolves_dependents_a_killed_worker_left_waiting(
    alias: str, workers: Workers
) -> None:
    _, fails, second, doomed, anyway = _stranded(alias)

    workers.start(alias)  # its recovery sweep (RESCUE_INTERVAL, 0.5 s here) finds them
    wait_until(
        lambda: state(alias, second) == "completed" and state(alias, anyway) == "completed",
        timeout=60,
        message="the stranded dependents to run",
    )

    assert sorted(steps_run(alias)) == ["anyway", "second"]
    assert Record.objects.using(alias).get(job_id=second.id).value["seen"] == ["first"]
    _assert_resolved_as_the_verdicts_would(alias, fails, doomed)
    assert "resolved the dependents of 2 finished job(s)" in workers.log()


def test_the_stranded_pass_resolves_like_the_verdict_and_only_once(alias: str) -> None:
    first, fails, second, doomed, anyway = _stranded(alias)

    assert sorted(dependencies.recover_stranded(alias)) == sorted([first.id, fails.id])
    assert dependencies.recover_stranded(alias) == []  # nothing left: a second pass is a no-op
    with transaction.atomic(using=alias):  # as a verdict's transaction calls it
        dependencies.resolve(alias, [first.id, fails.id])  # a late follow-up finds nothing

    rows = {row.id: row for row in Job.objects.using(alias).filter(id__in=[second.id, anyway.id])}
    assert [(rows[j.id].state, rows[j.id].waiting_for) for j in (second, anyway)] == [
        ("ready", 0),
        ("ready", 0),
    ]
    _assert_resolved_as_the_verdicts_would(alias, fails, doomed)


def _snapshot(alias: str) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]], int]:
    jobs = Job.objects.using(alias).order_by("id")
    edges = Dependency.objects.using(alias).order_by("id")
    return (
        list(jobs.values_list("id", "state", "waiting_for", "dependents", "last_error")),
        list(edges.values_list("id", "dependent_id", "dependency_id", "resolved")),
        JournalEntry.objects.using(alias).count(),
    )


def test_the_stranded_pass_changes_nothing_on_a_graph_that_is_not_stranded(alias: str) -> None:
    done, failing = Step("done").enqueue(using=alias), Step("fails", fail=True).enqueue(using=alias)
    Step("after done").enqueue(using=alias, after=[done])
    Step("after failing").enqueue(using=alias, after=[failing])
    drain(using=alias)  # their verdicts resolved them: completed, failed, cancelled
    running = Step("running").enqueue(using=alias)
    venturi.chain(Step("a"), Step("b"), Step("c")).enqueue(using=alias)
    venturi.group([Step("m1"), Step("m2")], then=Summary(batch=1)).enqueue(using=alias)
    claimed = _claimed(alias, running)
    Step("after running").enqueue(using=alias, after=[running])  # its verdict will resolve it
    before = _snapshot(alias)

    with CaptureQueriesContext(connections[alias]) as queries:
        assert dependencies.recover_stranded(alias) == []

    assert _snapshot(alias) == before
    assert len(queries.captured_queries) == 1, queries.captured_queries
    write_verdicts(alias, "w", [verdicts.completed(claimed)])
    assert dependencies.recover_stranded(alias) == []
    assert Job.objects.using(alias).filter(state=WAITING).count() == 3  # b, c and the callback


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_the_stranded_pass_and_a_late_follow_up_resolving_at_once_count_each_edge_once() -> None:
    """The pass waits for the follow-up's edge locks, then re-reads them: resolved."""
    alias = "default"
    member = Step("member").enqueue(using=alias)
    other = Step("other").enqueue(using=alias)
    member_claim = _claimed(alias, member)
    callback = Summary(batch=1).enqueue(using=alias, after=[member, other])
    _finish_without_resolving(alias, verdicts.completed(member_claim))
    recovered: list[list[int]] = []

    def recover() -> None:
        try:
            recovered.append(dependencies.recover_stranded(alias))
        finally:
            connections.close_all()

    with transaction.atomic(using=alias):
        dependencies.resolve(alias, [member.id])  # the follow-up, late but alive
        thread = threading.Thread(target=recover)
        thread.start()
        wait_until(lambda: _waits_for_a_lock(alias), message="the pass to wait")
    thread.join(timeout=30)

    assert recovered == [[member.id]]  # it took the job, and found its edge resolved
    row = Job.objects.using(alias).get(id=callback.id)
    assert (row.state, row.waiting_for) == ("waiting", 1)  # counted once, not twice
    drain(using=alias)
    assert state(alias, callback) == "completed"


def test_cleanup_resolves_a_stranded_dependency_before_deleting_it(alias: str) -> None:
    first, fails, second, doomed, anyway = _stranded(alias)

    result = cleanup(older_than=timedelta(0), states=["completed"], using=alias)
    assert result.jobs == 1
    assert not Job.objects.using(alias).filter(id=first.id).exists()
    assert state(alias, second) == "ready"

    delete_jobs(Job.objects.filter(id=fails.id), using=alias)
    assert state(alias, anyway) == "ready"
    _assert_resolved_as_the_verdicts_would(alias, fails, doomed)
