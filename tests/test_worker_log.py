"""The stderr log `venturi_worker` sets up: one line per run, written once per batch."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

import django_venturi as venturi
from django_venturi.worker import log as worker_log
from django_venturi.worker.log import FORMAT, BatchingStreamHandler, batched_lines
from tests.conftest import Workers
from tests.testapp import tasks


class CountingStream(io.StringIO):
    """A stream that counts the flushes handed to it."""

    flushes = 0

    def flush(self) -> None:
        self.flushes += 1


@pytest.fixture
def batching() -> Iterator[tuple[logging.Logger, CountingStream]]:
    stream = CountingStream()
    handler = BatchingStreamHandler(stream)
    handler.setFormatter(logging.Formatter(FORMAT))
    logger = logging.getLogger("django_venturi")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield logging.getLogger("django_venturi.worker"), stream
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


def test_info_lines_of_a_batch_are_flushed_once_at_its_end(
    batching: tuple[logging.Logger, CountingStream],
) -> None:
    logger, stream = batching
    with batched_lines():
        for n in range(5):
            logger.info("line %d", n)
        assert stream.flushes == 0
    assert stream.flushes == 1
    assert [line.rsplit(" ", 1)[-1] for line in stream.getvalue().splitlines()] == list("01234")


def test_a_warning_in_a_batch_and_a_line_outside_one_are_flushed_at_once(
    batching: tuple[logging.Logger, CountingStream],
) -> None:
    logger, stream = batching
    with batched_lines():
        logger.info("first")
        logger.warning("trouble")
        assert stream.flushes == 1 and "first" in stream.getvalue()
    logger.info("alone")
    assert stream.flushes == 3
    assert stream.getvalue().splitlines()[-1].endswith("alone")


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_a_worker_at_the_default_verbosity_logs_every_run(workers: Workers) -> None:
    venturi.enqueue_many([tasks.Noop(n=i) for i in range(300)])
    failed = tasks.Permanent().enqueue()
    result = workers.burst("default", env={"VENTURI_TEST_WORKER_LOG": "1"})
    lines = result.stderr.splitlines()
    assert lines[0].split(" ")[2:4] == ["INFO", "django_venturi.worker"], lines[0]
    completed = [line for line in lines if " INFO " in line and line.endswith(": completed")]
    assert len(completed) == 300, result.stderr[-3000:]
    assert any(" ERROR " in line and f"job {failed.pk} " in line for line in lines)
    assert lines[-1].endswith("stopped after 301 runs"), lines[-3:]


@pytest.mark.parametrize("created", [1796392830.0, 1796392830.0009, 1796392830.9996, 1796392831.5])
def test_the_worker_formatter_writes_what_the_default_one_does(created: float) -> None:
    """It makes each second's timestamp once; the line must not change for that."""
    cached = worker_log.stderr_handler().formatter
    assert cached is not None
    for offset in (0.0, 0.25, 1.0):  # the same second again, and the next one
        record = logging.LogRecord("django_venturi", logging.INFO, "f", 1, "m %d", (1,), None)
        record.created = created + offset
        record.msecs = (record.created - int(record.created)) * 1000
        assert cached.format(record) == logging.Formatter(worker_log.FORMAT).format(record)
