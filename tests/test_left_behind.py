"""What a claim says it left behind (`Claimed.left_behind`, `Claimed.counted_later`).

A worker claims again at once after a short claim, and after each of its runs
finishes, only when the claim passed over due jobs of capped or rate-limited
kinds: their places may have kept other kinds' jobs out of it, and a finishing
run or a passing window gives them room. A claim that took every due job says so,
whatever kinds are capped, so that a fleet with capped kinds registered costs
two claims per enqueue like any other (`tests/test_wake_order.py` counts them
with real workers). On PostgreSQL and SQLite (`claim_orm.py`), through `claim`.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

import django_venturi as venturi
from django_venturi.registry import registry
from django_venturi.store import pauses, verdicts
from django_venturi.store.claim import Claimed, ClaimRequest, KindLimit, claim
from django_venturi.store.rate_limits import RateRule
from django_venturi.store.scheduling import TierClock
from django_venturi.worker.claimer import Claimer
from tests.test_frozen_claimer import caps_lock_held_elsewhere
from tests.testapp.flow_tasks import Rated
from tests.testapp.scheduling_tasks import KeyCapped, Uncapped
from tests.testapp.tasks import Noop

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])

KINDS = ["tests.key_capped", "tests.uncapped", "tests.rated", "tests.noop"]
TWO_PER_HOUR = venturi.RateLimit(2, per=timedelta(hours=1))
"""A window no run of this module outlasts: its starts are counted, whenever the claim."""


def request() -> ClaimRequest:
    cap = registry.get("tests.key_capped").concurrency
    assert cap is not None and (cap.limit, cap.key) == (2, "account")
    return ClaimRequest(
        worker="w1",
        limit=50,
        kinds=KINDS,
        leases=[timedelta(minutes=5)] * len(KINDS),
        queues=None,
        limits=[KindLimit("tests.key_capped", global_cap=2, local_room=None, key="account")],
        rates=[RateRule("tests.rated", TWO_PER_HOUR)],
    )


def take(alias: str) -> Claimed:
    return claim(alias, request(), TierClock((6, 3, 1)))


def test_a_claim_that_took_every_due_job_left_nothing_behind(alias: str) -> None:
    venturi.enqueue_many([KeyCapped(account="a"), KeyCapped(account="b")], using=alias)
    venturi.enqueue_many([Uncapped() for _ in range(3)] + [Rated(n=1)], using=alias)
    claimed = take(alias)
    assert len(claimed) == 6
    assert not claimed.left_behind and not claimed.counted_later


def test_a_claim_whose_cap_turned_due_jobs_away_says_so(alias: str) -> None:
    venturi.enqueue_many([KeyCapped(account="a") for _ in range(3)], using=alias)
    venturi.enqueue_many([Uncapped()], using=alias)
    claimed = take(alias)
    assert sorted(job.kind for job in claimed) == ["tests.key_capped"] * 2 + ["tests.uncapped"]
    assert claimed.left_behind


def test_a_key_at_its_cap_counts_though_its_jobs_are_out_of_the_scan(alias: str) -> None:
    venturi.enqueue_many([KeyCapped(account="a") for _ in range(2)], using=alias)
    assert len(take(alias)) == 2  # took every due job: the key is at its cap now
    venturi.enqueue_many([KeyCapped(account="a"), Uncapped()], using=alias)
    claimed = take(alias)
    assert [job.kind for job in claimed] == ["tests.uncapped"]
    assert claimed.left_behind


def test_a_rate_limit_at_its_window_counts_as_left_behind(alias: str) -> None:
    venturi.enqueue_many([Rated(n=n) for n in range(2)], using=alias)
    first = take(alias)
    assert len(first) == 2 and not first.left_behind
    venturi.enqueue_many([Rated(n=3), Uncapped()], using=alias)
    claimed = take(alias)
    assert [job.kind for job in claimed] == ["tests.uncapped"]
    assert claimed.left_behind


def test_an_empty_claim_with_nothing_due_left_nothing_behind(alias: str) -> None:
    """An idle worker called for a job its peer took: quiet afterwards, or its peer's
    next verdict would make it claim again for nothing."""
    claimed = take(alias)
    assert len(claimed) == 0
    assert not claimed.left_behind and not claimed.counted_later


def test_an_empty_claim_whose_cap_turned_every_due_job_away_says_so(alias: str) -> None:
    venturi.enqueue_many([KeyCapped(account="a") for _ in range(2)], using=alias)
    assert len(take(alias)) == 2  # the key is at its cap now
    KeyCapped(account="a").enqueue(using=alias)
    claimed = take(alias)
    assert len(claimed) == 0
    assert claimed.left_behind


def test_a_paused_capped_kind_is_not_left_behind(alias: str) -> None:
    """A resume wakes the workers: nothing to claim again for."""
    pauses.pause(kind="tests.key_capped", using=alias)
    venturi.enqueue_many([KeyCapped(account="a"), Uncapped()], using=alias)
    claimed = take(alias)
    assert [job.kind for job in claimed] == ["tests.uncapped"]
    assert not claimed.left_behind


# ---------------------------------------------------------------- the caps lock (PostgreSQL)


def test_without_the_caps_lock_nothing_is_left_for_later_if_no_capped_job_is_ready() -> None:
    Noop(n=1).enqueue()
    with caps_lock_held_elsewhere():
        claimed = take("default")
    assert [job.kind for job in claimed] == ["tests.noop"]
    assert not claimed.counted_later and not claimed.left_behind


def test_without_the_caps_lock_a_ready_capped_job_is_left_for_later() -> None:
    KeyCapped(account="a").enqueue()
    Noop(n=1).enqueue()
    with caps_lock_held_elsewhere():
        claimed = take("default")
    assert [job.kind for job in claimed] == ["tests.noop"]
    assert claimed.counted_later and claimed.left_behind


# ---------------------------------------------------------------- the claimer


def quiet_claimer(kind_concurrency: dict[str, int]) -> Claimer:
    """A claim loop whose last claim took every due job (only what `claim_after` reads)."""
    claimer = Claimer.__new__(Claimer)
    claimer._quiet = True
    claimer.kind_concurrency = kind_concurrency
    return claimer


def test_a_quiet_claimer_claims_after_a_capped_kinds_run_only() -> None:
    """A job of a capped kind may wait for the place a finishing run frees; the
    notification of its enqueue may have called other workers, busy or quiet."""
    KeyCapped(account="a").enqueue()
    Noop(n=1).enqueue()
    finished = {
        job.kind: verdicts.from_outcome(job, registry.get(job.kind), venturi.Outcome.completed())
        for job in take("default")
    }
    assert not quiet_claimer({}).claim_after([finished["tests.noop"]])
    assert quiet_claimer({}).claim_after([finished["tests.key_capped"]])  # concurrency=
    assert quiet_claimer({"tests.noop": 1}).claim_after([finished["tests.noop"]])  # local cap
