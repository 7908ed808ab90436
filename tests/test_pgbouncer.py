"""Through a real PgBouncer in transaction-pooling mode (Debian's `pgbouncer`).

The test starts its own `pgbouncer` (a temporary ini: pool_mode = transaction,
127.0.0.1 on a free port, trust auth, the test database mapped to the server
of DATABASE_URL) and stops it at the end. Worker subprocesses see
VENTURI_TEST_PGBOUNCER_PORT, so their `default` alias goes through PgBouncer and
their listener straight to PostgreSQL (`LISTEN_DATABASE`, tests/settings.py).
Producers in this process use the alias `pooled`, the same database through
PgBouncer. The pool has fewer server connections than there are clients, so
connections are shared as in production: a session setting or a prepared
statement left on one server connection shows.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import django.db
import psycopg
import pytest
from django.conf import settings
from django.db import connections, transaction
from django.test import override_settings
from django.utils import timezone

import django_venturi as venturi
from django_venturi.checks import check_listen_connection
from django_venturi.models import Job, JournalEntry
from django_venturi.states import LIVE_STATES
from django_venturi.store import statements, verdicts
from django_venturi.store.claim import ClaimedJob, ClaimRequest, claim
from django_venturi.store.completion import write_verdicts
from django_venturi.store.connections import connection_params
from django_venturi.store.scheduling import TierClock
from django_venturi.worker import sweeper
from tests.conftest import Workers, wait_until
from tests.skips import missing_tool
from tests.testapp.control_tasks import Cancellable
from tests.testapp.dedup_tasks import PausingRecompute, Recompute
from tests.testapp.models import Record
from tests.testapp.scheduling_tasks import Capped
from tests.testapp.tasks import Chaos, Flaky, Noop, Pausing

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "pooled"])

POOLED = "pooled"
"""This process's alias for the test database through PgBouncer."""
POOL_SIZE = 4
"""Server connections per pool: fewer than the clients, so clients share them."""
SESSION_DEFAULTS = ("on", "auto")
"""PostgreSQL's defaults of `jit` and `plan_cache_mode`, which venturi tunes for its statements."""
CLEAN = (*SESSION_DEFAULTS, 0)
"""A server connection with PostgreSQL's defaults and no prepared statement."""


@dataclasses.dataclass
class PgBouncer:
    """A running `pgbouncer` process and how to reach it."""

    port: int
    user: str
    process: subprocess.Popen[bytes]
    log: Path

    def url(self, database: str) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def admin(self, command: str) -> list[dict[str, Any]]:
        """Run a command on PgBouncer's admin console (simple query protocol only)."""
        with psycopg.connect(
            self.url("pgbouncer"), autocommit=True, cursor_factory=psycopg.ClientCursor
        ) as connection:
            cursor = connection.execute(command)
            if cursor.description is None:  # a command, not a SHOW
                return []
            names = [column.name for column in cursor.description]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def write_config(directory: Path, port: int, server: dict[str, Any]) -> Path:
    """PgBouncer's ini and auth file, readable by the user it runs as."""
    database, user = server["NAME"], server["USER"]
    target = f"host={server['HOST'] or '127.0.0.1'} port={server['PORT'] or 5432}"
    if server["PASSWORD"]:
        target += f" password={server['PASSWORD']}"
    users = directory / "users.txt"
    users.write_text(f'"{user}" ""\n')
    ini = directory / "pgbouncer.ini"
    ini.write_text(
        "[databases]\n"
        f"{database} = {target} dbname={database} user={user}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = trust\n"
        f"auth_file = {users}\n"
        f"admin_users = {user}\n"
        "pool_mode = transaction\n"
        f"default_pool_size = {POOL_SIZE}\n"
        "max_client_conn = 500\n"
    )
    for path in (directory, users, ini):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return ini


