"""A worker that cannot make progress stops looking alive: real `venturi_worker` processes.

Two ways a worker used to keep beating while its jobs went nowhere: its log output
went to a pipe nobody read (the results writer blocked in the log handler), and
its handler threads were all abandoned past their timeout (no slot left for the
jobs it had already taken). Now logging goes through a bounded queue that drops
lines rather than blocking, and a worker whose handler pool, results writer or
claim loop stalls past `STALL_TIMEOUT` stops extending its leases, hands back the
runs it has not started, and exits non-zero; so does one stuck in a start-up step.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.db import connections
from django.test import override_settings

import django_venturi as venturi
from django_venturi.models import Job, WorkerProcess
from django_venturi.worker import log_queue
from django_venturi.worker.process import Worker, WorkerFailed
from tests import cluster_workers
from tests.conftest import ROOT, in_thread, result_of, wait_until, worker_env
from tests.tcp_proxy import TcpProxy
from tests.testapp.control_tasks import IgnoresTimeout
from tests.testapp.models import Record
from tests.testapp.tasks import Noop, Sleeper

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)
        if process.stdout is not None:
            process.stdout.close()


def spawn(
    started: list[subprocess.Popen[bytes]],
    *args: str,
    settings: dict[str, object] | None = None,
    log: Path | None = None,
) -> subprocess.Popen[bytes]:
    """A worker logging to `log`, or to a pipe this test reads only when it says so."""
    env = {**worker_env(), "VENTURI_TEST_SETTINGS": json.dumps(settings or {})}
    output = subprocess.PIPE if log is None else log.open("wb")
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "django", "venturi_worker", "--database", "default", *args],
            env=env,
            cwd=ROOT,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    finally:
        if log is not None:
            output.close()  # type: ignore[union-attr]
    started.append(process)
    return process


def test_a_worker_whose_log_output_is_never_read_keeps_writing_results(
    processes: list[subprocess.Popen[bytes]],
) -> None:
    jobs = venturi.enqueue_many([Noop(n=n) for n in range(2500)])
    # -v 2: a line per run and more, far past what the pipe's buffer (64 KiB) holds.
    worker = spawn(processes, "-v", "2", "--concurrency", "4")
    wait_until(
        lambda: Job.objects.filter(state=venturi.State.COMPLETED).count() == len(jobs),
        timeout=90,
        message="every job completed although nobody reads the worker's output",
    )
    assert worker.poll() is None
    worker.send_signal(signal.SIGTERM)
    # Still unread: its last lines cannot be written, and must not keep it alive.
    assert worker.wait(timeout=30) == 0
    output = worker.stdout.read().decode(errors="replace") if worker.stdout else ""
    # The scenario: the pipe was full (64 KiB), so many runs' lines were never written.
    assert len(output) > 60_000, len(output)
    assert output.count(": completed") < len(jobs), output.count(": completed")


class Blocking(logging.Handler):
    """A handler whose output blocks until released, like a pipe nobody reads."""

    def __init__(self) -> None:
        super().__init__()
        self.released = threading.Event()
        self.entered = threading.Event()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.entered.set()
        self.released.wait()
        self.lines.append(record.getMessage())


def test_a_full_log_queue_drops_and_counts_lines_instead_of_blocking() -> None:
    # On venturi's logger, where the log thread also says how many lines it dropped.
    logger = logging.getLogger("django_venturi")
    handler = Blocking()
    logger.addHandler(handler)
    configured = list(logger.handlers)
    propagate, logger.propagate = logger.propagate, False
    log = log_queue.LogQueue(capacity=10)
    log.install()
    try:
        finished = threading.Event()

        def hot_path() -> None:
            logger.warning("line %d", 0)
            handler.entered.wait()  # the log thread holds line 0, blocked in the output
            for n in range(1, 100):
                logger.warning("line %d", n)
            finished.set()

        threading.Thread(target=hot_path, daemon=True).start()
        assert finished.wait(timeout=10), "logging blocked the thread that logged"
        # One line taken by the blocked handler, ten queued: the rest dropped and counted.
        assert log.dropped == 89
        handler.released.set()
        wait_until(lambda: len(handler.lines) == 12, timeout=10, message="the queue written")
        assert logger.handlers != configured, "the handlers behind the queue while installed"
    finally:
        handler.released.set()
        assert log.uninstall()
        assert logger.handlers == configured, "the logger's own handlers given back"
        logger.removeHandler(handler)
        logger.propagate = propagate
    assert handler.lines[:11] == [f"line {n}" for n in range(11)]
    assert handler.lines[11].startswith("89 log lines dropped so far"), handler.lines[11]


def test_a_worker_with_no_handler_slot_left_hands_back_its_jobs_and_exits_non_zero(
    processes: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    # One slot: the first stuck handler is abandoned at its timeout (1 s + 1 s grace) and
    # a replacement thread takes the next run, which is stuck too; past that no thread
    # replaces it, and an ordinary job the worker claimed meanwhile never starts.
    venturi.enqueue_many([IgnoresTimeout(seconds=60)] * 2)
    ordinary = venturi.enqueue_many([Noop(n=n) for n in range(3)])
    ordinary_ids = [job.pk for job in ordinary]
    log = tmp_path / "worker.log"
    settings = {"STALL_TIMEOUT": 2, "HEARTBEAT_INTERVAL": 0.5}
    first = spawn(processes, "--concurrency", "1", settings=settings, log=log)
    wait_until(lambda: "no replacement" in log.read_text(), timeout=30, message="no slot left")
    # The scenario: an ordinary job held by this worker that no slot can start.
    held = Job.objects.filter(pk__in=ordinary_ids, state=venturi.State.RUNNING)
    assert held.exists(), list(Job.objects.values_list("id", "kind", "state", "attempt"))
    assert first.wait(timeout=30) != 0
    output = log.read_text()
    assert "its handler pool made no progress" in output, output[-3000:]
    # Handed back when it stopped, not left to a 5-minute lease.
    states = set(Job.objects.filter(pk__in=ordinary_ids).values_list("state", flat=True))
    assert states == {venturi.State.READY}, states
    spawn(processes, "--burst", "--queues", "default")
    wait_until(
        lambda: Job.objects.filter(pk__in=ordinary_ids, state=venturi.State.COMPLETED).count() == 3,
        timeout=30,
        message="the handed-back jobs completed by another worker",
    )


def test_a_stopping_worker_waiting_for_its_handlers_is_not_taken_for_stalled(
    processes: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    # Its claim loop has ended and its one handler runs on past STALL_TIMEOUT, within
    # the shutdown timeout: a graceful stop, not a stall.
    job = Sleeper(seconds=3, cooperative=False).enqueue()
    log = tmp_path / "worker.log"
    settings = {"STALL_TIMEOUT": 1, "HEARTBEAT_INTERVAL": 0.3}
    worker = spawn(processes, "--shutdown-timeout", "20", settings=settings, log=log)
    wait_until(lambda: Record.objects.filter(job_id=job.pk).exists(), timeout=30, message="started")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, log.read_text()[-3000:]
    assert "made no progress" not in log.read_text()
    job.refresh_from_db()
    assert job.state == venturi.State.COMPLETED, job.state


@pytest.mark.thorough  # 13 s; CI's chaos soak forgets connections (dead NAT) too
def test_a_worker_whose_connections_never_answer_again_exits_non_zero(
    processes: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    """A dead NAT: every connection of the worker stays open and silent for ever (its
    statements wait on sockets whose far end acknowledges and never answers; the
    heartbeat's own among them). The liveness watch, which touches no database, sees
    its parts stuck and the worker exits non-zero for its supervisor to restart it."""
    name = connections["default"].settings_dict["NAME"]
    port = connections["default"].settings_dict["PORT"] or 5432
    with TcpProxy(("127.0.0.1", int(port))) as proxy:
        settings = {"STALL_TIMEOUT": 2, "HEARTBEAT_INTERVAL": 0.5}
        env = {
            **cluster_workers.environment(f"postgres://postgres@127.0.0.1:{proxy.port}/{name}"),
            "VENTURI_TEST_SETTINGS": json.dumps(settings),
        }
        log = tmp_path / "worker.log"
        with log.open("wb") as output:
            worker = subprocess.Popen(
                [sys.executable, "-m", "django", "venturi_worker"],
                env=env,
                cwd=ROOT,
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        processes.append(worker)
        wait_until(lambda: " starting: " in log.read_text(), timeout=30, message="started")
        wait_until(lambda: WorkerProcess.objects.exists(), timeout=30, message="registered")
        assert proxy.forget() > 0, "the worker's connections went through the proxy"
        Noop().enqueue()  # a wake-up its listener never hears, a claim it never gets
        assert worker.wait(timeout=60) != 0
    output = log.read_text()
    assert "made no progress" in output, output[-3000:]


@contextlib.contextmanager
def worker_stuck_at_start_up() -> Iterator[Worker]:
    """A worker in a thread of this process whose first look for orphan kinds never
    returns (`STALL_TIMEOUT` 1 s): yields it once it is stuck there. On leaving, the
    step is released and the worker stopped; it must have failed on the stall."""
    stuck = threading.Event()
    release = threading.Event()

    def hangs() -> list[object]:
        stuck.set()
        release.wait(60)
        return []

    quick_stall = {**django_settings.VENTURI, "STALL_TIMEOUT": 1, "HEARTBEAT_INTERVAL": 0.3}
    with override_settings(VENTURI=quick_stall):
        worker = Worker(database="default", concurrency=1)
        worker.orphan_watch.look_at_start = hangs  # type: ignore[method-assign]
        thread, box = in_thread(worker.run)
        try:
            assert stuck.wait(30), "the worker reached its first look"
            yield worker
        finally:
            release.set()
            worker.stop(force=True)  # a no-op once it stalled
            thread.join(timeout=60)
    with pytest.raises(WorkerFailed, match="its start-up made no progress"):
        result_of(thread, box)


def test_a_worker_stuck_in_a_start_up_step_stops_looking_alive(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Between the services' start and the claim loop the worker registers and takes
    its first look for orphan kinds. A statement of those that never returns (its
    connection forgotten by a dead NAT as it ran, say) left a worker registered and
    beating that never claimed: nothing watched the start-up. It stalls as a loop does."""
    with worker_stuck_at_start_up():
        wait_until(
            lambda: "its start-up made no progress" in caplog.text,
            timeout=30,
            message="the stall, while the step still hangs",
        )
