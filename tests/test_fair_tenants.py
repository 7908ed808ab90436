"""Fair kinds (`@venturi.task(fair_by="account")`): the due jobs of a kind take turns by
the values of a payload field, on PostgreSQL and SQLite.

The claim-level tests call `claim` with the request a worker makes (and one worker's
turns: a `TierClock`); the worker test reads the handlers' own start times.
"""

from __future__ import annotations

import collections
import dataclasses
import io
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.test import Client

import django_venturi as venturi
from django_venturi.models import Job
from django_venturi.registry import RegistrationError
from django_venturi.store.claim import ClaimedJob, ClaimRequest, claim
from django_venturi.store.claim_statement import claim_shape
from django_venturi.store.claim_types import KindLimit
from django_venturi.store.scheduling import TierClock
from tests.conftest import Workers
from tests.testapp.models import Record
from tests.testapp.scheduling_tasks import Fair, FairLatest, Uncapped

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])

KINDS = ["tests.fair", "tests.uncapped"]


def request(limit: int, shape: str = "fair") -> ClaimRequest:
    """A claim of the fair kind in the statement of `shape`: "fair", or "full_fair" (a
    local cap on another kind makes the claim count, as with capped kinds)."""
    made = ClaimRequest(
        worker="w1",
        limit=limit,
        kinds=KINDS,
        leases=[timedelta(minutes=5)] * len(KINDS),
        queues=None,
        fair_kinds=["tests.fair"],
        limits=[KindLimit("tests.uncapped", None, 1000)] if shape == "full_fair" else [],
    )
    assert claim_shape(made) == shape
    return made


def accounts(jobs: list[ClaimedJob]) -> collections.Counter[str]:
    return collections.Counter(job.payload["account"] for job in jobs if "account" in job.payload)


def test_the_key_is_stored_at_enqueue_whichever_way(alias: str) -> None:
    one = Fair(account="acme").enqueue(using=alias)
    many = venturi.enqueue_many([Fair(account="globex"), Fair(account="")], using=alias)
    plain = Uncapped().enqueue(using=alias)
    stored = dict(Job.objects.using(alias).values_list("id", "fair_key"))
    assert stored == {one.pk: "acme", many[0].pk: "globex", many[1].pk: "", plain.pk: None}


def test_a_merge_that_changes_the_payload_moves_the_job_to_its_new_key(alias: str) -> None:
    first = FairLatest(name="report", account="acme").enqueue(using=alias)
    merged = FairLatest(name="report", account="globex").enqueue(using=alias)
    assert merged.pk == first.pk
    assert Job.objects.using(alias).get(pk=first.pk).fair_key == "globex"


@pytest.mark.parametrize("shape", ["fair", "full_fair"])
def test_one_accounts_backlog_does_not_hold_back_the_others(alias: str, shape: str) -> None:
    venturi.enqueue_many([Fair(account="acme", n=n) for n in range(50)], using=alias)
    venturi.enqueue_many([Fair(account=f"b{n}") for n in range(4)], using=alias)
    claimed = claim(alias, request(10, shape), TierClock((6, 3, 1)))
    # Ten places: one for each account in the first round, then acme's in the next ones.
    assert accounts(claimed) == {"acme": 6, "b0": 1, "b1": 1, "b2": 1, "b3": 1}
    acme = [job.payload["n"] for job in claimed if job.payload["account"] == "acme"]
    assert sorted(acme) == [0, 1, 2, 3, 4, 5]  # in enqueue order within an account


@pytest.mark.parametrize("shape", ["fair", "full_fair"])
def test_accounts_take_turns_round_robin_across_claims(alias: str, shape: str) -> None:
    names = [f"a{n:02}" for n in range(30)]
    venturi.enqueue_many([Fair(account=name, n=k) for k in range(3) for name in names], using=alias)
    clock = TierClock((6, 3, 1))
    served = [sorted(accounts(claim(alias, request(10, shape), clock))) for _ in range(4)]
    # Ten accounts a claim, each once. The claim's scan reaches ten accounts of their
    # own, so it looks 8 accounts past the last one whose turn it gave (FAIR_BEYOND):
    # those come first, then the accounts the scan reached, in enqueue order; the next
    # claim looks on from the 8th, wrapping round.
    assert served == [names[:10], names[8:18], names[16:26], names[:4] + names[24:]]


def test_an_account_the_scan_does_not_reach_gets_its_turn_within_a_claim(alias: str) -> None:
    names = [f"a{n:02}" for n in range(1, 30)]
    venturi.enqueue_many([Fair(account=name, n=k) for k in range(3) for name in names], using=alias)
    venturi.enqueue_many([Fair(account="a00")], using=alias)  # behind 87 older jobs
    claimed = claim(alias, request(10), TierClock((6, 3, 1)))
    assert sorted(accounts(claimed)) == ["a00", *names[:9]]


