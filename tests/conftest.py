"""Fixtures: real databases (PostgreSQL and SQLite) and real worker subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connections

ROOT = Path(__file__).resolve().parent.parent
BOTH_DATABASES = ["default", "sqlite"]
MARIADB = bool(os.environ.get("VENTURI_TEST_MARIADB_URL"))
"""Whether this run has a MariaDB or MySQL server too (`mariadb` in tests/settings.py)."""
ALIASES = [*BOTH_DATABASES, "mariadb"] if MARIADB else BOTH_DATABASES
"""The job databases the `alias` fixture runs backend-neutral tests on."""
WAGTAIL_CHECK = ROOT / "tests" / "wagtail_check"
WAGTAIL_SETTINGS = "tests.wagtail_check.settings"


def pytest_configure(config: pytest.Config) -> None:
    """Fail the whole run at once when PostgreSQL cannot be reached: never skip it.
    Then empty the tables after each transactional test in milliseconds, not with
    Django's `flush` (`tests/emptying.py`)."""
    import psycopg

    from tests import emptying, run_databases
    from tests.database import NoPostgreSQL, first_line, postgres_url

    url = postgres_url()
    try:
        psycopg.connect(url, connect_timeout=10).close()
    except psycopg.Error as error:
        raise NoPostgreSQL(f"cannot connect to {url}: {first_line(error)}") from None
    emptying.install()
    if run_databases.owns_the_run():
        try:
            hold = run_databases.RunDatabases(url, settings.RUN_SUFFIX)
        except run_databases.SuffixInUse as error:
            raise pytest.UsageError(str(error)) from None
        config.stash[RUN_DATABASES] = hold
        config.stash[STALE_RUNS] = hold.drop_stale()


RUN_DATABASES = pytest.StashKey[Any]()
"""This run's hold on its suffix (`tests/run_databases.py`), if it owns it."""
STALE_RUNS = pytest.StashKey[list[str]]()
"""The suffixes of gone runs whose databases this run dropped as it began."""


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Say first where the tests' PostgreSQL comes from, and the run's suffix."""
    import psycopg

    from tests.database import postgres_url, source

    with psycopg.connect(postgres_url()) as connection:
        version = connection.execute("SHOW server_version").fetchone()
    lines = [
        f"PostgreSQL {version[0] if version else '?'}: {source()}",
        f"this run's databases end with {settings.RUN_SUFFIX} (VENTURI_TEST_RUN)",
    ]
    if stale := config.stash.get(STALE_RUNS, []):
        lines.append(f"dropped the databases of gone runs: {', '.join(stale)}")
    return lines


def pytest_unconfigure(config: pytest.Config) -> None:
    """The owner of the run drops its databases and files, whatever the outcome."""
    if (hold := config.stash.get(RUN_DATABASES, None)) is not None:
        hold.close()


SKIPPED: list[tuple[str, str]] = []
"""(test id, reason) of each skip in this run."""


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped:
        from tests.skips import reason_of

        SKIPPED.append((report.nodeid, reason_of(report.longrepr)))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """In CI, a skip that tests/skips.py does not allow fails the run (exit status 1)."""
    from tests.skips import in_ci, unexpected

    surprises = unexpected(SKIPPED)
    if not surprises or not in_ci():
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_sep("=", "skips that tests/skips.py does not allow (CI fails on them)")
        for test, reason in surprises:
            reporter.write_line(f"{test}: {reason}")
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(params=ALIASES, ids=["postgresql", "sqlite", "mariadb"][: len(ALIASES)])
def alias(request: pytest.FixtureRequest) -> str:
    """Run the test once against PostgreSQL and once against SQLite, and once against
    MariaDB when VENTURI_TEST_MARIADB_URL is set."""
    return str(request.param)


NOT_ON_MARIADB = {
    "test_enqueue.py::test_enqueue_many_of_several_batches_is_all_or_nothing": "its refusing "
    "trigger is written for PostgreSQL and SQLite",
    "test_retry.py::test_a_failed_job_whose_key_has_a_ready_job_is_a_clash": "dedup is refused "
    "on MariaDB (venturi.E060)",
    "test_retry.py::test_another_integrity_error_is_raised_not_reported_as_a_clash": "dedup is "
    "refused on MariaDB (venturi.E060)",
}
"""Tests of the `alias` fixture that do not run on MariaDB, and why. Besides these, its
worker-process tests: the suite's tasks include dedup, caps and rate limits on the
default queue, which a MariaDB worker refuses (venturi.E060); tests/test_mariadb.py runs
workers on a queue of its own there."""


def _runs_on_mariadb(item: pytest.Item) -> bool:
    if f"{item.path.name}::{getattr(item, 'originalname', item.name)}" in NOT_ON_MARIADB:
        return False
    return "workers" not in getattr(item, "fixturenames", ())


def _may_use_mariadb(item: pytest.Item) -> None:
    """A test run on `mariadb` by the `alias` fixture may use that database, beside those
    its `django_db` mark names (`default` and `sqlite`)."""
    mark = item.get_closest_marker("django_db")
    if mark is None:
        return
    databases = mark.kwargs.get("databases") or ["default"]
    if databases == "__all__" or "mariadb" in databases:
        return
    kwargs = {**mark.kwargs, "databases": [*databases, "mariadb"]}
    item.add_marker(pytest.mark.django_db(*mark.args, **kwargs), append=False)


DJANGO_FACING = frozenset(
    f"test_{name}.py"
    for name in [
        "admin",
        "admin_history",
        "browser",
        "browser_permissions",
        "checks",
        "codec",
        "codec_fast",
        "demo",
        "django_tasks",
        "docs_examples",
        "docs_testing_example",
        "enqueue",
        "error_triage",
        "example_project",
        "first_contact",
        "maintenance",
        "migrations",
        "newcomer_messages",
        "operations",
        "payload_limit",
        "periodic",
        "readme",
        "registration",
        "schedules",
        "secret_masking",
        "settings_and_flags",
        "sqlite_setup",
        "testing_helpers",
        "table_health",
        "text",
        "traces",
    ]
)
"""The test modules of what changes with Django's or Python's version: the admin and its
templates, system checks, migrations, management commands, app loading, the Tasks
frameworks, `startproject`'s settings (README, demo), and the payload codecs (dataclass
and typing introspection). They carry the `django_facing` mark: CI runs the whole suite on
two Django and Python pairs and these modules on a third (`-m django_facing`)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests with real worker processes run on PostgreSQL in the default suite; their SQLite
    twins are `thorough` (CI runs them: `python3 -m pytest -m thorough`). Worker processes
    cost seconds each, and the SQLite paths they take are the ones the in-process tests
    cover on both databases. Modules in DJANGO_FACING are marked `django_facing`. Tests of
    the `alias` fixture that cannot run on MariaDB yet are deselected there."""
    left_out = []
    for item in items:
        if item.path.name in DJANGO_FACING:
            item.add_marker(pytest.mark.django_facing)
        callspec = getattr(item, "callspec", None)
        uses_workers = "workers" in getattr(item, "fixturenames", ())
        on = callspec.params.get("alias") if callspec is not None else None
        if uses_workers and on == "sqlite":
            item.add_marker(pytest.mark.thorough)
        if on == "mariadb" and not _runs_on_mariadb(item):
            left_out.append(item)
        elif on == "mariadb":
            _may_use_mariadb(item)
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if item not in left_out]


def pytest_ignore_collect(collection_path: Path) -> bool | None:
    """tests/wagtail_check/ runs under its own settings only (`tox -e wagtail`): the
    default suite neither collects it nor imports Wagtail. tests/test_mariadb.py needs a
    MariaDB server: collected only when VENTURI_TEST_MARIADB_URL names one."""
    if collection_path.name == "test_mariadb.py" and not MARIADB:
        return True
    if collection_path == WAGTAIL_CHECK and os.environ.get("DJANGO_SETTINGS_MODULE") != (
        WAGTAIL_SETTINGS
    ):
        return True
    return None


def worker_env() -> dict[str, str]:
    """The environment of a worker subprocess: this run's settings and test databases."""
    names = {alias: connections[alias].settings_dict["NAME"] for alias in ALIASES}
    env = dict(os.environ)
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": settings.SETTINGS_MODULE,
            "PYTHONPATH": str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
            "VENTURI_TEST_DATABASE_NAMES": json.dumps(names),
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def vanished_run(
    *, lease_expires_at: datetime, started_at: datetime, worker: str = "vanished:1:worker"
) -> dict[str, Any]:
    """The fields that make a job `running` under a claim of `worker`, a worker with no
    registry row (gone), whose lease runs out at `lease_expires_at`: for `update(**...)`
    or a row written by SQL."""
    return {
        "state": "running",
        "attempt": 1,
        "claim_token": uuid.uuid4(),
        "claimed_by": worker,
        "started_at": started_at,
        "lease_expires_at": lease_expires_at,
    }


