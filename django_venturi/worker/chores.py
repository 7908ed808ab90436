"""A worker's periodic chore: a daemon thread that does one pass every `interval` until
the worker's stop event is set (the retention sweeper, the maintainer).

A failed pass is logged and lost, never the thread: the next pass comes at the
interval, after the thread's broken connections are closed. Database errors are
logged without a traceback (they say enough); anything else with one.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from typing import ClassVar

from django.db import connections

from django_venturi.store.connections import DATABASE_ERRORS, close_broken_connections


class PeriodicChore:
    """Subclasses name the thread, the first wait, the logger and the failure's words,
    and do one pass in `run_pass`."""

    thread_name: ClassVar[str]
    first_after: ClassVar[timedelta]
    logger: ClassVar[logging.Logger]
    failure: ClassVar[str]
    """The warning of a failed pass: `%s` the error, then `%s` the interval."""

    def __init__(self, *, alias: str, stop: threading.Event, interval: timedelta) -> None:
        self.alias = alias
        self.stop = stop
        self.interval = interval
        self.thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)

    def run_pass(self) -> object:
        raise NotImplementedError

    def _run(self) -> None:
        wait = self.first_after
        while not self.stop.wait(wait.total_seconds()):
            try:
                self.run_pass()
            except Exception as error:  # any error: this pass is lost, the thread goes on
                self.logger.warning(
                    self.failure,
                    error,
                    self.interval,
                    exc_info=not isinstance(error, DATABASE_ERRORS),
                )
                close_broken_connections()
            wait = self.interval
        connections.close_all()
