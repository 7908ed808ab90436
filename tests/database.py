"""Where the test suite's PostgreSQL comes from: DATABASE_URL, else testcontainers.

Never a silent skip: without either, importing the settings fails with a
message that says how to provide a database.
"""

from __future__ import annotations

import atexit
import os

HOW_TO = (
    "The test suite needs PostgreSQL. Set DATABASE_URL, for example\n"
    "  DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres\n"
    "or run Docker so that testcontainers can start one."
)


def postgres_url() -> str:
    """Return a PostgreSQL URL for the tests, starting a container if need be."""
    url = os.environ.get("DATABASE_URL")
    if url:
        if not url.startswith(("postgres://", "postgresql://", "pgsql://")):
            raise RuntimeError(f"DATABASE_URL must be a PostgreSQL URL, got {url!r}\n{HOW_TO}")
        return url
    try:
        from testcontainers.postgres import PostgresContainer
    except ImportError as error:
        raise RuntimeError(f"{HOW_TO}\n(testcontainers is not installed: {error})") from None
    try:
        container = PostgresContainer("postgres:16-alpine", driver=None).start()
    except Exception as error:  # Docker missing or not running: say so, do not skip
        raise RuntimeError(
            f"{HOW_TO}\n(testcontainers could not start PostgreSQL: {error})"
        ) from None
    atexit.register(container.stop)
    url = container.get_connection_url().replace("postgresql+psycopg2://", "postgres://")
    os.environ["DATABASE_URL"] = url  # worker subprocesses use the same server
    return url
