"""`manage.py venturi_worker`: parse flags, build a Worker, run it."""

from __future__ import annotations

import argparse
import atexit
import difflib
import errno
import gc
import logging
import os
import socket
import sys
import threading
from typing import Any, NoReturn

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from django_venturi.checks import sqlite_transaction_mode_errors
from django_venturi.conf import (
    MAX_BATCH_SIZE,
    MAX_CONCURRENCY,
    MAX_POLL_INTERVAL,
    MAX_SHUTDOWN_TIMEOUT,
    venturi_settings,
)
from django_venturi.database_support import served_specs, unsupported_feature_errors
from django_venturi.management import flags
from django_venturi.migration_state import migration_errors
from django_venturi.registry import MAX_QUEUE_LENGTH, registry, validate_name
from django_venturi.worker.first_contact import DatabaseUnreachable
from django_venturi.worker.health_server import DEFAULT_HOST, HealthServer
from django_venturi.worker.log import stderr_handler
from django_venturi.worker.log_queue import LogQueue
from django_venturi.worker.process import Worker, WorkerFailed


def queue_list(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give at least one queue name")
    try:
        return [validate_name(name, field="queue", max_length=MAX_QUEUE_LENGTH) for name in names]
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def kind_caps(text: str) -> dict[str, int]:
    caps: dict[str, int] = {}
    for item in text.split(","):
        kind, sep, number = item.strip().rpartition("=")
        if not sep or not kind:
            raise argparse.ArgumentTypeError(f"expected kind=N, got {item.strip()!r}")
        try:
            caps[kind] = flags.concurrency(number)
        except argparse.ArgumentTypeError as error:
            raise argparse.ArgumentTypeError(f"{kind}={number}: {error}") from None
    return caps


class Command(BaseCommand):
    help = "Run a venturi worker: claim due jobs and run their handlers until stopped."
    requires_system_checks = "__all__"
    left_running = 0
    """Handlers still running when the worker stopped (see `run_from_argv`)."""
    own_process = False
    """Run from the command line (`run_from_argv`), not by `call_command`."""

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queues", type=queue_list, default=None, help="Comma-separated queues (default: all)."
        )
        parser.add_argument(
            "--concurrency",
            type=flags.concurrency,
            default=None,
            help=f"Handler slots, 1 to {MAX_CONCURRENCY} (default: VENTURI CONCURRENCY, 10).",
        )
        parser.add_argument(
            "--shutdown-timeout",
            type=flags.shutdown_timeout,
            default=None,
            help="Seconds running jobs get after SIGTERM, 0 to "
            f"{MAX_SHUTDOWN_TIMEOUT.total_seconds():g} (default: VENTURI SHUTDOWN_TIMEOUT, 30).",
        )
        parser.add_argument(
            "--poll-interval",
            type=flags.poll_interval,
            default=None,
            help="Seconds between polls without notifications, more than 0 and at most "
            f"{MAX_POLL_INTERVAL.total_seconds():g} (default: VENTURI POLL_INTERVAL, 1).",
        )
        parser.add_argument(
            "--batch-size",
            type=flags.batch_size,
            default=None,
            help=f"Most jobs per claim, 1 to {MAX_BATCH_SIZE} (default: VENTURI BATCH_SIZE, 500).",
        )
        flags.add_database(parser, default_note=" (VENTURI DATABASE)")
        parser.add_argument(
            "--kind-concurrency",
            type=kind_caps,
            default=None,
            metavar="KIND=N[,KIND=N]",
            help=f"At most N (1 to {MAX_CONCURRENCY}) jobs of KIND at once in this worker (the "
            "task's concurrency= caps all workers together).",
        )
        parser.add_argument(
            "--burst", action="store_true", help="Exit 0 once no job is running and none is due."
        )
        parser.add_argument(
            "--health-port",
            type=flags.health_port,
            default=0,
            metavar="PORT",
            help="Serve GET /livez and /readyz over HTTP on this port, for Kubernetes probes "
            "(default: 0, none). Each worker on a host needs a port of its own.",
        )
        parser.add_argument(
            "--health-host",
            type=flags.host,
            default=DEFAULT_HOST,
            metavar="ADDRESS",
            help=f"The address --health-port listens on (default: {DEFAULT_HOST}, every IPv4 "
            "interface; 127.0.0.1 for local checks only, :: for IPv6).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self._configure_logging(options["verbosity"])
        self._refuse_unknown_kinds(options["kind_concurrency"] or {})
        self._warn_of_unused_queues(options["queues"] or [])
        alias = options["database"] or venturi_settings.DATABASE
        if alias not in connections:
            raise CommandError(f"--database: {alias!r} is not an alias in DATABASES")
        self._refuse_sqlite_without_immediate(alias)
        self._refuse_unsupported_features(alias, options["queues"])
        worker = Worker(
            queues=options["queues"],
            concurrency=options["concurrency"],
            shutdown_timeout=options["shutdown_timeout"],
            poll_interval=options["poll_interval"],
            batch_size=options["batch_size"],
            database=options["database"],
            burst=options["burst"],
            kind_concurrency=options["kind_concurrency"],
            list_kinds=options["verbosity"] >= 2,
        )
        health = health_server(worker, options["health_host"], options["health_port"])
        restore = worker.install_signal_handlers()
        log = LogQueue() if self.own_process else None
        if log is not None:
            # A log output that blocks must not stop the worker (`log_queue.py`), and a
            # worker that stalled ends its process if its shutdown cannot end.
            log.install()
            worker.exit_if_wedged = lambda: exit_now(1)
        if self.own_process:
            # What start-up made (Django, the apps, their modules) lives as long as
            # the process: out of the cyclic collector's sight, its collections no
            # longer walk all of it (3.5 µs per job on tiny jobs). Not under
            # `call_command`, whose process may go on to other things.
            gc.freeze()
        try:
            # The database first (a burst worker stops if it does not answer), then
            # its schema, then the worker's threads.
            if worker.wait_for_database():
                self._refuse_an_old_schema(alias)
            worker.run()
        except DatabaseUnreachable as error:
            raise CommandError(str(error)) from None
        except WorkerFailed as error:
            if log is not None and not log.uninstall():
                exit_now(1)  # its output takes no more: saying why would block for ever
            raise CommandError(f"the worker stopped: {error}") from None
        finally:
            restore()
            if health is not None:
                health.stop()
            self.left_running = worker.left_running
            if log is not None and not log.uninstall():
                self.left_running += 1  # nothing more is written: end without waiting

    def run_from_argv(self, argv: list[str]) -> None:
        """Run as a process of its own; once the worker stopped, exit without waiting
        for handlers it released while they ran.

        Their runs are handed back and their results would be dropped, but the
        interpreter would wait at exit for the threads that `sync_to_async` lends to
        async handlers (and any other non-daemon thread a handler started), however
        long they take. `call_command` does not come here: it never ends its process.
        """
        self.own_process = True
        try:
            super().run_from_argv(argv)
        except SystemExit as exiting:
            if self.left_running:
                exit_now(exiting.code if isinstance(exiting.code, int) else 1)
            raise
        if self.left_running:
            exit_now(0)

    def _refuse_unknown_kinds(self, caps: dict[str, int]) -> None:
        """A cap on a kind no task registered is a typo: it would cap nothing."""
        known = registry.kinds()
        for kind in caps:
            if kind not in known:
                raise CommandError(f"--kind-concurrency: {unknown_kind(kind, known)}")

    def _warn_of_unused_queues(self, queues: list[str]) -> None:
        """Jobs may be enqueued on any queue, but a queue no task uses is often a typo."""
        used = default_queues()
        for queue in queues:
            if queue not in used:
                close = difflib.get_close_matches(queue, sorted(used), n=3)
                hint = f"did you mean {_either(close)}? " if close else ""
                self.stderr.write(
                    f"--queues: no registered task uses queue {queue!r} by default "
                    f"({hint}tasks use {', '.join(sorted(used))}); the worker serves it "
                    "anyway, for jobs enqueued with that queue",
                    self.style.WARNING,
                )

    def _refuse_sqlite_without_immediate(self, alias: str) -> None:
        """Exit with the check's message when `alias` is SQLite without IMMEDIATE transactions."""
        database = connections.settings[alias]
        errors = sqlite_transaction_mode_errors(alias, database, for_worker=True)
        if errors:
            raise CommandError(f"{errors[0].msg}\nHINT: {errors[0].hint} ({errors[0].id})")

    def _refuse_unsupported_features(self, alias: str, queues: list[str] | None) -> None:
        """Exit with `venturi.E060` when a task this worker serves uses a feature `alias`
        cannot hold (MariaDB and MySQL: `database_support.py`)."""
        for error in unsupported_feature_errors(alias, served_specs(queues)):
            raise CommandError(f"{error.msg}\nHINT: {error.hint} ({error.id})")

    def _refuse_an_old_schema(self, alias: str) -> None:
        """Exit with the check's message when venturi's migrations are behind on `alias`."""
        for message in migration_errors(alias):
            if message.is_serious():
                raise CommandError(f"{message.msg}\nHINT: {message.hint} ({message.id})")
            self.stderr.write(f"{message.id}: {message.msg}")

    def _configure_logging(self, verbosity: int) -> None:
        """Log to stderr unless the project configured the django_venturi logger itself."""
        logger = logging.getLogger("django_venturi")
        if logger.handlers or logging.getLogger().handlers:
            return
        logger.addHandler(stderr_handler())
        logger.setLevel({0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG))


def health_server(worker: Worker, host: str, port: int) -> HealthServer | None:
    """The worker's `/livez` and `/readyz` at `host`:`port`, serving (None for port 0).

    A port that cannot be had stops the worker here, before it waits for anything."""
    if not port:
        return None
    try:
        server = HealthServer(worker.probes, host=host, port=port)
    except OSError as error:
        raise CommandError(cannot_listen(host, port, error)) from None
    server.start()
    return server


def cannot_listen(host: str, port: int, error: OSError) -> str:
    """Why the health endpoint cannot have `host`:`port`, naming the flag to change."""
    if error.errno == errno.EADDRINUSE:
        return (
            f"--health-port {port}: port {port} is already in use on {host}; give each worker "
            "on a host a port of its own (or --health-port 0 for none)"
        )
    if isinstance(error, socket.gaierror) or error.errno == errno.EADDRNOTAVAIL:
        return f"--health-host {host}: cannot listen on {host}:{port} ({error})"
    return f"--health-port {port}: cannot listen on {host}:{port} ({error})"


def unknown_kind(kind: str, known: list[str]) -> str:
    """Say that no task is registered under `kind`, with the registered kinds it resembles."""
    close = difflib.get_close_matches(kind, known, n=3)
    if close:
        return f"no task is registered under kind {kind!r}; did you mean {_either(close)}?"
    listed = ", ".join(known[:KINDS_LISTED]) + (", ..." if len(known) > KINDS_LISTED else "")
    return f"no task is registered under kind {kind!r} (registered: {listed or 'none'})"


KINDS_LISTED = 10
"""How many registered kinds an error about an unknown kind lists."""


def _either(names: list[str]) -> str:
    quoted = [repr(name) for name in names]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]


