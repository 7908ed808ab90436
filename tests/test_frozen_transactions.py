"""A worker frozen inside one of its own transactions holds its locks for seconds, not
for as long as the freeze lasts.

The worker's loops set `idle_in_transaction_session_timeout` on their connections
(`statements.OWN_TRANSACTIONS_BOUNDED`). Here a real worker writes a retry verdict,
which runs in a transaction of its own; a trigger makes the statement sleep, the test
freezes the worker (SIGSTOP) while it sleeps, and then asks for the job's row lock
from another session. The server ends the frozen worker's session within the bound
(while the worker is still frozen), the lock comes free, and once the worker thaws it
finds its verdict unanswered, sees in the journal that it was not applied, and writes
it again: the job is retried and completes, each attempt journalled once.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable

import psycopg
import pytest
from django.db import connection, connections

import django_venturi as venturi
from django_venturi.models import Job, JournalEntry
from django_venturi.store.connections import connection_params
from django_venturi.store.statements import OWN_TRANSACTIONS_BOUNDED
from django_venturi.worker import Worker
from tests.conftest import Workers, wait_until
from tests.test_frozen_claimer import backend_state, one, sleep_trap
from tests.testapp.models import Record
from tests.testapp.tasks import Flaky

pytestmark = pytest.mark.django_db(transaction=True, databases=["default"])

BOUND = float(OWN_TRANSACTIONS_BOUNDED[1].removesuffix("s"))
LOCK_WAIT = 30
"""How long the test's own session waits for the row (its lock_timeout): unbounded, the
frozen worker would keep the lock until the test thaws it, past this. Generous beside
the bound, for the server's own timer and a loaded machine."""


def trapped_retry(job: Job) -> contextlib.AbstractContextManager[None]:
    """The first verdict that sends `job` back to `ready` sleeps `TRAP_SLEEP` seconds
    inside its statement (a retry verdict runs in a transaction of its own)."""
    return sleep_trap(f"OLD.id = {int(job.pk)} AND OLD.state = 'running' AND NEW.state = 'ready'")


def sleeping_verdict() -> int | None:
    """The backend whose verdict sleeps in the trap, inside a transaction, if one does."""
    return one(  # type: ignore[no-any-return]
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event = 'PgSleep' AND xact_start < query_start"
    )


def seconds_to_lock_row(job: Job) -> float:
    """Take `job`'s row lock from a session of our own; how long it took (at most 30 s)."""
    with psycopg.connect(**connection_params("default")) as other:
        other.execute(f"SET lock_timeout = '{LOCK_WAIT}s'")
        began = time.monotonic()
        table = connection.ops.quote_name(Job._meta.db_table)
        other.execute(f"SELECT id FROM {table} WHERE id = %s FOR UPDATE", [job.pk])
        took = time.monotonic() - began
        other.rollback()
    return took


def test_a_worker_frozen_in_its_verdict_transaction_holds_the_row_only_until_the_bound(
    workers: Workers,
) -> None:
    job = Flaky(failures=1).enqueue(queue="trap")
    with trapped_retry(job):
        frozen = workers.start("default", "--queues", "trap")
        holder = int(wait_until(sleeping_verdict, timeout=60, message="the verdict to sleep"))
        frozen.send_signal(signal.SIGSTOP)
        try:
            wait_until(
                lambda: backend_state(holder) == "idle in transaction",
                timeout=10,
                message="the verdict statement to end",
            )
            # Raises LockNotAvailable at LOCK_WAIT if the frozen session kept the row.
            waited = seconds_to_lock_row(job)
            print(f"the row was free after {waited:.1f} s (the bound: {BOUND} s)")
            assert backend_state(holder) is None  # the server ended the frozen session
            assert frozen.poll() is None  # still frozen: the server did it alone
            # Rolled back: the retry verdict is not in the job's row.
            assert Job.objects.get(pk=job.pk).state == venturi.State.RUNNING
        finally:
            frozen.send_signal(signal.SIGCONT)
        # Thawed, the worker finds its session ended, checks the journal and writes the
        # verdict again; the retry runs and completes.
        wait_until(
            lambda: Job.objects.filter(pk=job.pk, state=venturi.State.COMPLETED).exists(),
            timeout=30,
            message="the job to complete",
        )
    outcomes = list(
        JournalEntry.objects.filter(job_id=job.pk)
        .order_by("attempt")
        .values_list("attempt", "outcome")
    )
    assert outcomes == [(1, "retry"), (2, "completed")], outcomes
    assert Record.objects.filter(job_id=job.pk).count() == 2
    assert frozen.poll() is None
    assert "writing results failed" in workers.log(0)  # it met its ended session


def test_a_loop_step_bounds_the_connection_it_opens_and_opens_none_for_it() -> None:
    """The bound is on the connections of the worker's loop steps (`guarded`), set as a
    step connects, so a step that never reaches the database does not connect for it (a
    step with the database down must not fail for the bound alone). A connection the
    same worker's other threads open outside a step (a handler's) keeps the server's
    setting: the project's transactions are the project's."""
    worker = Worker(database="default", concurrency=1)
    seen: dict[str, object] = {}

    def idle_bound() -> str:
        with connections["default"].cursor() as cursor:
            cursor.execute("SHOW idle_in_transaction_session_timeout")
            return str(cursor.fetchone()[0])

    def in_a_thread(name: str, action: Callable[[], object]) -> None:
        def run() -> None:
            try:
                seen[name] = action()
            finally:
                connections.close_all()

        thread = threading.Thread(target=run)
        thread.start()
        thread.join(timeout=30)

    def step_without_a_round_trip() -> object:
        return worker.health.guarded(
            lambda: connections["default"].connection is None, what="a step"
        )

    in_a_thread("no round trip", step_without_a_round_trip)
    in_a_thread("a step", lambda: worker.health.guarded(idle_bound, what="a step"))
    in_a_thread("a handler", idle_bound)
    assert seen == {"no round trip": True, "a step": OWN_TRANSACTIONS_BOUNDED[1], "a handler": "0"}
