"""Waking idle workers: a notification calls two workers of a group, not all of them.

The order itself is checked on `WakeOrder` alone; what it buys (claims per
enqueue) and what it must not cost (a job waiting while a worker is free) with
real worker processes on PostgreSQL.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connections

import django_venturi as venturi
from django_venturi.models import Job, WorkerProcess
from django_venturi.store import listener_locks, registration
from django_venturi.store.registration import Peer
from django_venturi.worker.wake_order import HAND_ON_INTERVAL, Call, WakeOrder
from tests.conftest import Workers, wait_until
from tests.testapp import tasks
from tests.testapp.models import Record

KINDS = ["a.kind", "b.kind"]


def order(name: str, names: list[str], queues: list[str] | None = None) -> WakeOrder:
    wake_order = WakeOrder(worker=name, queues=queues, kinds=KINDS)
    wake_order.see([Peer(each, queues, KINDS) for each in names])
    return wake_order


# ---------------------------------------------------------------- the order


def test_a_notification_calls_the_first_two_workers_of_the_group() -> None:
    names = ["w3", "w1", "w4", "w2"]
    called = [name for name in names if order(name, names).answers("default")]
    assert sorted(called) == ["w1", "w2"]


def test_a_handed_on_call_reaches_the_next_two() -> None:
    names = ["w1", "w2", "w3", "w4", "w5"]
    assert [name for name in names if order(name, names).answers("default 2")] == ["w3", "w4"]
    assert [name for name in names if order(name, names).answers("default 4")] == ["w5"]


def test_workers_unlike_each_other_are_called_in_groups_of_their_own() -> None:
    peers = [
        Peer("a1", None, KINDS),
        Peer("a2", None, KINDS),
        Peer("a3", None, KINDS),
        Peer("e1", ["emails"], KINDS),
        Peer("k1", None, ["a.kind"]),
        Peer("k2", None, ["a.kind"]),
        Peer("k3", None, ["a.kind"]),
    ]
    called = []
    for peer in peers:
        wake_order = WakeOrder(worker=peer.name, queues=peer.queues, kinds=peer.kinds)
        wake_order.see(peers)
        if wake_order.answers("emails"):
            called.append(peer.name)
    # The workers serving every queue: two of each kind set. The emails worker: itself.
    assert called == ["a1", "a2", "e1", "k1", "k2"]


def test_a_worker_ignores_queues_it_does_not_serve() -> None:
    wake_order = order("w1", ["w1"], queues=["emails"])
    assert not wake_order.answers("default")
    assert wake_order.answers("emails")


def test_a_worker_not_in_its_own_view_answers_every_call() -> None:
    wake_order = WakeOrder(worker="new", queues=None, kinds=KINDS)
    assert wake_order.answers("default 6")
    wake_order.see([Peer("w1", None, KINDS), Peer("w2", None, KINDS)])
    assert wake_order.answers("default 6")


def test_a_notification_without_a_queue_or_a_reconnect_wakes_every_worker() -> None:
    names = ["w1", "w2", "w3"]
    assert order("w3", names).answers(None)
    assert order("w3", names).answers("")


def test_a_call_is_handed_on_to_the_next_workers_until_every_one_was_called() -> None:
    names = ["w1", "w2", "w3", "w4", "w5"]
    first = order("w1", names)
    assert first.answers("default")
    (call,) = first.take()
    assert call == Call("default", 0)
    assert first.take() == []
    assert first.hand_on([call]) == ["default 2"]
    last = order("w5", names)
    assert last.answers("default 4")
    assert last.hand_on(last.take()) == []  # no one after the last


def test_the_same_call_is_handed_on_at_most_once_per_interval_and_then_again() -> None:
    wake_order = order("w1", ["w1", "w2", "w3"])
    call = Call("default", 0)
    assert wake_order.hand_on([call]) == ["default 2"]
    assert wake_order.hand_on([call]) == []
    due = wake_order.next_deferred()
    assert due is not None and due > time.monotonic()
    assert wake_order.take() == []
    time.sleep(HAND_ON_INTERVAL + 0.01)
    assert wake_order.take() == [call]
    assert wake_order.next_deferred() is None
    assert wake_order.hand_on([call]) == ["default 2"]


def test_a_call_that_passed_by_is_answered_once_the_dead_are_left_out() -> None:
    """w1 and w2 were killed: their rows are listed, their listener locks are gone."""
    names = ["w1", "w2", "w3", "w4"]
    wake_order = order("w3", names)
    assert wake_order.hear(frozenset(listener_locks.key(name) for name in names)) is False
    assert not wake_order.answers("default")
    assert wake_order.look_due() is False  # looked less than LOOK_INTERVAL ago
    assert wake_order.take() == []
    assert wake_order.hear(frozenset(listener_locks.key(name) for name in ["w3", "w4"]))
    assert wake_order.take() == [Call("default", 0)]
    assert wake_order.answers("default")


def test_listener_locks_count_only_when_this_workers_own_is_seen() -> None:
    """A listener that is away, or that looks at another database, sees no lock of its own."""
    wake_order = order("w3", ["w1", "w2", "w3"])
    wake_order.hear(frozenset({listener_locks.key("w1")}))
    assert not wake_order.answers("default")
    assert wake_order.answers("default 2")


def test_workers_the_last_look_did_not_know_of_call_for_a_look() -> None:
    wake_order = order("w1", ["w1"])
    wake_order.hear(frozenset({listener_locks.key("w1")}))
    assert not wake_order.look_due()
    wake_order.see([Peer("w1", None, KINDS), Peer("w0", None, KINDS)])
    assert wake_order.look_due()


# ---------------------------------------------------------------- real workers

# Counts claim statements (see benchmarks/scale_claims.py, which validates the match).
CLAIM_COUNTER = """
CREATE SEQUENCE venturi_test_claims;
CREATE FUNCTION venturi_test_count_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_query() LIKE '%SET state = ''running''%'
       AND current_query() LIKE '%FOR UPDATE SKIP LOCKED%' THEN
        PERFORM nextval('venturi_test_claims');
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER venturi_test_count_claim AFTER UPDATE ON django_venturi_job
    FOR EACH STATEMENT EXECUTE FUNCTION venturi_test_count_claim();
