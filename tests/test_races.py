"""Operations racing in real concurrent PostgreSQL sessions: lock order, and what a race may delete.

Each test holds one session at a chosen point (a transaction left open, a
`merge()` that waits for a signal) and lets another run into it, then checks
the second either never waits on the first or waits without harm. The points
are reached by waiting on observable state (`pg_stat_activity`), never by
sleeping.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections, transaction

import django_venturi as venturi
from django_venturi.models import Job
from django_venturi.store import verdicts
from django_venturi.store.claim import ClaimedJob, ClaimRequest, claim
from django_venturi.store.completion import write_verdicts
from django_venturi.store.leases import recover_expired
from django_venturi.store.retry import retry_now
from django_venturi.store.scheduling import TierClock
from tests.conftest import wait_until
from tests.testapp.tasks import Noop

pytestmark = pytest.mark.django_db(transaction=True, databases=["default"])

ALIAS = "default"
INSIDE_MERGE = threading.Event()
LEAVE_MERGE = threading.Event()


@venturi.task(kind="tests.races.gate")
@dataclasses.dataclass
class Gate(venturi.Task):
    """Keyed; with `hold`, its `merge()` waits for the test (its producer holds the key)."""

    key: str
    hold: bool = False

    def dedup_key(self) -> str | None:
        return self.key

    def merge(self, existing: venturi.Existing[Gate]) -> venturi.Merge:
        if self.hold:
            INSIDE_MERGE.set()
            assert LEAVE_MERGE.wait(60), "the test never let the merge go on"
        if existing.state == venturi.State.RUNNING:
            return venturi.Merge.enqueue()
        return venturi.Merge.keep()

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        return venturi.Outcome.completed()


@pytest.fixture(autouse=True)
def _signals() -> None:
    INSIDE_MERGE.clear()
    LEAVE_MERGE.clear()


class Session(threading.Thread):
    """Runs `work` on its own database connection; keeps its result or error and backend pid."""

    def __init__(self, work: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.work = work
        self.pid: int | None = None
        self.result: Any = None
        self.error: BaseException | None = None
        self.started_work = threading.Event()

    def run(self) -> None:
        try:
            connections[ALIAS].ensure_connection()
            self.pid = connections[ALIAS].connection.info.backend_pid
            self.started_work.set()
            self.result = self.work()
        except BaseException as error:
            self.error = error
        finally:
            connections.close_all()

    def finish(self) -> Any:
        self.join(60)
        assert not self.is_alive(), "the session did not finish"
        if self.error is not None:
            raise self.error
        return self.result


def waits_on_a_lock(session: Session) -> bool:
    with connections[ALIAS].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'",
            [session.pid],
        )
        (count,) = cursor.fetchone()
    return bool(count)


def done_or_waiting(session: Session) -> bool:
    return not session.is_alive() or waits_on_a_lock(session)


def claim_one(kind: str) -> ClaimedJob:
    request = ClaimRequest(
        worker="w", limit=1, kinds=[kind], leases=[timedelta(minutes=5)], queues=None
    )
    (job,) = claim(ALIAS, request, TierClock((6, 3, 1)))
    return job


def test_cleanup_never_deletes_a_job_that_retry_now_made_ready() -> None:
    """Cleanup found the job failed and old, then deleted it by id after retry_now committed."""
    job = Noop().enqueue(using=ALIAS)
    run = claim_one("tests.noop")
    write_verdicts(ALIAS, "w", [verdicts.failed(run, verdicts.ErrorInfo("E", "no"))])
    Job.objects.using(ALIAS).filter(pk=job.pk).update(
        finished_at=run.started_at - timedelta(days=2)
    )
    retried, commit = threading.Event(), threading.Event()

    def retry_and_hold() -> Any:
        with transaction.atomic(using=ALIAS):
            result = retry_now([job.pk], using=ALIAS)
            retried.set()
            commit.wait(60)  # the row stays locked, its new state not yet visible
        return result

    retrying = Session(retry_and_hold)
    retrying.start()
    assert retried.wait(30), "retry_now did not return"
    cleaning = Session(lambda: venturi.cleanup(older_than=timedelta(days=1), using=ALIAS))
    cleaning.start()
    cleaning.started_work.wait(10)
    wait_until(lambda: done_or_waiting(cleaning), message="cleanup to finish or wait")
    commit.set()
    assert retrying.finish().retried == [job.pk]
    cleaning.finish()
    stored = Job.objects.using(ALIAS).filter(pk=job.pk).first()
    assert stored is not None, "cleanup deleted the job retry_now had made ready"
    assert stored.state == venturi.State.READY and stored.finished_at is None


def test_recovery_and_a_producer_of_the_same_key_never_deadlock() -> None:
    """Recovery locked an expired row, then waited for the key's advisory lock that a
    producer held while it waited for that row: PostgreSQL broke the cycle by killing one."""
    expired = Gate(key="k2").enqueue(using=ALIAS)
    run = claim_one("tests.races.gate")
    Gate(key="k1").enqueue(using=ALIAS)
    Job.objects.using(ALIAS).filter(pk=expired.pk).update(
        lease_expires_at=run.started_at - timedelta(seconds=1)
    )
    # One batch: it takes the advisory locks of k1 and k2 first, then merges k1 (and
    # waits inside that merge), then would merge k2 against its running row.
    producing = Session(
        lambda: venturi.enqueue_many([Gate(key="k1", hold=True), Gate(key="k2")], using=ALIAS)
    )
    producing.start()
    assert INSIDE_MERGE.wait(30), "the producer never reached merge()"
    recovering = Session(lambda: recover_expired(ALIAS, "rescuer"))
    recovering.start()
    recovering.started_work.wait(10)
    wait_until(lambda: done_or_waiting(recovering), message="recovery to finish or wait")
    LEAVE_MERGE.set()
    jobs = producing.finish()
    recovered = recovering.finish()
    # The producer's k2 went in as a follow-up behind the running job (recovery left it
    # for its next round), or recovery came first; either way nothing is lost.
    if not recovered:
        assert recover_expired(ALIAS, "rescuer") == [expired.pk]
    live = Job.objects.using(ALIAS).filter(state=venturi.State.READY).order_by("id")
    assert sorted(job.dedup_key for job in live) == ["k1", "k2"]
    assert expired.pk in [job.pk for job in live]
    assert jobs[0].dedup_key == "k1" and jobs[1].dedup_key == "k2"
    assert Job.objects.using(ALIAS).get(pk=expired.pk).journal.get().outcome == "lease_expired"
