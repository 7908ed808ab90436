"""The chaos soak (benchmarks/chaos.py) runs, injects its faults and finds no violation.

Twenty seconds of it (CI runs two minutes after the thorough tests; the soak's own
docstring says what it injects and checks). Thorough: with the drain and the 40 s
the workers get to beat again after the faults, it takes over a minute.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.cluster_workers import ROOT, require_private_clusters

SEED = 20261205
"""A fixed schedule: a failure here replays with `--seed`."""


@pytest.mark.thorough
def test_twenty_seconds_of_chaos_leave_no_violation() -> None:
    require_private_clusters()
    result = subprocess.run(
        [sys.executable, "benchmarks/chaos.py", "--minutes", "0.34", "--seed", str(SEED)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = result.stdout + result.stderr
    total = re.search(r"\| faults injected \|.*?\| total \| (\d+) \|", output, re.DOTALL)
    assert total is not None, output
    assert int(total.group(1)) >= 5, output  # the scenario: faults were injected
    assert "| completed |" in output, output
    assert result.returncode == 0, output
