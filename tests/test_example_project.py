"""The example project's tests, written with `django_venturi.testing`, pass as a user runs them."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import ROOT


def test_the_example_projects_tests_pass() -> None:
    env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--ds=example_project.settings",
            "example_project/shop/tests.py",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "8 passed" in result.stdout, result.stdout
