"""Real `venturi_worker` processes, and this process's ORM, on a private cluster.

The suite's settings take `default` from DATABASE_URL, so a worker subprocess
whose environment names the private cluster's URL works there and nowhere else.
This process reaches the same database under an alias of its own, added at run
time (the settings were read before the cluster existed).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import environ
from django.conf import settings
from django.core.management import call_command
from django.db import connections

from tests import clusters
from tests.skips import missing_tool
from tests.testapp import soak_tasks

ROOT = Path(__file__).resolve().parent.parent
DATABASE = "venturi"
"""The database made in each private cluster."""


def require_private_clusters() -> None:
    """Without root or postgresql-common: skip, or fail in CI (`skips.missing_tool`)."""
    reason = clusters.available()
    if reason is not None:
        missing_tool(reason)


@contextlib.contextmanager
def cluster_database(purpose: str, alias: str, *, ssl: bool = False) -> Iterator[clusters.Cluster]:
    """A private cluster whose database `venturi` is migrated and reached here as `alias`.

    In a test, inside `django_db_blocker.unblock()`: the suite's own databases stay
    untouched.
    """
    require_private_clusters()
    with clusters.private_cluster(purpose, ssl=ssl) as cluster:
        cluster.create_database(DATABASE)
        add_alias(alias, cluster.url(DATABASE))
        try:
            yield cluster
        finally:
            remove_alias(alias)


def add_alias(alias: str, url: str) -> None:
    """Make `alias` a database of this process (migrated), as if it were in DATABASES."""
    configured = connections.configure_settings({"default": environ.Env.db_url_config(url)})
    connections.settings[alias] = configured["default"]
    call_command("migrate", database=alias, verbosity=0)


def remove_alias(alias: str) -> None:
    if alias in connections.settings:
        connections[alias].close()
        del connections[alias]
        del connections.settings[alias]


def environment(url: str, *, listen_url: str | None = None, **venturi: Any) -> dict[str, str]:
    """A worker subprocess's environment: the suite's settings, `default` at `url`."""
    task_modules = [*settings.VENTURI["TASK_MODULES"], soak_tasks.MODULE]
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"VENTURI_TEST_DATABASE_NAMES", "VENTURI_TEST_LISTEN_URL"}
    }
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DATABASE_URL": url,
            "PYTHONPATH": str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
            "PYTHONUNBUFFERED": "1",
            "VENTURI_TEST_SETTINGS": json.dumps({"TASK_MODULES": task_modules, **venturi}),
        }
    )
    if listen_url is not None:
        env["VENTURI_TEST_LISTEN_URL"] = listen_url
    return env


class WorkerPool:
    """`venturi_worker` processes with their logs; killed and restarted at will."""

    def __init__(self, folder: Path, env: dict[str, str], *args: str) -> None:
        self.folder = folder
        self.env = env
        self.args = args
        self.processes: list[subprocess.Popen[bytes]] = []
        """Every process started, in order; a restart appends one."""
        self.slots: list[int] = []
        """Slot -> index in `processes` of the process that holds it now."""

    def start(self, count: int) -> None:
        for _ in range(count):
            self.slots.append(self._spawn())

    def _spawn(self) -> int:
        index = len(self.processes)
        with open(self.log_path(index), "wb") as log:
            self.processes.append(
                subprocess.Popen(
                    [sys.executable, "-m", "django", "venturi_worker", *self.args],
                    env=self.env,
                    cwd=ROOT,
                    stdout=log,
                    stderr=log,
                )
            )
        return index

    def current(self) -> list[subprocess.Popen[bytes]]:
        return [self.processes[index] for index in self.slots]

    def kill(self, slot: int) -> int:
        """SIGKILL the process in `slot` and start another there; the killed one's pid."""
        process = self.processes[self.slots[slot]]
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        self.slots[slot] = self._spawn()
        return process.pid

    def started(self) -> bool:
        """Whether every current process has started working (and handles SIGTERM)."""
        return all(" starting: " in self.log(index) for index in self.slots)

    def exited(self) -> list[tuple[int, int | None]]:
        """(pid, exit code) of current processes that exited on their own."""
        return [(p.pid, p.returncode) for p in self.current() if p.poll() is not None]

    def stop(self, timeout: float = 30) -> list[int | None]:
        """SIGTERM the current processes; their exit codes (None: had to be killed)."""
        codes: list[int | None] = []
        for process in self.current():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.current():
            try:
                codes.append(process.wait(timeout=timeout))
            except subprocess.TimeoutExpired:
                codes.append(None)
        self.kill_all()
        return codes

    def kill_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)

    def log_path(self, index: int) -> Path:
        return self.folder / f"worker-{index}.log"

    def log(self, index: int) -> str:
        return self.log_path(index).read_text(errors="replace")

    def logs(self) -> str:
        return "\n".join(
            f"--- worker {index} (pid {p.pid})\n{self.log(index)}"
            for index, p in enumerate(self.processes)
        )
