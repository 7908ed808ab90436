"""How the worker's services survive errors, and how the supervisor learns of a dead one.

Every loop of a worker (claiming, writing results, heartbeating) runs each of
its steps through `DatabaseHealth.guarded`: whatever a step raises, the loop
goes on. A database that went away is said once ("lost the database") and
once more when it is back; any other error (a deadlock, a lock or statement
timeout, a refused row, a bug) is logged with its traceback, and the step is
tried again after a short, growing delay.

A service whose thread ends anyway (an error outside its steps, which is a
bug) is a `Service` that reports it: the supervisor (the worker's main loop)
then stops claiming, releases what the worker holds and exits non-zero.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from django import db

from django_venturi.store import statements
from django_venturi.store.connections import (
    DATABASE_ERRORS,
    close_broken_connections,
    reachable,
    refuses_writes,
)
from django_venturi.worker import systemd

logger = logging.getLogger("django_venturi.worker")

T = TypeVar("T")

RECONNECT_DELAYS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0)
"""Waits between tries while the database is away, growing with the outage."""
STILL_LOST_EVERY = 30.0
"""While the database is away, the worker says so again this often."""
ERROR_DELAYS = (0.05, 0.2, 0.5, 1.0, 2.0)
"""Waits between tries of a step that keeps failing with the database up."""


@dataclasses.dataclass
class Streak:
    """How many times in a row a loop's step has failed (it paces the retries)."""

    count: int = 0


class DatabaseHealth:
    """Whether the worker reaches its database, shared by all of its threads."""

    def __init__(self, *, worker: str, alias: str) -> None:
        self.worker = worker
        self.alias = alias
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._said_at = 0.0
        """When the worker last said it is without the database."""
        self.on_database_error: Callable[[], None] = lambda: None
        """Called at every error that may have broken a connection (any thread's)."""
        self.on_back: Callable[[], None] = lambda: None
        """Called once the database is back after it was lost (or took no writes)."""

    @property
    def is_down(self) -> bool:
        with self._lock:
            return self._down_since is not None

    def guarded(
        self, action: Callable[[], T], *, what: str, streak: Streak | None = None
    ) -> T | None:
        """Run a step of a loop, its transactions bounded (`statements.own_transactions_bounded`);
        on any error log it, mend this thread's connections and return None. `streak` counts
        the loop's failures in a row (pass one to pace retries)."""
        streak = streak or Streak()
        try:
            with statements.own_transactions_bounded(self.alias):
                result = action()
        except Exception as error:
            streak.count += 1
            self.failed(error, what=what, repeated=streak.count > 1)
            return None
        streak.count = 0
        self.back()
        return result

    def failed(self, error: Exception, *, what: str, repeated: bool = False) -> None:
        """A step failed: a lost database, or an error the database (or a bug) raised.

        A server refusing writes (read-only after a failover, shutting down) is a
        database that is not there yet: the thread's connection is closed, so that its
        next try reconnects and follows the failover, and the worker waits as for a
        lost one until a connection may write again."""
        if refuses_writes(error):
            self.on_database_error()
            self._drop_connection()
            self.lost(error)
            return
        if isinstance(error, DATABASE_ERRORS):
            self.on_database_error()
            if not self._reaches_database():
                self.lost(error)
                return
        db.close_old_connections()
        level = logging.WARNING if isinstance(error, DATABASE_ERRORS) else logging.ERROR
        logger.log(
            level,
            "worker %s: %s failed (%s: %s); %s",
            self.worker,
            what,
            type(error).__name__,
            error,
            "still failing, trying again" if repeated else "trying again",
            exc_info=error if not repeated else None,
            extra={"worker": self.worker},
        )

    def _drop_connection(self) -> None:
        """Close this thread's connection to the alias, outside any transaction."""
        connection = db.connections[self.alias]
        if not connection.in_atomic_block:
            with contextlib.suppress(db.DatabaseError):
                connection.close()

    def _reaches_database(self) -> bool:
        """After a database error: is it the statement, or is the database gone?"""
        if self.is_down:
            return False
        return reachable(self.alias)

    def lost(self, error: Exception) -> None:
        """The database is away (or takes no writes): say so at once, and again every
        STILL_LOST_EVERY seconds while it lasts; systemd's status says so too."""
        db.close_old_connections()
        close_broken_connections()
        now = time.monotonic()
        with self._lock:
            first = self._down_since is None
            if first:
                self._down_since = self._said_at = now
            down_for = now - (self._down_since or now)
            again = not first and now - self._said_at >= STILL_LOST_EVERY
            if again:
                self._said_at = now
        if first:
            logger.error(
                "worker %s lost the database (%s); retrying until it is back",
                self.worker,
                error,
                extra={"worker": self.worker},
            )
            systemd.status(f"lost the database: {error}")
        elif again:
            logger.error(
                "worker %s still without the database after %.0f s (%s); retrying",
                self.worker,
                down_for,
                error,
                extra={"worker": self.worker},
            )

    def back(self) -> None:
        """After a step succeeded: if the database was lost, is it back? Say so once.

        A step may succeed without a round trip (a scheduler pass with no
        schedules, a claim with every kind at its cap), so while the database is
        down, success alone proves nothing: this thread's connection must work.
        """
        with self._lock:
            if self._down_since is None:
                return
        if not reachable(self.alias):
            return
        with self._lock:
            since, self._down_since = self._down_since, None
        if since is not None:
            self.on_back()
            systemd.status("working")
            logger.warning(
                "worker %s reconnected after %.1f s",
                self.worker,
                time.monotonic() - since,
                extra={"worker": self.worker},
            )

    def delay(self, failures: int) -> float:
        """How long to wait before trying a failed step again."""
        with self._lock:
            since = self._down_since
        if since is None:
            return ERROR_DELAYS[min(max(failures, 1), len(ERROR_DELAYS)) - 1]
        down_for = time.monotonic() - since
        for delay in RECONNECT_DELAYS:
            if down_for < delay * 4:
                return delay
        return RECONNECT_DELAYS[-1]


class Service:
    """One loop of the worker in a thread of its own; the supervisor sees if it dies."""

    name = "service"

    def __init__(self) -> None:
        self.failure: BaseException | None = None
        self.on_death: Callable[[], None] = lambda: None
        """Called if the loop ends on an error (the supervisor's wake-up)."""
        self._thread = threading.Thread(target=self._main, name=f"venturi-{self.name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    @property
    def started(self) -> bool:
        return self._thread.ident is not None

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def loop(self) -> None:
        raise NotImplementedError

    def _main(self) -> None:
        try:
            self.loop()
        except BaseException as error:
            self.failure = error
            logger.critical("the worker's %s died", self.name, exc_info=error)
            self.on_death()
        finally:
            _close_connections()

    def died(self) -> bool:
        """Whether the loop ended on an error (the supervisor must stop the worker)."""
        return self.failure is not None


def _close_connections() -> None:
    """A thread's last breath: close its connections, never raise."""
    try:
        db.connections.close_all()
    except Exception:
        logger.debug("closing a thread's connections failed", exc_info=True)
