"""Concurrency caps per key (`venturi.Concurrency(n, key=...)`): at most n running jobs
of a kind for each value of a payload field, on PostgreSQL and SQLite.

The claim-level tests call `claim` directly with the request a worker makes; the
worker tests count overlaps from the handlers' own start and end timestamps.
"""

from __future__ import annotations

import collections
import dataclasses
import signal
import threading
import time
from datetime import timedelta

import pytest
from django.db import connections
from django.utils import timezone

import django_venturi as venturi
from django_venturi.models import Job
from django_venturi.registry import RegistrationError, registry
from django_venturi.store.claim import ClaimedJob, ClaimRequest, KindLimit, claim
from django_venturi.store.scheduling import TierClock
from tests.conftest import Workers, wait_until
from tests.test_scheduling import intervals, overlap
from tests.testapp.scheduling_tasks import KeyCapped, Uncapped

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])

KINDS = ["tests.key_capped", "tests.uncapped"]


def request(*, limit: int = 50, start_room: int | None = None, worker: str = "w1") -> ClaimRequest:
    cap = registry.get("tests.key_capped").concurrency
    assert cap is not None and cap.key == "account"
    return ClaimRequest(
        worker=worker,
        limit=limit,
        kinds=KINDS,
        leases=[timedelta(minutes=5)] * len(KINDS),
        queues=None,
        limits=[KindLimit("tests.key_capped", global_cap=cap.limit, local_room=None, key=cap.key)],
        start_room=start_room,
    )


def take(alias: str, claim_request: ClaimRequest | None = None) -> list[ClaimedJob]:
    return claim(alias, claim_request or request(), TierClock((6, 3, 1)))


def accounts(jobs: list[ClaimedJob]) -> collections.Counter[str]:
    return collections.Counter(job.payload.get("account", "-") for job in jobs)


def finish(alias: str, jobs: list[ClaimedJob]) -> None:
    Job.objects.using(alias).filter(id__in=[job.id for job in jobs]).update(
        state=venturi.State.COMPLETED, finished_at=timezone.now()
    )


def test_a_claim_takes_at_most_the_cap_of_each_key(alias: str) -> None:
    venturi.enqueue_many([KeyCapped(account=name) for name in "aaaaabbbbb"], using=alias)
    assert accounts(take(alias)) == {"a": 2, "b": 2}
    assert take(alias) == []  # both keys are at their cap
    ready = Job.objects.using(alias).filter(state=venturi.State.READY)
    assert ready.count() == 6
    assert set(ready.values_list("attempt", flat=True)) == {0}  # no attempt spent


def test_a_finished_job_frees_its_keys_place(alias: str) -> None:
    venturi.enqueue_many([KeyCapped(account=name) for name in "aaaabb"], using=alias)
    first = take(alias)
    finish(alias, [job for job in first if job.payload["account"] == "a"][:1])
    assert accounts(take(alias)) == {"a": 1}


def test_a_key_at_its_cap_does_not_hold_up_other_keys(alias: str) -> None:
    """A hundred older jobs of one account fill the first claim's scan; once the account
    is at its cap its jobs are left out of the scan, and the next claim reaches b."""
    venturi.enqueue_many([KeyCapped(account="a") for _ in range(100)], using=alias)
    venturi.enqueue_many([KeyCapped(account="b") for _ in range(3)], using=alias)
    assert accounts(take(alias, request(limit=10))) == {"a": 2}
    assert accounts(take(alias, request(limit=10))) == {"b": 2}


def test_other_kinds_fill_the_claim_beside_a_capped_key(alias: str) -> None:
    venturi.enqueue_many([KeyCapped(account="a") for _ in range(5)], using=alias)
    venturi.enqueue_many([Uncapped() for _ in range(5)], using=alias)
    claimed = take(alias)
    assert collections.Counter(job.kind for job in claimed) == {
        "tests.key_capped": 2,
        "tests.uncapped": 5,
    }


