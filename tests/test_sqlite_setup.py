"""SQLite without IMMEDIATE transactions: `migrate` works, the worker refuses to start.

`venturi.W013` warns in `check` (and so in `migrate` and `runserver`); only the
worker, whose claims need the write lock up front, stops (`venturi.E013`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

SETTINGS = """
SECRET_KEY = "tests-only-not-secret"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_venturi"]
DATABASES = {{
    "default": {{"ENGINE": "django.db.backends.sqlite3", "NAME": {plain!r}}},
    "immediate": {{
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": {immediate!r},
        "OPTIONS": {{"transaction_mode": "IMMEDIATE"}},
    }},
}}
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A settings module whose jobs database is SQLite in Django's default transaction mode."""
    (tmp_path / "plain_sqlite_settings.py").write_text(
        SETTINGS.format(
            plain=str(tmp_path / "plain.sqlite3"), immediate=str(tmp_path / "immediate.sqlite3")
        )
    )
    return tmp_path


def manage(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != "VENTURI_TEST_DATABASE_NAMES"}
    env["DJANGO_SETTINGS_MODULE"] = "plain_sqlite_settings"
    env["PYTHONPATH"] = os.pathsep.join([str(project), str(ROOT), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "django", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_migrate_succeeds_with_a_warning(project: Path) -> None:
    result = manage(project, "migrate", "-v", "0")
    assert result.returncode == 0, result.stderr
    assert "venturi.W013" in result.stderr and "transaction_mode" in result.stderr
    assert (project / "plain.sqlite3").exists()


def test_the_worker_refuses_to_start_with_the_same_message(project: Path) -> None:
    assert manage(project, "migrate", "-v", "0").returncode == 0
    result = manage(project, "venturi_worker", "--burst")
    assert result.returncode == 1, result.stderr
    assert "venturi.E013" in result.stderr, result.stderr
    assert "DATABASES['default'] is SQLite without OPTIONS['transaction_mode']" in result.stderr
    assert "venturi_worker refuses to start" in result.stderr


def test_the_worker_checks_the_alias_it_is_given(project: Path) -> None:
    """`--database` names the jobs database: IMMEDIATE there is what counts."""
    assert manage(project, "migrate", "--database", "immediate", "-v", "0").returncode == 0
    result = manage(project, "venturi_worker", "--burst", "--database", "immediate")
    assert result.returncode == 0, result.stderr
    assert "venturi.E013" not in result.stderr
