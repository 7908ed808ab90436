"""Workflows run by real worker processes: a chain whose middle step is retried, and a
worker killed (SIGKILL) after its verdict committed and before its dependents resolved."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from django.db import connections, transaction

import django_venturi as venturi
from django_venturi.models import Dependency, Job
from django_venturi.store.dependencies import DEPENDENCY_FAILED
from tests.conftest import Workers, wait_until
from tests.testapp.models import Record
from tests.testapp.workflow_tasks import LeasedStep, RetriedStep, Step

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])

RETRY_ERROR = ("retry", "builtins.RuntimeError")


def state(alias: str, job: Job) -> str:
    return Job.objects.using(alias).values_list("state", flat=True).get(id=job.id)


def journal(alias: str, job: Job) -> list[tuple[str, str]]:
    return list(job.journal.using(alias).order_by("id").values_list("outcome", "error_type"))


def attempts(alias: str, job: Job) -> list[int]:
    """The attempts whose handler started (each records itself first)."""
    records = Record.objects.using(alias).filter(job_id=job.id).order_by("attempt")
    return list(records.values_list("attempt", flat=True))


def assert_cancelled_after(alias: str, job: Job, dependency: Job, ended: str) -> None:
    """`job` was cancelled once, naming `dependency`, and never ran."""
    row = Job.objects.using(alias).get(id=job.id)
    assert row.state == "cancelled" and row.finished_at is not None
    assert row.last_error.startswith(DEPENDENCY_FAILED)
    assert f"job #{dependency.id}, which it was enqueued after, ended {ended}" in row.last_error
    assert journal(alias, row) == [("cancelled", DEPENDENCY_FAILED)]
    assert attempts(alias, row) == []


def enqueue_dependents(dependency: Job, give_up: bool) -> list[Job]:
    """After a dependency that fails (`give_up`): one dependent to cancel (`doomed`) and
    one to run anyway; after one that completes: one dependent (`after`)."""
    if give_up:
        doomed = Step("doomed").enqueue(after=[dependency])
        return [doomed, Step("anyway").enqueue(after=[dependency], after_failure="run")]
    return [Step("after").enqueue(after=[dependency])]


def assert_dependents_resolved_once(
    alias: str, dependency: Job, dependents: list[Job], give_up: bool
) -> None:
    """Each dependent of `enqueue_dependents` was resolved once, as the verdict says."""
    if give_up:
        doomed, anyway = dependents
        assert_cancelled_after(alias, doomed, dependency, "failed")
        assert attempts(alias, anyway) == [1] and journal(alias, anyway) == [("completed", "")]
    else:
        (after,) = dependents
        assert attempts(alias, after) == [1] and journal(alias, after) == [("completed", "")]
        assert Record.objects.get(job_id=after.id).value["seen"] == ["dependency"]


# ---------------------------------------------------------------- a retried dependency


def test_a_dependent_waits_while_its_dependency_is_retried_then_runs_once_with_its_result(
    alias: str, workers: Workers, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    first, middle, last = venturi.chain(
        Step("first"), RetriedStep("middle", failing=1, gate=str(gate), held=2), Step("last")
    ).enqueue(using=alias)
    workers.start(alias, "--concurrency", "2")

    wait_until(
        lambda: attempts(alias, middle) == [1, 2],
        timeout=60,
        message="the middle step's second attempt to start",
    )
    # Its first attempt failed and was retried; the second is held: the dependent waits.
    assert journal(alias, middle) == [RETRY_ERROR]
    row = Job.objects.using(alias).get(id=last.id)
    assert (row.state, row.waiting_for) == ("waiting", 1)
    assert not Dependency.objects.using(alias).filter(dependent_id=last.id, resolved=True).exists()
    assert attempts(alias, last) == []

    gate.touch()
    wait_until(lambda: state(alias, last) == "completed", timeout=60, message="the last step")
    assert [outcome for outcome, _ in journal(alias, middle)] == ["retry", "completed"]
    assert attempts(alias, last) == [1]  # once
    assert Record.objects.using(alias).get(job_id=last.id).value["seen"] == ["middle"]
    assert journal(alias, last) == [("completed", "")]
    assert Job.objects.using(alias).get(id=last.id).result == "last"
    assert state(alias, first) == "completed"


def test_dependents_are_cancelled_naming_the_dependency_only_when_its_last_retry_fails(
    alias: str, workers: Workers, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    _, middle, last, after_last = venturi.chain(
        Step("first"),
        RetriedStep("middle", failing=3, gate=str(gate), held=3),
        Step("last"),
        Step("after last"),
    ).enqueue(using=alias)
    workers.start(alias, "--concurrency", "2")

    wait_until(
        lambda: attempts(alias, middle) == [1, 2, 3],
        timeout=60,
        message="the middle step's last attempt to start",
    )
    # Two failed attempts, each retried: nothing is cancelled yet.
    assert journal(alias, middle) == [RETRY_ERROR, RETRY_ERROR]
    assert [state(alias, job) for job in (last, after_last)] == ["waiting", "waiting"]
    assert journal(alias, last) == [] and journal(alias, after_last) == []

    gate.touch()  # the last attempt fails too
    wait_until(
        lambda: state(alias, after_last) == "cancelled",
        timeout=60,
        message="the dependents to be cancelled",
    )
    assert state(alias, middle) == "failed"
    assert [outcome for outcome, _ in journal(alias, middle)] == ["retry", "retry", "failed"]
    assert_cancelled_after(alias, last, middle, "failed")
    assert_cancelled_after(alias, after_last, last, "cancelled")


# ------------------------------------------- killed between a verdict and its resolution

# `resolve`'s first statement (`dependencies._COUNT_COMPLETIONS_SQL`), and the verdicts'
# (`completion._FINISH_SQL`).
RESOLVE_STATEMENT = "%WITH finished AS%"
VERDICT_STATEMENT = "%WITH verdict AS%"


def _resolving_backends(*, waiting: bool, statement: str = RESOLVE_STATEMENT) -> int:
    """Sessions running `statement` (only those waiting for a lock)."""
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")  # fresh inside a transaction
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND state = 'active' AND query LIKE %s "
            "AND (NOT %s OR wait_event_type = 'Lock')",
            [statement, waiting],
        )
        (count,) = cursor.fetchone()
    return int(count)


@pytest.mark.parametrize("give_up", [False, True], ids=["completed", "failed"])
def test_a_worker_killed_after_its_verdict_and_before_the_resolution_leaves_it_to_the_next(
    give_up: bool, workers: Workers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL writes a verdict in one statement and resolves the dependents enqueued
    after the job's claim in a transaction of its own (`completion.py`). The test holds
    the dependency's edges locked, so that the worker's resolution waits with the verdict
    committed; kills the worker there; and a new worker resolves them, once."""
    alias = "default"
    gate = tmp_path / "gate"
    dependency = RetriedStep("dependency", gate=str(gate), held=1, give_up=give_up).enqueue()
    # The killed worker's own rescue step stays out of the way: only its verdict's
    # follow-up resolves (its rescue ran once at start, with nothing to find).
    monkeypatch.setenv("VENTURI_TEST_SETTINGS", json.dumps({"RESCUE_INTERVAL": 3600}))
    killed = workers.start(alias)
    wait_until(lambda: attempts(alias, dependency) == [1], timeout=60, message="the handler")
    # Enqueued after its claim: the verdict's statement does not resolve them.
    dependents = enqueue_dependents(dependency, give_up)
    ended = "failed" if give_up else "completed"
    verdict = (ended, "Outcome.failed" if give_up else "")

    with transaction.atomic(using=alias):
        edges = Dependency.objects.select_for_update().filter(dependency_id=dependency.id)
        assert len(edges) == len(dependents)
        gate.touch()
        wait_until(
            lambda: state(alias, dependency) == ended and _resolving_backends(waiting=True),
            timeout=60,
            message="the verdict to commit and its resolution to wait for the edges",
        )
        os.kill(killed.pid, signal.SIGKILL)
        assert killed.wait(timeout=30) == -signal.SIGKILL
        # The verdict is whole and written once; the dependents are left waiting.
        assert journal(alias, dependency) == [verdict]
        assert [state(alias, job) for job in dependents] == ["waiting"] * len(dependents)
        assert Dependency.objects.filter(dependency_id=dependency.id, resolved=False).count() == (
            len(dependents)
        )
    # The dead worker's session wakes up holding the edges, finds no client, rolls back.
    wait_until(lambda: not _resolving_backends(waiting=False), message="the session to end")
    assert [state(alias, job) for job in dependents] == ["waiting"] * len(dependents)

    monkeypatch.delenv("VENTURI_TEST_SETTINGS")
    workers.start(alias)
    wait_until(
        lambda: (
            not Dependency.objects.filter(resolved=False).exists()
            and all(state(alias, job) in ("completed", "cancelled") for job in dependents)
        ),
        timeout=60,
        message="the next worker to resolve the stranded dependents and run them",
    )
    assert journal(alias, dependency) == [verdict]  # its verdict is not written again
    assert attempts(alias, dependency) == [1]
    assert_dependents_resolved_once(alias, dependency, dependents, give_up)
    assert "resolved the dependents of 1 finished job(s)" in workers.log(1)


