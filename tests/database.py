"""Where the test suite's PostgreSQL comes from: DATABASE_URL, else testcontainers.

Never a silent skip: without either, importing the settings raises `NoPostgreSQL`, a
`pytest.UsageError`, so that pytest stops at once with a few lines that say how to
provide a database (pytest-django imports the settings before any conftest runs, and
pytest prints a usage error without a traceback). Outside pytest (a test's worker
subprocess, which imports the same settings) it is a `RuntimeError`: importing pytest
cost each worker start 0.2 to 0.4 s, hundreds of times a run.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import warnings
from urllib.parse import urlsplit

HOW_TO = (
    "The test suite needs PostgreSQL. Set DATABASE_URL, for example\n"
    "  DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres\n"
    "or run Docker so that testcontainers can start one."
)


_USAGE_ERROR: type[Exception] = (
    sys.modules["pytest"].UsageError if "pytest" in sys.modules else RuntimeError
)


class NoPostgreSQL(_USAGE_ERROR):
    """Neither DATABASE_URL nor Docker gives the tests a PostgreSQL server."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"{HOW_TO}\n({reason})")


def postgres_url() -> str:
    """Return a PostgreSQL URL for the tests, starting a container if need be."""
    url = os.environ.get("DATABASE_URL")
    if url:
        if not url.startswith(("postgres://", "postgresql://", "pgsql://")):
            raise NoPostgreSQL(f"DATABASE_URL must be a PostgreSQL URL, got {url!r}")
        return url
    url = container_url()
    os.environ["DATABASE_URL"] = url  # worker subprocesses use the same server
    return url


def container_url() -> str:
    """Start PostgreSQL in Docker for this run and return its URL."""
    try:
        from testcontainers.community.postgres import PostgresContainer
    except ImportError as error:
        raise NoPostgreSQL(
            f"DATABASE_URL is not set, and testcontainers is missing: {error}"
        ) from None
    try:
        container = PostgresContainer("postgres:16-alpine", driver=None).start()
    except Exception as error:  # Docker missing or not running: say so, never skip
        reason = first_line(error)
    else:
        atexit.register(container.stop)
        return str(container.get_connection_url())
    # The Docker client's failed attempt leaves an unclosed socket behind; collect
    # it now, quietly, rather than let a ResourceWarning follow the message at exit.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
    raise NoPostgreSQL(f"DATABASE_URL is not set, and Docker could not start PostgreSQL: {reason}")


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
