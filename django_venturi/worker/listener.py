"""LISTEN on PostgreSQL: one dedicated connection per worker process.

Enqueues NOTIFY the channel with the queue name when they commit; the listener
wakes the claim loop. One connection carries several channels (the wake-up
channel, and the cancel channel whose payloads are job ids), each with its own
callback given the payload. If the connection drops, the worker still polls, and the
listener reconnects with a capped backoff; after each (re)connect it wakes the
loop once, since notifications sent while it was away are lost.

A `Session` may use the connection too: when it opens, and between two waits
(the wake order's look at which workers' listeners are connected). The LISTEN
statements are sent again after it did, so that the connection's last statement
is a LISTEN: operators find the listener in `pg_stat_activity` by its query.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from django_venturi.conf import venturi_settings
from django_venturi.store.connections import connection_params

if TYPE_CHECKING:
    import psycopg

logger = logging.getLogger("django_venturi.listener")

RECONNECT_DELAYS = (0.1, 0.5, 1.0, 2.0, 5.0)
WAIT_SLICE = 0.25
"""How long one wait for notifications lasts before checking for stop."""


def listener_alias(database: str) -> str:
    """The alias a worker of `database` listens on: LISTEN_DATABASE belongs to
    VENTURI["DATABASE"]; a worker given another alias listens on that alias itself."""
    if database == venturi_settings.DATABASE:
        return venturi_settings.LISTEN_DATABASE
    return database


class Session(Protocol):
    """What else the listener's connection does, in the listener's thread."""

    def opened(self, connection: psycopg.Connection[Any]) -> None:
        """The connection is new (before its LISTEN statements)."""

    def between(self, connection: psycopg.Connection[Any]) -> bool:
        """Between two waits for notifications; True if it sent statements."""

    def closed(self) -> None:
        """The connection is gone."""


class Listener:
    """A thread that calls `channels[name](payload)` for each notification on a channel.

    After each (re)connect every callback is called once with None: whatever
    was sent while the listener was away is lost, so look again.
    """

    def __init__(
        self,
        *,
        alias: str,
        channels: dict[str, Callable[[str | None], None]],
        session: Session | None = None,
    ) -> None:
        self.alias = alias
        self.channels = dict(channels)
        self.session = session
        self.connected = threading.Event()
        self._stopped = threading.Event()
        self._renew = threading.Event()
        self._params = connection_params(alias)
        self._thread = threading.Thread(target=self._run, name="venturi-listener", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=WAIT_SLICE + 1)

    def renew(self) -> None:
        """Connect again (within WAIT_SLICE): after the worker's database was away or took
        no writes, the server this connection reaches may no longer be the primary (a
        failover behind a DNS name or a virtual IP leaves open connections where they
        were), and notifications are sent on the new one."""
        self._renew.set()

    def _deliver(self, channel: str, payload: str | None) -> None:
        callback = self.channels.get(channel)
        if callback is None:
            return
        try:
            callback(payload)
        except Exception:  # a bad payload must not end the listener
            logger.exception("listener callback for %s failed on %r", channel, payload)

    def _run(self) -> None:
        import psycopg
        from psycopg import sql

        failures = 0
        while not self._stopped.is_set():
            try:
                with psycopg.connect(**self._params, autocommit=True) as connection:
                    listen = [
                        sql.SQL("LISTEN {}").format(sql.Identifier(channel))
                        for channel in self.channels
                    ]
                    if self.session is not None:
                        self.session.opened(connection)
                    for statement in listen:
                        connection.execute(statement)
                    self.connected.set()
                    if failures:
                        logger.warning("listener reconnected to %s", self.alias)
                    failures = 0
                    for channel in self.channels:
                        self._deliver(channel, None)
                    self._renew.clear()
                    while not self._stopped.is_set() and not self._renew.is_set():
                        # One at a time: the session may look between two of them.
                        for notify in connection.notifies(timeout=WAIT_SLICE, stop_after=1):
                            self._deliver(notify.channel, notify.payload)
                        if self.session is not None and self.session.between(connection):
                            for statement in listen:
                                connection.execute(statement)
            except Exception as error:  # any error: the worker polls meanwhile, never dies
                self.connected.clear()
                if self.session is not None:
                    self.session.closed()
                if failures == 0:
                    logger.error(
                        "listener lost its connection (%s); polling meanwhile",
                        error,
                        exc_info=not isinstance(error, psycopg.Error),
                    )
                delay = RECONNECT_DELAYS[min(failures, len(RECONNECT_DELAYS) - 1)]
                failures += 1
                self._stopped.wait(delay)
        self.connected.clear()