@pytest.mark.parametrize("give_up", [False, True], ids=["completed", "failed"])
def test_a_worker_killed_while_its_verdict_resolves_in_one_transaction_loses_nothing(
    give_up: bool, workers: Workers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dependents known at the claim resolve with the verdict: a completion in its one
    statement, a failure in its transaction. Killed while that waits for the edges, the
    worker leaves the completion whole (the statement commits when the lock is released:
    autocommit needs no client) and the failure unwritten (its transaction rolls back,
    and the job runs again once its lease runs out); either way the dependents resolve
    once, after the dependency's one verdict."""
    alias = "default"
    gate = tmp_path / "gate"
    dependency = LeasedStep("dependency", gate=str(gate), held=1, give_up=give_up).enqueue()
    dependents = enqueue_dependents(dependency, give_up)
    monkeypatch.setenv("VENTURI_TEST_SETTINGS", json.dumps({"RESCUE_INTERVAL": 3600}))
    killed = workers.start(alias)
    wait_until(lambda: attempts(alias, dependency) == [1], timeout=60, message="the handler")

    with transaction.atomic(using=alias):
        edges = Dependency.objects.select_for_update().filter(dependency_id=dependency.id)
        assert len(edges) == len(dependents)
        gate.touch()
        waits = RESOLVE_STATEMENT if give_up else VERDICT_STATEMENT
        wait_until(
            lambda: _resolving_backends(waiting=True, statement=waits),
            timeout=60,
            message="the verdict's resolution to wait for the edges",
        )
        assert state(alias, dependency) == "running"  # nothing of the verdict committed
        os.kill(killed.pid, signal.SIGKILL)
        assert killed.wait(timeout=30) == -signal.SIGKILL
    wait_until(lambda: not _resolving_backends(waiting=False, statement=waits), message="its end")
    resolved = Dependency.objects.filter(dependency_id=dependency.id, resolved=True).count()
    if give_up:  # rolled back
        assert (state(alias, dependency), journal(alias, dependency), resolved) == (
            "running",
            [],
            0,
        )
    else:  # committed whole, verdict and resolution
        assert (state(alias, dependency), journal(alias, dependency), resolved) == (
            "completed",
            [("completed", "")],
            1,
        )
        assert state(alias, dependents[0]) == "ready"

    monkeypatch.delenv("VENTURI_TEST_SETTINGS")
    workers.start(alias)
    wait_until(
        lambda: all(state(alias, job) in ("completed", "cancelled") for job in dependents),
        timeout=60,
        message="the next worker to finish the dependency and its dependents",
    )
    assert not Dependency.objects.filter(resolved=False).exists()
    if give_up:
        assert attempts(alias, dependency) == [1, 2]  # run again: its first verdict was lost
        assert [outcome for outcome, _ in journal(alias, dependency)] == [
            "lease_expired",
            "failed",
        ]
    else:
        assert attempts(alias, dependency) == [1]
        assert journal(alias, dependency) == [("completed", "")]
    assert_dependents_resolved_once(alias, dependency, dependents, give_up)
