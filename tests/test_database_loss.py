"""Losing PostgreSQL under a running worker: its backends terminated, its listener cut.

The server itself is never restarted (other runs share it). The tests terminate
the worker's backends with `pg_terminate_backend`, which is what the worker
sees of a restart, a failover or a network cut: every connection breaks at
once. For an outage that lasts, the test database also refuses new connections
for a few seconds (`ALTER DATABASE ... ALLOW_CONNECTIONS false`), which is what
a worker sees while a server restarts. Only this run's own test database is
touched.
"""

from __future__ import annotations

import collections
import json
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import psycopg
import pytest
from django.db import connections

import django_venturi as venturi
from django_venturi.models import Job, JournalEntry
from django_venturi.store import leases
from django_venturi.store.connections import connection_params
from django_venturi.worker import supervision
from django_venturi.worker.process import Worker
from tests.conftest import Workers, wait_until
from tests.testapp import tasks
from tests.testapp.models import Record

pytestmark = pytest.mark.django_db(transaction=True, databases=["default"])

ALIAS = "default"


def terminate(condition: str = "TRUE") -> list[int]:
    """Terminate the backends of the test database (not this one) matching `condition`."""
    with connections[ALIAS].cursor() as cursor:
        cursor.execute(
            "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            f"AND backend_type = 'client backend' AND ({condition})"
        )
        return [pid for pid, done in cursor.fetchall() if done]


def listeners() -> list[int]:
    """The backends of the test database that are LISTENing (the workers' listeners)."""
    with connections[ALIAS].cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND query LIKE 'LISTEN%%'"
        )
        return [pid for (pid,) in cursor.fetchall()]


def completed() -> int:
    return Job.objects.using(ALIAS).filter(state=venturi.State.COMPLETED).count()


def state_of(job_id: int) -> str:
    return str(Job.objects.using(ALIAS).values_list("state", flat=True).get(pk=job_id))


def started_up(workers: Workers, index: int = 0) -> bool:
    return " starting: " in workers.log(index)


def database_now() -> datetime:
    with connections[ALIAS].cursor() as cursor:
        cursor.execute("SELECT now()")
        (now,) = cursor.fetchone()
    return now


@contextmanager
def outage() -> Iterator[None]:
    """No connection to this run's test database but the test's own, until the block ends.

    Only this run's database refuses connections; the server, and other runs on
    it, carry on.
    """
    connections[ALIAS].ensure_connection()  # the test's own, kept through the outage
    name = connections[ALIAS].ops.quote_name(connections[ALIAS].settings_dict["NAME"])
    # PostgreSQL wants this said from another database: the server's maintenance one.
    params = {**connection_params(ALIAS), "dbname": "postgres"}
    with psycopg.connect(**params, autocommit=True) as admin:
        admin.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS false")
        try:
            terminate()
            yield
        finally:
            admin.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")


def side_effect_runs(path: Path) -> dict[int, list[int]]:
    """Job id -> the attempts whose handler ran, from `job attempt pid` lines."""
    ran: dict[int, list[int]] = collections.defaultdict(list)
    for line in path.read_text().splitlines():
        job_id, attempt, _pid = (int(part) for part in line.split())
        ran[job_id].append(attempt)
    return ran


def check_every_attempt_is_accounted_for(ids: set[int], ran: dict[int, list[int]]) -> None:
    """Each job completed once; each claim closed by one entry; each run belongs to a claim."""
    entries: dict[int, list[JournalEntry]] = collections.defaultdict(list)
    for entry in JournalEntry.objects.using(ALIAS).order_by("id"):
        entries[entry.job_id].append(entry)
    rows = {row.pk: row for row in Job.objects.using(ALIAS)}
    assert set(rows) == ids
    for job_id in ids:
        context = f"job {job_id}: {[(e.attempt, e.outcome) for e in entries[job_id]]}, ran {ran}"
        closing = [entry for entry in entries[job_id] if entry.outcome != "discarded"]
        assert rows[job_id].state == venturi.State.COMPLETED, context
        assert [entry.outcome for entry in closing][-1:] == ["completed"], context
        assert {entry.outcome for entry in closing[:-1]} <= {"lease_expired"}, context
        assert sorted(e.attempt for e in closing) == list(range(1, rows[job_id].attempt + 1))
        lost = {entry.attempt for entry in closing if entry.outcome == "lease_expired"}
        late = {entry.attempt for entry in entries[job_id] if entry.outcome == "discarded"}
        assert late <= lost, context
        assert len(ran[job_id]) == len(set(ran[job_id])), context
        assert set(ran[job_id]) - {closing[-1].attempt} <= lost, context