def start_pgbouncer(server: dict[str, Any]) -> PgBouncer:
    """PgBouncer in front of the server and database of `server` (a Django settings dict)."""
    executable = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    if not os.path.exists(executable):
        reason = "pgbouncer is not installed: apt-get install pgbouncer (.ci/run does)"
        missing_tool(reason)  # CI must run these tests
    directory = Path(tempfile.mkdtemp(prefix="venturi-pgbouncer-"))
    port = free_port()
    ini = write_config(directory, port, server)
    # PgBouncer refuses to run as root; -u switches to PostgreSQL's own user.
    as_user = ["-u", "postgres"] if os.geteuid() == 0 else []
    log = directory / "pgbouncer.log"
    with open(log, "wb") as output:
        process = subprocess.Popen(
            [executable, *as_user, str(ini)], stdout=output, stderr=subprocess.STDOUT
        )
    bouncer = PgBouncer(port=port, user=server["USER"], process=process, log=log)

    def answers() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"pgbouncer exited:\n{log.read_text()}")
        try:
            with psycopg.connect(bouncer.url(server["NAME"]), connect_timeout=2) as connection:
                connection.execute("SELECT 1")
        except psycopg.OperationalError:
            return False
        return True

    wait_until(answers, timeout=20, message="pgbouncer to accept connections")
    return bouncer


def stop_pgbouncer(bouncer: PgBouncer) -> None:
    bouncer.process.terminate()
    try:
        bouncer.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        bouncer.process.kill()
        bouncer.process.wait(timeout=10)
    shutil.rmtree(bouncer.log.parent, ignore_errors=True)


@pytest.fixture(scope="module")
def pgbouncer(django_db_setup: None, django_db_blocker: Any) -> Iterator[PgBouncer]:
    """PgBouncer for this module, and this process's alias `pooled` through it."""
    with django_db_blocker.unblock():
        direct = connections["default"].settings_dict
    bouncer = start_pgbouncer(direct)
    # Added before any test starts, so that tests may name it in their databases.
    connections.settings[POOLED] = {**direct, "HOST": "127.0.0.1", "PORT": str(bouncer.port)}
    yield bouncer
    connections[POOLED].close()
    del connections[POOLED]
    del connections.settings[POOLED]
    stop_pgbouncer(bouncer)


