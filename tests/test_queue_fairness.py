"""Fair claiming between queues: within a priority tier, the queues with due jobs
share a worker's claims (equal turns, or `QUEUE_WEIGHTS`), so a flooded queue
cannot hold back another queue's due jobs (issue 34)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.core.checks import Error
from django.test import override_settings

import django_venturi as venturi
from django_venturi.checks import check_settings
from django_venturi.models import Job
from django_venturi.registry import registry
from django_venturi.store.claim import ClaimRequest, claim
from django_venturi.store.scheduling import MAX_QUEUE_CLOCKS, TierClock
from tests.conftest import Workers
from tests.testapp.models import Record
from tests.testapp.tasks import Noop

NORMAL = int(venturi.Priority.NORMAL)


def request(limit: int) -> ClaimRequest:
    kinds = registry.kinds()
    return ClaimRequest(
        worker="w1",
        limit=limit,
        kinds=kinds,
        leases=[timedelta(minutes=5)] * len(kinds),
        queues=None,
    )


def flood(alias: str, bulk: int, other: int, other_queue: str = "default") -> None:
    """`bulk` jobs in queue `bulk`, then (newer) `other` jobs in `other_queue`, one tier."""
    venturi.enqueue_many([Noop(n=i) for i in range(bulk)], queue="bulk", using=alias)
    venturi.enqueue_many([Noop(n=1000 + i) for i in range(other)], queue=other_queue, using=alias)


# The clocks alone.


def test_two_queues_with_work_alternate_one_claim_at_a_time() -> None:
    clock = TierClock((6, 3, 1))
    taken = []
    for _ in range(6):
        bulk, other = clock.queue_turns(NORMAL, "bulk", 1)[0], clock.queue_turns(NORMAL, "b", 1)[0]
        queue = "bulk" if bulk <= other else "b"
        taken.append(queue)
        clock.record([(NORMAL, queue)], limit=1)
    assert taken == ["bulk", "b"] * 3


def test_a_queue_that_had_no_work_banks_no_credit() -> None:
    clock = TierClock((6, 3, 1))
    for _ in range(100):  # only `bulk` has work: 100 claims of one job
        clock.record([(NORMAL, "bulk")], limit=1)
    # `late` arrives: its first job comes next, then the two alternate (it does not
    # get 100 turns in a row for the claims it was not there for).
    assert clock.queue_turns(NORMAL, "late", 2) == [0.0, 1.0]
    assert clock.queue_turns(NORMAL, "bulk", 2) == [1.0, 2.0]


def test_queue_clocks_forget_queues_that_fell_behind() -> None:
    clock = TierClock((6, 3, 1))
    clock.record([(NORMAL, "a"), (NORMAL, "b")], limit=2)
    for _ in range(3):
        clock.record([(NORMAL, "a")], limit=1)
    assert set(clock.queues[NORMAL]) == {"a"}  # `b` is back at the default: no entry


# The claim, on PostgreSQL and SQLite.


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_a_flooded_queue_shares_single_job_claims_with_a_newer_one(alias: str) -> None:
    flood(alias, bulk=300, other=5)
    clock = TierClock((6, 3, 1))
    queues = [job.queue for _ in range(12) for job in claim(alias, request(1), clock)]
    # Equal turns: the older backlog first (the tie breaks by enqueue order), then
    # the newer queue, one each, until the newer queue is empty.
    assert queues == ["bulk", "default"] * 5 + ["bulk", "bulk"]


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_one_batch_takes_its_share_of_each_queue_in_turn_order(alias: str) -> None:
    flood(alias, bulk=300, other=20, other_queue="urgent")
    venturi.enqueue_many([Noop(n=2000 + i) for i in range(20)], queue="third", using=alias)
    clock = TierClock((6, 3, 1))
    batch = claim(alias, request(30), clock)
    assert [job.queue for job in batch] == ["bulk", "urgent", "third"] * 10
    for queue in ("bulk", "urgent", "third"):  # in enqueue order within each queue
        ids = [job.id for job in batch if job.queue == queue]
        assert ids == sorted(ids)


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_queue_weights_set_the_shares(alias: str) -> None:
    flood(alias, bulk=300, other=300)
    clock = TierClock((6, 3, 1), {"default": 4})
    queues = [job.queue for _ in range(50) for job in claim(alias, request(1), clock)]
    assert (queues.count("bulk"), queues.count("default")) == (10, 40)
    batches = [job.queue for _ in range(5) for job in claim(alias, request(10), clock)]
    assert (batches.count("bulk"), batches.count("default")) == (10, 40)


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_priority_tiers_still_come_before_queue_turns(alias: str) -> None:
    venturi.enqueue_many(
        [Noop(n=i) for i in range(60)], queue="a", priority=venturi.Priority.HIGH, using=alias
    )
    venturi.enqueue_many([Noop(n=i) for i in range(60)], queue="b", using=alias)
    clock = TierClock((6, 3, 1))
    tiers = [job.priority for _ in range(45) for job in claim(alias, request(1), clock)]
    assert (tiers.count(venturi.Priority.HIGH), tiers.count(venturi.Priority.NORMAL)) == (30, 15)


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_within_a_queue_the_order_stays_rank_then_enqueue(alias: str) -> None:
    flood(alias, bulk=10, other=10)
    urgent = list(Job.objects.using(alias).filter(queue="default").order_by("id"))
    Job.objects.using(alias).filter(pk=urgent[-1].pk).update(rank=-5)
    clock = TierClock((6, 3, 1))
    taken = [job.id for _ in range(4) for job in claim(alias, request(1), clock)]
    by_id = {job.pk: job for job in Job.objects.using(alias).filter(pk__in=taken)}
    in_default = [pk for pk in taken if by_id[pk].queue == "default"]
    assert in_default == [urgent[-1].pk, urgent[0].pk]


# Real workers.


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_a_worker_serves_a_newer_queue_while_a_backlog_drains(alias: str, workers: Workers) -> None:
    flood(alias, bulk=400, other=10)
    workers.burst(alias, "--concurrency", "1")
    order = list(Record.objects.using(alias).order_by("id").values_list("value", flat=True))
    assert len(order) == 410
    positions = [index for index, n in enumerate(order) if n >= 1000]
    # Equal turns: every other run until `default` is empty (the whole backlog
    # first before this change: positions 400 to 409).
    assert positions == list(range(1, 21, 2))


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_a_worker_follows_queue_weights_from_settings(alias: str, workers: Workers) -> None:
    flood(alias, bulk=200, other=200)
    weights = json.dumps({"QUEUE_WEIGHTS": {"bulk": 1, "default": 4}})
    workers.burst(alias, "--concurrency", "1", env={"VENTURI_TEST_SETTINGS": weights})
    order = list(Record.objects.using(alias).order_by("id").values_list("value", flat=True))
    first = order[:100]
    assert sum(1 for n in first if n >= 1000) == 80


# The setting's check.


@pytest.mark.parametrize(
    "value",
    [{"bulk": 0}, {"bulk": 1.5}, {"bulk": True}, {"no spaces": 1}, ["bulk"], {"bulk": 1001}],
)
def test_a_wrong_queue_weight_is_a_system_check_error(value: object) -> None:
    with override_settings(VENTURI={"QUEUE_WEIGHTS": value}):
        errors = [error for error in check_settings() if isinstance(error, Error)]
    assert [error.id for error in errors] == ["venturi.E016"]
    assert "QUEUE_WEIGHTS" in errors[0].msg


def test_queue_weights_pass_the_check() -> None:
    with override_settings(VENTURI={"QUEUE_WEIGHTS": {"bulk": 1, "default": 4}}):
        assert check_settings() == []


def test_a_worker_keeps_a_bounded_number_of_queue_clocks() -> None:
    clock = TierClock((6, 3, 1))
    for start in range(0, 3 * MAX_QUEUE_CLOCKS, 500):  # claims of one job from each of 500 queues
        clock.record([(NORMAL, f"q{n}") for n in range(start, start + 500)], limit=500)
    assert len(clock.queues[NORMAL]) == MAX_QUEUE_CLOCKS