"""
CLAIM_COUNTER_DROP = """
DROP TRIGGER IF EXISTS venturi_test_count_claim ON django_venturi_job;
DROP FUNCTION IF EXISTS venturi_test_count_claim();
DROP SEQUENCE IF EXISTS venturi_test_claims;
"""
CLAIMS = "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM venturi_test_claims"


@pytest.fixture
def claim_counter() -> Iterator[None]:
    with connections["default"].cursor() as cursor:
        cursor.execute(CLAIM_COUNTER_DROP)
        cursor.execute(CLAIM_COUNTER)
    try:
        yield
    finally:
        with connections["default"].cursor() as cursor:
            cursor.execute(CLAIM_COUNTER_DROP)


def claims() -> int:
    with connections["default"].cursor() as cursor:
        cursor.execute(CLAIMS)
        (count,) = cursor.fetchone()
    return int(count)


def start_idle_workers(
    workers: Workers, monkeypatch: pytest.MonkeyPatch, count: int, *args: str
) -> None:
    """Start `count` workers that poll once a minute (their loop claims whenever it
    wakes: for the lease sweep and the periodic scheduler too); wait until each one
    knows the others.

    With the test modules' capped and rate-limited kinds registered: their claims are
    the full statement, which must tell that it left no job behind for a limit, or
    its worker would claim again (`Claimer._after_claim`)."""
    settings = {"RESCUE_INTERVAL": 60, "PERIODIC_INTERVAL": 60}
    monkeypatch.setenv("VENTURI_TEST_SETTINGS", json.dumps(settings))
    for _ in range(count):
        workers.start("default", "--poll-interval", "60", *args)
    wait_until(
        lambda: WorkerProcess.objects.filter(stopped_at__isnull=True).count() == count,
        message=f"{count} workers to register",
    )
    wait_until_each_worker_has_seen_the_others()


def wait_until_each_worker_has_seen_the_others() -> None:
    """Each worker reads the registry right after writing its heartbeat: a heartbeat
    later than the last registration is followed by a read that finds every worker,
    and the heartbeat after that one comes once that read is done."""
    live = WorkerProcess.objects.filter(stopped_at__isnull=True)
    last_registered = max(live.values_list("started_at", flat=True))
    beat_after_it: dict[str, Any] = {}

    def each_beat_after(since: Callable[[str], Any]) -> bool:
        beats = dict(live.values_list("name", "heartbeat_at"))
        return all(beat > since(name) for name, beat in beats.items())

    wait_until(
        lambda: each_beat_after(lambda _name: last_registered),
        message="each worker to beat after the last one registered",
    )
    beat_after_it.update(live.values_list("name", "heartbeat_at"))
    wait_until(
        lambda: each_beat_after(lambda name: beat_after_it[name]),
        message="each worker to beat again, its read of the registry done",
    )


def ran(job: Job) -> Record | None:
    return Record.objects.filter(job_id=job.pk).first()


@pytest.mark.django_db(transaction=True)
def test_with_four_idle_workers_an_enqueue_costs_at_most_two_claims(
    workers: Workers, monkeypatch: pytest.MonkeyPatch, claim_counter: None
) -> None:
    start_idle_workers(workers, monkeypatch, 4)
    before = claims()
    for n in range(5):
        job = tasks.Noop(n=n).enqueue()
        wait_until(lambda job=job: ran(job), message="the job to run")
        # Both called workers claimed: one took the job, the other came back empty.
        wait_until(
            lambda n=n: claims() - before >= 2 * (n + 1),
            message=f"the two called workers' claims for job {n}",
        )
    spent = claims() - before
    # Every worker used to claim at every notification: 20 claims.
    assert spent <= 10, f"{spent} claims for 5 enqueues with 4 idle workers"


@pytest.mark.django_db(transaction=True)
def test_a_job_runs_at_once_on_a_free_worker_when_the_called_ones_are_full(
    workers: Workers, monkeypatch: pytest.MonkeyPatch, claim_counter: None
) -> None:
    """The first two hold as many jobs as they can: they hand the call on."""
    start_idle_workers(workers, monkeypatch, 3, "--concurrency", "1")
    ranked = sorted(WorkerProcess.objects.values_list("name", "pid"))
    first_two = {pid for _, pid in ranked[:2]}
    (_, third) = ranked[2]
    (third_process,) = [p for p in workers.processes if p.pid == third]
    # Each of the first two claims two (one running, one buffered): both are full. The
    # first claim to come back full hands its call on to the third, frozen meanwhile:
    # its claim would race the second one's for the four.
    third_process.send_signal(signal.SIGSTOP)
    try:
        blockers = venturi.enqueue_many([tasks.Sleeper(seconds=60) for _ in range(4)])
        wait_until(
            lambda: Job.objects.filter(state="running").count() == 4, message="four jobs claimed"
        )
        holders = set(
            Job.objects.filter(pk__in=[job.pk for job in blockers]).values_list(
                "claimed_by", flat=True
            )
        )
        assert holders == {name for name, _ in ranked[:2]}, "the first two workers took the four"
        # Full, the first two claim no more: the next claim is the third one's.
        before = claims()
    finally:
        third_process.send_signal(signal.SIGCONT)
    wait_until(lambda: claims() > before, message="the third worker to answer the call")
    enqueued = tasks.Sleeper(seconds=0).enqueue()
    # Within half a minute: not at a minute's poll, nor after a blocker's minute.
    record = wait_until(lambda: ran(enqueued), timeout=30, message="the new job to run")
    assert record.value == third and third not in first_two


@pytest.mark.django_db(transaction=True)
def test_a_job_runs_at_once_when_the_first_worker_was_killed_a_moment_ago(
    workers: Workers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed with -9, it stays listed as live until its heartbeat is old. A survivor
    answers: the second worker, which the call names beside it, or the third, once the
    survivors have seen the first one's listener lock go (who wins is a race)."""
    start_idle_workers(workers, monkeypatch, 3)
    ranked = sorted(WorkerProcess.objects.values_list("name", "pid"))
    first = ranked[0][1]
    survivors = {pid for _, pid in ranked[1:]}
    (killed,) = [p for p in workers.processes if p.pid == first]
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=10)
    job = tasks.Sleeper(seconds=0).enqueue()
    # Within half a minute: not at a minute's poll.
    record = wait_until(lambda: ran(job), timeout=30, message="the job to run")
    assert record.value in survivors