@pytest.fixture(autouse=True)
def workers_through_pgbouncer(pgbouncer: PgBouncer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker subprocesses: `default` through PgBouncer, the listener direct."""
    monkeypatch.setenv("VENTURI_TEST_PGBOUNCER_PORT", str(pgbouncer.port))


# ---------------------------------------------------------------- helpers


def live() -> list[Job]:
    return list(Job.objects.filter(state__in=LIVE_STATES))


def outcomes(job_id: int) -> list[str]:
    entries = JournalEntry.objects.filter(job_id=job_id).order_by("id")
    return list(entries.values_list("outcome", flat=True))


def runs_per_job() -> collections.Counter[int]:
    return collections.Counter(Record.objects.values_list("job_id", flat=True))


def no_errors_logged(workers: Workers) -> None:
    for index in range(len(workers.processes)):
        log = workers.log(index)
        assert "Traceback" not in log and "prepared statement" not in log, log


def server_sessions(bouncer: PgBouncer, database: str) -> list[tuple[str, str, int]]:
    """What every server connection of the pool holds, as a client sees it.

    `jit`, `plan_cache_mode` and the number of prepared statements. Each client
    holds a transaction open, so PgBouncer gives each its own server connection
    until all of the pool's are taken: what a statement left on one shows.
    """
    clients = [psycopg.connect(bouncer.url(database)) for _ in range(POOL_SIZE)]
    try:
        rows = [
            client.execute(
                "SELECT current_setting('jit'), current_setting('plan_cache_mode'), "
                "(SELECT count(*) FROM pg_prepared_statements), pg_backend_pid()"
            ).fetchone()
            for client in clients
        ]
    finally:
        for client in clients:
            client.close()
    assert len({row[3] for row in rows if row}) == POOL_SIZE  # every server connection
    return [(row[0], row[1], row[2]) for row in rows if row]


def claim_pooled(kind: str, limit: int = 100) -> list[ClaimedJob]:
    request = ClaimRequest(
        worker="test", limit=limit, kinds=[kind], leases=[timedelta(minutes=5)], queues=None
    )
    return claim(POOLED, request, TierClock((6, 3, 1)))


# ---------------------------------------------------------------- scenarios


SETTINGS_NOW = "SELECT current_setting('jit'), current_setting('plan_cache_mode')"
TUNED = ("off", "force_custom_plan")
"""What statements.WORKER_SESSION sets them to."""


def test_the_worker_settings_hold_for_the_statement_and_end_with_it(pgbouncer: PgBouncer) -> None:
    database = connections["default"].settings_dict["NAME"]
    assert not statements.behind_pooler("default")
    assert statements.behind_pooler(POOLED)
    for _ in range(3):  # the first call of a connection, then the later ones
        tuned = statements.fetch(POOLED, SETTINGS_NOW, [], session=statements.WORKER_SESSION)
        assert tuned == [TUNED]
        with transaction.atomic(using=POOLED):  # the capped claim's and the fold's way
            statements.prime_session(POOLED, statements.WORKER_SESSION)
            statements.fetch(POOLED, "SELECT 1", [])
            tuned = statements.fetch(POOLED, SETTINGS_NOW, [], session=statements.WORKER_SESSION)
            assert tuned == statements.fetch(POOLED, SETTINGS_NOW, []) == [TUNED]
        assert statements.fetch(POOLED, SETTINGS_NOW, []) == [SESSION_DEFAULTS]
    assert server_sessions(pgbouncer, database) == [CLEAN] * POOL_SIZE
    # A direct connection keeps them for its session, as before.
    statements.fetch("default", SETTINGS_NOW, [], session=statements.WORKER_SESSION)
    assert statements.fetch("default", SETTINGS_NOW, []) == [TUNED]


def test_an_error_in_a_statement_behind_the_pooler_is_djangos_and_leaves_it_usable() -> None:
    failing = "SELECT 1 / %s"
    session = statements.WORKER_SESSION
    statements.fetch(POOLED, "SELECT 1", [])
    with pytest.raises(django.db.DataError):  # division by zero, in the settings' pipeline
        statements.fetch(POOLED, failing, [0], session=session)
    assert statements.fetch(POOLED, failing, [1], session=session) == [(1,)]
    with pytest.raises(django.db.DataError), transaction.atomic(using=POOLED):
        statements.fetch(POOLED, failing, [0], session=session)
    assert statements.fetch(POOLED, SETTINGS_NOW, []) == [SESSION_DEFAULTS]
    assert statements.fetch(POOLED, failing, [1], session=session) == [(1,)]


def test_a_drain_of_hundreds_of_jobs(pgbouncer: PgBouncer, workers: Workers) -> None:
    database = connections["default"].settings_dict["NAME"]
    ids = [job.pk for job in venturi.enqueue_many([Noop(n=i) for i in range(400)], using=POOLED)]
    ids += [Noop(n=400 + i).enqueue(using=POOLED).pk for i in range(50)]  # the single insert
    ids += [Capped(seconds=0.01).enqueue(using=POOLED).pk for _ in range(6)]  # the capped claim
    for _ in range(3):
        workers.start("default", "--concurrency", "4")
    wait_until(lambda: not live(), timeout=90, message="the workers to drain")

    assert set(Job.objects.filter(pk__in=ids).values_list("state", flat=True)) == {"completed"}
    runs = runs_per_job()
    assert all(runs[job_id] == 1 for job_id in ids), "a job ran twice"
    assert JournalEntry.objects.filter(job_id__in=ids, outcome="completed").count() == len(ids)
    no_errors_logged(workers)
    # The workers' statements went through PgBouncer ...
    (stats,) = [row for row in pgbouncer.admin("SHOW STATS") if row["database"] == database]
    assert stats["total_xact_count"] > len(ids) // 100
    # ... and left no setting of theirs on the pool's server connections.
    workers.stop_all()
    assert server_sessions(pgbouncer, database) == [CLEAN] * POOL_SIZE


def test_the_listener_connects_directly(pgbouncer: PgBouncer, workers: Workers) -> None:
    """LISTEN never goes through the pooler; a NOTIFY sent through it wakes the worker."""
    database = connections["default"].settings_dict["NAME"]
    workers.start("default", "--concurrency", "2")

    def listeners() -> set[int]:
        with connections["default"].cursor() as cursor:
            cursor.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s AND query LIKE 'LISTEN%%'",
                [database],
            )
            return {row[0] for row in cursor.fetchall()}

    pids = wait_until(listeners, message="the worker to listen")
    through_pooler = {row["remote_pid"] for row in pgbouncer.admin("SHOW SERVERS")}
    assert not pids & through_pooler
    job = Cancellable().enqueue(using=POOLED)
    wait_until(lambda: Record.objects.filter(job_id=job.pk).exists(), message="the job to start")
    assert venturi.cancel(job.pk, using=POOLED) == venturi.CancelResult(cancelled=0, stopping=1)
    wait_until(lambda: Job.objects.get(pk=job.pk).state == venturi.State.CANCELLED, timeout=15)
    assert outcomes(job.pk) == ["cancelled"]
    assert "learnt by notification" in workers.log()


def test_a_killed_workers_jobs_are_recovered_by_another(workers: Workers, tmp_path: Path) -> None:
    path = tmp_path / "runs.txt"
    ids = [Chaos(path=str(path), sleep=30).enqueue(using=POOLED).pk for _ in range(4)]
    ids += [Chaos(path=str(path), sleep=0.01).enqueue(using=POOLED).pk for _ in range(20)]
    first = workers.start("default", "--concurrency", "4")

    def started() -> list[list[int]]:
        lines = path.read_text().splitlines() if path.exists() else []
        return [[int(field) for field in line.split()] for line in lines]

    # The four long runs hold all of the first worker's slots: kill it in the middle.
    wait_until(lambda: len([r for r in started() if r[0] in ids[:4]]) == 4, timeout=30)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    Job.objects.filter(pk__in=ids[:4]).update(payload={"path": str(path), "sleep": 0.01})
    workers.start("default", "--concurrency", "4")
    wait_until(lambda: not live(), timeout=60, message="the second worker to recover and drain")

    assert set(Job.objects.filter(pk__in=ids).values_list("state", flat=True)) == {"completed"}
    per_job = collections.Counter(row[0] for row in started())
    assert {job_id: per_job[job_id] for job_id in ids[:4]} == dict.fromkeys(ids[:4], 2)
    assert all(per_job[job_id] == 1 for job_id in ids[4:])
    assert all(outcomes(job_id) == ["lease_expired", "completed"] for job_id in ids[:4])


def test_a_keyed_enqueue_against_a_running_job_gets_a_follow_up(workers: Workers) -> None:
    first = Recompute(account="a").enqueue(using=POOLED)
    (running,) = claim_pooled("tests.recompute")
    follow_up = Recompute(account="a").enqueue(using=POOLED)  # merge(): running, so enqueue
    assert follow_up.pk != first.pk
    assert Recompute(account="a").enqueue(using=POOLED).pk == follow_up.pk  # merged into it
    assert write_verdicts(POOLED, "test", [verdicts.completed(running)]) == {first.pk}
    workers.start("default", "--concurrency", "2")
    wait_until(lambda: Job.objects.get(pk=follow_up.pk).state == venturi.State.COMPLETED)
    (record,) = Record.objects.filter(job_id=follow_up.pk)
    assert record.value == {"account": "a", "count": 2}


def test_pausing_keyed_jobs_under_producers_lose_no_enqueue(workers: Workers) -> None:
    """Pauses fold follow-ups back (the verdict's transaction) while producers enqueue."""
    PausingRecompute(account="p0", steps=20).enqueue(using=POOLED)
    workers.start("default", "--concurrency", "4")
    wait_until(lambda: Job.objects.filter(attempt__gt=0).exists(), message="a first run")
    errors: list[BaseException] = []

    def produce(n: int) -> None:
        try:
            for _ in range(25):
                PausingRecompute(account=f"p{n % 2}", steps=20).enqueue(using=POOLED)
                time.sleep(0.005)
        except BaseException as error:  # reported below
            errors.append(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    wait_until(lambda: not live(), timeout=90, message="the worker to drain")
    counts = [record.value["count"] for record in Record.objects.all()]
    assert sum(counts) == 1 + 6 * 25
    assert JournalEntry.objects.filter(outcome="paused").exists()
    no_errors_logged(workers)


def test_a_retry_a_pause_with_carry_and_a_cancel(workers: Workers) -> None:
    flaky = Flaky(failures=2).enqueue(using=POOLED)
    pausing = Pausing(steps=4).enqueue(using=POOLED)
    workers.start("default", "--concurrency", "2")
    wait_until(lambda: not live(), timeout=30, message="the worker to finish both")

    assert outcomes(flaky.pk) == ["retry", "retry", "completed"]
    errors = JournalEntry.objects.filter(job_id=flaky.pk, outcome="retry")
    assert list(errors.values_list("error_message", flat=True)) == [
        "flaky failure 1",
        "flaky failure 2",
    ]
    assert outcomes(pausing.pk) == ["paused", "paused", "paused", "completed"]
    seen = Record.objects.filter(job_id=pausing.pk).order_by("id").values_list("value", flat=True)
    assert list(seen) == [0, 1, 2, 3]  # each run saw the carry of the one before
    no_errors_logged(workers)


def test_periodic_ticks_are_enqueued_once(
    workers: Workers, monkeypatch: pytest.MonkeyPatch
) -> None:
    schedule = {"task": "tests.noop", "cron": "* * * * * *", "payload": {"n": 1}}
    monkeypatch.setenv("VENTURI_TEST_PERIODIC", json.dumps([schedule]))
    for _ in range(2):
        workers.start("default", "--concurrency", "2")
    wait_until(
        lambda: Job.objects.filter(state=venturi.State.COMPLETED).count() >= 3,
        timeout=30,
        message="three ticks to run",
    )
    workers.stop_all()
    ticks = list(Job.objects.values_list("periodic_tick", flat=True))
    assert len(set(ticks)) == len(ticks) and None not in ticks
    assert all(count == 1 for count in runs_per_job().values())


def test_a_sweep_through_the_pooler_leaves_its_lock_nowhere(
    pgbouncer: PgBouncer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep's lock must not stay on a server connection that other clients then use."""
    database = connections["default"].settings_dict["NAME"]
    old = timezone.now() - timedelta(days=30)
    Job.objects.create(kind="tests.noop", payload={}, state="completed", attempt=1, finished_at=old)
    delete = sweeper._delete
    others: list[psycopg.Connection[Any]] = []

    def delete_while_another_client_has_our_server(
        alias: str, policy: dict[str, timedelta]
    ) -> dict[str, Any]:
        # PgBouncer hands out the server connection used last: the sweep's, which
        # another client's transaction now holds until the sweep has ended.
        others.append(psycopg.connect(pgbouncer.url(database)))
        others[0].execute("SELECT 1")
        return delete(alias, policy)

    monkeypatch.setattr(sweeper, "_delete", delete_while_another_client_has_our_server)
    try:
        with override_settings(VENTURI={"RETENTION": {"completed": "1d"}}):
            results = sweeper.sweep(POOLED)
    finally:
        for other in others:
            other.commit()
            other.close()
        monkeypatch.setattr(sweeper, "_delete", delete)
    assert results is not None and results["completed"].jobs == 1
    # Another worker can sweep next: the lock is free, through the pooler and directly.
    with override_settings(VENTURI={"RETENTION": {"completed": "1d"}}):
        assert sweeper.sweep(POOLED) is not None
    with psycopg.connect(**connection_params("default"), autocommit=True) as direct:
        taken = direct.execute("SELECT pg_try_advisory_lock(%s)", [sweeper.ADVISORY_LOCK_KEY])
        assert taken.fetchone() == (True,)


def test_a_sweep_whose_lock_cannot_connect_raises_djangos_error(pgbouncer: PgBouncer) -> None:
    """The sweeper thread survives what it catches: Django's errors, not psycopg's."""
    database = connections["default"].settings_dict["NAME"]
    Job.objects.using(POOLED).exists()  # connected before PgBouncer turns new clients away
    pgbouncer.admin(f'DISABLE "{database}"')  # quoted: names may hold "-"
    try:
        with (
            override_settings(VENTURI={"RETENTION": {"completed": "1d"}}),
            pytest.raises(django.db.OperationalError),
        ):
            sweeper.sweep(POOLED)
    finally:
        pgbouncer.admin(f'ENABLE "{database}"')


def test_a_listener_through_the_pooler_is_a_warning_of_the_database_checks() -> None:
    # Jobs through the pooler and no LISTEN_DATABASE: the listener would use it too.
    with override_settings(VENTURI={**settings.VENTURI, "DATABASE": POOLED}):
        (warning,) = check_listen_connection(databases=[POOLED])
        assert warning.id == "venturi.W050" and repr(POOLED) in warning.msg
        assert check_listen_connection(databases=None) == []  # plain `check`: no connection
    direct_listener = {**settings.VENTURI, "DATABASE": POOLED, "LISTEN_DATABASE": "default"}
    with override_settings(VENTURI=direct_listener):
        assert check_listen_connection(databases=[POOLED]) == []
    assert check_listen_connection(databases=["default"]) == []
