"""The stderr log `venturi_worker` sets up when the project configured none.

One line per run at the default verbosity must not cost the worker its speed.
The results writer logs a whole batch of verdicts at once (`run_events.py`);
this handler writes those lines into a buffer and hands the buffer to stderr
once per batch, in one write, instead of one write per line. A warning or an
error is written at once, and so is every line logged outside a batch.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import threading
import time
from collections.abc import Iterator
from typing import TextIO

FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"

_batch = threading.local()


@contextlib.contextmanager
def batched_lines() -> Iterator[None]:
    """Within this block, this thread's INFO and DEBUG lines are written at its end, by
    this thread, to the batching handlers it wrote to (none, when the worker's logging
    goes through its queue: `log_queue.py`)."""
    _batch.open = True
    _batch.touched = set()
    try:
        yield
    finally:
        _batch.open = False
        touched, _batch.touched = _batch.touched, set()
        for handler in touched:
            handler.flush_batch()


class BatchingStreamHandler(logging.StreamHandler[TextIO]):
    """A stream handler that flushes INFO and DEBUG lines once per batch (see above)."""

    def flush(self) -> None:
        if getattr(_batch, "open", False):
            return  # `batched_lines` flushes at the end of its block
        super().flush()

    def emit(self, record: logging.LogRecord) -> None:
        super().emit(record)
        if getattr(_batch, "open", False):
            if record.levelno >= logging.WARNING:
                super().flush()
            else:
                _batch.touched.add(self)

    def flush_batch(self) -> None:
        super().flush()


class _Formatter(logging.Formatter):
    """The default formatter, with each second's `asctime` made once, not per line."""

    _second: tuple[int, str] = (-1, "")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        if second != self._second[0]:
            self._second = (second, time.strftime("%Y-%m-%d %H:%M:%S", self.converter(second)))
        return f"{self._second[1]},{int(record.msecs):03d}"  # logging's default layout


def stderr_handler() -> logging.Handler:
    """A batching handler on a buffered stream over stderr's file descriptor, or a
    plain one when stderr has none (a test that replaced `sys.stderr`)."""
    try:
        fileno = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        handler: logging.Handler = logging.StreamHandler(sys.stderr)
    else:
        raw = io.FileIO(fileno, "w", closefd=False)
        stream = io.TextIOWrapper(
            io.BufferedWriter(raw, 1 << 16),
            encoding=sys.stderr.encoding or "utf-8",
            errors="backslashreplace",
        )
        sys.stderr.flush()
        handler = BatchingStreamHandler(stream)
    handler.setFormatter(_Formatter(FORMAT))
    return handler