def test_a_worker_survives_its_connections_being_terminated_mid_backlog(
    workers: Workers,
) -> None:
    count = 1000
    jobs = venturi.enqueue_many([tasks.Steady(n=i, sleep=0.02) for i in range(count)], using=ALIAS)
    ids = {job.pk for job in jobs}
    worker = workers.start(ALIAS, "--concurrency", "4")
    killed_backends: list[int] = []

    # Two sudden losses, then a storm: every connection killed again and again for 1.5 s.
    for threshold in (200, 450):
        wait_until(lambda threshold=threshold: completed() >= threshold, timeout=60)
        assert worker.poll() is None
        killed = terminate()
        assert killed, "the worker had no connection to terminate"
        killed_backends.extend(killed)
    wait_until(lambda: completed() >= 700, timeout=60)
    storm_ends = time.monotonic() + 1.5
    while time.monotonic() < storm_ends:
        assert worker.poll() is None
        killed_backends.extend(terminate())
        time.sleep(0.05)

    wait_until(lambda: completed() == count, timeout=90, message="every job to complete")
    assert worker.poll() is None, "the worker exited"
    log = workers.log(0)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0

    entries: dict[int, list[str]] = collections.defaultdict(list)
    for job_id, outcome in JournalEntry.objects.using(ALIAS).values_list("job_id", "outcome"):
        entries[job_id].append(outcome)
    records = collections.Counter(Record.objects.using(ALIAS).values_list("job_id", flat=True))
    rows = {row.pk: row for row in Job.objects.using(ALIAS)}
    assert set(rows) == ids and all(row.state == venturi.State.COMPLETED for row in rows.values())
    reran = 0
    for job_id in ids:
        outcomes = entries[job_id]
        context = f"job {job_id}: {outcomes}, {records[job_id]} runs"
        # Completed exactly once; any other entry is a run the outage broke.
        assert outcomes.count("completed") == 1, context
        assert set(outcomes) <= {"completed", "retry", "lease_expired", "discarded"}, context
        closing = [outcome for outcome in outcomes if outcome != "discarded"]
        assert rows[job_id].attempt == len(closing), context
        # Each run's side effect is accounted for by a journal entry closing its claim.
        assert 1 <= records[job_id] <= len(closing), context
        if records[job_id] > 1:
            reran += 1
    assert not set(records) - ids

    assert "lost the database" in log and "reconnected after" in log
    assert "listener lost its connection" in log and "listener reconnected" in log
    broken = sum(1 for outcomes in entries.values() if len(outcomes) > 1)
    print(
        f"\ndatabase loss: {count} jobs, {len(killed_backends)} backends terminated, "
        f"all completed once; {broken} jobs with a broken run, {reran} run more than once; "
        f"'lost the database' logged {log.count('lost the database')} times"
    )


