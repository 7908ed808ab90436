"""A frozen or dead worker holds up no other worker's claims.

Claims of capped and rate-limited kinds count each other's jobs behind the caps lock
(`store/claim.py`). Here a real worker is frozen (SIGSTOP), or killed while the server
keeps its connections (a lost host), *while it holds that lock*: a trigger makes its
claim statement sleep, the test sees in pg_locks that the worker's backend holds the
lock, and freezes or kills the worker then. Two other workers meanwhile complete plain
jobs at once (unlimited kinds never wait for the lock). The lock's statement and the
claim went in one pipeline with its Sync: the holder's transaction needs nothing more
from its worker, commits as soon as its statement ends and frees the lock, and the
capped and rate-limited jobs complete then. The frozen worker runs what it claimed
when it thaws; the lost worker's claim is recovered when its lease runs out. Caps and
rate limits hold throughout, and every job runs once.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connection, connections
from django.utils import timezone

import django_venturi as venturi
from django_venturi.models import Job, WorkerProcess
from django_venturi.registry import registry
from django_venturi.store.claim import (
    CAPS_LOCK_HOLD,
    CAPS_LOCK_KEY,
    ClaimRequest,
    KindLimit,
    claim,
)
from django_venturi.store.connections import connection_params
from django_venturi.store.rate_limits import RateRule
from django_venturi.store.scheduling import TierClock
from tests.conftest import Workers, wait_until
from tests.test_rate_limits import assert_at_most_per_window, handler_starts
from tests.test_scheduling import intervals, overlap
from tests.testapp.flow_tasks import Rated
from tests.testapp.models import Record
from tests.testapp.scheduling_tasks import Capped
from tests.testapp.tasks import Noop

pytestmark = pytest.mark.django_db(transaction=True, databases=["default"])

RATED = registry.get("tests.rated").rate_limit
assert RATED is not None

TRAP_SLEEP = 1.0
"""How long the trapped claim statement runs, the caps lock held, before it returns."""
HOLD = CAPS_LOCK_HOLD.total_seconds()
SLACK = 3.0
"""Time for the other workers to claim and run the limited jobs once the lock is free."""


# ---------------------------------------------------------------- the claim beside a holder


def capped_request(worker: str = "w1") -> ClaimRequest:
    kinds = ["tests.noop", "tests.capped", "tests.rated"]
    return ClaimRequest(
        worker=worker,
        limit=50,
        kinds=kinds,
        leases=[timedelta(minutes=5)] * len(kinds),
        queues=None,
        limits=[KindLimit("tests.capped", global_cap=2, local_room=None)],
        rates=[RateRule("tests.rated", RATED)],
    )


@contextlib.contextmanager
def caps_lock_held_elsewhere() -> Iterator[None]:
    other = psycopg.connect(**connection_params("default"))
    try:
        other.execute("SELECT pg_advisory_xact_lock(%s)", [CAPS_LOCK_KEY])
        yield
    finally:
        other.rollback()
        other.close()


def limited_jobs_done_once_the_statement_ends(
    holder: int, others: dict[str, list[Job]]
) -> list[Job]:
    """The holder's statement ends; its transaction commits without its worker (the
    pipeline's Sync came with the statement) and frees the lock: the backend is idle,
    not idle in transaction, and the capped and rate-limited jobs complete. Returns them."""
    wait_until(lambda: caps_lock_holder() != holder, timeout=TRAP_SLEEP + SLACK, message="the lock")
    # Committed, waiting for nothing (not idle in transaction, waiting for its worker).
    wait_until(lambda: backend_state(holder) == "idle", timeout=SLACK, message="the commit")
    limited = others["capped"] + others["rated"]
    wait_until(lambda: completed(limited), timeout=SLACK + HOLD, message="limited jobs")
    return limited


def test_a_claim_beside_the_caps_lock_holder_takes_other_kinds_at_once() -> None:
    venturi.enqueue_many([Noop(n=i) for i in range(3)])
    venturi.enqueue_many([Capped() for _ in range(3)])
    venturi.enqueue_many([Rated(n=i) for i in range(3)])
    clock = TierClock((6, 3, 1))
    with caps_lock_held_elsewhere():
        # Tried, not waited for: the lock's other session keeps it until the block ends,
        # and a claim that waited would not come back with the other kinds and a try later.
        beside = claim("default", capped_request(), clock)
        assert sorted(job.kind for job in beside) == ["tests.noop"] * 3
        assert beside.counted_later  # the capped and rated kinds: left for the next try
    after = claim("default", capped_request(), clock)
    assert sorted(job.kind for job in after) == ["tests.capped"] * 2 + ["tests.rated"] * 3
    assert not after.counted_later


def test_the_bounds_last_for_the_claims_transaction_only() -> None:
    Capped().enqueue()
    assert len(claim("default", capped_request(), TierClock((6, 3, 1)))) == 1
    with connection.cursor() as cursor:
        for name in ("idle_in_transaction_session_timeout", "lock_timeout", "tcp_user_timeout"):
            cursor.execute(f"SHOW {name}")
            assert cursor.fetchone() == ("0",), name


def test_racing_claims_never_pass_a_global_cap() -> None:
    """Eight claimers race for 1 s on a kind capped at 2 whose jobs never finish: the
    claims that find the lock taken leave the kind alone, the others count exactly."""
    venturi.enqueue_many([Capped() for _ in range(40)])
    taken: list[int] = []
    lock = threading.Lock()
    deadline = time.monotonic() + 1.0

    def claimer(index: int) -> None:
        try:
            clock = TierClock((6, 3, 1))
            while time.monotonic() < deadline:
                jobs = claim("default", capped_request(f"w{index}"), clock)
                with lock:
                    taken.extend(job.id for job in jobs)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(taken) == 2
    assert Job.objects.filter(state=venturi.State.RUNNING).count() == 2


# ---------------------------------------------------------------- the trap


@contextlib.contextmanager
def trapped_claim(job: Job) -> Iterator[None]:
    """The first claim of `job` that holds the caps lock sleeps `TRAP_SLEEP` seconds
    inside its claim statement (every claim of the test suite's workers tries to take
    the lock: some registered kinds are capped or rate-limited); later claims of it do
    not. A claim that found the lock taken by another worker's claim leaves the job
    alone (the row is not updated), so that a later one springs the trap."""
    holds_caps_lock = (
        "EXISTS (SELECT FROM pg_locks WHERE pid = pg_backend_pid() AND granted "
        "AND locktype = 'advisory' AND objsubid = 1 "
        f"AND classid::bigint = {CAPS_LOCK_KEY >> 32} "
        f"AND objid::bigint = {CAPS_LOCK_KEY & 0xFFFFFFFF})"
    )
    with sleep_trap(f"OLD.id = {int(job.pk)} AND NEW.state = 'running'", only_if=holds_caps_lock):
        yield


@contextlib.contextmanager
def sleep_trap(when: str, *, only_if: str = "TRUE") -> Iterator[None]:
    """The first update of a job row that matches `when` (a trigger's WHEN condition on
    OLD and NEW) in a statement for which `only_if` holds sleeps `TRAP_SLEEP` seconds
    inside that statement; later updates do not. Until then, an update for which
    `only_if` does not hold is skipped (the row stays as it was)."""
    table = connection.ops.quote_name(Job._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute("CREATE SEQUENCE venturi_test_trap_seq")
        cursor.execute(
            "CREATE FUNCTION venturi_test_trap() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN "
            f"IF NOT (SELECT is_called FROM venturi_test_trap_seq) AND NOT {only_if} "
            "THEN RETURN NULL; END IF; "
            f"IF nextval('venturi_test_trap_seq') = 1 THEN PERFORM pg_sleep({TRAP_SLEEP}); "
            "END IF; RETURN NEW; END $$"
        )
        cursor.execute(
            f"CREATE TRIGGER venturi_test_trap BEFORE UPDATE ON {table} FOR EACH ROW "
            f"WHEN ({when}) EXECUTE FUNCTION venturi_test_trap()"
        )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TRIGGER IF EXISTS venturi_test_trap ON {table}")
            cursor.execute("DROP FUNCTION IF EXISTS venturi_test_trap()")
            cursor.execute("DROP SEQUENCE IF EXISTS venturi_test_trap_seq")


def one(sql: str, params: list[Any] | None = None) -> Any:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        row = cursor.fetchone()
    return None if row is None else row[0]


def caps_lock_holder() -> int | None:
    """The backend that holds the caps lock of the test database, if one does."""
    return one(  # type: ignore[no-any-return]
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 "
        "AND classid::bigint = %s AND objid::bigint = %s "
        "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        [CAPS_LOCK_KEY >> 32, CAPS_LOCK_KEY & 0xFFFFFFFF],
    )


def sleeping_claim() -> int | None:
    """The backend whose claim statement sleeps in the trap, if one does."""
    return one(  # type: ignore[no-any-return]
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event = 'PgSleep'"
    )


def backend_state(pid: int) -> str | None:
    """The state of backend `pid` (None once it has ended)."""
    return one("SELECT state FROM pg_stat_activity WHERE pid = %s", [pid])  # type: ignore[no-any-return]


def trapped_holder(trap: Job) -> int:
    """Wait until the trapped claim sleeps holding the caps lock; its backend's pid."""
    pid = wait_until(sleeping_claim, timeout=60, message="the trapped claim to sleep")
    assert caps_lock_holder() == pid, "the trapped claim holds the caps lock"
    assert Job.objects.get(pk=trap.pk).state == venturi.State.READY  # not committed
    return int(pid)


