"""LISTEN on PostgreSQL: one dedicated connection per worker process.

Enqueues NOTIFY the channel with the queue name when they commit; the listener
wakes the claim loop. One connection carries several channels (the wake-up
channel, and the cancel channel whose payloads are job ids), each with its own
callback given the payload. If the connection drops, the worker still polls, and the
listener reconnects with a capped backoff; after each (re)connect it wakes the
loop once, since notifications sent while it was away are lost.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from django_venturi.store.connections import connection_params

logger = logging.getLogger("django_venturi.listener")

RECONNECT_DELAYS = (0.1, 0.5, 1.0, 2.0, 5.0)
WAIT_SLICE = 0.25
"""How long one wait for notifications lasts before checking for stop."""


class Listener:
    """A thread that calls `channels[name](payload)` for each notification on a channel.

    After each (re)connect every callback is called once with None: whatever
    was sent while the listener was away is lost, so look again.
    """

    def __init__(self, *, alias: str, channels: dict[str, Callable[[str | None], None]]) -> None:
        self.alias = alias
        self.channels = dict(channels)
        self.connected = threading.Event()
        self._stopped = threading.Event()
        self._params = connection_params(alias)
        self._thread = threading.Thread(target=self._run, name="venturi-listener", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=WAIT_SLICE + 1)

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
                    for channel in self.channels:
                        connection.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                    self.connected.set()
                    if failures:
                        logger.warning("listener reconnected to %s", self.alias)
                    failures = 0
                    for channel in self.channels:
                        self._deliver(channel, None)
                    while not self._stopped.is_set():
                        for notify in connection.notifies(timeout=WAIT_SLICE):
                            self._deliver(notify.channel, notify.payload)
            except Exception as error:  # any error: the worker polls meanwhile, never dies
                self.connected.clear()
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