def test_the_listener_re_listens_after_its_connection_is_terminated(
    workers: Workers, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing but a notification wakes it in time: an hour's poll, and an hour between
    # its recovery sweeps and scheduler passes (the test settings' half second would
    # wake it, and claim, without one).
    chores = {"RESCUE_INTERVAL": 3600, "PERIODIC_INTERVAL": 3600}
    monkeypatch.setenv("VENTURI_TEST_SETTINGS", json.dumps(chores))
    worker = workers.start(ALIAS, "--poll-interval", "3600")
    (first,) = wait_until(listeners, timeout=30, message="the worker to LISTEN")

    def done_within(seconds: float, n: int) -> float:
        begun = time.monotonic()
        job = tasks.Noop(n=n).enqueue(using=ALIAS)
        wait_until(
            lambda: state_of(job.pk) == venturi.State.COMPLETED,
            timeout=seconds,
            message=f"job {n} to be done (the poll interval is an hour)",
        )
        return time.monotonic() - begun

    # Woken by NOTIFY: within half a minute, not at the hour's poll.
    done_within(30, 0)

    assert terminate(f"pid = {first}") == [first]
    # This job's NOTIFY may reach nobody; the listener wakes the worker when it is back.
    latencies = [done_within(30, 1)]
    (second,) = wait_until(
        lambda: [pid for pid in listeners() if pid != first],
        timeout=30,
        message="the worker to LISTEN again",
    )
    for n in range(2, 7):
        latencies.append(done_within(30, n))
    assert worker.poll() is None
    log = workers.log(0)
    assert "listener lost its connection" in log and "listener reconnected" in log
    assert "lost the database" not in log  # only the listener's connection was cut
    print(f"\nlistener: {second} replaced {first}; latencies {[round(t, 2) for t in latencies]}")
    assert started_up(workers)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0


def run_through_an_outage(
    workers: Workers, tmp_path: Path, task: type, during: Callable[[], object]
) -> tuple[set[int], dict[int, list[int]], list[JournalEntry], str]:
    """A backlog, a worker, and an outage in the middle of it that lasts while `during`
    runs (on the test's own connection, the only one the database still has)."""
    path = tmp_path / "runs.log"
    count = 600
    jobs = venturi.enqueue_many([task(path=str(path), sleep=0.02)] * count, using=ALIAS)
    ids = {job.pk for job in jobs}
    worker = workers.start(ALIAS, "--concurrency", "4")
    wait_until(lambda: completed() >= 150, timeout=60)
    with outage():
        during()
        assert worker.poll() is None
    after = database_now()
    wait_until(lambda: completed() == count, timeout=60, message="every job to complete")
    assert worker.poll() is None, "the worker exited"
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    ran = side_effect_runs(path)
    check_every_attempt_is_accounted_for(ids, ran)
    # Held across the outage: claimed before it, with a verdict only written after it.
    # A run's start is its handler's (or the claim's, for a lost claim), and a job
    # claimed before the outage may have waited in the worker's buffer and started
    # during it: no claim can start one then, so a start before its end will do.
    spanning = list(
        JournalEntry.objects.using(ALIAS).filter(
            job_id__in=ids, started_at__lt=after, finished_at__gt=after
        )
    )
    log = workers.log(0)
    # One outage, logged once, and once when it is over.
    assert log.count("lost the database") == 1 and log.count("reconnected after") == 1, log
    return ids, ran, spanning, log


def test_results_computed_during_an_outage_shorter_than_the_lease_are_written_after_it(
    workers: Workers, tmp_path: Path
) -> None:
    ids, ran, spanning, _log = run_through_an_outage(
        workers,
        tmp_path,
        tasks.OutlastsOutage,
        lambda: time.sleep(4),  # the outage's length (shorter than the lease): no wait
    )
    # The claims outlived the outage (10 s lease): their results were kept, then written.
    assert spanning, "no job was held by the worker across the outage"
    for entry in spanning:
        outcomes = list(
            JournalEntry.objects.using(ALIAS)
            .filter(job_id=entry.job_id)
            .values_list("outcome", flat=True)
        )
        assert (entry.outcome, entry.attempt, outcomes) == ("completed", 1, ["completed"])
        assert ran[entry.job_id] == [1]
    reran = sorted(job_id for job_id in ids if len(ran[job_id]) > 1)
    print(f"\noutage < lease: {len(spanning)} results written after the outage; reran {reran}")


def rescue_the_silent_workers_claims() -> set[int]:
    """Recover, as another worker would, every claim of the cut-off worker once its
    lease (2 s) has run out; return the ids. Its heartbeats cannot reach the database,
    so each lease runs out and the worker counts as silent."""
    rescued: set[int] = set()

    def all_rescued() -> bool:
        rescued.update(leases.recover_expired(ALIAS, "rescuer"))
        return bool(rescued) and not Job.objects.using(ALIAS).filter(state="running").exists()

    wait_until(all_rescued, timeout=60, message="the cut-off worker's claims to expire")
    return rescued


def test_results_computed_during_an_outage_longer_than_the_lease_are_fenced(
    workers: Workers, tmp_path: Path
) -> None:
    rescued: set[int] = set()
    _ids, ran, spanning, _log = run_through_an_outage(
        workers, tmp_path, tasks.Chaos, lambda: rescued.update(rescue_the_silent_workers_claims())
    )
    # Each claim the worker held was recovered while it was cut off: whatever it
    # computed for them in the meantime arrived with a stale claim. None of it may be
    # written: every rescued job completed by a later run.
    assert rescued, "no claim of the worker was recovered during the outage"
    entries: dict[int, list[tuple[int, str]]] = collections.defaultdict(list)
    for entry in JournalEntry.objects.using(ALIAS).filter(job_id__in=rescued).order_by("id"):
        entries[entry.job_id].append((entry.attempt, entry.outcome))
    for job_id in rescued:
        assert (1, "lease_expired") in entries[job_id], entries[job_id]
        assert (1, "completed") not in entries[job_id], entries[job_id]
        assert 2 in ran[job_id], f"job {job_id} was not run again: {entries[job_id]}"
    # The outage's own runs: handlers that ran attempt 1 of a rescued job and whose
    # result the worker could only send after it. Each was fenced off: discarded.
    computed_in_the_dark = {job_id for job_id in rescued if 1 in ran[job_id]}
    assert computed_in_the_dark, "no result of a rescued claim was computed in the outage"
    discarded = {entry.job_id for entry in spanning if entry.outcome == "discarded"}
    assert discarded == computed_in_the_dark, entries


def test_an_action_without_a_round_trip_does_not_count_as_the_database_coming_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A scheduler pass with no schedules succeeds with the database down: not a recovery."""
    worker = Worker(database=ALIAS, concurrency=1)
    outcomes: list[object] = []

    def in_a_thread(action: Callable[[], object]) -> None:
        """The worker's own threads have their own connections: so does this one."""

        def run() -> None:
            try:
                outcomes.append(worker.health.guarded(action, what="a step"))
            finally:
                connections.close_all()

        thread = threading.Thread(target=run)
        thread.start()
        thread.join(timeout=30)

    with caplog.at_level(logging.INFO, logger="django_venturi"):
        with outage():
            in_a_thread(lambda: Job.objects.using(ALIAS).exists())
            in_a_thread(lambda: "no round trip")
            in_a_thread(lambda: "no round trip")
        lost_during = caplog.text.count("lost the database")
        back_during = caplog.text.count("reconnected after")
        in_a_thread(lambda: "no round trip")
    assert outcomes == [None, "no round trip", "no round trip", "no round trip"]
    assert (lost_during, back_during) == (1, 0), caplog.text
    assert caplog.text.count("reconnected after") == 1, caplog.text


def test_async_handlers_get_a_working_connection_after_the_database_came_back(
    workers: Workers,
) -> None:
    """The ORM calls of `async def` handlers run in `sync_to_async`'s own thread, which no
    request cycle cleans up: its connection, broken by the outage, must not stay broken."""
    worker = workers.start(ALIAS, "--concurrency", "2")
    first = tasks.AsyncTask(n=1).enqueue(using=ALIAS)
    wait_until(lambda: state_of(first.pk) == venturi.State.COMPLETED, timeout=30)
    assert terminate(), "no backend of the worker to terminate"
    second = tasks.AsyncTask(n=2).enqueue(using=ALIAS)
    wait_until(
        lambda: (
            state_of(second.pk) != venturi.State.READY
            and JournalEntry.objects.using(ALIAS).filter(job_id=second.pk).exists()
        ),
        timeout=30,
        message="the second job's first run",
    )
    runs = JournalEntry.objects.using(ALIAS).filter(job_id=second.pk).order_by("id")
    assert [(e.attempt, e.outcome, e.error_message) for e in runs][:1] == [(1, "completed", "")]
    assert worker.poll() is None


def test_a_worker_without_its_database_says_so_again_while_it_lasts(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Once when the database goes, then every STILL_LOST_EVERY seconds (30 s), not at
    every failed try: an operator reading the log of a long outage sees it is still on."""
    monkeypatch.setattr(supervision, "STILL_LOST_EVERY", 0.2)
    health = supervision.DatabaseHealth(worker="w", alias="default")
    outage = psycopg.OperationalError("connection refused")
    with caplog.at_level(logging.ERROR, logger="django_venturi.worker"):
        health.lost(outage)
        health.lost(outage)  # a try soon after: nothing new to say
        time.sleep(0.25)  # past the (shortened) repeat interval
        health.lost(outage)
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 2, messages
    assert "lost the database" in messages[0]
    assert "still without the database after 0 s" in messages[1], messages
    assert health.is_down