# ---------------------------------------------------------------- the jobs beside


def enqueue_the_others() -> dict[str, list[Job]]:
    return {
        "plain": venturi.enqueue_many([Noop(n=i) for i in range(20)]),
        "capped": venturi.enqueue_many([Capped(seconds=0.1) for _ in range(6)]),
        "rated": venturi.enqueue_many([Rated(n=i) for i in range(12)]),
    }


def completed(jobs: list[Job]) -> bool:
    done = Job.objects.filter(pk__in=[job.pk for job in jobs], state=venturi.State.COMPLETED)
    return done.count() == len(jobs)


def assert_limits_held_and_each_ran_once(every: list[Job], recovered: Sequence[Job] = ()) -> None:
    """Caps and rate limits held, each job ran once, and only the `recovered` ones (their
    first claim lost with its worker) were claimed twice."""
    assert overlap(intervals("default", "capped")) <= 2  # Capped: concurrency=2
    assert_at_most_per_window(handler_starts("rated"), 5, 0.4)  # Rated: 5 per 400 ms
    assert not Job.objects.exclude(state=venturi.State.COMPLETED).exists()
    runs = sorted(Record.objects.values_list("job_id", flat=True))
    assert runs == sorted(job.pk for job in every), "each job ran once"
    again = {job.pk for job in recovered}
    attempts = dict(Job.objects.values_list("pk", "attempt"))
    assert {pk: attempt for pk, attempt in attempts.items() if attempt != 1} == dict.fromkeys(
        again, 2
    )


