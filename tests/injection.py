"""Real database errors at chosen places of a real worker (tests/test_error_injection.py).

PL/pgSQL triggers on venturi's tables recognize each place by what its
statement does, and when the control table arms that place they make the
statement fail, for a given number of times, with an error the database really
raises:

- `data`: `convert_from('\\x00', 'UTF8')`, SQLSTATE 22021 (a NUL, as in a
  handler's text);
- `integrity`: a duplicate key in a table of the injection's own, 23505;
- `deadlock`: a real deadlock with a partner session of the test
  (`DeadlockPartner`), 40P01, found by PostgreSQL's deadlock detector;
- `serialization`: `RAISE ... USING ERRCODE = 'serialization_failure'`,
  40001 (READ COMMITTED, the worker's level, never raises it by itself);
- `lock_timeout`: a wait for an advisory lock the test holds
  (`LockHolder`) under `lock_timeout`, 55P03;
- `statement_timeout`: `pg_sleep` past the `statement_timeout` the worker's
  connections are given (`statement_timeout_url`), 57014;
- `connection`: `pg_terminate_backend(pg_backend_pid())`, 57P01: the worker's
  connection is gone, in the middle of that very statement.

The count of firings is a sequence: `nextval` is not transactional, so the
error that rolls back the statement leaves the count. The listener has no
statement to fail: the test terminates its backend from outside.

Run as `python -m tests.injection <venturi_worker arguments>`, this module runs
the worker command after hooking `sys.excepthook` and `threading.excepthook`,
so that an exception nothing caught leaves an unmistakable line in the log.
"""

from __future__ import annotations

import sys
import threading
import types
from typing import Any

import psycopg

PLACES = ("claim", "heartbeat", "verdict", "recovery", "listener", "sweeper", "scheduler")
ERRORS = (
    "data",
    "integrity",
    "deadlock",
    "serialization",
    "lock_timeout",
    "statement_timeout",
    "connection",
)
NAMES = {
    "data": ('invalid byte sequence for encoding "UTF8": 0x00', "22021", "DataError"),
    "integrity": ("duplicate key value violates unique constraint", "23505", "IntegrityError"),
    "deadlock": ("deadlock detected", "40P01", "DeadlockDetected"),
    "serialization": ("could not serialize access", "40001", "SerializationFailure"),
    "lock_timeout": ("canceling statement due to lock timeout", "55P03", "LockNotAvailable"),
    "statement_timeout": (
        "canceling statement due to statement timeout",
        "57014",
        "QueryCanceled",
    ),
    "connection": (
        "terminating connection due to administrator command",
        "57P01",
        "AdminShutdown",
        # What libpq says of a connection terminated while idle (the listener's).
        "server closed the connection unexpectedly",
    ),
}
"""How a log can name each error: PostgreSQL's message, its SQLSTATE, or its class
(Django's for data and integrity errors, psycopg's for the others)."""


def names(error: str, log: str) -> bool:
    """Whether `log` names the injected `error` (see NAMES)."""
    return any(name in log for name in NAMES[error])


HELD_KEY = 7301
"""The advisory lock `LockHolder` holds: `lock_timeout` firings wait for it."""
DEADLOCK_FIRST = 7302
"""Taken by the worker's statement, then wanted by the `DeadlockPartner`."""
DEADLOCK_SECOND = 7303
"""Held by the `DeadlockPartner`, then wanted by the worker's statement."""
STATEMENT_TIMEOUT_MS = 600
UNCAUGHT = "venturi-injection: uncaught exception"