def run_one_after_another(count: int, expected_pid: int) -> None:
    """Enqueue `count` jobs one after another; each runs on `expected_pid` within half a
    minute (the workers poll once a minute: a job that runs in time was woken for)."""
    for n in range(count):
        job = tasks.Sleeper(seconds=0).enqueue()
        record = wait_until(
            lambda job=job: ran(job), timeout=30, message=f"job {n} to run (a minute's poll)"
        )
        assert record.value == expected_pid


@pytest.mark.django_db(transaction=True)
def test_wake_ups_reach_the_survivor_at_once_after_three_of_four_workers_were_killed(
    workers: Workers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kill -9 (a lost node, an OOM kill) leaves registry rows that look live for
    `stale_after()` (30 s); their listeners' connections are gone at once, and the
    survivor, last of its group, is called right away instead of at its next poll."""
    start_idle_workers(workers, monkeypatch, 4)
    *doomed, (_, survivor) = sorted(WorkerProcess.objects.values_list("name", "pid"))
    for _, pid in doomed:
        (process,) = [p for p in workers.processes if p.pid == pid]
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
    run_one_after_another(15, expected_pid=survivor)
    # The killed workers were still live by their heartbeats throughout: the survivor
    # was not called, it answered a call to the dead.
    listed = {peer.name for peer in registration.live_peers("default")}
    assert {name for name, _ in doomed} <= listed, "measured after the rows went stale"