def test_jobs_without_the_field_or_with_null_share_one_key(alias: str) -> None:
    payloads = [{"seconds": 0.1}, {"account": None, "seconds": 0.1}] * 2
    Job.objects.using(alias).bulk_create(
        [Job(kind="tests.key_capped", payload=payload) for payload in payloads]
    )
    assert len(take(alias)) == 2
    assert take(alias) == []  # the key "" is at its cap, whichever way it is empty


def test_a_claim_takes_keyed_jobs_only_into_idle_slots(alias: str) -> None:
    venturi.enqueue_many([KeyCapped(account=name) for name in "abcdef"], using=alias)
    assert len(take(alias, request(start_room=3))) == 3
    assert take(alias, request(start_room=0)) == []


def test_racing_claims_never_pass_a_keys_cap() -> None:
    """Eight claimers race for 1 s over 4 accounts capped at 2 whose jobs never finish."""
    venturi.enqueue_many([KeyCapped(account=name) for name in "abcd" * 10])
    taken: list[ClaimedJob] = []
    lock = threading.Lock()
    deadline = time.monotonic() + 1.0

    def claimer(index: int) -> None:
        try:
            clock = TierClock((6, 3, 1))
            while time.monotonic() < deadline:
                jobs = claim("default", request(worker=f"w{index}", limit=3), clock)
                with lock:
                    taken.extend(jobs)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert accounts(taken) == {"a": 2, "b": 2, "c": 2, "d": 2}


def test_a_cap_key_must_be_a_payload_field() -> None:
    with pytest.raises(RegistrationError, match="concurrency key 'tenant' is not a field"):

        @venturi.task(kind="tests.bad_cap_key", concurrency=venturi.Concurrency(2, key="tenant"))
        @dataclasses.dataclass
        class BadKey(venturi.Task):
            account: str = ""

            def handle(self, ctx: venturi.Context) -> venturi.Outcome:
                return venturi.Outcome.completed()


@pytest.mark.parametrize("value", [0, -1, True, "2", 2.0])
def test_a_bad_concurrency_names_the_option(value: object) -> None:
    with pytest.raises(RegistrationError, match="concurrency must be a positive int"):

        @venturi.task(kind="tests.bad_cap", concurrency=value)  # type: ignore[arg-type]
        @dataclasses.dataclass
        class BadCap(venturi.Task):
            def handle(self, ctx: venturi.Context) -> venturi.Outcome:
                return venturi.Outcome.completed()


@pytest.mark.parametrize("limit", [0, -2, None, "2"])
def test_a_bad_concurrency_limit_is_refused(limit: object) -> None:
    with pytest.raises(ValueError, match="Concurrency limit must be a positive int"):
        venturi.Concurrency(limit)  # type: ignore[arg-type]


def test_concurrency_n_is_a_cap_without_key() -> None:
    assert registry.get("tests.capped").concurrency == venturi.Concurrency(2)


# ---------------------------------------------------------------- with real workers


def all_done(alias: str) -> bool:
    return not Job.objects.using(alias).exclude(state=venturi.State.COMPLETED).exists()


def test_each_key_runs_at_most_its_cap_across_worker_processes(
    alias: str, workers: Workers
) -> None:
    """Three workers of 4 slots, 4 accounts capped at 2, retries among them: from the
    handlers' own timestamps, no account ever ran more than 2 at once, and each ran 2."""
    jobs = [
        KeyCapped(account=name, seconds=0.1, retry_first=index % 3 == 0)
        for index, name in enumerate("abcd" * 6)
    ]
    venturi.enqueue_many(jobs, using=alias)
    processes = [workers.start(alias, "--concurrency", "4") for _ in range(3)]
    wait_until(lambda: all_done(alias), timeout=60, message="every job to complete")
    for process in processes:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    for name in "abcd":
        runs = intervals(alias, f"key_capped:{name}")
        assert len(runs) == 6 + 2  # two of each account's six asked for a retry
        assert overlap(runs) == 2, name