def start_the_others(workers: Workers) -> None:
    for _ in range(2):
        workers.start("default", "--concurrency", "4", "--queues", "default")
    probe = Noop(n=-2).enqueue()
    wait_until(
        lambda: Job.objects.filter(pk=probe.pk, state=venturi.State.COMPLETED).exists(),
        timeout=60,
        message="the other workers to be up",
    )
    Record.objects.filter(job_id=probe.pk).delete()
    Job.objects.filter(pk=probe.pk).delete()


# ---------------------------------------------------------------- a frozen worker


def test_a_worker_frozen_holding_the_caps_lock_holds_up_no_other_claim(
    workers: Workers,
) -> None:
    start_the_others(workers)
    trap = Noop(n=-1).enqueue(queue="trap")
    with trapped_claim(trap):
        frozen = workers.start("default", "--queues", "trap")
        holder = trapped_holder(trap)
        frozen.send_signal(signal.SIGSTOP)
        try:
            others = enqueue_the_others()
            # Plain jobs do not wait for the lock: all done while the frozen worker holds it.
            wait_until(lambda: completed(others["plain"]), timeout=10, message="plain jobs")
            limited = limited_jobs_done_once_the_statement_ends(holder, others)
            # Its claim committed while it was frozen: the trapped job is its own to run.
            assert Job.objects.get(pk=trap.pk).state == venturi.State.RUNNING
            assert frozen.poll() is None
        finally:
            frozen.send_signal(signal.SIGCONT)
        wait_until(lambda: completed([trap]), timeout=30, message="the trapped job")
    assert frozen.poll() is None
    assert_limits_held_and_each_ran_once([trap, *others["plain"], *limited])