INSTALL = """
CREATE TABLE venturi_inject_control (
    place text PRIMARY KEY,
    error text NOT NULL,
    times integer NOT NULL
);
CREATE SEQUENCE venturi_inject_reached;
CREATE TABLE venturi_inject_unique (id integer PRIMARY KEY);
INSERT INTO venturi_inject_unique VALUES (1);

CREATE FUNCTION venturi_inject_at(at_place text) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    armed venturi_inject_control%ROWTYPE;
BEGIN
    SELECT * INTO armed FROM venturi_inject_control WHERE place = at_place;
    IF NOT FOUND OR nextval('venturi_inject_reached') > armed.times THEN
        RETURN;
    END IF;
    CASE armed.error
    WHEN 'data' THEN
        PERFORM convert_from('\\x00'::bytea, 'UTF8');
    WHEN 'integrity' THEN
        INSERT INTO venturi_inject_unique VALUES (1);
    WHEN 'deadlock' THEN
        PERFORM pg_advisory_xact_lock({deadlock_first});
        -- Once the partner waits for the lock this statement holds, want the one it
        -- holds: a cycle, which this backend's detector (20 ms, the partner's: 60 s)
        -- breaks by failing this statement.
        FOR i IN 1..400 LOOP
            EXIT WHEN EXISTS (
                SELECT 1 FROM pg_locks
                WHERE locktype = 'advisory' AND objid = {deadlock_first} AND NOT granted
                  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
            );
            PERFORM pg_sleep(0.005);
        END LOOP;
        PERFORM set_config('deadlock_timeout', '20ms', true);
        PERFORM set_config('lock_timeout', '5s', true);
        PERFORM pg_advisory_xact_lock({deadlock_second});
    WHEN 'serialization' THEN
        RAISE EXCEPTION 'could not serialize access due to concurrent update (injected at %)',
            at_place USING ERRCODE = 'serialization_failure';
    WHEN 'lock_timeout' THEN
        PERFORM set_config('lock_timeout', '100ms', true);
        PERFORM pg_advisory_xact_lock({held_key});
    WHEN 'statement_timeout' THEN
        IF current_setting('statement_timeout') IN ('0', '') THEN
            RAISE EXCEPTION 'venturi-injection: no statement_timeout on this connection';
        END IF;
        PERFORM pg_sleep(30);
    WHEN 'connection' THEN
        PERFORM pg_terminate_backend(pg_backend_pid());
        PERFORM pg_sleep(30);
    END CASE;
    RAISE EXCEPTION 'venturi-injection: % at % did not fail', armed.error, at_place;
END $$;

-- The places of venturi_job's statements.
CREATE FUNCTION venturi_inject_job() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM venturi_inject_at('sweeper');  -- only retention deletes jobs
        RETURN OLD;
    END IF;
    IF TG_OP = 'INSERT' THEN
        IF NEW.periodic_tick IS NOT NULL THEN
            PERFORM venturi_inject_at('scheduler');
        END IF;
    ELSIF OLD.state = 'ready' AND NEW.state = 'running' THEN
        PERFORM venturi_inject_at('claim');
    ELSIF OLD.state = 'running' AND NEW.state = 'running'
          AND NEW.claim_token IS NOT DISTINCT FROM OLD.claim_token
          AND NEW.lease_expires_at IS DISTINCT FROM OLD.lease_expires_at THEN
        PERFORM venturi_inject_at('heartbeat');
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER venturi_inject_job BEFORE INSERT OR UPDATE OR DELETE ON {job}
    FOR EACH ROW EXECUTE FUNCTION venturi_inject_job();

-- The journal entry is written by the same statement as the job's new state: a
-- recovered lease's entry says `lease_expired`, any other is a worker's verdict.
CREATE FUNCTION venturi_inject_journal() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.outcome = 'lease_expired' THEN
        PERFORM venturi_inject_at('recovery');
    ELSE
        PERFORM venturi_inject_at('verdict');
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER venturi_inject_journal BEFORE INSERT ON {journal}
    FOR EACH ROW EXECUTE FUNCTION venturi_inject_journal();
"""

UNINSTALL = """
DROP TRIGGER IF EXISTS venturi_inject_job ON {job};
DROP TRIGGER IF EXISTS venturi_inject_journal ON {journal};
DROP FUNCTION IF EXISTS venturi_inject_job();
DROP FUNCTION IF EXISTS venturi_inject_journal();
DROP FUNCTION IF EXISTS venturi_inject_at(text);
DROP TABLE IF EXISTS venturi_inject_control;
DROP TABLE IF EXISTS venturi_inject_unique;
DROP SEQUENCE IF EXISTS venturi_inject_reached;
"""


def session(params: dict[str, Any]) -> psycopg.Connection[Any]:
    """An autocommit connection of the test's own, never subject to a timeout."""
    connection = psycopg.connect(**params, autocommit=True)
    connection.execute("SET statement_timeout = 0")
    connection.execute("SET lock_timeout = 0")
    return connection