@pytest.mark.parametrize("shape", ["fair", "full_fair"])
def test_queues_share_a_claim_of_a_fair_kind_by_their_turns(alias: str, shape: str) -> None:
    # Two slots (queues), every key reached: the places follow the queues' turns.
    venturi.enqueue_many([Fair(account=f"a{n}") for n in range(4)], queue="one", using=alias)
    venturi.enqueue_many([Fair(account=f"b{n}") for n in range(4)], queue="two", using=alias)
    claimed = claim(alias, request(4, shape), TierClock((6, 3, 1)))
    assert sorted(accounts(claimed)) == ["a0", "a1", "b0", "b1"]


def test_a_capped_fair_kind_passes_its_cap_in_turn_order(alias: str) -> None:
    venturi.enqueue_many([Fair(account="acme", n=n) for n in range(3)], using=alias)
    venturi.enqueue_many([Fair(account="globex")], using=alias)
    capped = dataclasses.replace(request(10), limits=[KindLimit("tests.fair", None, 2)])
    claimed = claim(alias, capped, TierClock((6, 3, 1)))
    # Room for 2: the first round (acme's first job, globex's), not enqueue order.
    assert accounts(claimed) == {"acme": 1, "globex": 1}


def test_each_worker_keeps_its_own_turns(alias: str) -> None:
    venturi.enqueue_many(
        [Fair(account=f"a{n}", n=k) for k in range(2) for n in range(4)], using=alias
    )
    first, second = TierClock((6, 3, 1)), TierClock((6, 3, 1))
    assert sorted(accounts(claim(alias, request(2), first))) == ["a0", "a1"]
    assert sorted(accounts(claim(alias, request(2), second))) == ["a0", "a1"]  # a0's second job
    assert sorted(accounts(claim(alias, request(2), first))) == ["a2", "a3"]


def test_a_fair_kind_takes_no_more_places_than_enqueue_order_gives_it(alias: str) -> None:
    older = venturi.enqueue_many([Uncapped() for _ in range(5)], using=alias)
    venturi.enqueue_many([Fair(account=f"a{n}") for n in range(5)], using=alias)
    claimed = claim(alias, request(5), TierClock((6, 3, 1)))
    assert sorted(job.id for job in claimed) == sorted(job.pk for job in older)


def test_fair_by_must_be_a_payload_field() -> None:
    with pytest.raises(RegistrationError, match="fair_by 'tenant' is not a field"):

        @venturi.task(kind="tests.bad_fair", fair_by="tenant")
        @dataclasses.dataclass
        class BadFair(venturi.Task):
            account: str = ""

            def handle(self, ctx: venturi.Context) -> venturi.Outcome:
                return venturi.Outcome.completed()


def test_newcomers_start_ahead_of_a_big_backlog_on_real_workers(
    alias: str, workers: Workers
) -> None:
    """Two workers, 400 jobs of one account queued first, then one job each for ten
    other accounts: by the handlers' own start times, every newcomer started while most
    of the big account's backlog still waited (in enqueue order it would have waited
    for all 400)."""
    venturi.enqueue_many(
        [Fair(account="acme", n=n, seconds=0.005) for n in range(400)], using=alias
    )
    venturi.enqueue_many([Fair(account=f"new{n}") for n in range(10)], using=alias)
    workers.burst(alias, "--concurrency", "4")
    starts = sorted(
        (value["t"], value["account"])
        for value in Record.objects.using(alias).filter(kind="fair").values_list("value", flat=True)
    )
    assert len(starts) == 410
    last_newcomer = max(index for index, (_, account) in enumerate(starts) if account != "acme")
    assert last_newcomer < 100, starts[: last_newcomer + 1]


def test_the_stats_show_each_fair_kinds_keys(alias: str) -> None:
    venturi.enqueue_many([Fair(account="acme") for _ in range(3)], using=alias)
    venturi.enqueue_many([Fair(account=name) for name in ("globex", "globex", "")], using=alias)
    Fair(account="later").enqueue(using=alias, delay=timedelta(hours=1))  # not due
    (use,) = [use for use in venturi.stats(using=alias).fair if use.kind == "tests.fair"]
    assert use.as_dict() == {
        "kind": "tests.fair",
        "fair_by": "account",
        "keys_with_due": 3,
        "busiest": [["acme", 3], ["globex", 2], ["", 1]],
        "waiting": 6,
    }
    out = io.StringIO()
    call_command("venturi_stats", "--database", alias, stdout=out)
    line = 'fair tests.fair by account: 3 keys with due jobs (busiest: acme 3, globex 2, "" 1)'
    assert f"{line}; 6 due waiting" in out.getvalue()


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_the_admin_stats_page_shows_the_fair_kinds(admin_client: Client) -> None:
    venturi.enqueue_many([Fair(account=name) for name in ("acme", "acme", "<b>x</b>")])
    page = admin_client.get("/admin/django_venturi/job/stats/").content.decode()
    section = page.split('id="venturi-fair"')[1].split("</div>")[0]
    assert "<caption>Fair kinds</caption>" in section
    assert (
        "<tr><td>tests.fair</td><td>account</td><td>2</td>"
        "<td>acme (2), &lt;b&gt;x&lt;/b&gt; (1)</td><td>3</td></tr>"
    ) in section