# ---------------------------------------------------------------- a lost host


class KeepingProxy:
    """A TCP proxy to the test database's server. A client that goes away is not
    passed on: the server keeps its connection, as when a host is lost without a word."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self.listener.accept()
                server = socket.create_connection(self.target)
                self.sockets += [client, server]
                threading.Thread(target=self._pump, args=(client, server), daemon=True).start()
                threading.Thread(target=self._pump, args=(server, client), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        # Either side's end, or an error, stops this direction; no socket is closed
        # (the server's stays open for as long as the proxy runs).
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)

    def close(self) -> None:
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.close()


@pytest.fixture
def proxy() -> Iterator[KeepingProxy]:
    database = settings.DATABASES["default"]
    keeping = KeepingProxy(database["HOST"] or "127.0.0.1", int(database["PORT"] or 5432))
    yield keeping
    keeping.close()


def test_a_worker_lost_holding_the_caps_lock_holds_up_no_other_claim(
    workers: Workers, proxy: KeepingProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    start_the_others(workers)
    trap = Noop(n=-1).enqueue(queue="trap")
    with trapped_claim(trap):
        monkeypatch.setenv("VENTURI_TEST_PROXY_PORT", str(proxy.port))
        lost = workers.start("default", "--queues", "trap")
        monkeypatch.delenv("VENTURI_TEST_PROXY_PORT")
        holder = trapped_holder(trap)
        lost.kill()
        lost.wait(10)
        others = enqueue_the_others()
        wait_until(lambda: completed(others["plain"]), timeout=10, message="plain jobs")
        # The server never learns that the worker is gone, and needs not: the claim's
        # transaction commits when its statement ends, and frees the lock.
        limited = limited_jobs_done_once_the_statement_ends(holder, others)
        # The lost claim holds its job until the lease runs out (made to, here: the
        # worker's last heartbeat and the lease in the past); then a worker runs it.
        claimed = Job.objects.get(pk=trap.pk)
        assert claimed.state == venturi.State.RUNNING
        an_hour_ago = timezone.now() - timedelta(hours=1)
        Job.objects.filter(pk=trap.pk).update(lease_expires_at=an_hour_ago)
        WorkerProcess.objects.filter(name=claimed.claimed_by).update(
            heartbeat_at=an_hour_ago - timedelta(hours=1)
        )
        workers.start("default", "--queues", "trap")
        wait_until(lambda: completed([trap]), timeout=30, message="the trapped job")
    assert_limits_held_and_each_ran_once([trap, *others["plain"], *limited], recovered=[trap])
    # The proxy keeps the lost worker's connection open, as a silent host's would stay
    # until TCP keepalives end it: ended here, so that the test database can go.
    one("SELECT pg_terminate_backend(%s)", [holder])
    wait_until(lambda: backend_state(holder) is None, timeout=10, message="the lost session")
