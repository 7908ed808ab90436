"""The README's demo (`example_project/manage.py venturi_demo`) on a fresh PostgreSQL database.

It creates its own database when the server lacks it (never the `postgres`
maintenance database), and a second run says truthfully what it deleted.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from django.conf import settings

from tests.conftest import ROOT
from tests.database import drop_database, url_of

DATABASE = f"venturi_demo{settings.RUN_SUFFIX}"


@pytest.fixture
def demo_url() -> Iterator[str]:
    """A DATABASE_URL naming a database the server does not have."""
    drop_database(DATABASE)
    yield url_of(DATABASE)
    drop_database(DATABASE)


def run_demo(url: str) -> str:
    env = dict(os.environ, DATABASE_URL=url, DJANGO_SETTINGS_MODULE="example_project.settings")
    result = subprocess.run(
        [sys.executable, "example_project/manage.py", "venturi_demo", "--count", "2"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_the_demo_creates_its_database_and_says_what_it_deleted(demo_url: str) -> None:
    first = run_demo(demo_url)
    assert f"Created the database {DATABASE!r}." in first, first
    assert "Deleted" not in first, first

    second = run_demo(demo_url)
    assert "Created the database" not in second, second
    # Two of each of five kinds: 10 jobs, 22 runs (each kind's journal is fixed), 2 signups.
    assert "Deleted what earlier demo runs left: 22 journal entries, 10 jobs, 2 signups." in (
        second
    ), second