class Injection:
    """The triggers and their control table in one database, for the life of a test."""

    def __init__(self, params: dict[str, Any]) -> None:
        from django_venturi.models import Job, JournalEntry

        names = {"job": Job._meta.db_table, "journal": JournalEntry._meta.db_table}
        self.uninstall = UNINSTALL.format(**names)
        install = INSTALL.format(
            **names,
            held_key=HELD_KEY,
            deadlock_first=DEADLOCK_FIRST,
            deadlock_second=DEADLOCK_SECOND,
        )
        self.connection = session(params)
        try:
            self.connection.execute(self.uninstall)
            self.connection.execute(install)
        except BaseException:
            self.connection.close()
            raise

    def arm(self, place: str, error: str, times: int) -> None:
        """Fail the next `times` statements at `place` with `error` (and restart the count)."""
        self.connection.execute("DELETE FROM venturi_inject_control")
        self.connection.execute("ALTER SEQUENCE venturi_inject_reached RESTART")
        self.connection.execute(
            "INSERT INTO venturi_inject_control VALUES (%s, %s, %s)", [place, error, times]
        )

    def disarm(self) -> None:
        self.connection.execute("DELETE FROM venturi_inject_control")

    def reached(self) -> int:
        """How many times an armed place was reached (it failed the first `times`)."""
        row = self.connection.execute(
            "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM venturi_inject_reached"
        ).fetchone()
        return int(row[0]) if row else 0

    def close(self) -> None:
        try:
            self.connection.execute(self.uninstall)
        finally:
            self.connection.close()


class LockHolder:
    """Holds the advisory lock that `lock_timeout` firings wait for."""

    def __init__(self, params: dict[str, Any]) -> None:
        self.connection = session(params)
        self.connection.execute("SELECT pg_advisory_lock(%s)", [HELD_KEY])

    def close(self) -> None:
        self.connection.close()


class DeadlockPartner:
    """The other side of each injected deadlock: a session of the test, in a thread.

    It holds DEADLOCK_SECOND. Whenever a statement takes DEADLOCK_FIRST, it asks
    for that lock too and waits; the statement then asks for DEADLOCK_SECOND, and
    PostgreSQL's deadlock detector fails the statement (whose backend checks after
    20 ms, this one after 60 s). The partner then gets DEADLOCK_FIRST, lets it go,
    and waits for the next firing.
    """

    POLL = 0.01

    def __init__(self, params: dict[str, Any]) -> None:
        self.connection = session(params)
        self.connection.execute("SET deadlock_timeout = '60s'")
        self.connection.execute("SELECT pg_advisory_lock(%s)", [DEADLOCK_SECOND])
        self.cycles = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="deadlock-partner", daemon=True)
        self._thread.start()

    def _first_is_taken(self) -> bool:
        row = self.connection.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND objid = %s "
            "AND granted AND database = (SELECT oid FROM pg_database "
            "WHERE datname = current_database()))",
            [DEADLOCK_FIRST],
        ).fetchone()
        return bool(row and row[0])

    def _run(self) -> None:
        while not self._stop.wait(self.POLL):
            if self._first_is_taken():
                self.connection.execute("SELECT pg_advisory_lock(%s)", [DEADLOCK_FIRST])
                self.connection.execute("SELECT pg_advisory_unlock(%s)", [DEADLOCK_FIRST])
                self.cycles += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.connection.close()


def statement_timeout_url(url: str) -> str:
    """`url` with a `statement_timeout` for every connection made with it."""
    separator = "&" if "?" in url else "?"
    return f"{url}{separator}options=-c%20statement_timeout%3D{STATEMENT_TIMEOUT_MS}"


def _report_thread(args: threading.ExceptHookArgs) -> None:
    name = args.thread.name if args.thread is not None else "?"
    sys.stderr.write(f"{UNCAUGHT} in thread {name}: {args.exc_type.__name__}: {args.exc_value}\n")
    threading.__excepthook__(args)


def _report_main(
    kind: type[BaseException], value: BaseException, traceback: types.TracebackType | None
) -> None:
    sys.stderr.write(f"{UNCAUGHT} in the main thread: {kind.__name__}: {value}\n")
    sys.__excepthook__(kind, value, traceback)


def main(argv: list[str]) -> None:
    """`manage.py venturi_worker argv...`, with uncaught exceptions marked in the log."""
    threading.excepthook = _report_thread
    sys.excepthook = _report_main
    from django.core.management import execute_from_command_line

    execute_from_command_line(["django", "venturi_worker", *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