def default_queues() -> set[str]:
    """The queues jobs go to unless enqueued with another one: each task's, the default
    queue, and the QUEUES of venturi's Django Tasks backends."""
    queues = {spec.queue or venturi_settings.DEFAULT_QUEUE for spec in registry.specs()}
    queues.add(venturi_settings.DEFAULT_QUEUE)
    tasks = getattr(settings, "TASKS", None)
    if not isinstance(tasks, dict) or not tasks:
        return queues
    # Here, not at the top: the backend loads the Tasks frameworks installed, which a
    # worker of a project without TASKS never needs (start-up time).
    from django_venturi.tasks_backend.backend import is_venturi_backend

    for entry in tasks.values():
        if isinstance(entry, dict) and is_venturi_backend(entry.get("BACKEND")):
            queues.update(
                name for name in entry.get("QUEUES", ["default"]) if isinstance(name, str)
            )
    return queues


EXIT_WAIT = 5.0
"""Seconds `exit_now` gives the atexit callbacks and the final flushes."""


def exit_now(status: int) -> NoReturn:
    """End the process: run the atexit callbacks (logging's flush among them) and exit
    without joining the threads still running handlers. An output nobody reads would
    block those flushes for ever: they get EXIT_WAIT seconds."""
    finishing = threading.Thread(target=_finish_output, name="venturi-exit", daemon=True)
    finishing.start()
    finishing.join(EXIT_WAIT)
    os._exit(status)


def _finish_output() -> None:
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
