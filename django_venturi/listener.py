"""LISTEN on PostgreSQL: one dedicated connection per worker process.

Enqueues NOTIFY the channel with the queue name when they commit; the listener
wakes the claim loop. If the connection drops, the worker still polls, and the
listener reconnects with a capped backoff; after each (re)connect it wakes the
loop once, since notifications sent while it was away are lost.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from django.db import connections

logger = logging.getLogger("django_venturi.listener")

RECONNECT_DELAYS = (0.1, 0.5, 1.0, 2.0, 5.0)
WAIT_SLICE = 0.25
"""How long one wait for notifications lasts before checking for stop."""


def connection_params(alias: str) -> dict[str, Any]:
    """psycopg connection parameters of a Django database alias."""
    params = connections[alias].get_connection_params()
    return {
        key: value
        for key, value in params.items()
        if key not in {"cursor_factory", "context", "prepare_threshold", "server_side_binding"}
    }


class Listener:
    """A thread that calls `on_notify` whenever a notification arrives on `channel`."""

    def __init__(self, *, alias: str, channel: str, on_notify: Callable[[], None]) -> None:
        self.alias = alias
        self.channel = channel
        self.on_notify = on_notify
        self.connected = threading.Event()
        self._stopped = threading.Event()
        self._params = connection_params(alias)
        self._thread = threading.Thread(target=self._run, name="venturi-listener", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=WAIT_SLICE + 1)

    def _run(self) -> None:
        import psycopg
        from psycopg import sql

        failures = 0
        while not self._stopped.is_set():
            try:
                with psycopg.connect(**self._params, autocommit=True) as connection:
                    connection.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
                    self.connected.set()
                    if failures:
                        logger.warning("listener reconnected to %s", self.alias)
                    failures = 0
                    self.on_notify()
                    while not self._stopped.is_set():
                        for _ in connection.notifies(timeout=WAIT_SLICE):
                            self.on_notify()
            except psycopg.Error as error:
                self.connected.clear()
                if failures == 0:
                    logger.error("listener lost its connection (%s); polling meanwhile", error)
                delay = RECONNECT_DELAYS[min(failures, len(RECONNECT_DELAYS) - 1)]
                failures += 1
                self._stopped.wait(delay)
        self.connected.clear()
