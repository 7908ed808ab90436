"""Logging off the worker's hot path: records go through a bounded queue to one thread.

A log handler writes to a file, a pipe, a socket or a mail server, and each of
those can block: a pipe whose reader stopped reading (a supervisor that hung, a
`| tee` on a full disk) blocks every `write` for as long as it stays full. A
worker whose results writer or handler threads logged straight into it would
stop writing verdicts while its heartbeat went on extending their leases: jobs
held for as long as the worker lived.

While a worker runs, every handler configured on any logger (the project's
`LOGGING` and venturi's own stderr handler) sits behind a `QueueingHandler`:
logging a line only puts the record on a bounded queue, and one thread
(`venturi-log`) hands the records to the real handlers, in order, flushing a
batching handler once per burst. When the queue is full (the output does not
keep up) a line is dropped and counted instead of waiting; the log thread says
how many were dropped once it has room again.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from django_venturi.worker.log import batched_lines

CAPACITY = 10_000
"""Records that may wait for the log thread; past this, lines are dropped."""
BURST = 500
"""Records the log thread hands on before it lets a batching handler flush."""
STOP_WAIT = 2.0
"""Seconds the worker waits at exit for the queued lines to be written."""

IDLE_CHECK = 0.5
"""The log thread, idle, looks at the queue at least this often (it is woken at once)."""

_Entry = tuple[list[logging.Handler], logging.LogRecord] | None


class QueueingHandler(logging.Handler):
    """Stands in for a logger's real handlers: queues each record for the log thread."""

    def __init__(self, log: LogQueue, targets: list[logging.Handler]) -> None:
        super().__init__()
        self.log = log
        self.targets = targets
        self.lowest = min((target.level for target in targets), default=logging.CRITICAL + 1)

    def handle(self, record: logging.LogRecord) -> bool:
        # No lock, no filters of its own: the real handlers apply theirs in the log thread.
        self.emit(record)
        return True

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= self.lowest:  # each target's own level: in the log thread
            self.log.put(frozen(record), self.targets)


def frozen(record: logging.LogRecord) -> logging.LogRecord:
    """The record with its message made now: its arguments may change before it is written."""
    if record.args:
        try:
            record.msg = record.getMessage()
        except Exception:  # a bad format string: the real handler reports it as logging does
            return record
        record.args = None
    return record


class LogQueue:
    """The bounded queue and the thread that writes what it holds.

    A deque, not a `queue.Queue`: appending takes no lock (the GIL makes it atomic),
    and the log thread is woken only when it waits, not at every line: the worker's
    hot path pays about a microsecond a line."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self._entries: collections.deque[_Entry] = collections.deque()
        self._wake = threading.Event()
        self._waiting = False
        self.dropped = 0
        """Lines dropped because the queue was full (never reset)."""
        self._reported = 0
        self._thread = threading.Thread(target=self._write, name="venturi-log", daemon=True)
        self._installed: list[tuple[logging.Logger, list[logging.Handler]]] = []

    def put(self, record: logging.LogRecord, targets: list[logging.Handler]) -> None:
        if len(self._entries) >= self.capacity:
            self.dropped += 1  # two threads at once may lose a count: never a line more
            return
        self._entries.append((targets, record))
        if self._waiting:
            self._wake.set()

    # ------------------------------------------------------------ installing

    def install(self) -> None:
        """Put every configured logger's handlers behind this queue and start the thread."""
        for logger in _configured_loggers():
            handlers = list(logger.handlers)
            self._installed.append((logger, handlers))
            logger.handlers = [QueueingHandler(self, handlers)]
        self._thread.start()

    def uninstall(self, timeout: float = STOP_WAIT) -> bool:
        """Give the loggers their handlers back and let the thread write what is queued,
        for at most `timeout` seconds; False if the output did not take it all."""
        for logger, handlers in self._installed:
            logger.handlers = handlers
        self._installed = []
        if not self._thread.is_alive():
            return True
        self._entries.append(None)  # the end marker, past the capacity if need be
        self._wake.set()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # ------------------------------------------------------------ the log thread

    def _write(self) -> None:
        while True:
            with batched_lines():
                for entry in self._burst():
                    if entry is None:
                        return
                    targets, record = entry
                    for target in targets:
                        if record.levelno >= target.level:
                            target.handle(record)
            self._report_drops()

    def _burst(self) -> Iterator[_Entry]:
        """The next record (waiting for it), then those already queued, up to BURST."""
        while not self._entries:
            self._waiting = True
            if not self._entries:  # looked again once the putters know it waits
                self._wake.wait(IDLE_CHECK)
                self._wake.clear()
            self._waiting = False
        for _ in range(BURST):
            try:
                yield self._entries.popleft()
            except IndexError:
                return

    def _report_drops(self) -> None:
        dropped = self.dropped
        if dropped == self._reported:
            return
        record = logging.LogRecord(
            "django_venturi.worker",
            logging.WARNING,
            __file__,
            0,
            "%d log lines dropped so far: the log output did not keep up (%d since the last note)",
            (dropped, dropped - self._reported),
            None,
        )
        self._reported = dropped
        handlers = {logger.name: handlers for logger, handlers in self._installed}
        for handler in handlers.get("django_venturi", handlers.get("root", [])):
            if record.levelno >= handler.level:
                handler.handle(record)


def _configured_loggers() -> list[logging.Logger]:
    """The root logger and every other logger with handlers of its own."""
    loggers = [logging.getLogger()]
    for logger in list(logging.Logger.manager.loggerDict.values()):
        if isinstance(logger, logging.Logger) and logger.handlers:
            loggers.append(logger)
    return [logger for logger in loggers if logger.handlers]


@contextmanager
def queued_logging() -> Iterator[LogQueue]:
    """Logging through a `LogQueue` for the block (the worker's life)."""
    log = LogQueue()
    log.install()
    try:
        yield log
    finally:
        log.uninstall()