def django_command(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run `python -m django <args>` in a subprocess with this run's settings; never raises on
    its exit status (the caller asserts what it expects)."""
    return subprocess.run(
        [sys.executable, "-m", "django", *args],
        env=worker_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


class Workers:
    """Starts `manage.py venturi_worker` subprocesses and cleans up after them."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.processes: list[subprocess.Popen[bytes]] = []

    def command(self, alias: str, *args: str) -> list[str]:
        return [sys.executable, "-m", "django", "venturi_worker", "--database", alias, *args]

    def burst(
        self, alias: str, *args: str, timeout: float = 90, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a burst worker to the end (`env` adds to its environment); fail the test if it
        does not exit 0."""
        result = subprocess.run(
            self.command(alias, "--burst", *args),
            env={**worker_env(), **(env or {})},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert result.returncode == 0, f"worker exited {result.returncode}:\n{result.stderr}"
        return result

    def start(self, alias: str, *args: str) -> subprocess.Popen[bytes]:
        with open(self.tmp_path / f"worker-{len(self.processes)}.log", "wb") as log:
            process = subprocess.Popen(
                self.command(alias, *args), env=worker_env(), cwd=ROOT, stdout=log, stderr=log
            )
        self.processes.append(process)
        return process

    def log(self, index: int = 0) -> str:
        return (self.tmp_path / f"worker-{index}.log").read_text(errors="replace")

    def stop_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=10)


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    pool = Workers(tmp_path)
    yield pool
    pool.stop_all()


def wait_until(condition: Callable[[], Any], *, timeout: float = 30, message: str = "") -> Any:
    """Poll `condition` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {message or condition}")
        time.sleep(0.02)


def in_thread(target: Callable[..., Any], *args: Any) -> tuple[threading.Thread, dict[str, Any]]:
    """Run `target(*args)` in a thread with its own connections; return (thread, result box)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = target(*args)
        except BaseException as error:  # reported by the test, not lost in the thread
            box["error"] = error
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def result_of(thread: threading.Thread, box: dict[str, Any], timeout: float = 10) -> Any:
    thread.join(timeout)
    assert not thread.is_alive(), "the thread is still blocked"
    if "error" in box:
        raise box["error"]
    return box["result"]
