"""The test suite's first contact: without PostgreSQL it stops at once with a short message."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT


def run_pytest_without_a_database(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`python3 -m pytest` as the README says, with no DATABASE_URL and no Docker.

    It stops while pytest-django loads the settings, before collection; should a
    database turn up anyway (a Testcontainers `tc.host` in the home directory wins
    over DOCKER_HOST), `--collect-only` of this one module keeps it from running tests.
    """
    env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
    env["DOCKER_HOST"] = f"unix://{tmp_path / 'no-docker.sock'}"
    return subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-p", "no:cacheprovider"),
            *("--collect-only", "-q", "tests/test_suite_database.py"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_without_database_url_or_docker_pytest_says_what_it_needs(tmp_path: Path) -> None:
    result = run_pytest_without_a_database(tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 4, output  # pytest's usage error: neither a pass nor a skip
    assert "DATABASE_URL" in output and "Docker" in output, output
    assert "Traceback" not in output and "DeprecationWarning" not in output, output
    assert len(output.strip().splitlines()) <= 6, output
